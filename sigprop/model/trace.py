"""The trace object (`sigprop predict --json`) and the prediction summary."""

from __future__ import annotations

import json
import math

import numpy as np

from sigprop import __version__
from sigprop.model.growth import BOUNDED_LAWS, COMPOUNDING_LAWS, _times, classify
from sigprop.rules.residual import exp_or_inf as _exp

LOG10E = 1.0 / math.log(10.0)


def num(v: float):
    """A JSON number; overflowed values become the strings "inf"/"-inf" (never NaN)."""
    v = float(v)
    if math.isnan(v):
        raise FloatingPointError("NaN in a trace value")
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def json_num(v):
    """A JSON number where NaN may occur (an undefined ratio, a standard error from one draw):
    None and NaN become null, an overflow the strings "inf" / "-inf" (as :func:`num`)."""
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return None
    return num(v)


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
    per_layer = [p for p in points if p.sublayer in ("ffn", "block")]
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
    bw = bw._replace(log_ratio=-log_ratio_bw)      # top over input, as the law was fitted
    if not per_layer:
        # no layer predicted (a softmax saturates in layer 1): no law either
        fw, bw = fw._replace(law="undetermined"), bw._replace(law="undetermined")
    elif len(per_layer) < 3:
        # too few layers for a law: judged on the whole model's change, input to top
        fw, bw = _few_layers(fw), _few_layers(bw)
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
        "n_layers": int(last.layer),
        # where the prediction stopped because the model left the rules' domain (a softmax
        # saturated beyond the attention rule's range), and why; None for a complete trace
        "saturation_layer": getattr(points, "saturation_layer", None),
        "domain_note": getattr(points, "domain_note", None),
        # the approximations the prediction leaned on beyond where they were measured to hold
        "approximation_notes": list(getattr(points, "approximation_notes", ())),
    }
    out["verdict"] = verdict(fw, bw, out)
    out["verdict_class"] = out["verdict"].split(":", 1)[0]
    return out


def _few_layers(g):
    return g._replace(law="constant" if abs(g.log_ratio) < math.log(1.1) else "undetermined")


#: verdict thresholds (documented in docs/guide.md, "The verdict"): total factors (last / first
#: of the forward variance, input / output of the gradient variance, either direction)
STABLE_FACTOR = 2.0
BOUNDED_FACTOR = 10.0
UNSTABLE_FACTOR = 1000.0
#: per-layer factor beyond which a series that compounds (exponential law, or too few layers
#: to name one) is unstable however small its total
STEP_FACTOR = 2.0
#: attention logit variance beyond which the softmax is near its hard-max limit
LOGIT_SATURATION = 10.0
#: token correlation at the top: beyond the first the representation is collapsing, beyond
#: the second it has collapsed
CORR_COLLAPSING = 0.9
CORR_COLLAPSED = 0.99
CLASSES = ("stable", "bounded", "drifting", "unstable")


