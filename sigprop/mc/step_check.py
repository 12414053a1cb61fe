"""`sigprop check --step`: the Monte Carlo of one optimizer step (:mod:`sigprop.mc.step`) as a
result object (schema ``sigprop.step/1``, docs/formats.md), its summary and its notes.

There is no prediction to compare with (docs/update.md): the object carries the measurement
only, ``"predicted": null``, and the command's exit code is 0.  Per trace point: the stream's
variance at the initial parameters, the ``"update"`` (var, rel, fresh_var,
fresh_rel) with standard errors over the weight draws; per sublayer point also each module's
output change relative to its output (``"modules"``: q, k, v, o; in, out or gate, up, down),
each parameter's relative change ||dtheta|| / ||theta|| (``"weights"``; the norm of the change
itself where theta starts at 0), the attention logit variance before and after the step, and,
under Adam and AdamW, the share of the sublayer's parameter entries whose gradient is at most
eps (there eps at least halves the step).
"""

from __future__ import annotations


import numpy as np

from sigprop.model.trace import json_num
from sigprop.errors import DomainError

SCHEMA = "sigprop.step/1"

#: a sublayer whose eps share (the largest of its parameters') reaches this gets a note
EPS_NOTE_SHARE = 0.01

_KIND = {"attn": "attention", "ffn": "ffn"}




def require_step_options(batch, simulation: dict, tolerance: dict) -> None:
    """DomainError for a `check` option that does not apply to the step's Monte Carlo: ``batch``
    given (the step's batch is --batch-size), a simulation option away from its default
    (``simulation``: name -> (value, default): backend, device, rng, dask, workers; the step runs
    in NumPy on the CPU, one draw after another), a tolerance away from its default
    (``tolerance``: the values of :data:`sigprop.model.checking.DEFAULT_TOL`'s keys; nothing is
    compared)."""
    from sigprop.model.checking import DEFAULT_TOL

    if batch is not None:
        raise DomainError("--step takes its batch from --batch-size (default 8): drop --batch")
    for name, (value, default) in simulation.items():
        if getattr(value, "value", value) != getattr(default, "value", default):
            raise DomainError(f"--step runs the NumPy simulation on the CPU, one trial after another: drop --{name}")
    if any(v != DEFAULT_TOL[k] for k, v in tolerance.items()):
        raise DomainError("--step compares nothing (no prediction of the step exists): drop the tolerance options")


def require_memory(model, batch_size: int, dtype: str = "float64") -> None:
    """DomainError when one draw of the step would need more memory than is available (about
    three times a check trial's: the parameters, their gradients and new values, the backward's
    tape and the module outputs kept for the comparison; :func:`sigprop.mc.model.check_memory`)."""
    from sigprop.mc.component import available_memory
    from sigprop.mc.model import trial_memory

    need = 3.0 * trial_memory(model, batch_size, dtype)
    have = available_memory()
    if have is not None and need > have:
        m = model
        raise DomainError(f"the step's Monte Carlo of this model ({m.n_layers} layers, d_model {m.d_model}, d_ff "
                          f"{m.d_ff}, seq_len {m.seq_len}, batch {batch_size}, {dtype}) needs about "
                          f"{need / 2**30:.3g} GiB of memory, more than the {have / 2**30:.3g} GiB available: a "
                          "smaller --batch-size, model or sequence")


#: a Hugging Face config's bias note (sigprop.interop.hf) -> whether every linear map has a bias
#: (True) or none has (False); a family whose note is not here has biases on some maps only
_HF_BIASES = (("no biases", False), ("no projection biases", False), ("use_bias false: no projection biases", False),
              ("bias false: no projection biases", False), ("biases on every projection", True),
              ("biases on q, k, v, dense, fc1, fc2", True), ("biases (use_bias): q, k, v, o, c_fc, c_proj", True),
              ("bias true: biases on query_key_value, dense", True),
              ("biases: q, k, v and o and gate, up and down", True), ("biases: FFN in and out, q, k, v and o", True))


def linear_biases(model) -> bool:
    """Whether the linear maps of ``model`` have biases (the step simulates all or none): the
    resolution's ``"bias"`` (``--no-bias``: False; a model file: True, the format's default),
    for a Hugging Face config its biases as :mod:`sigprop.interop.hf` names them.  DomainError
    for a config with biases on some maps only, or with a LayerNorm without a bias."""
    hf = model.notes.get("hf")
    if hf is None:
        return bool(model.notes.get("bias", True))
    notes = hf.get("notes", [])
    if any("LayerNorm without a bias" in n or "bias-free LayerNorm" in n for n in notes):
        raise DomainError(f"--step with --hf-config: {hf['family']}'s LayerNorm has no bias, which the step's "
                          "Monte Carlo does not simulate (yet)")
    for n in notes:
        for prefix, value in _HF_BIASES:
            if n.startswith(prefix):
                return value
    said = next((n for n in notes if "bias" in n), "biases not named")
    raise DomainError(f"--step with --hf-config: the step's Monte Carlo gives every linear map a bias or none, "
                      f"and this {hf['family']} config has {said!r} (not simulated yet)")


