"""Memoised values of pure functions: one bounded map type, one policy, owned by an object.

Three pieces:

* :class:`Bounded`, the one bounded map: at most ``limit`` entries, the oldest (insertion
  order) dropped first when a new one would exceed it, half of them at a time.  Keys are
  values (hashable), or the identity of an object (:meth:`Bounded.for_object`, for read-only
  arrays and parameter dicts that are the same object at every layer: the object is kept
  with its value, so its ``id`` cannot be reused while the entry lives).
* :class:`Kind`, a declared memo: a name, a size limit and a sentence of what it holds.  A
  module declares its kinds at import (they hold no values); every lookup goes through
  :func:`current`, the :class:`Memos` in effect.
* :class:`Memos`, the owner: one :class:`Bounded` per kind.  :func:`current` returns the one
  in effect (a context variable; by default the process's, :func:`process`), :func:`using`
  puts another in effect for a block.  The predictor runs under the ``memos`` of its
  :class:`sigprop.model.tables.TableCache`, so a caller that wants a prediction isolated from
  everything computed before passes ``TableCache(memos=Memos())``.

What may be memoised here: values that are a function of their key alone (the rules'
statistics keyed by their exact inputs, the position model's constants per sequence length,
tables read from the on-disk store under a key that covers their sources).  A lookup never
changes a value, only whether it is computed again, so a prediction gives the same numbers,
bit for bit, whatever was memoised before it (``tests/test_memo.py`` checks this on whole
predictions).  Per-prediction state (which tables a prediction built, how many layers share
a chain) is not a memo: it lives in the prediction's ``TableCache``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
from typing import Any, Callable

_MISSING = object()


class Bounded:
    """A map of at most ``limit`` entries, the oldest dropped first.  ``data`` is the dict
    itself, for a caller on a hot path that reads a hit inline (and stores through
    :meth:`put` or :meth:`for_object`)."""

    __slots__ = ("limit", "data")

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("a memo's limit is at least 1")
        self.limit = int(limit)
        self.data: dict = {}

    def get(self, key, compute: Callable[[], Any]):
        """The value under ``key``, ``compute()`` stored there on a miss."""
        hit = self.data.get(key, _MISSING)
        if hit is _MISSING:
            hit = self.put(key, compute())
        return hit

    def peek(self, key, default=None):
        """The value under ``key``, ``default`` on a miss (nothing computed)."""
        return self.data.get(key, default)

    def put(self, key, value):
        """Store ``value`` under ``key``; returns it.  At the limit the oldest half of the
        entries (at least one) is dropped first, the map rebuilt without them (dropping one
        entry at a time leaves the dict's freed slots at its front, which every later
        ``next(iter(...))`` scans: ~3 us a store at 4,096 entries; an eighth at a time made
        a LayerNorm Scaling prediction, ~7,000 parameter dicts, 4% slower than half)."""
        d = self.data
        if key not in d and len(d) >= self.limit:
            d = self.data = dict(itertools.islice(d.items(), max(1, self.limit // 2), None))
        d[key] = value
        return value

    def for_object(self, obj, compute: Callable[[], Any], extra=None):
        """The value for the object ``obj`` itself (its identity, with a hashable qualifier
        ``extra``), ``compute()`` on a miss.  The entry keeps ``obj``, so its ``id`` is not
        reused while the entry lives."""
        key = id(obj) if extra is None else (id(obj), extra)
        hit = self.data.get(key)
        if hit is None or hit[0] is not obj:
            hit = self.put(key, (obj, compute()))
        return hit[1]

    def clear(self) -> None:
        self.data.clear()

    def __len__(self) -> int:
        return len(self.data)


#: every declared kind, by name
KINDS: dict[str, "Kind"] = {}


class Kind:
    """A declared memo: ``name`` (unique), ``limit`` entries, ``doc`` (what it holds).  Its
    values live in the :class:`Memos` in effect (:func:`current`)."""

    __slots__ = ("name", "limit", "doc")

    def __init__(self, name: str, limit: int, doc: str = ""):
        if name in KINDS:
            raise ValueError(f"memo kind {name!r} is declared twice")
        self.name, self.limit, self.doc = name, int(limit), doc
        KINDS[name] = self

    def map(self) -> Bounded:
        """This kind's map in the memos in effect."""
        return _CURRENT.get().map(self)

    # (the two lookups below are on the predictor's per-layer paths: the hit is inlined)
    def get(self, key, compute: Callable[[], Any]):
        memos = _CURRENT.get()
        m = memos._maps.get(self)
        if m is None:
            m = memos.map(self)
        hit = m.data.get(key, _MISSING)
        return m.put(key, compute()) if hit is _MISSING else hit

    def for_object(self, obj, compute: Callable[[], Any], extra=None):
        memos = _CURRENT.get()
        m = memos._maps.get(self)
        if m is None:
            m = memos.map(self)
        hit = m.data.get(id(obj) if extra is None else (id(obj), extra))
        if hit is not None and hit[0] is obj:
            return hit[1]
        return m.for_object(obj, compute, extra)

    def __repr__(self) -> str:
        return f"Kind({self.name!r}, {self.limit})"


class Memos:
    """The memoised values of every kind: one :class:`Bounded` per :class:`Kind`."""

    def __init__(self):
        self._maps: dict[Kind, Bounded] = {}

    def map(self, kind: Kind) -> Bounded:
        m = self._maps.get(kind)
        if m is None:
            m = self._maps[kind] = Bounded(kind.limit)
        return m

    def clear(self) -> None:
        """Forget every value."""
        for m in self._maps.values():
            m.clear()

    def sizes(self) -> dict[str, int]:
        """Entries held per kind name (kinds never used are left out)."""
        return {k.name: len(m) for k, m in self._maps.items() if len(m)}


_PROCESS = Memos()
_CURRENT: contextvars.ContextVar[Memos] = contextvars.ContextVar("sigprop_memos", default=_PROCESS)


def process() -> Memos:
    """The process's memos (in effect unless :func:`using` put others in effect)."""
    return _PROCESS


def current() -> Memos:
    """The memos in effect."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(memos: Memos):
    """Put ``memos`` in effect for the block."""
    token = _CURRENT.set(memos)
    try:
        yield memos
    finally:
        _CURRENT.reset(token)


def frozen(values):
    """``values`` (an array, or a tuple of arrays and numbers) with every array made read-only
    in place: what a memo shares between its callers must not be changed by one of them."""
    import numpy as np

    for v in (values if isinstance(values, tuple) else (values,)):
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return values


def memoised(kind: Kind):
    """Decorator: the function's value memoised in ``kind`` under its positional arguments
    (hashable; the function must be pure in them)."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args):
            memos = _CURRENT.get()
            m = memos._maps.get(kind)
            if m is None:
                m = memos.map(kind)
            hit = m.data.get(args, _MISSING)
            return m.put(args, fn(*args)) if hit is _MISSING else hit

        inner.kind = kind
        return inner

    return wrap
