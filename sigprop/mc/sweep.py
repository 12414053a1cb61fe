"""Grid sweeps in the published error metric.

Each Monte Carlo component module declares a :class:`SweepSpec`: the published grid, how a
grid point becomes a :class:`Case` (rule parameters, component parameters, input and
gradient states, sample sizes), and the published percentile figures.  :func:`run_sweep`
evaluates the rule and measures the component at every chosen point and returns the
50/90/99th-percentile errors in percent.

Error metric (the published one): ``|measured - predicted| / |measured|`` for variances;
for covariances the smaller of that and ``|measured - predicted| / predicted variance``.
The "x_corr"/"g_corr" moments are scored on the covariance (corr x var), exactly like the
published "x cov"/"g cov" columns.  For means the published text divides by the predicted
*variance*, which is not scale-invariant (a mean error of 1e-3 scores 100% at variance 1e-3
and 0.01% at variance 10); sigprop divides the mean error by the predicted *standard
deviation* instead (the smaller of that and the relative error), and says so in the docs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from sigprop.mc.component import Component, Measurement, measure, moments_of
from sigprop.state import Backward, Forward

MOMENTS = ("x_mean", "x_var", "x_corr", "g_var", "g_corr")


@dataclass(frozen=True)
class Case:
    rule_params: dict
    sim_params: dict
    x: Forward
    g: Backward
    runs: int
    batch: int


@dataclass(frozen=True)
class SweepSpec:
    component: Component
    grid: dict[str, tuple]
    make_case: Callable[[dict], Case]
    #: published p50/p90/p99 per moment, percent (None where not published)
    published: dict[str, tuple[float, float, float] | None]
    moments: tuple[str, ...] = MOMENTS
    note: str = ""
    #: named alternative grids (e.g. softmax's extended logit range)
    variants: dict[str, dict] = field(default_factory=dict)

    def points(self, grid: dict | None = None) -> list[dict]:
        grid = grid or self.grid
        keys = list(grid)
        return [dict(zip(keys, vals)) for vals in itertools.product(*(grid[k] for k in keys))]


def errors(pred_x: Forward, pred_g: Backward, meas: Measurement) -> dict[str, float]:
    """Published error metric per moment, as fractions."""

    def rel(m, p):
        return abs(m - p) / abs(m) if m != 0 else (0.0 if p == 0 else np.inf)

    def rel_or_var(m, p, v):
        return min(rel(m, p), abs(m - p) / abs(v))

    def rel_or_std(m, p, v):
        return min(rel(m, p), abs(m - p) / np.sqrt(abs(v)))

    mx, mg = meas.x, meas.g
    px_var, pg_var = float(pred_x.var), float(pred_g.var)
    return {
        "x_mean": rel_or_std(mx.mean, float(pred_x.mean), px_var),
        "x_var": rel(mx.var, px_var),
        "x_corr": rel_or_var(mx.cov, float(pred_x.corr) * px_var, px_var),
        "g_var": rel(mg.var, pg_var),
        "g_corr": rel_or_var(mg.cov, float(pred_g.corr) * pg_var, pg_var),
    }


@dataclass
class SweepResult:
    component: str
    n_configs: int
    seed: int
    percentiles: dict[str, dict[str, float]]
    published: dict
    seconds: float
    rows: list[dict]
    #: percentiles of alternative rules scored on the same measurements
    also: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)


def choose_points(spec: SweepSpec, n: int | None, seed: int, grid: dict | None = None) -> list[dict]:
    pts = spec.points(grid)
    if n is None or n >= len(pts):
        return pts
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(len(pts), size=n, replace=False))
    return [pts[i] for i in idx]


def _percentiles(rows, moments, key="errors"):
    pct = {}
    for mom in moments:
        e = np.array([r[key][mom] for r in rows]) * 100
        pct[mom] = {f"p{q}": float(np.percentile(e, q)) for q in (50, 90, 99)}
    return pct


def _measure_task(component, sim_params, x, g, runs, batch, seed, dtype, backend, device, stream):
    """One grid point's measurement on a named backend (what a Dask worker runs)."""
    from sigprop.mc.backend import get_backend

    return measure(component, sim_params, x, g, runs=runs, batch=batch, seed=seed, dtype=dtype,
                   backend=get_backend(backend, device), stream=stream)


def run_sweep(spec: SweepSpec, rule, *, n: int | None = 500, seed: int = 0, dtype=np.float32,
              grid: dict | None = None, progress: Callable[[int, int], None] | None = None,
              also: tuple = (), backend=None, stream: str = "host", distributor=None) -> SweepResult:
    """Measure every chosen grid point once; score ``rule`` (and the rules in ``also``, e.g.
    the published forms) against the same measurements.  Point i draws from seed
    ``seed * 1_000_003 + i`` alone, so ``distributor`` (a Dask
    :class:`sigprop.mc.distributed.Distributor`) gives the serial run's numbers."""
    from sigprop.mc.backend import numpy_backend

    bk = backend or numpy_backend()
    pts = choose_points(spec, n, seed, grid)
    cases = [spec.make_case(pt) for pt in pts]
    tasks = [(spec.component, c.sim_params, c.x, c.g, c.runs, c.batch, seed * 1_000_003 + i, dtype, bk.name,
              bk.device_name, stream) for i, c in enumerate(cases)]
    if distributor is not None:
        measured = distributor.map(_measure_task, tasks, progress=progress, what="points")
    else:
        measured = []
        for i, t in enumerate(tasks):
            measured.append(measure(*t[:4], runs=t[4], batch=t[5], seed=t[6], dtype=dtype, backend=bk,
                                    stream=stream))
            if progress:
                progress(i + 1, len(pts))
    rows, total_s = [], 0.0
    for pt, case, meas in zip(pts, cases, measured):
        px, pg = rule.evaluate(case.x, case.g, **case.rule_params)
        total_s += meas.seconds
        err = errors(px, pg, meas)
        alt = {}
        for other in also:
            ox, og = other.evaluate(case.x, case.g, **case.rule_params)
            alt[other.name] = errors(ox, og, meas)
        rows.append({"point": pt, "errors": err, "also": alt,
                     "predicted": moments_of(px, pg),
                     "measured": {"x_mean": meas.x.mean, "x_var": meas.x.var, "x_corr": meas.x.corr,
                                  "g_var": meas.g.var, "g_corr": meas.g.corr},
                     "se": moments_of(meas.x, meas.g, se=True)})
    pct = _percentiles(rows, spec.moments)
    alt_pct = {o.name: _percentiles([{"e": r["also"][o.name]} for r in rows], spec.moments, "e") for o in also}
    pub = {k: (dict(zip(("p50", "p90", "p99"), v)) if v else None) for k, v in spec.published.items()}
    return SweepResult(spec.component.name, len(pts), seed, pct, pub, total_s, rows, alt_pct)
