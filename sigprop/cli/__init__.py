"""Command-line interface: one module per command; commands parse options, call the library,
render.  No maths here.

Exit codes: 0 success, 1 negative verdict, 2 bad input, 3 numerical failure.

Start-up: ``main()`` imports only the module of the command being run (``sigprop predict``
does not import the Monte Carlo, plotting or LaTeX commands, and typer builds one command
instead of eight); anything else (``sigprop --help``, an unknown name) loads every command.
A plain ``sigprop predict`` line (model options, ``--every``, ``--full``, ``--json``, ``--symbolic``) does
not import typer at all (:mod:`sigprop.cli._predict`).  ``sigprop.cli.app`` is the full
application.
"""

from __future__ import annotations

import gc
import importlib
import sys

from sigprop.cli import _report, _streams
from sigprop.cli._report import fail  # noqa: F401  (re-exported)

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
    "measure": "measure",
    "audit": "audit",
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


def _click_exceptions():
    """click's exception classes (typer >= 0.25 vendors click as typer._click)."""
    try:
        from typer._click import exceptions
    except ImportError:                       # older typer: click itself
        from click import exceptions
    return exceptions


def _usage_line(e) -> tuple[str, str]:
    """(command path, message) for a click usage error, as one plain line."""
    ctx = getattr(e, "ctx", None)
    prog = ctx.command_path if ctx is not None else "sigprop"
    msg = " ".join(e.format_message().split()).rstrip(".")
    if msg[:1].isupper() and not msg[1:2].isupper():
        msg = msg[0].lower() + msg[1:]
    return prog, msg


#: the exit code of an interrupted command (128 + SIGINT); the console ends by SIGINT itself
INTERRUPTED = 130


def main(args: list[str] | None = None) -> None:
    """Run the command line ``args`` (default ``sys.argv[1:]``); ends with SystemExit carrying
    the exit code.  Bad input, whether click rejects it while parsing or sigprop while running,
    is one line on stderr and exit 2.  Ctrl-C (KeyboardInterrupt), wherever it comes, is
    SystemExit(130) with nothing on stderr (its notes dropped)."""
    import time

    _report.START = time.perf_counter()
    try:
        _main(args)
    except KeyboardInterrupt:
        _report.NOTES.clear()
        raise SystemExit(INTERRUPTED) from None


def _main(args: list[str] | None) -> None:
    args = sys.argv[1:] if args is None else list(args)
    args = _plugins(args)
    first = args[0] if args else None
    if first == "predict":
        from sigprop.cli import _predict

        parsed = _predict.parse(args[1:])
        if parsed is not None:
            _report.PROG = "sigprop predict"
            try:
                code = _library_errors(_predict.run, **parsed)
            except KeyboardInterrupt:
                _report.NOTES.clear()            # interrupted: nothing more is said
                raise
            finally:
                _report.flush_notes()
            raise SystemExit(code)
    if first != "predict":
        # the process entry (sigprop.__main__) paused the cyclic collector for start-up; the
        # other commands (Monte Carlo, sympy) may make reference cycles, so it runs again
        gc.enable()
    if first not in ("rules", "check-component"):
        # the whole-model commands' options come from sigprop.model.presets (and NumPy); imported
        # here, before the command modules, a `predict --json` run touched ~600 fewer memory
        # pages (~2 ms) than when their registration imported it
        import sigprop.model.presets  # noqa: F401
    app = load([first] if first in COMMANDS else None)
    _report.PROG = "sigprop"
    code = None
    try:
        code = _run(app, args)   # typer ends a KeyboardInterrupt as exit code 130 itself
    except KeyboardInterrupt:
        _report.NOTES.clear()
        raise
    finally:
        if code == INTERRUPTED:
            _report.NOTES.clear()
        _report.flush_notes()
    raise SystemExit(code)


