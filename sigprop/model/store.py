"""An on-disk store for the interpolation tables of the predictor and of the solver.

Building the table of an attention branch costs about fifty evaluations of the attention rule
(~0.3-0.5 s), more than predicting 768 layers from it (the solver's attention branch table
is most of a solve's time: docs/benchmarks.md).  A built table is a pure function of
the rule chain, its parameters and the rules' source code, so it is kept on disk and reused
by later processes.

* Where: ``$SIGPROP_CACHE_DIR`` when it is set; else, once :func:`use_default` has been called
  (the command line does, in ``sigprop.__main__``), ``$XDG_CACHE_HOME/sigprop``, else
  ``~/.cache/sigprop``; else nowhere: a library call reads and writes no store unless asked
  (the environment variable, or :func:`use_default`).  ``SIGPROP_CACHE_DIR=off`` (or ``0``,
  ``none``, empty) disables the store everywhere.
* Key: a SHA-256 of the table's inputs together with a digest of the source files that can
  shape a table's numbers (``_SOURCES``: the whole ``sigprop.rules``, ``sigprop.backend`` and
  ``sigprop.model`` packages and the modules they import, and the solver's branch evaluation
  and table, ``sigprop/solve/blocks.py``) and of the NumPy and Python versions
  (whose arithmetic produced the numbers), so editing any of them invalidates every stored
  table.
* A stored entry holds exactly the float64 numbers the build computed, so a prediction is
  bit-for-bit the same whether its tables were built or loaded.  The file is
  ``MAGIC | n (uint64, little-endian) | SHA-256(key, n, payload) | payload of n float64``:
  written to a temporary file and renamed into place (atomic), and on reading, anything but
  a complete file written for this very key (truncated, corrupted, renamed, another format)
  reads as absent.  Entries with a non-finite number are neither written nor read.  What the
  numbers must satisfy beyond that (shape, the build's verification) the tables check
  themselves (sigprop.model.tables).
* Reading never follows, blocks on or swallows a file it did not write: an entry is opened
  with ``O_NOFOLLOW | O_NONBLOCK`` and taken only if it is a regular file (a symlink, even
  to a regular file in the store, a FIFO, a device, a directory read as absent: the store
  writes none of them), whose size is exactly what its header's ``n`` says, with ``n`` at
  most ``MAX_VALUES`` (64 MiB of payload; the largest table seen is 0.67 MB); only that many
  bytes are read.  A bad entry is rebuilt like a corrupt one, and the rebuilt entry is
  renamed over it (a directory in its place stays, and its table is rebuilt each run).
* The seal detects accidents, not forgery: it is an unkeyed SHA-256, so whoever can write
  the store's directory can write an entry that changes an answer.  The store is as trusted
  as its directory (docs/security.md); ``SIGPROP_CACHE_DIR=off`` disables it.
* Any failure to read or write (a read-only home, a full disk) falls back to building;
  nothing is ever raised from here.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import numpy as np

from sigprop import registry

try:    # the built-in SHA-256 (hashlib's import initialises OpenSSL: ~8 ms of start-up)
    from _sha2 import sha256 as _sha256          # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256 as _sha256    # Python 3.11
    except ImportError:                          # pragma: no cover
        from hashlib import sha256 as _sha256

_OFF = {"", "0", "off", "none", "false", "no"}
#: every source whose code can shape a stored table, relative to the package: whole packages
#: rather than a list of the table code's modules, because the chains, parameters and row
#: lengths a table is built for come from across sigprop.model (blocks, spec, presets, the
#: predictor, positions), the rules import one another lazily, and a forgotten file would let
#: a stale table through silently, whereas hashing a file too many only costs a rebuild (any
#: edit to sigprop.model, the predictor included, invalidates the store).  Of the solver only
#: solve/blocks.py (its branch evaluation and table): the rest of sigprop.solve decides the
#: weight stds, which enter a solver table's key by value.  The test suite checks that every
#: sigprop module a prediction imports is covered or in ``_NOT_NUMERIC``.
_SOURCES = ("rules", "backend", "model", "solve/blocks.py", "state.py", "errors.py", "symbols.py", "registry.py", "rope.py")
#: modules a prediction imports that cannot change a number: the package's lazy API
#: (``__init__``), the progress display on stderr and the memos (which decide only whether a
#: value is computed again, tests/test_memo.py)
_NOT_NUMERIC = ("__init__.py", "progress.py", "memo.py")
#: file format: magic (format version included), the payload's float64 count n (8 bytes,
#: little-endian), the 32-byte seal, then the payload
MAGIC = b"SIGPROP-TABLE-3\n"
SUFFIX = ".tbl"
_HEAD = len(MAGIC) + 8 + 32
#: the most float64s an entry may hold (64 MiB): neither written nor read above it (the
#: largest table, a causal LayerNorm Scaling attention's over correlation x variance at 64
#: positions, is 0.67 MB)
MAX_VALUES = 1 << 23
#: how an entry is opened: never through a symlink, never waiting on a FIFO's writer
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
_digest: str | None = None
#: whether the default directory is used where $SIGPROP_CACHE_DIR is not set (:func:`use_default`)
_DEFAULT = {"on": False}


def use_default(on: bool = True) -> None:
    """Use the default directory (``$XDG_CACHE_HOME/sigprop``, else ``~/.cache/sigprop``) where
    ``$SIGPROP_CACHE_DIR`` is not set; the command line turns it on, a library call that wants
    the store between processes turns it on itself (or sets the variable)."""
    _DEFAULT["on"] = bool(on)


def directory() -> Path | None:
    """The store's directory; None: no store (disabled, or the library not asked to use one)."""
    env = os.environ.get("SIGPROP_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env)
    if not _DEFAULT["on"]:
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sigprop"


def source_files(root: Path | None = None) -> list[Path]:
    """The files ``_SOURCES`` names (directories: every ``*.py`` below them), in digest order."""
    root = Path(__file__).resolve().parent.parent if root is None else root
    out = []
    for rel in _SOURCES:
        path = root / rel
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def _read(path: Path) -> bytes:
    return path.read_bytes()


def source_digest() -> str:
    """SHA-256 over the source files whose code determines a table's numbers, and the NumPy
    and Python versions that execute it."""
    global _digest
    if _digest is None:
        root = Path(__file__).resolve().parent.parent
        h = _sha256()
        h.update(f"numpy {np.__version__}; python {sys.version}".encode())
        for f in source_files(root):
            h.update(str(f.relative_to(root)).encode())
            h.update(_read(f))
        _digest = h.hexdigest()
    return _digest


def key(*parts) -> str:
    """A file-name-safe key for ``parts`` (reprs of tuples, floats, strings)."""
    h = _sha256(source_digest().encode())
    h.update(registry.digest().encode())    # plugins' code (sigprop.extend): not in the sources
    h.update(repr(parts).encode())
    return h.hexdigest()[:40]


def path(k: str) -> Path | None:
    """The file of key ``k`` (None: the store is disabled)."""
    d = directory()
    return None if d is None else d / f"{k}{SUFFIX}"


def _seal(k: str, count: bytes, payload: bytes) -> bytes:
    h = _sha256(k.encode())
    h.update(count)
    h.update(payload)
    return h.digest()


def _read_entry(p: Path) -> bytes | None:
    """The header and payload of the entry file ``p``, or None: not a regular file (opened
    without following a symlink or waiting on a FIFO), not this format, or not exactly the
    size its header says (at most MAX_VALUES float64s).  Reads at most that many bytes."""
    try:
        fd = os.open(p, _OPEN_FLAGS)
    except OSError:                      # absent, a symlink (ELOOP), unreadable
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _HEAD + 8 <= st.st_size <= _HEAD + 8 * MAX_VALUES:
            return None
        head = _read_exactly(fd, _HEAD)
        if head is None or not head.startswith(MAGIC):
            return None
        n = int.from_bytes(head[len(MAGIC):len(MAGIC) + 8], "little")
        if not 1 <= n <= MAX_VALUES or st.st_size != _HEAD + 8 * n:
            return None
        payload = _read_exactly(fd, 8 * n)
        return None if payload is None else head + payload
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd`` (None if the file ends first)."""
    parts, left = [], size
    while left:
        b = os.read(fd, left)
        if not b:
            return None
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


def load(k: str) -> np.ndarray | None:
    """The float64 vector stored under ``k``; None where there is none, or the file is not a
    complete, finite entry written for ``k`` (or not a regular file: module docstring)."""
    p = path(k)
    if p is None:
        return None
    data = _read_entry(p)
    if data is None:
        return None
    count, payload = data[len(MAGIC):len(MAGIC) + 8], data[_HEAD:]
    if data[len(MAGIC) + 8:_HEAD] != _seal(k, count, payload):
        return None
    arr = np.frombuffer(payload, dtype="<f8").astype(np.float64)
    return arr if np.all(np.isfinite(arr)) else None


def save(k: str, arr) -> bool:
    """Store the float64 vector ``arr`` under ``k`` atomically; False where nothing was written
    (store disabled or unwritable, or ``arr`` not a finite vector of 1 to MAX_VALUES numbers)."""
    d = directory()
    if d is None:
        return False
    arr = np.ascontiguousarray(arr, dtype="<f8")
    if arr.ndim != 1 or not 1 <= arr.size <= MAX_VALUES or not np.all(np.isfinite(arr)):
        return False
    import tempfile                  # (only when writing: keeps it off the start-up path)

    payload = arr.tobytes()
    count = arr.size.to_bytes(8, "little")
    tmp = None
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{k}.", suffix=".tmp", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + count + _seal(k, count, payload) + payload)
        os.replace(tmp, d / f"{k}{SUFFIX}")
        return True
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False