def run(model, step: dict, trials: int = 8, seed: int = 0, dtype: str = "float64", bias: bool | None = None):
    """The step's Monte Carlo of ``model`` (:func:`sigprop.mc.step.simulate_step` with the
    keywords ``step`` of :func:`sigprop.model.update.settings`), after the memory check;
    ``bias`` None: the model's own (:func:`linear_biases`).  DomainError for a model it does not
    simulate."""
    from sigprop.mc.step import check_supported, simulate_step
    from sigprop.model.encdec import is_encdec

    if is_encdec(model):
        raise DomainError("--step does not simulate encoder-decoder models (yet)")
    check_supported(model)
    if bias is None:
        bias = linear_biases(model)
    require_memory(model, step["batch_size"], dtype)
    return simulate_step(model, trials=trials, seed=seed, dtype=np.dtype(dtype), bias=bias, **step)


def _where(model, key: str):
    """(layer, sublayer) of the trace point a parameter or module ``key`` belongs to (the
    output for the final norm's), and its name within it."""
    if not key.startswith("layers."):
        return (model.n_layers, "output"), key
    _, l, rest = key.split(".", 2)
    layer = int(l) + 1
    if model.block == "parallel":
        return (layer, "block"), rest
    head = rest.split(".", 1)[0]
    if head == "norms":
        kind = rest.split(".")[1].rsplit("_", 1)[0]
    else:
        kind = _KIND[head]
    return (layer, kind), rest


def points(model, meas) -> list[dict]:
    """The measured POINTs (module docstring), the input first, in trace order (the model's
    output, which differs from the last point with a final norm, is in :func:`summary`)."""
    out = []
    extra = {p: {"modules": {}, "weights": {}, "logit": None} for p in meas.points}
    for k, v in meas.modules.items():
        p, name = _where(model, k)
        extra[p]["modules"][name] = {"rel": json_num(v.mean), "rel_se": json_num(v.se)}
    for k, v in meas.weights.items():
        p, name = _where(model, k)
        extra[p]["weights"][name] = {"rel": json_num(v["rel"].mean), "rel_se": json_num(v["rel"].se),
                                     "abs": json_num(v["abs"].mean), "abs_se": json_num(v["abs"].se),
                                     "grad_rms": json_num(v["grad_rms"].mean), "eps_share": json_num(v["eps_share"].mean)}
    for k, v in meas.logits.items():
        p, _ = _where(model, k + ".o")
        extra[p]["logit"] = v
    for i, (layer, sub) in enumerate(meas.points[:-1]):
        e = extra[(layer, sub)]
        lg = e["logit"]
        shares = [w["eps_share"] for w in e["weights"].values() if w["eps_share"] is not None]
        pt = {"layer": layer, "sublayer": sub,
              "forward": {"var": json_num(meas.stream_var[i])},
              "update": {"var": json_num(meas.var[i]), "rel": json_num(meas.rel[i]), "fresh_var": json_num(meas.fresh_var[i]),
                         "fresh_rel": json_num(meas.fresh_rel[i])},
              "logit_var": None if lg is None else json_num(lg["before"].mean),
              "logit_var_after": None if lg is None else json_num(lg["after"].mean),
              "se": {"forward": {"var": json_num(meas.stream_var_se[i])},
                     "update": {"var": json_num(meas.var_se[i]), "rel": json_num(meas.rel_se[i]),
                                "fresh_var": json_num(meas.fresh_var_se[i]), "fresh_rel": json_num(meas.fresh_rel_se[i])},
                     "logit_var": None if lg is None else json_num(lg["before"].se),
                     "logit_var_after": None if lg is None else json_num(lg["after"].se)}}
        if sub != "input":
            pt["modules"] = e["modules"]
            pt["weights"] = e["weights"]
            pt["eps_share"] = max(shares) if shares else None
        out.append(pt)
    return out


