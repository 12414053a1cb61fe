"""Writing an output file (``-o FILE`` of `export`, `plot`, `solve-init`) so that a failure
leaves the old content: :func:`replacing` writes into a temporary file beside the target (same
directory, so the same file system) and moves it over the target with ``os.replace`` only once
every byte is written and synced. A full disk, an unwritable directory or an error while the
content is produced leaves the target as it was and no temporary file behind.

* A target that is a symbolic link to a regular file: the link itself is replaced by the new
  file (the file it pointed to is left alone), as ``mv`` and most editors' "atomic save" do.
* A target that exists and is not a regular file (``/dev/stdout``, ``/dev/null``, a FIFO, a
  terminal; through a link or not) has no content to keep: it is opened and written in place.
* A new file gets the permissions the umask gives (``0o666 & ~umask``), a replaced one keeps
  its mode (not its owner, nor other hard links to it: they keep the old content).
* The directory must be writable (the temporary file is made there), even where the file
  itself is.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile


def _mode(path: str) -> int:
    """The permission bits of the file at ``path`` (after links), or those the umask gives a
    new file."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


@contextlib.contextmanager
def replacing(path, mode: str = "w", encoding: str | None = "utf-8"):
    """A file object (``mode`` "w" text, "wb" binary) whose content replaces ``path`` when the
    ``with`` block ends without an exception (module docstring); on an exception the target is
    untouched and the temporary file removed. OSError for an unwritable place, as ``open``."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    enc = None if mode == "wb" else encoding
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        # a device, FIFO or terminal: nothing to keep, and its directory (/dev) is not ours
        with open(path, mode, encoding=enc) as f:
            yield f
        return
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, _mode(path))
        with os.fdopen(fd, mode, encoding=enc) as f:
            fd = None
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(path, text: str) -> None:
    """Replace the file ``path`` by ``text`` (UTF-8), as :func:`replacing`."""
    with replacing(path, "w") as f:
        f.write(text)
