"""Rendering of check-component results (tables and JSON); the verdicts come from the library."""

from __future__ import annotations

import json

from sigprop.model.trace import json_num
from sigprop import __version__
from sigprop.mc.sweep import MOMENTS

LABEL = {"x_mean": "x mean", "x_var": "x var", "x_corr": "x cov", "g_var": "g var", "g_corr": "g cov"}




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


def render_single(res, as_json: bool) -> None:
    """Show a :class:`sigprop.mc.component.ComponentCheck` (the verdict is the library's)."""
    t = res.tolerance
    if as_json:
        print(json.dumps({
            "schema": "sigprop.component-check/1", "version": __version__, "component": res.component,
            "params": res.params, "seed": res.seed, "dtype": res.dtype, "runs": res.trials, "trials": res.trials,
            "batch": res.batch,
            "predicted": {k: json_num(v) for k, v in res.predicted.items()},
            "measured": {k: json_num(v) for k, v in res.measured.items()},
            "se": {k: json_num(v) for k, v in res.se.items()},
            "errors_percent": {k: json_num(100 * v) for k, v in res.errors.items()},
            "tolerance": {"rel": t["var"], "var_rel": t["var"], "grad_rel": t["grad"], "corr_abs": t["corr"],
                          "z": t["z"]},
            "pass_by_moment": res.passed_by_moment, "pass": res.passed, "simulate_s": res.seconds,
        }, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    params = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in res.params.items())
    t = Table(title=f"{res.component} ({params}): seed {res.seed}, {res.trials} draws x batch {res.batch}, "
                    f"{res.dtype}")
    for col in ("moment", "predicted", "measured ± SE", "error %", "verdict"):
        t.add_column(col, justify="right" if col != "moment" else "left")
    for k in MOMENTS:
        lab = {"x_corr": "x corr", "g_corr": "g corr"}.get(k, LABEL[k])
        t.add_row(lab, f"{res.predicted[k]:.6g}", f"{res.measured[k]:.6g} ± {res.se[k]:.2g}",
                  f"{100 * res.errors[k]:.2f}", "[green]ok[/]" if res.passed_by_moment[k] else "[red]FAIL[/]")
    c = Console()
    c.print(t)
    c.print("[green]pass[/]" if res.passed else "[red]outside tolerance[/]")
