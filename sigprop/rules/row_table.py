"""The attention rule's one-row statistics as a shipped table.

The statistics of one softmax row (``sigprop.rules.attention._ROW``: A2, m1, Bz, ..., and the
fourth-cumulant responses) are functions of two dimensionless numbers only, the row's logit
variance v and its length n; every model's attention evaluates them at the (v, n) its rows
meet, each value an integral (``sigprop.rules.softmax_moments``, ~1e-9 relative).  Evaluating
them was most of a first prediction's cost (the interpolation tables of a model's chains are
built from hundreds of rule evaluations), and of every run of the chains that are never
tabled.  This module holds them once, for every model, as piecewise Chebyshev interpolants
over fixed panels, built by this module and shipped as package data (``row_stats.npz``):

* v: one panel linear in v over [0, V_LIN] (the statistics are analytic in v at 0; a
  statistic that vanishes there, m1, is stored divided by v, so its relative accuracy holds at
  any small v), then panels of width 2 in log v up to V_MAX = e^4 (~55);
* n: the lengths 1 .. 12 exactly (rows shorter than a statistic's number of distinct keys are
  the rule's truncated ones), then panels of width ~1.6 in log n from 12 to N_MAX = 2^17;
* degree 20 per panel and axis (first-kind Chebyshev nodes, barycentric evaluation).

SIGPROP_ROW_TABLE=off in the environment turns the table off.  Outside that range (v > e^4,
n > 2^17, a length below 12 that is not an integer) the caller evaluates the integral directly.  The interpolants' error against the integrals, measured at
seeded random points off the nodes (``tests/rules/test_row_table.py``; ``python -m
sigprop.rules.row_table --check`` prints it), is stated in :data:`TOLERANCE`.

    python -m sigprop.rules.row_table --write    # rebuild row_stats.npz (about 7 s)
    python -m sigprop.rules.row_table --check    # the error at random points, per statistic
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np

from sigprop import memo

#: the shipped file
PATH = Path(__file__).with_name("row_stats.npz")
#: format of the file (a file of another version is not used)
VERSION = 1
#: the panels: v linear over [0, V_LIN], then log v panels of width LOG_V_STEP up to log V_MAX
V_LIN = math.exp(-4.0)
LOG_V_MAX = 4.0
LOG_V_STEP = 2.0
#: lengths 1 .. N_EXACT exactly, then log n panels from N_EXACT to N_MAX
N_EXACT = 12
N_MAX = 2 ** 17
N_PANELS = 6
#: polynomial degree per panel and axis
DEGREE = 20
#: the bound on the relative error of an interpolated statistic against its integral at random
#: points off the nodes (the test holds the table to it): relative to max(|value|, 1e-9 of its
#: scale ~1/n, times v for m1; 0.01 of it at n = 1, where several statistics are 0 and their
#: integrals rounding).  The fourth-cumulant responses ("k4") are held relative to the statistic
#: they correct (r + kappa_4 v^2 / 24 r4 at kappa_4 = 1: their own integrals lose digits to
#: cancellation as v -> 0, where the correction vanishes).  Measured (400 points, seed 0): at
#: most 3e-8 for v < 20 (most statistics 1e-9 .. 1e-8), 1.8e-7 (Ra) and 4.3e-7 (Ra's k4
#: response) at v 20 .. 55, where the integrals themselves are rougher.
TOLERANCE = 1e-6

_TABLES = ("rows", "rows4", "rows.T2e2", "rows.T2e2.k4")
#: the fourth-cumulant tables, each with the table of the statistics it corrects
_BASE = {"rows4": "rows", "rows.T2e2.k4": "rows.T2e2"}


def _cheb(deg: int) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(deg + 1)
    th = (2 * k + 1) * np.pi / (2 * deg + 2)
    return np.cos(th), (-1.0) ** k * np.sin(th)


_X, _W = _cheb(DEGREE)


def _v_edges() -> np.ndarray:
    """Panel edges on the v axis: [0, V_LIN] in v, then in log v."""
    n = int(round((LOG_V_MAX - math.log(V_LIN)) / LOG_V_STEP))
    return np.linspace(math.log(V_LIN), LOG_V_MAX, n + 1)


def _n_edges() -> np.ndarray:
    return np.linspace(math.log(N_EXACT), math.log(N_MAX), N_PANELS + 1)


def v_nodes() -> np.ndarray:
    """Every v node, panel by panel (panel 0 linear in v)."""
    e = _v_edges()
    out = [V_LIN * (1 + _X) / 2]
    for a, b in zip(e[:-1], e[1:]):
        out.append(np.exp((a + b) / 2 + (b - a) / 2 * _X))
    return np.concatenate(out)


def n_nodes() -> np.ndarray:
    """The exact lengths 1 .. N_EXACT, then the log-n panels' nodes."""
    e = _n_edges()
    out = [np.arange(1, N_EXACT + 1, dtype=float)]
    for a, b in zip(e[:-1], e[1:]):
        out.append(np.exp((a + b) / 2 + (b - a) / 2 * _X))
    return np.concatenate(out)


