"""`sigprop predict`: the per-sublayer trace of a whole model."""

from __future__ import annotations

import typer

from sigprop.cli._app import app
from sigprop.cli._model_options import build_model, model_options


@app.command("predict")
@model_options(default_layers=24)
def predict_cmd(
    every: int = typer.Option(1, min=1, help="Show only every K-th layer (and the first and last)."),
    as_json: bool = typer.Option(False, "--json", help="Print the trace as JSON (schema sigprop.trace/1)."),
    symbolic: bool = typer.Option(False, "--symbolic", help="Print the derived per-layer maps and closed forms, each closed form with its relative error against the layer-by-layer prediction (with --json: the trace plus a \"symbolic\" object, null when a softmax saturates)."),
    model_opts: dict = None,
) -> None:
    """Predict forward variance, token correlation, logit variance and gradient variance, layer by layer."""
    model = build_model(model_opts, default_layers=24)
    if symbolic:
        from sigprop.model.symbolic import require_supported

        require_supported(model)
    from sigprop.model.predict import predict
    from sigprop.model.trace import trace, trace_text

    points = predict(model, stop_at_saturation=True)
    # the derivation needs the whole model inside the rules' domain: a saturating softmax
    # gives the trace up to there (symbolic: null), as without --symbolic
    derivable = points.saturation_layer is None
    if symbolic and not as_json and derivable:
        from sigprop.cli._render_model import render_symbolic

        render_symbolic(model)
        return
    if as_json:
        extra = {"hf": model.notes["hf"]} if "hf" in model.notes else None
        if symbolic:
            from sigprop.model import symbolic as sym

            extra = {**(extra or {}), "symbolic": sym.to_json(sym.derive(model)) if derivable else None}
        print(trace_text(model, points, every, extra))
        return
    tr = trace(model, points, every)
    from sigprop.cli._render_model import render_trace

    if symbolic:
        print(f"no closed forms: the softmax saturates at layer {points.saturation_layer}, outside the rules' "
              "domain; the trace up to there:")
    render_trace(model, tr)
