"""An on-disk store for the predictor's interpolation tables.

Building the table of an attention branch costs about fifty evaluations of the attention rule
(~0.3-0.5 s), more than predicting 768 layers from it.  A built table is a pure function of
the rule chain, its parameters and the rules' source code, so it is kept on disk and reused
by later processes.

* Where: ``$SIGPROP_CACHE_DIR``, else ``$XDG_CACHE_HOME/sigprop``, else ``~/.cache/sigprop``.
  ``SIGPROP_CACHE_DIR=off`` (or ``0``, ``none``, empty) disables the store.
* Key: a SHA-256 of the table's inputs together with a digest of the source files of the
  rules, the numeric backend and the table code, so editing any of them invalidates every
  stored table.
* A stored table holds exactly the numbers the build computed (float64, written atomically),
  so a prediction is bit-for-bit the same whether its tables were built or loaded.
* Any failure to read or write (a read-only home, a truncated file) falls back to building;
  nothing is ever raised from here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

try:    # the built-in SHA-256 (hashlib's import initialises OpenSSL: ~8 ms of start-up)
    from _sha2 import sha256 as _sha256          # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256 as _sha256    # Python 3.11
    except ImportError:                          # pragma: no cover
        from hashlib import sha256 as _sha256

_OFF = {"", "0", "off", "none", "false", "no"}
_SOURCES = ("rules", "backend", "model/tables.py", "model/profile.py", "model/store.py", "state.py")
_digest: str | None = None


def directory() -> Path | None:
    env = os.environ.get("SIGPROP_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sigprop"


def source_digest() -> str:
    """SHA-256 over the source files whose code determines a table's numbers."""
    global _digest
    if _digest is None:
        root = Path(__file__).resolve().parent.parent
        h = _sha256()
        for rel in _SOURCES:
            path = root / rel
            files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
            for f in files:
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
        _digest = h.hexdigest()
    return _digest


def key(*parts) -> str:
    """A file-name-safe key for ``parts`` (reprs of tuples, floats, strings)."""
    h = _sha256(source_digest().encode())
    h.update(repr(parts).encode())
    return h.hexdigest()[:40]


def load(k: str) -> np.ndarray | None:
    d = directory()
    if d is None:
        return None
    try:
        arr = np.load(d / f"{k}.npy", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return arr if arr.ndim == 1 and arr.dtype == np.float64 and arr.size >= 3 else None


def save(k: str, arr: np.ndarray) -> None:
    d = directory()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{k}.{os.getpid()}.tmp.npy"
        np.save(tmp, np.asarray(arr, dtype=np.float64), allow_pickle=False)
        os.replace(tmp, d / f"{k}.npy")
    except OSError:
        pass
