"""Error lines and notes on stderr, shared by every command (no typer here, so that a plain
``sigprop predict`` line, parsed without typer, reports its errors the same way):

* bad input is one line on stderr, ``sigprop COMMAND: error: ...``, exit 2, nothing on stdout
  (:func:`fail`);
* notes (:func:`note`) wait for the end of the command and are written then (:func:`flush_notes`).
"""

from __future__ import annotations

import sys

#: ``sigprop`` or ``sigprop COMMAND``: the prefix of error lines (set when a command runs)
PROG = "sigprop"
#: notes waiting for the end of the command (:func:`note`)
NOTES: list[str] = []


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
