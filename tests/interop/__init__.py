"""Tests of sigprop.interop."""
