"""`sigprop check-component`: one rule against Monte Carlo, for one configuration or a sweep."""

from __future__ import annotations

import json
from enum import Enum

import typer

from sigprop.cli._app import app
from sigprop.cli.check import BACKEND_HELP, DEVICE_HELP, RNG_HELP, WORKERS_HELP, ArrayBackend, Device, Stream


class DType(str, Enum):
    float32 = "float32"
    float64 = "float64"


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
        out[key.strip()] = int(num) if num.is_integer() and "." not in value and "e" not in value.lower() else num
    return out


@app.command("check-component")
def check_component_cmd(
    name: str = typer.Argument(..., help="Component: see `sigprop rules` (linear, dropout, relu, ...)."),
    param: list[str] = typer.Option(None, "--param", "-p", help="Rule/simulation parameter KEY=VALUE (repeatable), e.g. -p d_in=256."),
    x_mean: float = typer.Option(0.0, help="Input mean."),
    x_var: float = typer.Option(1.0, help="Input variance."),
    x_corr: float = typer.Option(0.2, help="Input token correlation."),
    g_var: float = typer.Option(1.0, help="Variance of the upstream gradient."),
    g_corr: float = typer.Option(0.0, help="Token correlation of the upstream gradient."),
    runs: int = typer.Option(8, min=2, help="Independent weight draws (single configuration)."),
    batch: int = typer.Option(8, min=1, help="Sequences per draw (single configuration)."),
    seed: int = typer.Option(0, min=0, help="Random seed (reported)."),
    dtype: DType = typer.Option(DType.float32, help="Simulation precision."),
    backend: ArrayBackend = typer.Option(ArrayBackend.numpy, help=BACKEND_HELP),
    device: Device = typer.Option(Device.cpu, help=DEVICE_HELP),
    rng: Stream = typer.Option(Stream.host, "--rng", help=RNG_HELP),
    dask: str = typer.Option(None, "--dask", help="With --sweep: run the grid points on a Dask cluster: a "
                                                   "scheduler address or 'local'."),
    workers: int = typer.Option(None, "--workers", help=WORKERS_HELP),
    tol: float = typer.Option(0.05, min=0.0, help="Relative tolerance for means and variances."),
    tol_corr: float = typer.Option(0.03, min=0.0, help="Absolute tolerance for correlations."),
    z: float = typer.Option(4.0, min=0.0, help="Also pass when within z standard errors."),
    sweep: bool = typer.Option(False, "--sweep", help="Run the published grid instead of one configuration."),
    full: bool = typer.Option(False, "--full", help="With --sweep: every grid point, not a seeded subset."),
    n: int = typer.Option(500, min=1, help="With --sweep: number of grid points sampled."),
    grid: str = typer.Option("published", help="With --sweep: 'published' or a component's named variant grid (e.g. softmax 'extended', attention 'causal')."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
) -> None:
    """Check one component's rule against Monte Carlo sampling."""
    import numpy as np

    from sigprop import rules as R
    from sigprop.mc import components as C
    from sigprop.errors import DomainError

    from sigprop.mc.backend import get_backend

    rule = R.get(name)
    comp = C.get(name)
    np_dtype = np.float32 if dtype is DType.float32 else np.float64
    bk = get_backend(backend.value, device.value)
    if not (bk.is_numpy or comp.array_api):
        raise DomainError(f"component {name} runs on the numpy backend only")
    if (dask is not None or workers is not None) and not sweep:
        raise DomainError("--dask and --workers apply to --sweep (one configuration is one process)")
    if sweep:
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

                res = run_sweep(spec, rule, n=None if full else n, seed=seed, dtype=np_dtype, grid=g,
                                progress=stderr_progress("points", every_s=5.0), backend=bk, stream=rng.value,
                                distributor=dist)
            else:
                with _progress(not as_json) as tick:
                    res = run_sweep(spec, rule, n=None if full else n, seed=seed, dtype=np_dtype, grid=g,
                                    progress=tick, backend=bk, stream=rng.value)
        finally:
            if dist is not None:
                dist.close()
        render_sweep(res, spec, grid, as_json, dtype.value)
        return

    from sigprop.cli._render import render_single
    from sigprop.mc.component import measure
    from sigprop.state import Backward, Forward

    params = _parse_params(param)
    rule_names = {p.name for p in rule.params}
    extra = set(params) - rule_names - set(comp.sim_params)
    if extra:
        raise DomainError(f"{name}: unknown parameter(s) {', '.join(sorted(extra))}; rule parameters: "
                          f"{', '.join(sorted(rule_names))}; simulation: {', '.join(comp.sim_params) or '-'}")
    x = Forward(x_mean, x_var, x_corr)
    gs = Backward(g_var, g_corr)
    px, pg = rule.evaluate(x, gs, **{k: v for k, v in params.items() if k in rule_names})
    sim = {q.name: q.default for q in rule.params if q.default is not None}
    sim.update(params)
    meas = measure(comp, sim, x, gs, runs=runs, batch=batch, seed=seed, dtype=np_dtype, backend=bk, stream=rng.value)
    ok = render_single(name, sim, seed, dtype.value, px, pg, meas, tol, tol_corr, z, as_json)
    raise typer.Exit(0 if ok else 1)


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


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, default=float)
