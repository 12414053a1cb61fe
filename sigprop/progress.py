"""Progress on stderr for computations that may take seconds (a prediction, the
interpolation-table builds inside it).

The numerical code reports through :func:`task`, a context manager yielding an object with
``advance(steps=1)``; it imports nothing heavy.  Only when progress is shown is ``rich``
imported, and it draws a transient spinner with the elapsed time on **stderr** (erased when
the task ends; stdout, where ``--json`` writes, is never touched).

Shown when ``SIGPROP_PROGRESS`` is ``1`` (or ``on``, ``yes``, ``true``, ``always``: at once,
drawn with terminal control codes even where stderr is a file or pipe), never when it is
``0`` (or ``off``, ``no``, ``false``, ``never``), and otherwise only when stderr is a
terminal, for tasks still running after DELAY seconds (a quick command never imports rich).
Nested tasks share one display.  Where progress is shown, the whole-model commands also end
with the time they took, one line on stderr (:func:`sigprop.cli._report.done`).
"""

from __future__ import annotations

import os
import sys

_ON = {"1", "on", "yes", "true", "always"}
_OFF = {"0", "off", "no", "false", "never"}
#: seconds a task runs before it is shown on a terminal (0 when asked for explicitly)
DELAY = 1.0


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
_state = {"display": None, "users": 0, "lock": None}


def _display():
    """The shared rich display, started on first use (call with the lock held)."""
    if _state["display"] is None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        _state["display"] = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                     TimeElapsedColumn(), console=Console(stderr=True, force_terminal=_forced()),
                                     transient=True)
        _state["display"].start()
    return _state["display"]


class _Shown:
    """A task shown once it has run ``delay`` seconds (a timer thread adds it to the display)."""

    def __init__(self, description: str, total: float | None, delay: float):
        self.description, self.total, self.delay = description, total, delay
        self.id, self.done, self.closed = None, 0.0, False

    def __enter__(self):
        import threading

        if _state["lock"] is None:
            _state["lock"] = threading.Lock()
        if self.delay <= 0:
            self._show()
            self.timer = None
        else:
            self.timer = threading.Timer(self.delay, self._show)
            self.timer.daemon = True
            self.timer.start()
        return self

    def _show(self) -> None:
        with _state["lock"]:
            if self.closed:
                return
            d = _display()
            _state["users"] += 1
            self.id = d.add_task(self.description, total=self.total, completed=self.done)

    def advance(self, steps: float = 1) -> None:
        self.done += steps
        if self.id is not None:
            with _state["lock"]:
                if self.id is not None:
                    _state["display"].advance(self.id, steps)

    def __exit__(self, *exc) -> bool:
        if self.timer is not None:
            self.timer.cancel()
        with _state["lock"]:
            self.closed = True
            if self.id is not None:
                _state["display"].remove_task(self.id)
                self.id = None
                _state["users"] -= 1
                if _state["users"] == 0:
                    _state["display"].stop()
                    _state["display"] = None
        return False


def task(description: str, total: float | None = None):
    """A context manager for one task of ``total`` steps (None: unknown) whose handle has
    ``advance(steps=1)``; does nothing unless :func:`enabled`."""
    if not enabled():
        return _SILENT
    return _Shown(description, total, 0.0 if _forced() else DELAY)
