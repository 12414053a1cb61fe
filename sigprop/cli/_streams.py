"""The process's standard streams, as the console entry (:func:`sigprop.cli.console`) ends a
command whose output cannot be written, or that is interrupted (docs/formats.md, "Exit codes"):

* stdout that cannot be written (a full disk, ``>&-``, an I/O error): one line on stderr,
  ``sigprop COMMAND: error: cannot write to stdout: ...``, exit code 2;
* stdout or stderr whose reader went away (a broken pipe, ``sigprop predict --json | head``):
  the process ends quietly by SIGPIPE, as a C program would (the shell reports 141);
* Ctrl-C (SIGINT): the process ends quietly by SIGINT (the shell reports 130), so a shell loop
  around sigprop stops too;
* stderr that cannot be written otherwise (``2>/dev/full``, ``2>&-``): its lines are dropped
  (there is nowhere to say so) and the command ends with its own exit code.

:func:`guard` wraps ``sys.stdout`` and ``sys.stderr`` so that a failed write or flush raises
:class:`StreamFailure`, a BaseException that no ``except Exception`` or ``except OSError`` of the
library or of typer takes for its own; the console turns it into the ending above.
"""

from __future__ import annotations

import errno
import os
import sys

try:    # the C module under `signal` (`signal`'s own import, its enums, is ~0.3-0.5 ms of start-up)
    import _signal as signal
except ImportError:                              # pragma: no cover
    import signal

SIGINT = signal.SIGINT
SIGPIPE = getattr(signal, "SIGPIPE", 13)         # (Windows has no SIGPIPE: the exit code says it)


class StreamFailure(BaseException):
    """A write or flush of stdout (``name``) failed with ``error`` (an OSError)."""

    def __init__(self, name: str, error: OSError):
        super().__init__(name, error)
        self.name = name
        self.error = error

    @property
    def broken_pipe(self) -> bool:
        return self.error.errno == errno.EPIPE


class _Guarded:
    """``stream`` (a text file), whose failed writes and flushes raise :class:`StreamFailure`
    (``name`` "stdout"), or are dropped (``name`` "stderr"; a broken pipe raises)."""

    def __init__(self, stream, name: str):
        self._stream = stream
        self._name = name

    def _failed(self, e: OSError):
        if self._name == "stdout" or e.errno == errno.EPIPE:
            raise StreamFailure(self._name, e) from None

    def write(self, s):
        try:
            return self._stream.write(s)
        except OSError as e:
            self._failed(e)
            return len(s)

    def writelines(self, lines):
        for s in lines:
            self.write(s)

    def flush(self):
        try:
            self._stream.flush()
        except OSError as e:
            self._failed(e)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _refusing(fd: int):
    """A text stream on descriptor ``fd``, which was closed when the process started: the
    descriptor is taken (so that no file opened later lands on it, and no child inherits a
    file there) by /dev/null opened read-only, which refuses writes (EBADF)."""
    null = os.open(os.devnull, os.O_RDONLY)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
    return open(fd, "w", encoding="utf-8", closefd=False)


#: set by :func:`_on_sigint`: an exception that ends the command after it is the interruption's
#: (NumPy turns a KeyboardInterrupt that meets its import into an ImportError)
interrupted = False


def _on_sigint(signum, frame):
    global interrupted
    interrupted = True
    raise KeyboardInterrupt


def guard() -> None:
    """Wrap sys.stdout and sys.stderr (module docstring); a stream whose descriptor was closed at
    start-up (``sys.stdout`` None) first gets one that refuses writes.  Ctrl-C raises
    KeyboardInterrupt as before, and is recorded (:data:`interrupted`)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        if isinstance(stream, _Guarded):
            continue
        if stream is None:
            stream = _refusing(fd)
        setattr(sys, name, _Guarded(stream, name))


def die(sig: int) -> None:
    """End the process by signal ``sig`` (SIGINT, SIGPIPE) with its default action, after
    flushing stderr; nothing more of stdout is written."""
    try:
        sys.stderr.flush()
    except BaseException:                # noqa: BLE001  (nothing can be said any more)
        pass
    if os.name == "posix":
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(128 + sig)                  # should the signal not end it at once
