"""Error lines and notes on stderr, shared by every command (no typer here, so that a plain
``sigprop predict`` line, parsed without typer, reports its errors the same way):

* bad input is one line on stderr, ``sigprop COMMAND: error: ...``, exit 2, nothing on stdout
  (:func:`fail`);
* notes (:func:`note`) wait for the end of the command and are written then (:func:`flush_notes`);
* the whole-model commands end with the time they took (:func:`done`), on stderr where progress
  is shown (:func:`sigprop.progress.enabled`: a terminal, or ``SIGPROP_PROGRESS=1``), so that
  stdout stays the result alone.
"""

from __future__ import annotations

import sys

#: ``sigprop`` or ``sigprop COMMAND``: the prefix of error lines (set when a command runs)
PROG = "sigprop"
#: notes waiting for the end of the command (:func:`note`)
NOTES: list[str] = []
#: time.perf_counter() when the command line began to be run (set by sigprop.cli.main)
START: float | None = None


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr (``sigprop COMMAND: error: message``), nothing on stdout, then
    exit with ``code``."""
    line = " ".join(str(message).split())      # one line, whatever the message holds
    NOTES.clear()                               # bad input: the error line is all there is
    sys.stderr.write(f"{PROG}: error: {line}\n")
    raise SystemExit(code)


def note(message: str) -> None:
    """A one-line note for stderr (``sigprop COMMAND: note: message``), written when the
    command ends (:func:`flush_notes`) unless it ends on bad input."""
    NOTES.append(f"{PROG}: note: {message}\n")


def flush_notes() -> None:
    while NOTES:
        sys.stderr.write(NOTES.pop(0))


def seconds(s: float) -> str:
    """A duration in a few characters: 0.31 s, 12.3 s, 754 s."""
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s" if s < 100 else f"{s:.0f} s"


def done() -> None:
    """The command's last note: ``sigprop COMMAND: done in 0.31 s`` (since :data:`START`),
    written with the notes where progress is shown (module docstring); nothing without a
    start time (a command called as a function)."""
    import time

    from sigprop import progress

    if START is not None and progress.enabled():
        NOTES.append(f"{PROG}: done in {seconds(time.perf_counter() - START)}\n")