def _largest(pts, field: str):
    best = None
    for p in pts:
        for name, v in (p.get(field) or {}).items():
            if v["rel"] is not None and (best is None or v["rel"] > best[2]["rel"]):
                best = (p, name, v)
    if best is None:
        return None
    p, name, v = best
    return {"layer": p["layer"], "sublayer": p["sublayer"], "name": name, "rel": v["rel"], "rel_se": v["rel_se"]}


def eps_note(pts, step: dict) -> str | None:
    """One line where Adam's eps dominates the step (the sublayers where at least
    :data:`EPS_NOTE_SHARE` of some parameter's entries have |g| <= eps), else None."""
    if step["optimizer"] == "sgd":
        return None
    hit = [p for p in pts if (p.get("eps_share") or 0.0) >= EPS_NOTE_SHARE]
    if not hit:
        return None
    worst = max(hit, key=lambda p: p["eps_share"])
    return (f"Adam's eps {step['eps']:g} is at least |g| on {100 * worst['eps_share']:.3g}% of a parameter's entries "
            f"at layer {worst['layer']} {worst['sublayer']} (the most; {len(hit)} of {len(pts) - 1} sublayers reach "
            f"{100 * EPS_NOTE_SHARE:g}%): there the step is less than lr/2, not the sign step of lr")


def summary(model, meas, pts, step: dict) -> dict:
    """The update at the top (the last trace point) and at the model's output, the largest
    module and weight change, the largest logit variance after the step, and the eps note."""
    top = pts[-1]["update"]
    top_se = pts[-1]["se"]["update"]
    out_i = len(meas.points) - 1
    att = [p for p in pts if p["logit_var_after"] is not None]
    mx = max(att, key=lambda p: p["logit_var_after"]) if att else None
    s = {"update_rel_top": top["rel"], "update_rel_top_se": top_se["rel"],
         "update_fresh_rel_top": top["fresh_rel"], "update_fresh_rel_top_se": top_se["fresh_rel"],
         "update_rel_output": json_num(meas.rel[out_i]), "update_rel_output_se": json_num(meas.rel_se[out_i]),
         "update_fresh_rel_output": json_num(meas.fresh_rel[out_i]),
         "update_fresh_rel_output_se": json_num(meas.fresh_rel_se[out_i]),
         "largest_module_rel": _largest(pts, "modules"), "largest_weight_rel": _largest(pts, "weights"),
         "max_logit_var_after": None if mx is None else {"layer": mx["layer"], "value": mx["logit_var_after"],
                                                         "before": mx["logit_var"]},
         "eps_note": eps_note(pts, step)}
    rel, se = top["rel"], top_se["rel"]
    s["verdict"] = (f"measured, not predicted: one {step['optimizer']} step at lr {step['lr']:g} changes the top "
                    f"stream by {_pm(rel, se)} of its variance on the step's batch, "
                    f"{_pm(top['fresh_rel'], top_se['fresh_rel'])} on a fresh batch")
    return s


def _pm(v, se) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if se is None else f"{v:.4g} +- {se:.2g}"


def notes(model, step: dict, bias: bool) -> list[str]:
    """What the measurement assumes, in words (printed and under "notes" in --json)."""
    out = ["dropout off for the step and the measurement (the model in eval mode)",
           "every weight matrix, bias and norm gain (and LayerNorm bias) takes the step; skip, branch and norm "
           "scales are constants" + ("" if bias else "; the linear maps have no biases (--no-bias)"),
           "loss (1 / (batch x seq_len)) sum over the batch's tokens of <y, u>, u drawn from the gradient law "
           "(--grad-var, --grad-corr)",
           "rel = var(F' - F) / var(F) over all entries of the stream, the global mean removed; a module's rel "
           "includes the change of its input from the layers below"]
    if step["optimizer"] != "sgd":
        out.append("the first Adam step is bias-corrected: lr g / (|g| + eps), the betas do not enter")
    return out


def step_object(model, meas, step: dict) -> dict:
    """The ``sigprop.step/1`` object of a measurement (module docstring)."""
    from sigprop import __version__

    bias = meas.settings["bias"]
    pts = points(model, meas)
    return {"schema": SCHEMA, "version": __version__, "model": model.to_json(), "seed": meas.seed,
            "dtype": meas.settings["dtype"], "trials": meas.trials,
            "step": {"optimizer": step["optimizer"], "lr": step["lr"], "batch_size": step["batch_size"],
                     "adam_betas": list(step["betas"]), "adam_eps": step["eps"],
                     "weight_decay": step["weight_decay"], "bias": bool(bias), "dropout": "off"},
            "predicted": None, "measured": pts, "summary": summary(model, meas, pts, step),
            "notes": notes(model, step, bias), "timing": {"simulate_s": meas.seconds}}
