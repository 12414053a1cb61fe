"""Tests of sigprop.cli."""
