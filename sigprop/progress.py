"""Progress on stderr for computations that may take seconds (interpolation-table builds).

The numerical code reports through :func:`task`, a context manager yielding an object with
``advance(steps=1)``; it imports nothing heavy.  Only when progress is shown is ``rich``
imported, and it draws a transient spinner with the elapsed time on **stderr** (erased when
the task ends; stdout, where ``--json`` writes, is never touched).

Shown when ``SIGPROP_PROGRESS`` is ``1`` (or ``on``, ``yes``, ``true``, ``always``; then drawn
with terminal control codes even where stderr is a file or pipe), never
when it is ``0`` (or ``off``, ``no``, ``false``, ``never``), and otherwise only when stderr
is a terminal.  Nested tasks share one display.
"""

from __future__ import annotations

import os
import sys

_ON = {"1", "on", "yes", "true", "always"}
_OFF = {"0", "off", "no", "false", "never"}


def _forced() -> bool:
    return os.environ.get("SIGPROP_PROGRESS", "").strip().lower() in _ON


def enabled() -> bool:
    """Whether progress is shown (see the module docstring)."""
    env = os.environ.get("SIGPROP_PROGRESS", "").strip().lower()
    if env in _ON:
        return True
    if env in _OFF:
        return False
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Silent:
    """The task handle when nothing is shown."""

    def advance(self, steps: float = 1) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


_SILENT = _Silent()
_display = None          # the rich Progress shown while at least one task runs
_depth = 0


class _Shown:
    def __init__(self, description: str, total: float | None):
        self.description, self.total = description, total

    def __enter__(self):
        global _display, _depth
        if _display is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            _display = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True, force_terminal=_forced()),
                                transient=True)
            _display.start()
        _depth += 1
        self.id = _display.add_task(self.description, total=self.total)
        return self

    def advance(self, steps: float = 1) -> None:
        _display.advance(self.id, steps)

    def __exit__(self, *exc) -> bool:
        global _display, _depth
        _display.remove_task(self.id)
        _depth -= 1
        if _depth == 0:
            _display.stop()
            _display = None
        return False


def task(description: str, total: float | None = None):
    """A context manager for one task of ``total`` steps (None: unknown) whose handle has
    ``advance(steps=1)``; does nothing unless :func:`enabled`."""
    return _Shown(description, total) if enabled() else _SILENT
