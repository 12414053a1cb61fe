"""Command-line interface: one module per command; commands parse options, call the library,
render.  No maths here.

Exit codes (contract.md): 0 success, 1 negative verdict, 2 bad input, 3 numerical failure.
"""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    name="sigprop",
    help="Analytic signal propagation for deep transformers: moment rules, predictions and their "
    "Monte Carlo proof.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

from sigprop.cli import rules as _rules  # noqa: E402,F401  (registers commands)
from sigprop.cli import check_component as _check_component  # noqa: E402,F401
from sigprop.cli import predict as _predict  # noqa: E402,F401
from sigprop.cli import check as _check  # noqa: E402,F401
from sigprop.cli import compare as _compare  # noqa: E402,F401
from sigprop.cli import plot as _plot  # noqa: E402,F401
from sigprop.cli import export as _export  # noqa: E402,F401
from sigprop.cli import solve_init as _solve_init  # noqa: E402,F401


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr, nothing on stdout, then exit."""
    sys.stderr.write(f"sigprop: error: {message}\n")
    raise SystemExit(code)


def main() -> None:
    from sigprop.errors import SigpropError

    try:
        app()
    except SigpropError as e:
        fail(str(e), 2)
    except FloatingPointError as e:
        fail(f"numerical failure: {e}", 3)
