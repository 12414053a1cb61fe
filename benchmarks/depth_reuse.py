"""What reusing a branch's evaluation across layers would buy a deep causal model, measured:
a prototype, not part of sigprop (it patches ``Predictor`` in this process only).

A deep stack of identical layers feeds each branch a stream that changes slowly with depth.
The prototype reuses a branch's whole forward evaluation (its output, covariance over
positions and record) at the next layers with the same parameters while the branch input has
moved by at most ``tol_f`` since the evaluation (the input's mean, correlation, relative
variance and, entry by entry, its position deviation), and the branch's backward evaluation
(gradient state, covariance over positions and factors at the branch input) while the
gradient's covariance over positions at the branch output, its variance (relative) and its
correlation have moved by at most ``tol_b``.  The sampled logit law's layers are never reused.

For each pair of tolerances it prints the in-process time of one warm prediction (median of
``--repeats``, after an untimed run that fills the table cache), how many branch evaluations
were made and reused, and the largest deviation of the trace from the exact prediction
(tolerances 0) over every point: log variance, correlation, log gradient variance, gradient
correlation (absolute) and logit variance (relative).

    python benchmarks/depth_reuse.py [--seq-len 256] [--layers 768] [--repeats 3]
                                     [--pairs 1e-4,0 1e-3,0 1e-3,1e-2 ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sigprop.model import predict as P  # noqa: E402
from sigprop.model import presets  # noqa: E402

_BRANCH, _BRANCH_BACKWARD = P.Predictor._branch, P.Predictor._branch_backward
TOL = {"f": 0.0, "b": 0.0}
COUNT = {"forward evaluated": 0, "forward reused": 0, "backward evaluated": 0, "backward reused": 0}


def _near(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    return a.shape == b.shape and float(np.max(np.abs(a - b))) <= tol


def _branch(self, br, unit, h, dev_in, tok, prof_in=None):
    tol = TOL["f"]
    if tol <= 0 or dev_in is None or prof_in is not None or unit.post_norm:
        return _BRANCH(self, br, unit, h, dev_in, tok, prof_in)
    key = (id(self._chain(br.slot, br.layer, unit.in_norm, br.norm_scale)), br.kind, br.out_norm, unit.in_norm, tok)
    cache = self.__dict__.setdefault("_reuse_f", {})
    hit = cache.get(key)
    if hit is not None:
        h0, d0, got = hit
        if (abs(h.mean - h0.mean) <= tol and abs(h.var / h0.var - 1.0) <= tol and abs(h.corr - h0.corr) <= tol
                and _near(dev_in, d0, tol)):
            COUNT["forward reused"] += 1
            return got
    got = _BRANCH(self, br, unit, h, dev_in, tok, prof_in)
    COUNT["forward evaluated"] += 1
    kw = None if got is None else got[0][-1]
    if got is not None and (kw is None or kw.query is None):
        cache[key] = (h, dev_in.copy(), got)
    return got


def _branch_backward(self, rec, g, w):
    tol = TOL["b"]
    if tol <= 0 or w is None:
        return _BRANCH_BACKWARD(self, rec, g, w)
    cache = self.__dict__.setdefault("_reuse_b", {})
    hit = cache.get(id(rec.branch_ops))
    if hit is not None:
        g0, w0, got, ops = hit
        if (ops is rec.branch_ops and abs(g.var - g0.var) <= tol * abs(g0.var) and abs(g.corr - g0.corr) <= tol
                and _near(w, w0, tol)):
            COUNT["backward reused"] += 1
            return got
    got = _BRANCH_BACKWARD(self, rec, g, w)
    COUNT["backward evaluated"] += 1
    cache[id(rec.branch_ops)] = (g, w.copy(), got, rec.branch_ops)
    return got


def trace(model) -> np.ndarray:
    pts = P.predict(model)
    return np.array([[p.log_var, p.corr, p.log_gvar, p.gcorr, np.nan if p.logit_var is None else p.logit_var]
                     for p in pts])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--layers", type=int, default=768)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pairs", nargs="*", default=["1e-4,0", "1e-3,0", "3e-3,0", "1e-3,1e-2", "1e-3,3e-2"],
                    help="tol_f,tol_b pairs")
    a = ap.parse_args()
    P.Predictor._branch, P.Predictor._branch_backward = _branch, _branch_backward
    m = presets.resolve("preln", n_layers=a.layers, causal=True, seq_len=a.seq_len)
    print(f"preln causal, {a.layers} layers, seq {a.seq_len}; medians of {a.repeats} warm predictions")
    ref = None
    for pair in ["0,0"] + list(a.pairs):
        TOL["f"], TOL["b"] = (float(t) for t in pair.split(","))
        trace(m)                                   # fills the table cache
        ts = []
        for _ in range(a.repeats):
            for k in COUNT:
                COUNT[k] = 0
            t0 = time.perf_counter()
            tr = trace(m)
            ts.append(time.perf_counter() - t0)
        if ref is None:
            ref = tr
            base = statistics.median(ts)
        d = np.abs(tr - ref)
        d[:, 4] /= np.abs(ref[:, 4])
        dev = "  ".join(f"{n} {np.nanmax(d[:, i]):.1e}" for i, n in
                        enumerate(("log var", "corr", "log grad var", "grad corr", "logit var (rel)")))
        counts = ", ".join(f"{k} {v}" for k, v in COUNT.items()) if TOL["f"] or TOL["b"] else "exact"
        print(f"tol_f {TOL['f']:g}, tol_b {TOL['b']:g}: {statistics.median(ts):.3f} s "
              f"({statistics.median(ts) / base:.2f} x exact); {counts}\n    largest deviation: {dev}")


if __name__ == "__main__":
    main()
