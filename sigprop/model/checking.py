"""Compare a prediction with a whole-model Monte Carlo measurement (`sigprop check`).

A point passes when, for every moment, |predicted - measured| <= max(tol x |measured|,
z x SE) (variances: relative tolerance; correlations: absolute tolerance).  At finite width
the weight draws really differ (a Post-LN model's input gradient varies by a factor of several
between draws), so the standard error term matters as much as the percentage.

Also reported: the R^2 of log predicted vs log measured variance over all points (the
DeepScaleLM paper's headline figure), forward and backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sigprop.errors import DomainError
from sigprop.model.growth import sci_exp
from sigprop.model.trace import num, point_json

DEFAULT_TOL = {"forward_var": 0.05, "grad_var": 0.05, "corr": 0.03, "logit_var": 0.05, "z": 4.0}


@dataclass
class CheckResult:
    predicted: list[dict]
    measured: list[dict]
    errors: dict
    r2: dict
    tolerance: dict
    passed: bool
    failures: list[str]
    failed_points: list[bool] = None   # per point: is any of its moments outside tolerance
    #: the prediction's approximation notes (sigprop.model.predict.approximation_notes)
    approximation_notes: tuple = ()


def within(pred, meas, se, tol, z, absolute=False):
    """|pred - meas| <= max(tolerance, z x se): ``tol`` absolute, or relative to ``meas``;
    ``se`` counts only where finite."""
    allowed = tol if absolute else tol * abs(meas)
    if se is not None and math.isfinite(se):
        allowed = max(allowed, z * se)
    return abs(pred - meas) <= allowed


def _stats(a: list[float]) -> dict:
    a = np.asarray(a, dtype=float)
    if a.size == 0:
        return {"median": None, "p90": None, "max": None}
    with np.errstate(invalid="ignore"):
        return {"median": _or_higher(np.median(a), a, 50), "p90": _or_higher(np.percentile(a, 90), a, 90),
                "max": float(a.max())}


def _or_higher(v, a: np.ndarray, q: float) -> float:
    """``v``, a median or percentile interpolated between two values; where the interpolation
    met two infinite errors (inf - inf: NaN), the q-th percentile's next value up, inf."""
    v = float(v)
    return float(np.percentile(a, q, method="higher")) if math.isnan(v) else v


def r2_log(pred: list[float], meas: list[float]) -> float | None:
    """R^2 of log(measured) explained by log(predicted) (identity line, not a fitted one)."""
    p, m = np.log(np.asarray(pred, float)), np.log(np.asarray(meas, float))
    ok = np.isfinite(p) & np.isfinite(m)
    p, m = p[ok], m[ok]
    if p.size < 2:
        return None
    ss = np.sum((m - m.mean()) ** 2)
    return float(1 - np.sum((m - p) ** 2) / ss) if ss > 0 else None


def tolerances(tol: dict | None = None, defaults: dict = DEFAULT_TOL) -> dict:
    """``defaults`` (the whole-model ones unless given) updated with ``tol``, each checked to
    be a finite number >= 0."""
    tol = {**defaults, **(tol or {})}
    for k, v in tol.items():
        if k not in defaults:
            raise DomainError(f"unknown tolerance {k!r}; known: {', '.join(defaults)}")
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise DomainError(f"tolerance {k} must be a finite number >= 0, got {v!r}")
    return tol


