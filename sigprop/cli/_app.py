"""The typer application every command module registers on (see sigprop.cli)."""

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


@app.callback()
def _group() -> None:
    """Analytic signal propagation for deep transformers: moment rules, predictions and their
    Monte Carlo proof."""
    # (a callback keeps `sigprop` a command group when main() has loaded a single command)


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr, nothing on stdout, then exit."""
    sys.stderr.write(f"sigprop: error: {message}\n")
    raise SystemExit(code)
