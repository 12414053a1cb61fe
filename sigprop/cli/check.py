"""`sigprop check`: whole-model Monte Carlo against the prediction."""

from __future__ import annotations

import json
from enum import Enum

import typer

from sigprop.cli._app import app
from sigprop.cli._model_options import build_model, model_options


class DType(str, Enum):
    float32 = "float32"
    float64 = "float64"


@app.command("check")
@model_options
def check_cmd(
    trials: int = typer.Option(8, min=2, help="Independent weight draws."),
    batch: int = typer.Option(8, min=1, help="Sequences per draw."),
    seed: int = typer.Option(0, min=0, help="Random seed (reported)."),
    dtype: DType = typer.Option(DType.float32, help="Simulation precision."),
    tol_var: float = typer.Option(0.05, "--tol-var", min=0.0, help="Relative tolerance, forward variance."),
    tol_grad: float = typer.Option(0.05, "--tol-grad", min=0.0, help="Relative tolerance, gradient variance."),
    tol_corr: float = typer.Option(0.03, "--tol-corr", min=0.0, help="Absolute tolerance, correlations."),
    tol_logit: float = typer.Option(0.05, "--tol-logit", min=0.0, help="Relative tolerance, logit variance."),
    z: float = typer.Option(4.0, "--z", min=0.0, help="Also pass within z standard errors."),
    every: int = typer.Option(1, min=1, help="Show only every K-th layer in the table."),
    as_json: bool = typer.Option(False, "--json", help="Print the contract's check object."),
    model_opts: dict = None,
) -> None:
    """Simulate the whole model with NumPy and compare every point with the prediction (exit 1 on failure)."""
    import numpy as np

    from sigprop import __version__
    from sigprop.mc.model import simulate
    from sigprop.model.checking import compare, complete_prediction, tolerances

    tol = tolerances({"forward_var": tol_var, "grad_var": tol_grad, "corr": tol_corr, "logit_var": tol_logit, "z": z})
    model = build_model(model_opts, default_layers=12)
    points = complete_prediction(model)
    meas = simulate(model, batch=batch, trials=trials, seed=seed,
                    dtype=np.float32 if dtype is DType.float32 else np.float64)
    res = compare(points, meas, tol)
    if as_json:
        print(json.dumps({
            "schema": "sigprop.check/1", "version": __version__, "model": model.to_json(), "seed": seed,
            "dtype": meas.dtype, "trials": trials, "batch": batch,
            "predicted": res.predicted, "measured": res.measured, "errors": res.errors, "r2_log_var": res.r2,
            "tolerance": res.tolerance, "pass": res.passed, "failures": res.failures,
            "timing": {"simulate_s": meas.simulate_s, "gflop": meas.gflop},
        }))
    else:
        from sigprop.cli._render_model import render_check

        render_check(model, res, meas, every)
    raise typer.Exit(0 if res.passed else 1)