def compare(points, meas, tol: dict | None = None) -> CheckResult:
    tol = tolerances(tol)
    # points pair by position: the same (layer, sublayer) sequence (a parallel model has one
    # "block" point per layer); measurements stored without their labels are paired by count
    pairs = [(p.layer, p.sublayer) for p in points]
    labels = getattr(meas, "points", None)
    if len(pairs) != len(meas.forward) or (labels is not None and pairs != [tuple(t) for t in labels]):
        raise DomainError(f"the prediction's {len(pairs)} points do not pair with the measurement's "
                          f"{len(meas.forward)} (layer, sublayer) points")
    pred_json, meas_json, fails, failed = [], [], [], []
    e = {"forward_var_relerr": [], "grad_var_relerr": [], "forward_corr_abserr": [], "grad_corr_abserr": [],
         "logit_var_relerr": []}
    pv, mv, pg, mg = [], [], [], []
    for k, p in enumerate(points):
        f, b = meas.forward[k], meas.backward[k]
        lv = meas.logit_var[k]
        pred_json.append(point_json(p, with_log=False))
        meas_json.append({
            "layer": p.layer, "sublayer": p.sublayer,
            "forward": {"mean": num(f.mean), "var": num(f.var), "corr": num(f.corr)},
            "backward": {"var": num(b.var), "corr": num(b.corr)},
            "logit_var": None if lv is None else num(lv[0]),
            "se": {"forward": {"mean": num(f.mean_se), "var": num(f.var_se), "corr": num(f.corr_se)},
                   "backward": {"var": num(b.var_se), "corr": num(b.corr_se)},
                   "logit_var": None if lv is None else num(lv[1])},
        })
        checks = [
            ("forward var", p.var, f.var, f.var_se, tol["forward_var"], False, "forward_var_relerr"),
            ("forward corr", p.corr, f.corr, f.corr_se, tol["corr"], True, "forward_corr_abserr"),
            ("grad var", p.gvar, b.var, b.var_se, tol["grad_var"], False, "grad_var_relerr"),
            ("grad corr", p.gcorr, b.corr, b.corr_se, tol["corr"], True, "grad_corr_abserr"),
        ]
        if lv is not None and p.logit_var is not None:
            checks.append(("logit var", p.logit_var, lv[0], lv[1], tol["logit_var"], False, "logit_var_relerr"))
        n_fails = len(fails)
        for name, pr, me, se, t, absolute, key in checks:
            err = abs(pr - me) if absolute else abs(pr - me) / abs(me) if me else (0.0 if pr == me else math.inf)
            e[key].append(err)
            if not within(pr, me, se, t, tol["z"], absolute):
                fails.append(f"layer {p.layer} {p.sublayer}: {name} predicted {pr:.5g}, measured {me:.5g} ± {se:.2g}")
        failed.append(len(fails) > n_fails)
        pv.append(p.var), mv.append(f.var), pg.append(p.gvar), mg.append(b.var)
    r2 = {"forward_var": r2_log(pv, mv), "grad_var": r2_log(pg, mg)}
    return CheckResult(pred_json, meas_json, {k: _stats(v) for k, v in e.items()}, r2, tol, not fails, fails,
                       failed, tuple(getattr(points, "approximation_notes", ())))


def require_complete(points) -> None:
    """Refuse a prediction that stopped early (a softmax saturated beyond the rules' domain):
    a check compares complete predictions only."""
    if getattr(points, "saturation_layer", None) is not None:
        raise DomainError(f"the prediction stops before layer {points.saturation_layer}, where the softmax saturates "
                          f"({points.domain_note}): check compares complete predictions only (predict shows the "
                          "trace up to there)")


def check_object(model, res: CheckResult, meas, seed: int, trials: int, batch: int) -> dict:
    """The check object (schema ``sigprop.check/1``, docs/formats.md) of a comparison ``res``
    of the prediction with the measurement ``meas``."""
    from sigprop import __version__

    return {
        "schema": "sigprop.check/1", "version": __version__, "model": model.to_json(), "seed": seed,
        "dtype": meas.dtype, "trials": trials, "batch": batch,
        "backend": meas.backend, "device": meas.device, "rng": meas.rng, "dask_workers": meas.workers,
        "predicted": res.predicted, "measured": res.measured,
        # (a relative error against a measured 0 is inf: written "inf", as the trace writes it)
        "errors": {k: {s: None if v is None else num(v) for s, v in st.items()} for k, st in res.errors.items()},
        "r2_log_var": res.r2,
        "tolerance": res.tolerance, "pass": res.passed, "failures": res.failures,
        "approximation_notes": list(res.approximation_notes),
        "timing": {"simulate_s": meas.simulate_s, "gflop": meas.gflop},
    }


