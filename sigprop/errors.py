"""Exceptions shared by the library and the CLI (which maps them to exit codes)."""


class SigpropError(Exception):
    """Base class of sigprop's own errors."""


class DomainError(SigpropError, ValueError):
    """An input lies outside the domain a rule (or option) is valid on: exit code 2."""
