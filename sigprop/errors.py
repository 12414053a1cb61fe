"""Exceptions shared by the library and the CLI (which maps them to exit codes)."""


class SigpropError(Exception):
    """Base class of sigprop's own errors."""


class DomainError(SigpropError, ValueError):
    """An input lies outside the domain a rule (or option) is valid on: exit code 2."""


def float_range_failure(e: Exception) -> FloatingPointError:
    """The numerical failure (exit 3) for a float operation that left float64 where no
    log-space form carries it (``e``: an OverflowError or ZeroDivisionError; the predictor also
    passes a LinAlgError): one message for the predictor and the command line's last resort."""
    return FloatingPointError(f"a moment leaves the float64 range ({type(e).__name__}: {e}); weight stds, "
                              "scales or inputs this large (or this small) are outside what sigprop evaluates")
