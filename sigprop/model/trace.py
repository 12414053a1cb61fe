"""The contract's trace object (`sigprop predict --json`) and the prediction summary."""

from __future__ import annotations

import json
import math

import numpy as np

from sigprop import __version__
from sigprop.model.growth import classify, sci_log10

LOG10E = 1.0 / math.log(10.0)


def num(v: float):
    """A JSON number; overflowed values become the strings "inf"/"-inf" (never NaN)."""
    v = float(v)
    if math.isnan(v):
        raise FloatingPointError("NaN in a trace value")
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def point_json(p, with_log: bool) -> dict:
    out = {
        "layer": p.layer, "sublayer": p.sublayer,
        "forward": {"mean": num(p.mean), "var": num(p.var), "corr": num(p.corr)},
        "backward": {"var": num(p.gvar), "corr": num(p.gcorr)},
        "logit_var": None if p.logit_var is None else num(p.logit_var),
    }
    if with_log:
        out["forward"]["log10_var"] = num(p.log_var * LOG10E)
        out["backward"]["log10_var"] = num(p.log_gvar * LOG10E)
    return out


def thin(points: list, every: int) -> list:
    """Keep the input point, every K-th layer's points and the last layer's."""
    if every <= 1:
        return list(points)
    last = points[-1].layer
    return [p for p in points if p.layer == 0 or p.layer % every == 0 or p.layer == last]


def summary(points: list) -> dict:
    first, last = points[0], points[-1]
    per_layer = [p for p in points if p.sublayer == "ffn"]
    depth = np.array([p.layer for p in per_layer], dtype=float)
    fw = classify(depth, np.array([p.log_var for p in per_layer]))
    # gradient as a function of depth measured from the input: the point entering layer l
    g_pts = [points[0]] + per_layer[:-1]
    gd = np.arange(1, len(g_pts) + 1, dtype=float)
    bw = classify(gd, np.array([p.log_gvar for p in g_pts]))
    logits = [p.logit_var for p in points if p.logit_var is not None]
    log_ratio_fw = last.log_var - first.log_var
    log_ratio_bw = first.log_gvar - last.log_gvar
    # the law is fitted from layer 1 on; the verdict's "overall" factor is the summary's (input
    # to top), as is the gradient's
    fw = fw._replace(log_ratio=log_ratio_fw)
    out = {
        "forward_var_final": num(last.var),
        "forward_var_growth": num(_exp(log_ratio_fw)),
        "log10_forward_var_growth": num(log_ratio_fw * LOG10E),
        "forward_law": fw.law,
        "grad_ratio_input_output": num(_exp(log_ratio_bw)),
        "log10_grad_ratio_input_output": num(log_ratio_bw * LOG10E),
        "grad_law": bw.law,
        "corr_top": num(last.corr),
        "max_logit_var": num(max(logits)) if logits else None,
        # where the prediction stopped because the model left the rules' domain (a softmax
        # saturated beyond the attention rule's range), and why; None for a complete trace
        "saturation_layer": getattr(points, "saturation_layer", None),
        "domain_note": getattr(points, "domain_note", None),
    }
    out["verdict"] = verdict(fw, bw, out)
    return out


def _exp(v: float) -> float:
    return math.exp(v) if v < 709 else math.inf


def verdict(fw, bw, s: dict) -> str:
    if s.get("saturation_layer") is not None:
        return f"unstable: softmax saturates at layer {s['saturation_layer']} ({s['domain_note']})"
    parts = [fw.describe("forward variance"), _grad_words(bw, s)]
    corr = s["corr_top"]
    if isinstance(corr, float) and corr > 0.9:
        parts.append(f"token correlation reaches {corr:.3f} at the top (rank collapse)")
    if s["max_logit_var"] not in (None,) and isinstance(s["max_logit_var"], float) and s["max_logit_var"] > 10:
        parts.append(f"attention logit variance up to {s['max_logit_var']:.3g} (softmax saturates)")
    stable = fw.law == "constant" and bw.law == "constant"
    # unstable: geometric growth or decay that has compounded beyond a factor of 10 (an
    # exponential law with a rate ~ 1/N, as in DeepScaleLM's beta^2 = k/N, stays bounded)
    unstable = any(g.law == "exponential" and abs(g.log_ratio) > math.log(10.0) for g in (fw, bw))
    return ("stable: " if stable else "unstable: " if unstable else "drifting: ") + "; ".join(parts)