def _weights(t: np.ndarray) -> np.ndarray:
    """Barycentric weights (P, DEGREE + 1), summing to 1, of the points t in [-1, 1]."""
    d = t[:, None] - _X[None, :]
    hit = d == 0
    c = _W / np.where(hit, 1.0, d)
    c = np.where(hit.any(axis=1, keepdims=True), hit.astype(float), c)
    return c / c.sum(axis=1, keepdims=True)


def _v_locate(v: np.ndarray):
    """Panel index and local coordinate in [-1, 1] of each v (0 <= v <= V_MAX)."""
    e = _v_edges()
    lin = v <= V_LIN
    lv = np.log(np.maximum(v, V_LIN))
    p = np.clip(np.searchsorted(e, lv, side="right") - 1, 0, len(e) - 2)
    t = np.where(lin, 2 * v / V_LIN - 1, (2 * lv - e[p] - e[p + 1]) / (e[p + 1] - e[p]))
    return np.where(lin, 0, p + 1), np.clip(t, -1.0, 1.0)


def _n_locate(n: np.ndarray):
    e = _n_edges()
    ln = np.log(n)
    p = np.clip(np.searchsorted(e, ln, side="right") - 1, 0, len(e) - 2)
    return p, np.clip((2 * ln - e[p] - e[p + 1]) / (e[p + 1] - e[p]), -1.0, 1.0)


class RowTable:
    """One table: the statistics ``names`` on the (v, n) nodes, each stored as f(v) v^-power."""

    def __init__(self, names, values, power):
        self.names = tuple(names)
        self.values = np.asarray(values, dtype=float)            # (names, NV, NN)
        self.power = np.asarray(power, dtype=int)

    @staticmethod
    def covers(v: np.ndarray, n: np.ndarray) -> np.ndarray:
        exact = (n >= 1) & (n <= N_EXACT) & (n == np.round(n))
        return (v >= 0) & (v <= math.exp(LOG_V_MAX)) & (exact | ((n >= N_EXACT) & (n <= N_MAX)))

    def lookup(self, v: np.ndarray, n: np.ndarray) -> np.ndarray:
        """The statistics (names, P) at covered points v, n (1-d arrays of length P)."""
        D1 = DEGREE + 1
        pv, tv = _v_locate(v)
        cv = _weights(tv)
        out = np.empty((len(self.names), v.size))
        exact = n <= N_EXACT
        if np.any(exact):
            idx = np.nonzero(exact)[0]
            for p in np.unique(pv[idx]):
                s = idx[pv[idx] == p]
                blk = self.values[:, p * D1:(p + 1) * D1, :][:, :, np.round(n[s]).astype(int) - 1]  # (k, D1, |s|)
                out[:, s] = np.einsum("pi,kip->kp", cv[s], blk)
        idx = np.nonzero(~exact)[0]
        if idx.size:
            pn, tn = _n_locate(n[idx])
            cn = _weights(tn)
            key = pv[idx] * N_PANELS + pn
            for kk in np.unique(key):
                sel = key == kk
                p, q = divmod(int(kk), N_PANELS)
                blk = self.values[:, p * D1:(p + 1) * D1, N_EXACT + q * D1:N_EXACT + (q + 1) * D1]
                out[:, idx[sel]] = np.einsum("pi,kij,pj->kp", cv[idx[sel]], blk, cn[sel])
        for p in np.unique(self.power):
            if p:
                out[self.power == p] *= v ** float(p)
        return out


_FILE = memo.Kind("row_table.file", 8, "the shipped row tables, as read from row_stats.npz, per tag")


def table(tag: str) -> RowTable | None:
    """The shipped table ``tag`` (``rows``, ``rows4``, ``rows.T2e2``, ``rows.T2e2.k4``: the
    attention rule's memo tags), or None where the file is absent or of another version, or
    where the environment sets SIGPROP_ROW_TABLE=off (every statistic then by its integral: for
    benchmarks, and to rule the table out)."""
    if os.environ.get("SIGPROP_ROW_TABLE", "").strip().lower() == "off":
        return None
    return _FILE.get((tag, str(PATH)), lambda: _load(tag))


