"""Tests of sigprop.torch."""
