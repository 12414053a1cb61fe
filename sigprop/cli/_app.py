"""The typer application every command module registers on (see sigprop.cli), and the
conventions every command shares:

* ``-h`` and ``--help`` print the help; ``--version`` prints ``sigprop <version>``, on the
  application and on every command (:class:`SigpropTyper` adds it to each command it
  registers);
* bad input is one line on stderr, ``sigprop COMMAND: error: ...``, exit 2, nothing on stdout
  (:func:`fail`, from :mod:`sigprop.cli._report`; :func:`sigprop.cli.main` turns
  option-parsing errors into the same line);
* an option renamed for consistency keeps its old spelling as a hidden, deprecated alias
  (:func:`renamed`): it still works, with a one-line note on stderr.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Optional

import typer

from sigprop import __version__
from sigprop.cli import _report
from sigprop.cli._report import fail, flush_notes, note  # noqa: F401  (re-exported)


def _current_context():
    """The running command's click context, or None (typer >= 0.25 vendors click)."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:                       # older typer: click itself
        from click import get_current_context
    return get_current_context(silent=True)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"sigprop {__version__}\n")
        raise typer.Exit(0)


def _version_option():
    return typer.Option(False, "--version", is_eager=True, callback=_version, expose_value=True,
                        help="Show the version and exit.")


def _plugin_option():
    # (sigprop.cli.main imports the files and removes the option before typer parses the line:
    # here it is only documented)
    return typer.Option(None, "--plugin", metavar="FILE.py",
                        help="Import FILE.py before the model is read (repeatable; also the SIGPROP_PLUGINS "
                        "environment variable): your own code, which runs. It registers components with "
                        "sigprop.extend (docs/extending.md).")


def _common(fn):
    """``fn`` with the options every command shares (``--version``, ``--plugin``) and a record
    of the command being run (for the prefix of error lines)."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        kwargs.pop("_version", None)
        kwargs.pop("_plugin", None)
        ctx = _current_context()
        if ctx is not None:
            _report.PROG = ctx.command_path
        return fn(*args, **kwargs)

    extra = [inspect.Parameter("_version", inspect.Parameter.KEYWORD_ONLY, default=_version_option(),
                               annotation=bool),
             inspect.Parameter("_plugin", inspect.Parameter.KEYWORD_ONLY, default=_plugin_option(),
                               annotation=Optional[list[str]])]
    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])
    return wrapper


class SigpropTyper(typer.Typer):
    """A typer application whose commands all take ``-h`` and ``--version``."""

    def __init__(self, **kwargs):
        kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"]})
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("pretty_exceptions_enable", False)
        super().__init__(**kwargs)

    def command(self, *args, **kwargs):
        register = super().command(*args, **kwargs)
        return lambda fn: register(_common(fn))


app = SigpropTyper(
    name="sigprop",
    help="Analytic signal propagation for deep transformers: moment rules, predictions and their "
    "Monte Carlo proof.",
    no_args_is_help=True,
)


@app.callback()
def _group(_version: bool = _version_option()) -> None:
    """Analytic signal propagation for deep transformers: moment rules, predictions and their
    Monte Carlo proof."""
    # (a callback keeps `sigprop` a command group when main() has loaded a single command)


def renamed(ctx, new: str, value, old_flag: str, old_value, quiet: bool = False, use: str | None = None):
    """The value of option ``new`` (its parameter name; ``--new-name`` on the command line),
    given either under its name or under ``old_flag``, its hidden deprecated spelling (whose
    value, None when not given, is ``old_value``; a note on stderr unless ``quiet``).  Both
    given: bad input.  ``use``: what the note recommends (default ``--new-name``)."""
    if old_value is None:
        return value
    new_flag = "--" + new.replace("_", "-")
    src = ctx.get_parameter_source(new)
    if src is not None and src.name != "DEFAULT":
        from sigprop.errors import DomainError

        raise DomainError(f"{old_flag} is the old spelling of {new_flag}: give {new_flag} only")
    if not quiet:
        note(f"{old_flag} is deprecated; use {use or new_flag}")
    return old_value
