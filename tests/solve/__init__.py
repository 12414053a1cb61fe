"""Tests of sigprop.solve."""
