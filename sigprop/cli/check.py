"""`sigprop check`: whole-model Monte Carlo against the prediction."""

from __future__ import annotations

import json
from typing import Optional

import typer

from sigprop.cli._app import app
from sigprop.cli._choices import (
    BACKEND_HELP, DASK_HELP, DEVICE_HELP, RNG_HELP, WORKERS_HELP, ArrayBackend, Device, DType, Stream)
from sigprop.cli._model_options import build_model, model_options
from sigprop.cli._step import step_options
from sigprop.cli._tolerance import TOL_CORR, TOL_GRAD, TOL_LOGIT, TOL_VAR, Z, tolerance_values


@app.command("check")
@model_options(default_layers=12)
@step_options
def check_cmd(
    trials: int = typer.Option(8, min=2, help="Independent weight draws."),
    batch: Optional[int] = typer.Option(None, min=1, help="Sequences per draw (default 8; with --step the step's "
                                        "batch is --batch-size)."),
    seed: int = typer.Option(0, min=0, help="Random seed (reported)."),
    dtype: Optional[DType] = typer.Option(None, help="Simulation precision (default float32; float64 with --step)."),
    backend: ArrayBackend = typer.Option(ArrayBackend.numpy, help=BACKEND_HELP),
    device: Device = typer.Option(Device.cpu, help=DEVICE_HELP),
    rng: Stream = typer.Option(Stream.host, "--rng", help=RNG_HELP),
    dask: str = typer.Option(None, "--dask", help=DASK_HELP),
    workers: int = typer.Option(None, "--workers", help=WORKERS_HELP),
    tol_var: float = TOL_VAR,
    tol_grad: float = TOL_GRAD,
    tol_corr: float = TOL_CORR,
    tol_logit: float = TOL_LOGIT,
    z: float = Z,
    every: Optional[int] = typer.Option(None, min=1, metavar="K", help="Show only every K-th layer (and the input "
                                        "and the top layer) in the table (default: about 40 rows)."),
    full: bool = typer.Option(False, "--full", help="Show every row of the table."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (schema sigprop.check/1; "
                                 "with --step sigprop.step/1)."),
    model_opts: dict = None,
    step_opts: dict = None,
) -> None:
    """Simulate the whole model (NumPy by default; PyTorch or CuPy on a CPU or GPU; trials on a Dask
    cluster with --dask) and compare every point with the prediction (exit 1 on failure). With --step:
    simulate one optimizer step from the initialisation and report its update per point (no prediction;
    exit 0)."""
    from sigprop.cli._render_rows import conflict
    from sigprop.cli._report import done
    from sigprop.model.checking import check_model, check_object, tolerances

    conflict(every, full)
    if step_opts:
        _check_step(model_opts, step_opts, trials, batch, seed, dtype, every, full, as_json,
                    simulation=dict(backend=(backend, ArrayBackend.numpy), device=(device, Device.cpu),
                                    rng=(rng, Stream.host), dask=(dask, None), workers=(workers, None)),
                    tolerances=tolerance_values(tol_var, tol_grad, tol_corr, tol_logit, z))
        done()
        raise typer.Exit(0)
    batch = 8 if batch is None else batch
    dtype = DType.float32 if dtype is None else dtype

    tol = tolerances(tolerance_values(tol_var, tol_grad, tol_corr, tol_logit, z))
    model = build_model(model_opts, default_layers=12, encdec=True)
    from sigprop.model.encdec import is_encdec

    if is_encdec(model):
        from sigprop.cli._render_encdec import check_encdec

        passed = check_encdec(model, tol, trials, batch, seed, dtype.value, backend.value, rng.value, dask, as_json,
                              every, full)
        done()
        raise typer.Exit(0 if passed else 1)
    points, meas, res = check_model(model, tol, trials=trials, batch=batch, seed=seed, dtype=dtype.value,
                                    backend=backend.value, device=device.value, rng=rng.value, dask=dask,
                                    workers=workers, progress=True)
    if as_json:
        obj = check_object(model, res, meas, seed, trials, batch)
        if "hf" in model.notes:
            obj["hf"] = model.notes["hf"]
        print(json.dumps(obj))
    else:
        from sigprop.cli._render_model import render_check

        where = f"{meas.backend} on {meas.device}, random numbers: {meas.rng}"
        if meas.workers is not None:
            where += f", trials on {meas.workers} Dask workers"
        render_check(model, res, meas, every, full, where)
    done()
    raise typer.Exit(0 if res.passed else 1)


def _check_step(model_opts, step_opts, trials, batch, seed, dtype, every, full, as_json, simulation, tolerances):
    """`check --step`: the step's Monte Carlo (sigprop.mc.step_check), rendered."""
    from sigprop.mc import step_check
    from sigprop.model.update import settings

    step = settings(step_opts)
    step_check.require_step_options(batch, simulation, tolerances)
    model = build_model(model_opts, default_layers=12, encdec=True)
    dt = "float64" if dtype is None else dtype.value
    meas = step_check.run(model, step, trials=trials, seed=seed, dtype=dt)
    obj = step_check.step_object(model, meas, step)
    if as_json:
        if "hf" in model.notes:
            obj["hf"] = model.notes["hf"]
        print(json.dumps(obj))
        return
    from sigprop.cli._render_step import render_step

    render_step(model, obj, every, full)
