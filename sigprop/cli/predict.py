"""`sigprop predict`: the per-sublayer trace of a whole model (typer's registration; the work
is :func:`sigprop.cli._predict.run`)."""

from __future__ import annotations

from typing import Optional

import typer

from sigprop.cli._app import app
from sigprop.cli._model_options import model_options
from sigprop.cli._step import refuse as refuse_step, step_options


@app.command("predict")
@model_options(default_layers=24)
@step_options
def predict_cmd(
    every: Optional[int] = typer.Option(None, min=1, metavar="K", help="Show only every K-th layer (and the input and the "
                              "top layer); with --json too (default: text shows about 40 rows, JSON every layer)."),
    full: bool = typer.Option(False, "--full", help="Show every row of the trace (text; JSON is whole already)."),
    as_json: bool = typer.Option(False, "--json", help="Print the trace as JSON (schema sigprop.trace/1)."),
    symbolic: bool = typer.Option(False, "--symbolic", help="Print the derived per-layer maps and closed forms, each closed form with its relative error against the layer-by-layer prediction (with --json: the trace plus a \"symbolic\" object, null when a softmax saturates)."),
    model_opts: dict = None,
    step_opts: dict = None,
) -> None:
    """Predict forward variance, token correlation, logit variance and gradient variance, layer by layer."""
    refuse_step("predict", step_opts)
    from sigprop.cli._predict import run

    run(model_opts, every, as_json, symbolic, full)
