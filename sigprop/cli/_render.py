"""Rendering helpers for check-component (tables and JSON); no maths beyond error ratios."""

from __future__ import annotations

import json
import math

from sigprop import __version__
from sigprop.mc.sweep import MOMENTS, errors

LABEL = {"x_mean": "x mean", "x_var": "x var", "x_corr": "x cov", "g_var": "g var", "g_corr": "g cov"}


def _num(v):
    v = float(v)
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else None)


def render_sweep(res, spec, grid, as_json, dtype):
    if as_json:
        print(json.dumps({
            "schema": "sigprop.component-sweep/1", "version": __version__, "component": res.component,
            "grid": grid, "n_configs": res.n_configs, "seed": res.seed, "dtype": dtype,
            "percentiles": res.percentiles, "published": res.published,
            "simulate_s": res.seconds,
        }, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{res.component}: {res.n_configs} configurations ({grid} grid), seed {res.seed}, "
                    f"{dtype}; relative error in %")
    t.add_column("moment")
    t.add_column("sigprop p50 / p90 / p99", justify="right")
    t.add_column("published p50 / p90 / p99", justify="right")
    for mom in spec.moments:
        p = res.percentiles[mom]
        pub = res.published.get(mom)
        t.add_row(LABEL[mom], " / ".join(f"{p[k]:.2f}" for k in ("p50", "p90", "p99")),
                  " / ".join(f"{pub[k]:.1f}" for k in ("p50", "p90", "p99")) if pub else "-")
    c = Console()
    c.print(t)
    c.print(f"simulation time {res.seconds:.1f} s" + (f"; {spec.note}" if spec.note else ""))


def render_single(name, params, seed, dtype, px, pg, meas, tol, tol_corr, z, as_json) -> bool:
    pred = {"x_mean": px.mean, "x_var": px.var, "x_corr": px.corr, "g_var": pg.var, "g_corr": pg.corr}
    mx, mg = meas.x, meas.g
    got = {"x_mean": mx.mean, "x_var": mx.var, "x_corr": mx.corr, "g_var": mg.var, "g_corr": mg.corr}
    se = {"x_mean": mx.mean_se, "x_var": mx.var_se, "x_corr": mx.corr_se, "g_var": mg.var_se, "g_corr": mg.corr_se}
    err = errors(px, pg, meas)
    verdict = {}
    for k in MOMENTS:
        p, m, s = float(pred[k]), float(got[k]), float(se[k])
        if k == "g_var" or k == "x_var":
            allowed = tol * abs(m)
        elif k == "x_mean":
            allowed = tol * math.sqrt(abs(float(px.var)))
        else:
            allowed = tol_corr
        verdict[k] = bool(abs(p - m) <= max(allowed, z * s if math.isfinite(s) else 0.0))
    ok = all(verdict.values())
    if as_json:
        print(json.dumps({
            "schema": "sigprop.component-check/1", "version": __version__, "component": name,
            "params": params, "seed": seed, "dtype": dtype, "runs": meas.runs, "batch": meas.batch,
            "predicted": {k: _num(v) for k, v in pred.items()},
            "measured": {k: _num(v) for k, v in got.items()},
            "se": {k: _num(v) for k, v in se.items()},
            "errors_percent": {k: _num(100 * v) for k, v in err.items()},
            "tolerance": {"rel": tol, "corr_abs": tol_corr, "z": z},
            "pass_by_moment": verdict, "pass": ok, "simulate_s": meas.seconds,
        }, indent=2))
        return ok
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{name} {params}: seed {seed}, {meas.runs} draws x batch {meas.batch}, {dtype}")
    for col in ("moment", "predicted", "measured ± SE", "error %", "verdict"):
        t.add_column(col, justify="right" if col != "moment" else "left")
    for k in MOMENTS:
        lab = {"x_corr": "x corr", "g_corr": "g corr"}.get(k, LABEL[k])
        t.add_row(lab, f"{float(pred[k]):.6g}", f"{float(got[k]):.6g} ± {float(se[k]):.2g}",
                  f"{100 * err[k]:.2f}", "[green]ok[/]" if verdict[k] else "[red]FAIL[/]")
    c = Console()
    c.print(t)
    c.print("[green]pass[/]" if ok else "[red]outside tolerance[/]")
    return ok
