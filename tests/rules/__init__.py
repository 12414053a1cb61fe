"""Tests of sigprop.rules."""