def _plugins(args: list[str]) -> list[str]:
    """Import the plugin files of ``--plugin FILE`` (any command, any position) and of
    ``SIGPROP_PLUGINS`` before anything reads a model (sigprop.extend); the arguments without
    those options.  A plugin that cannot be imported is bad input (one line, exit 2)."""
    import os

    if not os.environ.get("SIGPROP_PLUGINS") and not any(a == "--plugin" or a.startswith("--plugin=") for a in args):
        return args
    from sigprop import extend
    from sigprop.errors import SigpropError

    try:
        paths, rest = extend.plugin_paths(args)
        extend.load_plugins(paths)
    except SigpropError as e:
        fail(str(e), 2)
    return rest


def _library_errors(fn, *args, **kwargs) -> int:
    """The exit code of ``fn(*args, **kwargs)`` (its return value if an int, else 0); the
    library's bad input (SigpropError) ends in :func:`fail` with exit 2, a numerical failure
    (FloatingPointError, or an OverflowError or ZeroDivisionError that reached here) with exit
    3."""
    from sigprop.errors import SigpropError, float_range_failure

    try:
        code = fn(*args, **kwargs)
    except SigpropError as e:
        fail(str(e), 2)
    except FloatingPointError as e:
        fail(f"numerical failure: {e}", 3)
    except (OverflowError, ZeroDivisionError) as e:
        # one that no library layer turned into a FloatingPointError (predict's does): one line
        fail(f"numerical failure: {float_range_failure(e)}", 3)
    return code if isinstance(code, int) else 0


def _run(app, args) -> int:
    """The exit code of the command line ``args``; bad input ends in :func:`fail`."""
    import typer

    cx = _click_exceptions()
    try:
        code = _library_errors(app, args=args, prog_name="sigprop", standalone_mode=False)
    except cx.NoArgsIsHelpError as e:       # `sigprop`, `sigprop export`: the help, on stdout
        sys.stdout.write(e.format_message().rstrip("\n") + "\n")
        code = 0
    except cx.UsageError as e:              # unknown option or command, bad or missing value
        _report.PROG, msg = _usage_line(e)
        fail(msg, 2)
    except cx.ClickException as e:
        fail(" ".join(e.format_message().split()), e.exit_code)
    except typer.Abort:
        fail("aborted", 1)
    return code


def console() -> None:
    """The console entry point (`sigprop`, `python -m sigprop`, through sigprop.__main__):
    :func:`main` with guarded standard streams (:mod:`sigprop.cli._streams`: stdout that cannot
    be written is one line on stderr and exit 2; a broken pipe ends the process quietly by
    SIGPIPE, Ctrl-C by SIGINT), then the process ends with ``os._exit`` once stdout and stderr
    are flushed.  The interpreter's own teardown (finalising NumPy and every module, freeing the
    prediction's records) took ~40 ms of a ~300 ms `predict --layers 768` run and does no work a
    finished command needs: tables are written to the store atomically during the run, and
    sigprop registers no exit handlers.  In-process callers use :func:`main`, which raises
    SystemExit as usual."""
    import os

    try:
        _streams.guard()
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
        if code == INTERRUPTED or _streams.interrupted:   # even if it came out as another error
            _streams.die(_streams.SIGINT)
        sys.stdout.flush()
        sys.stderr.flush()
    except KeyboardInterrupt:                # while flushing, or before main() took over
        _streams.die(_streams.SIGINT)
    except _streams.StreamFailure as f:
        if f.broken_pipe:
            _streams.die(_streams.SIGPIPE)
        code = 2
        try:
            sys.stderr.write(f"{_report.PROG}: error: cannot write to stdout: {f.error.strerror or f.error}\n")
            sys.stderr.flush()
        except BaseException:                # noqa: BLE001  (stderr is gone too)
            pass
    except BaseException:
        if _streams.interrupted:             # e.g. NumPy's ImportError for an interrupted import
            _streams.die(_streams.SIGINT)
        raise
    os._exit(code)