def _grad_words(g, s) -> str:
    r = s["grad_ratio_input_output"]
    l10 = s.get("log10_grad_ratio_input_output")
    if isinstance(r, float) and math.isfinite(r) and r > 0:
        rs = f"{r:.3g}"
    elif isinstance(l10, float) and math.isfinite(l10):
        rs = sci_log10(l10)
    else:
        rs = str(r)
    if g.law == "constant":
        return f"gradient variance conserved (input/output {rs})"
    towards = "grows" if (isinstance(l10, float) and l10 > 0) else "shrinks"
    if g.law == "exponential":
        word = "explodes" if towards == "grows" else "vanishes"
        return f"gradient {word} geometrically towards the input (input/output {rs})"
    if g.law == "mixed":
        return (f"gradient {towards} towards the input without a single growth law "
                f"(input/output {rs}; best fit {g.best}, R^2 {g.r2:.2f})")
    return f"gradient {g.law} in depth (input/output {rs})"


def _with_log(points: list) -> bool:
    """Whether the trace carries log10 variances (some variance under- or overflows): the
    variances are exp(log) (see StreamPoint), finite below 709 and positive above -745."""
    for p in points:
        if not (-745.0 < p.log_var < 709.0 and -745.0 < p.log_gvar < 709.0):
            return True
    return False


def trace(model, points: list, every: int = 1) -> dict:
    kept = thin(points, every)
    with_log = _with_log(points)
    return {
        "schema": "sigprop.trace/1",
        "version": __version__,
        "model": model.to_json(),
        "points": [point_json(p, with_log) for p in kept],
        "summary": summary(points),
    }


def trace_text(model, points: list, every: int = 1) -> str:
    """``json.dumps(trace(model, points, every))``, the same text, built faster (`sigprop
    predict --json`): the points are written straight to text (:func:`point_text`) instead
    of through dicts, and the model's layers are serialised once per run of identical
    layers (Model.layer_runs)."""
    kept = thin(points, every)
    with_log = _with_log(points)
    model_head = {**model.json_head(), "layers": _LAYERS}
    head = {"schema": "sigprop.trace/1", "version": __version__, "model": model_head,
            "points": _POINTS, "summary": summary(points)}
    texts = []
    runs = model.layer_runs()
    for start, end in zip(runs[:-1], runs[1:]):          # one text per run of identical layers
        texts += [json.dumps(model.layers_json([start])[0])] * (end - start)
    layers = "[" + ", ".join(texts) + "]"
    body = "[" + ", ".join([point_text(p, with_log) for p in kept]) + "]"
    return json.dumps(head).replace(json.dumps(_POINTS), body, 1).replace(json.dumps(_LAYERS), layers, 1)


def _num_text(v) -> str:
    """:func:`num` as JSON text (floats as json.dumps writes them: ``float.__repr__``)."""
    v = float(v)
    if v - v == 0.0:                  # finite
        return float.__repr__(v)
    return json.dumps(num(v))         # "inf" / "-inf"; NaN raises


def point_text(p, with_log: bool) -> str:
    """``json.dumps(point_json(p, with_log))`` (tested equal), without the dicts."""
    mean, var, corr, gvar, gcorr = float(p.mean), p.var, float(p.corr), p.gvar, float(p.gcorr)
    if (mean - mean) + (var - var) + (corr - corr) + (gvar - gvar) + (gcorr - gcorr) == 0.0:   # all finite
        # (``!r`` of a float is float.__repr__, json.dumps's float text)
        f = f'{{"mean": {mean!r}, "var": {var!r}, "corr": {corr!r}'
        b = f'{{"var": {gvar!r}, "corr": {gcorr!r}'
    else:
        f = f'{{"mean": {_num_text(mean)}, "var": {_num_text(var)}, "corr": {_num_text(corr)}'
        b = f'{{"var": {_num_text(gvar)}, "corr": {_num_text(gcorr)}'
    if with_log:
        f += f', "log10_var": {_num_text(p.log_var * LOG10E)}'
        b += f', "log10_var": {_num_text(p.log_gvar * LOG10E)}'
    lv = "null" if p.logit_var is None else _num_text(p.logit_var)
    sub = _SUBLAYER_TEXT.get(p.sublayer) or json.dumps(p.sublayer)
    return (f'{{"layer": {int(p.layer)}, "sublayer": {sub}, "forward": {f}}}, '
            f'"backward": {b}}}, "logit_var": {lv}}}')


_SUBLAYER_TEXT = {name: json.dumps(name) for name in ("input", "attention", "ffn")}
_LAYERS = "\x00sigprop-layers\x00"
_POINTS = "\x00sigprop-points\x00"