def verdict(fw, bw, s: dict) -> str:
    """One of :data:`CLASSES`, a colon, then the reasons with their numbers.

    From magnitudes and growth laws together (``fw``, ``bw``: the Growth of the forward and
    gradient variances, their ``log_ratio`` the whole model's; ``s``: the summary so far):

    * unstable: a total factor beyond x1000; or a compounding series (exponential law, or
      too few layers to name a law) beyond x10 in total or x2 per layer; or the token
      correlation at the top beyond 0.99 (rank collapse);
    * drifting: a total factor beyond x10 of a series that does not settle (laws other than
      constant and bounded); or logit variance beyond 10; or top correlation beyond 0.9;
    * bounded: every total factor within x10, or a settling series (bounded law) within x1000;
    * stable: every total factor within x2 and no flag.
    """
    if s.get("saturation_layer") is not None:
        return f"unstable: softmax saturates at layer {s['saturation_layer']} ({s['domain_note']})"
    n_layers = max(int(s.get("n_layers") or 1), 1)
    # (name, growth, log of the factor as reported, sign from the law's direction to it)
    series = (("forward variance", fw, fw.log_ratio, 1.0), ("gradient input/output", bw, -bw.log_ratio, -1.0))
    reasons: dict[str, list[str]] = {c: [] for c in CLASSES}
    for what, g, log_f, _ in series:
        lr = abs(log_f)
        per_layer = lr / n_layers
        total = _factor(log_f)
        if lr > math.log(UNSTABLE_FACTOR):
            reasons["unstable"].append(f"{what} changes {total}, beyond x{UNSTABLE_FACTOR:g}")
        elif g.law in COMPOUNDING_LAWS and lr > math.log(BOUNDED_FACTOR):
            reasons["unstable"].append(f"{what} compounds ({g.law}) to {total}, beyond x{BOUNDED_FACTOR:g}")
        elif g.law in COMPOUNDING_LAWS and per_layer > math.log(STEP_FACTOR):
            reasons["unstable"].append(f"{what} changes {_factor(log_f / n_layers)} per layer, "
                                       f"beyond x{STEP_FACTOR:g}")
        elif lr > math.log(BOUNDED_FACTOR) and g.law not in BOUNDED_LAWS:
            reasons["drifting"].append(f"{what} changes {total}, beyond x{BOUNDED_FACTOR:g}")
        elif lr > math.log(BOUNDED_FACTOR):
            reasons["bounded"].append(f"{what} settles at {total} by layer {g.length:.0f}, "
                                      f"within x{UNSTABLE_FACTOR:g}")
        elif lr > math.log(STABLE_FACTOR):
            reasons["bounded"].append(f"{what} changes {total}, beyond x{STABLE_FACTOR:g} but "
                                      f"within x{BOUNDED_FACTOR:g}")
    corr = s.get("corr_top")
    if isinstance(corr, float) and corr > CORR_COLLAPSED:
        reasons["unstable"].append(f"token correlation reaches {corr:.4f} at the top, beyond "
                                   f"{CORR_COLLAPSED:g} (rank collapse)")
    elif isinstance(corr, float) and corr > CORR_COLLAPSING:
        reasons["drifting"].append(f"token correlation reaches {corr:.3f} at the top, beyond "
                                   f"{CORR_COLLAPSING:g} (rank collapse)")
    lv = s.get("max_logit_var")
    if isinstance(lv, float) and lv > LOGIT_SATURATION:
        reasons["drifting"].append(f"attention logit variance up to {lv:.3g}, beyond {LOGIT_SATURATION:g} "
                                   "(the softmax nears its hard-max limit)")
    elif lv == "inf":
        reasons["drifting"].append("attention logit variance overflows (the softmax is a hard max)")
    cls = next((c for c in reversed(CLASSES) if reasons[c]), "stable")
    why = "; ".join(reasons[cls]) if cls != "stable" else f"every change within x{STABLE_FACTOR:g}"
    laws = [_describe(what, g, log_f, sign, n_layers) for what, g, log_f, sign in series]
    # the correlation and logit flags of a lower class stay in the sentence
    laws += [r for c in CLASSES if c != cls for r in reasons[c] if r.startswith(("token", "attention"))]
    return f"{cls}: {why}. " + "; ".join(laws)


def _factor(log_value: float) -> str:
    """'x<factor>', with its inverse for a factor below 1 ('x0.0797 = 1/12.5')."""
    if log_value < -math.log(1.05):
        return f"{_times(log_value)} = 1/{_times(-log_value)[1:]}"
    return _times(log_value)


def _describe(what: str, g, log_ratio: float, sign: float, n_layers: int) -> str:
    """One series in words: its total factor, its law, and the law's own number (``sign``
    turns the law's per-layer slope into the direction of the reported factor)."""
    total = _times(log_ratio)
    if g.law == "constant":
        return f"{what} {total} (constant)"
    if g.law == "bounded":
        return f"{what} {total} (bounded: settles by layer {g.length:.0f})"
    if g.law == "undetermined":
        return f"{what} {total} over {n_layers} layer{'s' if n_layers != 1 else ''} (too few layers for a growth law)"
    if g.law == "exponential":
        return f"{what} {total} (exponential in depth, {_times(sign * g.slope, 4)} per layer)"
    if g.law == "mixed":
        return f"{what} {total} (no single growth law; best fit {g.best}, R^2 {g.r2:.2f})"
    return f"{what} {total} ({g.law} in depth)"


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


def trace_text(model, points: list, every: int = 1, extra: dict | None = None) -> str:
    """``json.dumps(trace(model, points, every))``, the same text, built faster (`sigprop
    predict --json`): the points are written straight to text (:func:`point_text`) instead
    of through dicts, and the model's layers are serialised once per run of identical
    layers (Model.layer_runs).  ``extra``: more top-level fields, after "summary"."""
    kept = thin(points, every)
    with_log = _with_log(points)
    model_head = {**model.json_head(), "layers": _LAYERS}
    head = {"schema": "sigprop.trace/1", "version": __version__, "model": model_head,
            "points": _POINTS, "summary": summary(points), **(extra or {})}
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


_SUBLAYER_TEXT = {name: json.dumps(name) for name in ("input", "attention", "ffn", "block", "norm")}
_LAYERS = "\x00sigprop-layers\x00"
_POINTS = "\x00sigprop-points\x00"
