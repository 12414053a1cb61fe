"""`sigprop check-component`: one rule against Monte Carlo, for one configuration or a sweep."""

from __future__ import annotations

from typing import Optional

import typer

from sigprop.cli._app import app, renamed
from sigprop.cli._choices import BACKEND_HELP, DEVICE_HELP, RNG_HELP, WORKERS_HELP, ArrayBackend, Device, DType, Stream


def _parse_params(items: list[str]) -> dict:
    from sigprop.errors import DomainError

    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DomainError(f"--param expects KEY=VALUE, got {item!r}")
        try:
            num = float(value)
        except ValueError:
            raise DomainError(f"--param {key}: {value!r} is not a number") from None
        # "64" is an integer; "64.0" and "1e3" are floats (integer parameters accept them
        # when they are whole numbers)
        out[key.strip()] = int(value) if num.is_integer() and value.strip().lstrip("+-").isdigit() else num
    return out


@app.command("check-component")
def check_component_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Component: linear, dropout, residual, relu, gelu, layernorm, embedding, "
                               "softmax or attention (`sigprop rules NAME` shows its parameters)."),
    param: list[str] = typer.Option(None, "--param", "-p", help="Rule or simulation parameter KEY=VALUE (repeatable), "
                                    "e.g. -p d_in=256; simulation sizes default to L 16 tokens and width d 64."),
    input_mean: float = typer.Option(0.0, "--input-mean", help="Mean of the component's input."),
    input_var: float = typer.Option(1.0, "--input-var", help="Variance of the component's input."),
    input_corr: float = typer.Option(0.2, "--input-corr", help="Token correlation of the component's input."),
    grad_var: float = typer.Option(1.0, "--grad-var", help="Variance of dLoss/d(output), the upstream gradient."),
    grad_corr: float = typer.Option(0.0, "--grad-corr", help="Token correlation of the upstream gradient."),
    trials: int = typer.Option(8, "--trials", min=2, help="Independent weight draws (single configuration)."),
    batch: int = typer.Option(8, min=1, help="Sequences per draw (single configuration)."),
    seed: int = typer.Option(0, min=0, help="Random seed (reported)."),
    dtype: DType = typer.Option(DType.float32, help="Simulation precision."),
    backend: ArrayBackend = typer.Option(ArrayBackend.numpy, help=BACKEND_HELP),
    device: Device = typer.Option(Device.cpu, help=DEVICE_HELP),
    rng: Stream = typer.Option(Stream.host, "--rng", help=RNG_HELP),
    dask: str = typer.Option(None, "--dask", help="With --sweep: run the grid points on a Dask cluster: a "
                                                   "scheduler address or 'local'."),
    workers: int = typer.Option(None, "--workers", help=WORKERS_HELP),
    tol_var: float = typer.Option(0.05, "--tol-var", min=0.0, help="Relative tolerance, output mean (in standard "
                                  "deviations) and variance."),
    tol_grad: float = typer.Option(0.05, "--tol-grad", min=0.0, help="Relative tolerance, gradient variance."),
    tol_corr: float = typer.Option(0.03, "--tol-corr", min=0.0, help="Absolute tolerance, correlations."),
    z: float = typer.Option(4.0, min=0.0, help="Also pass when within z standard errors."),
    sweep: bool = typer.Option(False, "--sweep", help="Run the published grid instead of one configuration."),
    full: bool = typer.Option(False, "--full", help="With --sweep: every grid point, not a seeded subset."),
    n: int = typer.Option(500, min=1, help="With --sweep: number of grid points sampled."),
    grid: str = typer.Option("published", help="With --sweep: 'published' or a component's named variant grid (e.g. softmax 'extended', attention 'causal')."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
    # old spellings (deprecated, hidden): the names of the whole-model commands replaced them
    runs: Optional[int] = typer.Option(None, "--runs", min=2, hidden=True),
    x_mean: Optional[float] = typer.Option(None, "--x-mean", hidden=True),
    x_var: Optional[float] = typer.Option(None, "--x-var", hidden=True),
    x_corr: Optional[float] = typer.Option(None, "--x-corr", hidden=True),
    g_var: Optional[float] = typer.Option(None, "--g-var", hidden=True),
    g_corr: Optional[float] = typer.Option(None, "--g-corr", hidden=True),
    tol: Optional[float] = typer.Option(None, "--tol", min=0.0, hidden=True),
) -> None:
    """Check one component's rule against Monte Carlo sampling (exit 1 if outside tolerance)."""
    import numpy as np

    from sigprop.errors import DomainError
    from sigprop.mc import components as C

    from sigprop.mc.backend import get_backend

    trials = renamed(ctx, "trials", trials, "--runs", runs)
    input_mean = renamed(ctx, "input_mean", input_mean, "--x-mean", x_mean)
    input_var = renamed(ctx, "input_var", input_var, "--x-var", x_var)
    input_corr = renamed(ctx, "input_corr", input_corr, "--x-corr", x_corr)
    grad_var = renamed(ctx, "grad_var", grad_var, "--g-var", g_var)
    grad_corr = renamed(ctx, "grad_corr", grad_corr, "--g-corr", g_corr)
    tol_var = renamed(ctx, "tol_var", tol_var, "--tol", tol, use="--tol-var and --tol-grad")
    tol_grad = renamed(ctx, "tol_grad", tol_grad, "--tol", tol, quiet=True)   # --tol set both
    from sigprop.rules.base import STATE_PARAMS

    for key, flag, v in (("x_mean", "--input-mean", input_mean), ("x_var", "--input-var", input_var),
                         ("x_corr", "--input-corr", input_corr), ("g_var", "--grad-var", grad_var),
                         ("g_corr", "--grad-corr", grad_corr)):
        STATE_PARAMS[key]._replace(name=flag).check(v)
    np_dtype = np.float32 if dtype is DType.float32 else np.float64
    comp = C.get(name)
    bk = get_backend(backend.value, device.value)
    if not (bk.is_numpy or comp.array_api):
        raise DomainError(f"component {name} runs on the numpy backend only")
    if (dask is not None or workers is not None) and not sweep:
        raise DomainError("--dask and --workers apply to --sweep (one configuration is one process)")
    if sweep:
        from sigprop import rules as R
        from sigprop.cli._render import render_sweep
        from sigprop.mc.sweep import run_sweep

        spec = C.SWEEPS[name]
        if grid != "published" and grid not in spec.variants:
            raise DomainError(f"{name} has no grid {grid!r}; known: published"
                              + "".join(f", {k}" for k in spec.variants))
        g = None if grid == "published" else spec.variants[grid]["grid"]
        from sigprop.mc.distributed import from_options

        dist = from_options(dask, workers)
        try:
            if dist is not None:
                from sigprop.mc.distributed import stderr_progress

                res = run_sweep(spec, R.get(comp.rule), n=None if full else n, seed=seed, dtype=np_dtype, grid=g,
                                progress=stderr_progress("points", every_s=5.0), backend=bk, stream=rng.value,
                                distributor=dist)
            else:
                with _progress(not as_json) as tick:
                    res = run_sweep(spec, R.get(comp.rule), n=None if full else n, seed=seed, dtype=np_dtype, grid=g,
                                    progress=tick, backend=bk, stream=rng.value)
        finally:
            if dist is not None:
                dist.close()
        render_sweep(res, spec, grid, as_json, dtype.value)
        return

    from sigprop.cli._render import render_single
    from sigprop.mc.component import check
    from sigprop.state import Backward, Forward

    res = check(name, _parse_params(param), Forward(input_mean, input_var, input_corr), Backward(grad_var, grad_corr),
                trials=trials, batch=batch, seed=seed, dtype=np_dtype,
                tol={"var": tol_var, "grad": tol_grad, "corr": tol_corr, "z": z}, backend=bk, stream=rng.value)
    render_single(res, as_json)
    raise typer.Exit(0 if res.passed else 1)


class _progress:
    """A rich progress bar on stderr (silent when disabled or stderr is not a terminal)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

        self.p = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self.p.__enter__()
        self.task = None

        def tick(i, total):
            if self.task is None:
                self.task = self.p.add_task("sweep", total=total)
            self.p.update(self.task, completed=i)

        return tick

    def __exit__(self, *exc):
        if self.enabled:
            self.p.__exit__(*exc)
        return False
