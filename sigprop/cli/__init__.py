"""Command-line interface: one module per command; commands parse options, call the library,
render.  No maths here.

Exit codes (contract.md): 0 success, 1 negative verdict, 2 bad input, 3 numerical failure.

Start-up: ``main()`` imports only the module of the command being run (``sigprop predict``
does not import the Monte Carlo, plotting or LaTeX commands, and typer builds one command
instead of eight); anything else (``sigprop --help``, an unknown name) loads every command.
``sigprop.cli.app`` is the full application.
"""

from __future__ import annotations

import gc
import importlib
import sys

from sigprop.cli._app import fail  # noqa: F401  (re-exported)

#: command name -> module (sigprop.cli.<module>) that registers it
COMMANDS = {
    "rules": "rules",
    "check-component": "check_component",
    "predict": "predict",
    "check": "check",
    "compare": "compare",
    "plot": "plot",
    "export": "export",
    "solve-init": "solve_init",
}


def load(names=None):
    """Register the commands ``names`` (default: all) and return the typer app."""
    from sigprop.cli._app import app

    for name in COMMANDS if names is None else names:
        importlib.import_module(f"sigprop.cli.{COMMANDS[name]}")
    return app


def __getattr__(name: str):
    if name == "app":
        return load()
    raise AttributeError(f"module 'sigprop.cli' has no attribute {name!r}")


def main() -> None:
    from sigprop.errors import SigpropError

    first = sys.argv[1] if len(sys.argv) > 1 else None
    if first != "predict":
        # the process entry (sigprop.__main__) paused the cyclic collector for start-up; the
        # other commands (Monte Carlo, sympy) may make reference cycles, so it runs again
        gc.enable()
    app = load([first] if first in COMMANDS else None)
    try:
        app()
    except SigpropError as e:
        fail(str(e), 2)
    except FloatingPointError as e:
        fail(f"numerical failure: {e}", 3)


def console() -> None:
    """The console entry point (`sigprop`, `python -m sigprop`, through sigprop.__main__): :func:`main`, then the process
    ends with ``os._exit`` once stdout and stderr are flushed.  The interpreter's own teardown
    (finalising NumPy and every module, freeing the prediction's records) took ~40 ms of a
    ~300 ms `predict --layers 768` run and does no work a finished command needs: tables are
    written to the store atomically during the run, and sigprop registers no exit handlers.
    In-process callers use :func:`main`, which raises SystemExit as usual."""
    import os

    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            sys.stderr.write(f"{code}\n")
            code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:                  # e.g. the reader went away (broken pipe)
        code = code or 1
    os._exit(code)

