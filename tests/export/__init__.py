"""Tests of sigprop.export."""
