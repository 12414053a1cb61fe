"""Reading the files a user names: one reader for every input file (``--config`` TOML,
``--spec`` and ``--init-from`` model files, ``--hf-config`` config.json), bounded before
anything is parsed (docs/formats.md, "Input files").

* Only regular files are read: a FIFO, a device (``/dev/zero``), a socket or a directory is
  refused without reading it (the file is opened non-blocking, so a FIFO without a writer does
  not block, and checked with ``fstat`` on the open descriptor).
* A file larger than its kind's limit is refused before it is read: :data:`MAX_CONFIG_BYTES`
  for the configs (``--config``, ``--hf-config``: real ones are a few kilobytes),
  :data:`MAX_MODEL_BYTES` for model files (they hold every layer: a trace of the
  1,000,000-layer limit is about 0.9 GB).
* JSON nested deeper than :data:`MAX_DEPTH` arrays/objects is refused before the parser sees
  it (:func:`json_depth`, a scan of the bytes at C speed); a TOML file the parser cannot
  nest that deep, an integer of more digits than Python converts, text that is not UTF-8:
  each is a :class:`~sigprop.errors.DomainError` naming the file, never a traceback.

Every error is a DomainError (the command line's exit 2) whose message names what the file
is for and its path.
"""

from __future__ import annotations

import os
import stat

from sigprop.errors import DomainError

#: the largest --config (TOML) or --hf-config (config.json) file read, in bytes (16 MiB)
MAX_CONFIG_BYTES = 16 << 20
#: the largest model file (--spec, --init-from, a trace or solution holding a model) read, in
#: bytes (2 GiB: a trace of 1,000,000 layers, sigprop's limit, is about 0.9 GB)
MAX_MODEL_BYTES = 2 << 30
#: the deepest nesting of JSON arrays and objects read (sigprop's own files nest 7 deep, a
#: Hugging Face config 4)
MAX_DEPTH = 100

_KINDS = ((stat.S_ISDIR, "Is a directory"), (stat.S_ISFIFO, "not a regular file (a FIFO)"),
          (stat.S_ISCHR, "not a regular file (a character device)"),
          (stat.S_ISBLK, "not a regular file (a block device)"), (stat.S_ISSOCK, "not a regular file (a socket)"))


def check_path(path, what: str):
    """``path`` as given, when it is a str or an os.PathLike; DomainError otherwise (the Python
    API's file arguments)."""
    if isinstance(path, (str, os.PathLike)) and not isinstance(path, bool):
        return path
    raise DomainError(f"{what} must be a file path (str or os.PathLike), got {type(path).__name__}")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def read_bytes(path, what: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (DomainError beyond,
    and for anything that is not a regular file or cannot be read)."""
    shown = repr(os.fspath(check_path(path, what)))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise DomainError(f"cannot read {what} {shown}: {e.strerror or e}") from None
    except (TypeError, ValueError) as e:             # a path with a NUL byte
        raise DomainError(f"cannot read {what} {shown}: {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            why = next((w for test, w in _KINDS if test(st.st_mode)), "not a regular file")
            raise DomainError(f"cannot read {what} {shown}: {why}")
        if st.st_size > limit:
            raise DomainError(f"{what} {shown} is {_size(st.st_size)}, more than the {_size(limit)} read for a {what}")
        chunks, total = [], 0
        want = st.st_size + 1                    # one byte more: a file that grew meanwhile
        while total <= limit:
            n = want - total if total < want else 1 << 16
            b = os.read(fd, min(n, limit + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
        if total > limit:
            raise DomainError(f"{what} {shown} is more than the {_size(limit)} read for a {what}")
        return b"".join(chunks)
    except OSError as e:
        raise DomainError(f"cannot read {what} {shown}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_text(path, what: str, limit: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (:func:`read_bytes`)."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DomainError(f"{what} {str(path)!r} is not UTF-8 text") from None


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``data`` (brackets inside
    strings not counted).  Exact for valid JSON, and for the part of invalid JSON before its
    first error (where a parser stops).  Byte operations and NumPy only: a pass or two at
    memory speed, no Python loop over the characters (UTF-8 never puts a quote, a backslash or
    a bracket inside a multibyte character)."""
    # escapes: an escaped backslash, then an escaped quote, are neither a string's end nor a
    # bracket (left to right, as a parser pairs them)
    b = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    b = b.translate(None, _NOT_STRUCTURE)        # only quotes and brackets are left
    b = b.replace(b'""', b"")                    # an adjacent pair of quotes leaves every parity as it was
    if not b:
        return 0
    import numpy as np

    a = np.frombuffer(b, np.uint8)
    deepest, level, inside = 0, 0, 0
    chunk = 1 << 24
    for i in range(0, a.size, chunk):
        c = a[i:i + chunk]
        step = ((c == ord("[")) | (c == ord("{"))).astype(np.int64) - ((c == ord("]")) | (c == ord("}")))
        q = c == ord('"')
        if q.any() or inside:
            par = (np.cumsum(q, dtype=np.int64) + inside) & 1    # odd: inside a string
            step[par == 1] = 0
            inside = int(par[-1])
        run = np.cumsum(step) + level
        deepest = max(deepest, int(run.max()))
        level = int(run[-1])
    return deepest


_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')


def read_json(path, what: str, limit: int = MAX_CONFIG_BYTES, constant_note: str = ""):
    """The parsed JSON file ``path`` (:func:`read_bytes`): text that is not UTF-8 or not JSON,
    nesting deeper than :data:`MAX_DEPTH`, an integer of more digits than Python converts and
    the non-standard constants NaN / Infinity raise DomainError naming ``what`` and the path
    (``constant_note`` is added to the last)."""
    import json

    data = read_bytes(path, what, limit)
    shown = repr(str(path))
    depth = json_depth(data)
    if depth > MAX_DEPTH:
        raise DomainError(f"{what} {shown} nests arrays/objects {depth} deep, more than the {MAX_DEPTH} read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DomainError(f"{what} {shown} is not UTF-8 text") from None
    del data

    def reject(name: str):
        raise ValueError(f"non-standard JSON constant {name}{constant_note}")

    try:
        return json.loads(text, parse_constant=reject)
    except json.JSONDecodeError as e:
        raise DomainError(f"{what} {shown} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise DomainError(f"{what} {shown} nests arrays/objects too deeply for the JSON parser") from None
    except ValueError as e:
        raise DomainError(f"{what} {shown}: {_digits(e)}") from None


def _digits(e: ValueError) -> str:
    """A ValueError's message without Python's advice to raise the integer-digits limit."""
    return str(e).split("; use sys.set_int_max_str_digits()")[0]


def read_toml(path, what: str = "config file", limit: int = MAX_CONFIG_BYTES) -> dict:
    """The parsed TOML file ``path`` (:func:`read_text`); invalid TOML, nesting deeper than the
    parser recurses, and an integer of more digits than Python converts raise DomainError."""
    import tomllib

    text = read_text(path, what, limit)
    shown = repr(str(path))
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DomainError(f"{what} {shown} is not valid TOML: {e}") from None
    except RecursionError:
        raise DomainError(f"{what} {shown} nests arrays/tables too deeply for the TOML parser") from None
    except ValueError as e:          # an integer beyond sys.get_int_max_str_digits() digits
        raise DomainError(f"{what} {shown}: {_digits(e)}") from None