#: the variances a simulation samples faithfully, per dtype, measured: a 1-layer Pre-LN model
#: (d 8, 2 tokens, 2 x 1 draws) sampled at input variances 1e-37 to 1e37 in float32 gave finite
#: moments with nonzero standard errors, while its attention logits (a variance ~var^2 below the
#: norm's eps) lost them between logit variances 4e-44 and 4e-48; in float64 the stream kept
#: them from 1e-155 to 1e150 and lost them at 1e-160 and 1e155.  The bounds keep a margin
VAR_RANGES = {"float32": (1e-36, 1e36), "float64": (1e-150, 1e150)}


def require_representable(points, dtype: str) -> None:
    """Refuse (DomainError) a simulation in ``dtype`` of the predicted ``points`` whose stream
    or gradient variance, or attention logit variance, leaves the dtype's VAR_RANGES anywhere:
    the simulation would underflow or overflow there and report NaN or a standard error of 0
    (float32 at an input variance of 1e-300: NaN; at 1e-29 the logit variance, ~var^2,
    underflowed; float64 at 1e-250: standard errors 0; VAR_RANGES says what was measured).  An exact 0 (a branch that adds
    nothing) samples as 0 and passes."""
    if dtype not in VAR_RANGES:
        return
    lo, hi = VAR_RANGES[dtype]
    llo, lhi = math.log(lo), math.log(hi)
    for p in points:
        lt = None
        if p.logit_var is not None:
            lt = math.log(p.logit_var) if p.logit_var > 0 else (-math.inf if p.logit_var == 0 else math.nan)
        for what, lv in (("stream", p.log_var), ("gradient", p.log_gvar), ("attention logit", lt)):
            if lv is None or lv == -math.inf:
                continue
            if not llo <= lv <= lhi:
                where = "the input" if p.layer == 0 else f"layer {p.layer} ({p.sublayer})"
                f_lo, f_hi = VAR_RANGES["float64"]
                hint = ": use --dtype float64" if dtype == "float32" and math.log(f_lo) <= lv <= math.log(f_hi) else ""
                raise DomainError(f"the predicted {what} variance at {where} is {sci_exp(lv)}, outside the "
                                  f"{lo:g} to {hi:g} a {dtype} simulation samples{hint}")


def check_model(model, tol: dict, *, trials: int, batch: int, seed: int, dtype: str = "float32",
                backend: str = "numpy", device: str = "cpu", rng: str = "host", dask: str | None = None,
                workers: int | None = None, progress: bool = False):
    """Predict ``model`` and measure it with the whole-model Monte Carlo (``sigprop check``):
    ``(points, measurement, comparison)``.  A prediction that stops at a saturating softmax is
    refused (:func:`require_complete`); ``dask``/``workers`` run the trials on a Dask cluster
    (``progress``: report them on stderr as they complete)."""
    import numpy as np

    from sigprop.mc.backend import get_backend
    from sigprop.mc.distributed import from_options, stderr_progress
    from sigprop.mc.model import simulate
    from sigprop.model.predict import predict

    bk = get_backend(backend, device)
    if dask is None or dask == "local":          # (before a local cluster starts; simulate checks again)
        import os

        from sigprop.mc.model import check_memory

        parallel = 1 if dask is None and workers is None else min(workers or os.cpu_count() or 1, trials)
        check_memory(model, batch, getattr(np, dtype), bk, parallel=parallel)
    points = predict(model, stop_at_saturation=True)
    require_complete(points)
    require_representable(points, dtype)
    dist = from_options(dask, workers)
    try:
        meas = simulate(model, batch=batch, trials=trials, seed=seed, dtype=getattr(np, dtype),
                        backend=bk, stream=rng, distributor=dist,
                        progress=stderr_progress("trials") if progress and dist is not None else None)
    finally:
        if dist is not None:
            dist.close()
    return points, meas, compare(points, meas, tol)
