"""Tests of sigprop.mc."""