def _load(tag: str) -> RowTable | None:
    try:
        with np.load(PATH, allow_pickle=False) as f:
            if int(f["version"]) != VERSION or tuple(f["v_nodes"].shape) != v_nodes().shape:
                return None
            if tuple(f["n_nodes"].shape) != n_nodes().shape:
                return None
            return RowTable(str(f[f"{tag}.names"]).split(","), f[f"{tag}.values"], f[f"{tag}.power"])
    except (OSError, KeyError, ValueError):
        return None


def _spec(tag: str):
    from sigprop.rules import attention as A

    names = ("T2e2",) if "T2e2" in tag else A._ROW_SHARED
    return names, tag in _BASE


def names_of(tag: str) -> tuple[str, ...]:
    return _spec(tag)[0]


def direct(tag: str, v, n) -> np.ndarray:
    """The integrals themselves (names, P) at v, n (1-d arrays)."""
    from sigprop.backend import numeric
    from sigprop.rules import attention as A

    names, k4 = _spec(tag)
    d = A._row_stats(numeric, np.asarray(v, dtype=float), np.asarray(n, dtype=float), names, k4)
    return np.stack([np.broadcast_to(np.asarray(d[k], dtype=float), np.shape(v)) for k in names])


def build(tag: str) -> dict:
    """The table ``tag`` evaluated at its nodes (the file's entries for it)."""
    names, k4 = _spec(tag)
    vn, nn = v_nodes(), n_nodes()
    V, N = np.meshgrid(vn, nn, indexing="ij")
    vals = direct(tag, V.ravel(), N.ravel()).reshape(len(names), *V.shape)
    # each statistic is stored as f(v) v^-a, a its power at v -> 0 (m1 ~ v; the fourth-cumulant
    # responses of the statistics divided by v ~ 1/v), an analytic function with a finite
    # non-zero limit, so that the interpolant keeps its relative accuracy at small v
    small = direct(tag, np.array([1e-4, 1e-3]), np.array([64.0, 64.0]))
    power = np.round(np.log10(np.abs(small[:, 1] / small[:, 0]))).astype(int)
    vals *= V[None] ** -power[:, None, None]
    return {f"{tag}.names": np.array(",".join(names)), f"{tag}.values": vals, f"{tag}.power": power}


def write(path: Path = PATH) -> None:
    data = {"version": np.array(VERSION), "v_nodes": v_nodes(), "n_nodes": n_nodes()}
    for tag in _TABLES:
        data.update(build(tag))
    np.savez(path, **data)
    _FILE.map().clear()


def errors(tag: str, points: int = 400, seed: int = 0) -> tuple[tuple[str, ...], np.ndarray]:
    """Relative errors (names, points) of the shipped table against the integrals at seeded
    random points: log v uniform over [-35, LOG_V_MAX] (a quarter of them linear over
    [0, V_LIN]), n log-uniform over [1, N_MAX] (a quarter exact lengths 1 .. N_EXACT)."""
    rng = np.random.default_rng(seed)
    lv = rng.uniform(-35.0, LOG_V_MAX, points)
    v = np.where(rng.random(points) < 0.25, rng.uniform(0, V_LIN, points), np.exp(lv))
    n = np.exp(rng.uniform(math.log(N_EXACT), math.log(N_MAX), points))
    n = np.where(rng.random(points) < 0.25, rng.integers(1, N_EXACT + 1, points).astype(float), n)
    t = table(tag)
    if t is None:
        raise RuntimeError(f"{PATH} is missing or of another version: python -m sigprop.rules.row_table --write")
    got, want = t.lookup(v, n), direct(tag, v, n)
    err, ref = np.abs(got - want), want
    if tag in _BASE:                           # relative to the statistic the response corrects
        err, ref, t = err * v**2 / 24, direct(_BASE[tag], v, n), table(_BASE[tag])
    # the floor: ~1e-9 of a statistic's scale (~1/n, times v for m1); at n = 1, where several
    # statistics are 0 and their integrals rounding (~2e-10), 0.01 of it
    floor = np.where(n == 1, 1e-2, 1e-9 / n) * v ** t.power[:, None].astype(float)
    return names_of(tag), err / np.maximum(np.abs(ref), floor)


def main(argv: list[str]) -> int:
    if "--write" in argv:
        write()
        print(f"wrote {PATH} ({PATH.stat().st_size / 1e6:.2f} MB)")
    if "--check" in argv or "--write" in argv:
        for tag in _TABLES:
            names, err = errors(tag)
            print(tag + ": " + ", ".join(f"{nm} {e.max():.1e}" for nm, e in zip(names, err)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
