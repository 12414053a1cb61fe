"""Discretisation error of the position grids (sigprop.model.positions) against the exact
position model, at sequence lengths where both are affordable.

Usage: python benchmarks/positions_error.py [L ...] [--layers N ...] [--arch A ...]
       [--init I] [--d-model D] [--grids SPEC ...]

For each (arch, layers, L): the relative error, worst over the trace points, of the forward
variance, |error| of the forward correlation, the relative error of the gradient variance and
|error| of the gradient correlation, and the relative error of the input gradient's position
profile at positions 0, 1, 2, 10, 100, L-1 (on the node grid interpolated to that position
where it is not a node; on a block grid the block holding it).  ``--grids``: grids other than
the default one (positions.NodeGrid(L)), each against the same exact run: ``nodes:HEAD,H,ORDER``
(a NodeGrid) or ``blocks:P0,Q`` (the block grid positions.Grid)."""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from sigprop.model import positions
from sigprop.model.predict import Predictor, _points
from sigprop.model.presets import resolve

POS = (0, 1, 2, 10, 100)


def run(model, exact_max, grid=None):
    old, old_for = positions.EXACT_MAX, positions.grid_for
    positions.EXACT_MAX = exact_max
    if grid is not None:
        positions.grid_for = lambda L, exact_max=None: grid
    try:
        t = time.perf_counter()
        pr = Predictor(model)
        recs = pr.forward()
        grads = pr.backward(recs)[0]
        pts = _points(model, recs, grads)
        dt = time.perf_counter() - t
    finally:
        positions.EXACT_MAX, positions.grid_for = old, old_for
    prof = recs[0].g_prof
    L = model.seq_len
    idx = list(POS) + [L - 1]
    if pr.grid is not None and hasattr(pr.grid, "at"):
        vals = [float(v) for v in pr.grid.at(prof, idx)]
    elif pr.grid is not None:
        blk = [int(np.searchsorted(pr.grid.end, i, side="right")) for i in idx]
        vals = [float(prof[b]) for b in blk]
    else:
        vals = [float(prof[i]) for i in idx]
    return pts, vals, dt, (pr.grid.size if pr.grid is not None else L)


def _grid(spec: str, L: int):
    kind, _, args = spec.partition(":")
    a = args.split(",")
    if kind == "blocks":
        return positions.Grid(L, int(a[0]), float(a[1]))
    if kind == "nodes":
        return positions.NodeGrid(L, int(a[0]), float(a[1]), int(a[2]) if len(a) > 2 else positions.ORDER)
    raise SystemExit(f"unknown grid {spec!r} (nodes:HEAD,H,ORDER or blocks:P0,Q)")


def compare(arch, layers, L, d=64, init=None, grids=(None,)):
    m = resolve(arch, init, n_layers=layers, causal=True, seq_len=L, d_model=d, n_heads=2, d_ff=4 * d)
    ex, pex, tex, _ = run(m, 10 ** 9)
    for spec in grids:
        grid = None if spec is None else _grid(spec, L)
        yield _errors(m, arch, init, layers, L, ex, pex, tex, grid)


def _errors(m, arch, init, layers, L, ex, pex, tex, grid):
    gr, pgr, tgr, nb = run(m, 0, grid)
    fv = max(abs(math.exp(a.log_var - b.log_var) - 1) for a, b in zip(gr, ex))
    fc = max(abs(a.corr - b.corr) for a, b in zip(gr, ex))
    gv = max(abs(math.exp(a.log_gvar - b.log_gvar) - 1) for a, b in zip(gr, ex))
    gc = max(abs(a.gcorr - b.gcorr) for a, b in zip(gr, ex))
    pe = [abs(a / b - 1) for a, b in zip(pgr, pex)]
    sig = list((grid if grid is not None else positions.NodeGrid(L)).signature())
    return dict(arch=arch, init=m.init if hasattr(m, "init") else init, layers=layers, L=L, grid=sig,
                nodes=nb, fwd_var=fv, fwd_corr=fc, grad_var=gv, grad_corr=gc,
                profile_exact=pex, profile_err=pe, t_exact=tex, t_graded=tgr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("L", nargs="*", type=int, default=[512, 1024])
    ap.add_argument("--layers", nargs="*", type=int, default=[4, 12])
    ap.add_argument("--arch", nargs="*", default=["preln", "postln", "dslm", "lns"])
    ap.add_argument("--init", default=None)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--grids", nargs="*", default=None,
                    help="nodes:HEAD,H,ORDER or blocks:P0,Q (default: the default node grid)")
    a = ap.parse_args()
    grids = [None] if not a.grids else a.grids
    for arch in a.arch:
        for layers in a.layers:
            for L in a.L:
                for res in compare(arch, layers, L, a.d_model, a.init, grids):
                    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
