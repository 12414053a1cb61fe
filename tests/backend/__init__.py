"""Tests of sigprop.backend."""
