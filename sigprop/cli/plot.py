"""`sigprop plot`: forward variance, gradient variance, token correlation and attention
logit variance against depth, one line per architecture; --check adds Monte Carlo markers."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sigprop.cli._app import app
from sigprop.cli._choices import DType
from sigprop.cli._model_options import build_models, model_options
from sigprop.cli._step import refuse as refuse_step, step_options


@app.command("plot")
@model_options(multi_arch=True, default_layers=24)
@step_options
def plot_cmd(
    output: Path = typer.Option(..., "-o", "--output", help="Figure file: .png, .svg or .pdf."),
    check: bool = typer.Option(False, "--check", help="Overlay a whole-model Monte Carlo measurement as markers."),
    trials: int = typer.Option(8, min=2, help="--check: independent weight draws per architecture."),
    batch: int = typer.Option(8, min=1, help="--check: sequences per draw."),
    seed: int = typer.Option(0, min=0, help="--check: random seed (reported; every architecture uses it)."),
    dtype: DType = typer.Option(DType.float32, help="--check: simulation precision."),
    mark_every: int = typer.Option(None, "--mark-every", min=1, help="--check: a marker every K layers (default: about 16 per line)."),
    title: str = typer.Option(None, help="Figure title (default: the shared model options; '' for none)."),
    width: float = typer.Option(3.4, min=1.0, max=100.0, help="Figure width in inches (default: one column of a "
                                "two-column paper)."),
    height: float = typer.Option(3.6, min=1.0, max=100.0, help="Figure height in inches."),
    dpi: int = typer.Option(300, min=10, max=2400, help="Resolution of PNG output (at most 50 megapixels in all)."),
    model_opts: dict = None,
    step_opts: dict = None,
) -> None:
    """Plot variance, gradient, correlation and logit variance against depth (needs the 'plot' extra)."""
    refuse_step("plot", step_opts)
    from sigprop import plot

    plot.require_matplotlib()
    plot.check_size(output, width, height, dpi)
    from sigprop.compare import compare

    rows = compare(build_models(model_opts, default_layers=24, encdec=True))
    measurements = None
    if check:
        import numpy as np

        from sigprop.model.checking import compare as check_points

        measurements = []
        for r, meas in plot.measure(rows, batch=batch, trials=trials, seed=seed,
                                    dtype=np.float32 if dtype is DType.float32 else np.float64):
            measurements.append(meas)
            if meas is None:
                continue
            res = check_points(r.points, meas)
            e = res.errors
            sys.stderr.write(f"{r.arch}: Monte Carlo {meas.simulate_s:.1f} s; median error: forward var "
                             f"{_pct(e['forward_var_relerr'])}, gradient var {_pct(e['grad_var_relerr'])}, "
                             f"corr {_abs(e['forward_corr_abserr'])}; {sum(res.failed_points)} of "
                             f"{len(r.points)} points outside `check`'s tolerance\n")
    data = plot.figure_data(rows, measurements, mark_every=mark_every, title=title)
    fig = plot.make_figure(data, width=width, height=height)
    plot.save(fig, output, dpi=dpi)
    print(f"wrote {output}: {len(rows)} architectures ({', '.join(r.arch + (f' [{r.stack}]' if r.stack else '') for r in rows)})"
          + (f"; Monte Carlo markers: {trials} trials x batch {batch}, seed {seed}, {dtype.value}" if check else ""))


def _pct(stats: dict) -> str:
    return "-" if stats["median"] is None else f"{100 * stats['median']:.2g}%"


def _abs(stats: dict) -> str:
    return "-" if stats["median"] is None else f"{stats['median']:.2g}"
