"""`sigprop predict`: the per-sublayer trace of a whole model (typer's registration; the work
is :func:`sigprop.cli._predict.run`)."""

from __future__ import annotations

import typer

from sigprop.cli._app import app
from sigprop.cli._model_options import model_options


@app.command("predict")
@model_options(default_layers=24)
def predict_cmd(
    every: int = typer.Option(1, min=1, help="Show only every K-th layer (and the first and last)."),
    as_json: bool = typer.Option(False, "--json", help="Print the trace as JSON (schema sigprop.trace/1)."),
    symbolic: bool = typer.Option(False, "--symbolic", help="Print the derived per-layer maps and closed forms, each closed form with its relative error against the layer-by-layer prediction (with --json: the trace plus a \"symbolic\" object, null when a softmax saturates)."),
    model_opts: dict = None,
) -> None:
    """Predict forward variance, token correlation, logit variance and gradient variance, layer by layer."""
    from sigprop.cli._predict import run

    run(model_opts, every, as_json, symbolic)
