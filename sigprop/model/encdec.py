"""Encoder-decoder models (docs/formats.md, "Encoder-decoder models"): the model object
{"arch", "encoder": STACK, "decoder": STACK}, its prediction and its trace.

* The encoder stack runs on its own input (its ``input``, its ``seq_len``, bidirectional unless it
  says ``causal``); its output E is its last stream, after its final norm where ``final_norm``.
* The decoder's layers hold "cross_attention" sublayers: queries from the decoder stream, keys and
  values from E (sigprop.rules.cross_attention), no mask, no rotary positions, the stack's QK-norm.
* The loss gradient enters at the decoder's output only (its ``grad``); the encoder's output
  receives the sum of every cross-attention's key/value gradient.  Different layers'
  contributions come through independent weights (each layer's own W_k, W_v, W_o), zero-mean,
  so their cross terms vanish in expectation and the variances and covariances add
  (checked by the whole-model Monte Carlo, tests/model/test_encdec.py).

Prediction (:func:`predict`): the encoder's forward pass gives E; the decoder's forward and
backward passes (its cross-attention chains read E's state from the decoder's notes, the backward
records each cross-attention op's output gradient, ``Predictor.cross_grads``); every op's
key/value gradient (the ``cross_attention_kv`` rule at E, its query input the op's) summed; then
the encoder with that sum as its upstream gradient (at its final norm's output where it has
one).  The trace lists the encoder's points, then the decoder's, each with its "stack".
"""

from __future__ import annotations

import json
import math

import numpy as np

from sigprop.errors import DomainError
from sigprop.state import Backward, Forward

#: the one line a command that does not take an encoder-decoder model says
REFUSED = ("an encoder-decoder model ({\"encoder\": ..., \"decoder\": ...}) is taken by the commands predict, "
           "check, compare and plot only (yet): this command (or API call) does not implement it")
_KEYS = ("arch", "encoder", "decoder")
STACKS = ("encoder", "decoder")
#: the placeholder upstream gradient of the encoder before the decoder's backward pass
_PLACEHOLDER = {"var": 1.0, "corr": 0.0}


class EncoderDecoder:
    """An encoder stack and a decoder stack (:class:`sigprop.model.spec.Model` each; the
    encoder's ``grad`` is a placeholder, replaced by the decoder's gradient into E)."""

    __slots__ = ("arch", "encoder", "decoder")

    def __init__(self, arch: str, encoder, decoder):
        object.__setattr__(self, "arch", arch)
        object.__setattr__(self, "encoder", encoder)
        object.__setattr__(self, "decoder", decoder)
        if encoder.d_model != decoder.d_model:
            raise DomainError(f"the encoder's d_model ({encoder.d_model}) and the decoder's ({decoder.d_model}) "
                              "must be the same")
        if not any(s.kind == "cross_attention" for s in decoder.slots()):
            raise DomainError("the decoder has no cross_attention sublayer: it never reads the encoder")

    def __setattr__(self, name, value):
        raise AttributeError("EncoderDecoder is frozen")

    @property
    def n_layers(self) -> int:
        return self.encoder.n_layers + self.decoder.n_layers

    def stack(self, name: str):
        return self.encoder if name == "encoder" else self.decoder

    def __eq__(self, other):
        if not isinstance(other, EncoderDecoder):
            return NotImplemented
        return self.arch == other.arch and self.encoder == other.encoder and self.decoder == other.decoder

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EncoderDecoder(arch={self.arch!r}, encoder={self.encoder!r}, decoder={self.decoder!r})"

    def to_json(self) -> dict:
        enc = self.encoder.to_json()
        enc.pop("grad", None)
        return {"arch": self.arch, "encoder": enc, "decoder": self.decoder.to_json()}

    @classmethod
    def from_json(cls, obj, where: str = "model") -> "EncoderDecoder":
        from sigprop.model.spec import _keys, _parse_model, _type_name

        if type(obj) is not dict:
            raise DomainError(f"{where} must be an object, got {_type_name(obj)}")
        _keys(obj, _KEYS, where)
        arch = obj["arch"]
        if not isinstance(arch, str):
            raise DomainError(f"{where}.arch must be a string, got {_type_name(arch)}")
        stacks = {}
        for name in STACKS:
            s = obj[name]
            w = f"{where}.{name}"
            if type(s) is not dict:
                raise DomainError(f"{w} must be a model object, got {_type_name(s)}")
            s = dict(s)
            s.setdefault("arch", arch)
            if name == "encoder":
                if "grad" in s:
                    raise DomainError(f"{w}.grad: the encoder's gradient comes from the decoder's cross-attention "
                                      "(the loss gradient enters at the decoder's output only): drop it")
                s["grad"] = dict(_PLACEHOLDER)
            stacks[name] = _parse_model(s, w, cross=name == "decoder")
        try:
            return cls(arch, stacks["encoder"], stacks["decoder"])
        except DomainError as e:
            raise DomainError(f"{where}: {e}") from None


def is_encdec(model) -> bool:
    return isinstance(model, EncoderDecoder)


def refuse(model, who: str) -> None:
    """DomainError (one line) when ``model`` is an encoder-decoder model and ``who`` does not
    implement one."""
    if isinstance(model, EncoderDecoder):
        raise DomainError(f"{who} does not implement encoder-decoder models (yet): predict, check, compare and plot do")


# ---------------------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------------------

class StackPoints(list):
    """The trace points of one stack (StreamPoint), with ``stack`` and what predict.Points carries."""

    stack: str = ""
    saturation_layer = None
    domain_note = None
    approximation_notes: tuple = ()


class Prediction:
    """An encoder-decoder prediction: ``encoder``, ``decoder`` (StackPoints), E (the encoder
    output's state), the gradient into E (its sum) and each cross-attention's contribution
    ((decoder layer, Backward))."""

    def __init__(self, model, encoder, decoder, e_state, e_grad, contributions):
        self.model, self.encoder, self.decoder = model, encoder, decoder
        self.e_state, self.e_grad, self.contributions = e_state, e_grad, contributions

    def points(self) -> list:
        """(stack, point) in trace order: the encoder's, then the decoder's."""
        return [("encoder", p) for p in self.encoder] + [("decoder", p) for p in self.decoder]


def encoder_output(enc, tables=None) -> Forward:
    """The encoder's output state E (its last stream, after its final norm where it has one)."""
    from sigprop.model import predict as P

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        pr = P.Predictor(enc, False, tables)
        pr.forward()
        s = pr._end
        x = P._real(s.log_var, s.x)
        if enc.final_norm:
            x = P._fwd(pr._norm(s.tok, x))
    return Forward(float(x.mean), float(x.var), float(x.corr))


def _stack_points(model, name: str, tables=None) -> tuple[StackPoints, object]:
    from sigprop.model import predict as P

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        pr = P.Predictor(model, False, tables)
        try:
            records = pr.forward()
            grads, _ = pr.backward(records)
        except (OverflowError, ZeroDivisionError, np.linalg.LinAlgError) as e:
            raise P.float_range_failure(e) from None
    pts = StackPoints(P._points(model, records, grads, pr.top_grad))
    pts.stack = name
    pts.approximation_notes = P.approximation_notes(records)
    return pts, pr


def encoder_gradient(e_state: Forward, cross_grads: list) -> tuple[Backward, list]:
    """The gradient into E summed over the decoder's cross-attentions (``cross_grads``:
    Predictor.cross_grads, (layer, op, log var at the op's output, corr)): each op's
    cross_attention_kv backward at E with its query input; variances and covariances add."""
    from sigprop.rules.cross_attention import CROSS_KV

    var = cov = 0.0
    parts = []
    for layer, op, lg, gc in sorted(cross_grads, key=lambda t: t[0]):
        if lg == -math.inf:
            parts.append((layer, Backward(0.0, 0.0)))
            continue
        p = {k: v for k, v in op.params.items() if not k.startswith("enc_")}
        q = op.x
        p.update(dec_mean=float(q.mean), dec_var=float(q.var), dec_corr=float(q.corr))
        _, g = CROSS_KV.fast(e_state, Backward(math.exp(lg), float(gc)), p, need_forward=False)
        parts.append((layer, g))
        var += g.var
        cov += g.var * g.corr
    if not var > 0 or not math.isfinite(var):
        raise DomainError(f"the gradient into the encoder output is {var:g}: the decoder's cross-attention sends "
                          "the encoder nothing it can follow (all-zero value or output weights?)")
    return Backward(var, min(max(cov / var, -1.0), 1.0)), parts


def predict(model: EncoderDecoder, tables=None) -> Prediction:
    """The encoder's and the decoder's trace points (module docstring)."""
    enc, dec = model.encoder, model.decoder
    e_state = encoder_output(enc, tables)
    dec_e = dec.replace(notes={**dec.notes, "encoder_output": e_state, "encoder_seq_len": enc.seq_len})
    dpts, pr = _stack_points(dec_e, "decoder", tables)
    e_grad, parts = encoder_gradient(e_state, pr.cross_grads)
    enc_g = enc.replace(grad=e_grad)
    epts, _ = _stack_points(enc_g, "encoder", tables)
    return Prediction(model, epts, dpts, e_state, e_grad, parts)


def decoder_with_encoder(model: EncoderDecoder, e_state: Forward):
    """The decoder stack with the encoder output's state in its notes (what its cross-attention
    chains read)."""
    dec = model.decoder
    return dec.replace(notes={**dec.notes, "encoder_output": e_state, "encoder_seq_len": model.encoder.seq_len})


# ---------------------------------------------------------------------------------------
# the trace
# ---------------------------------------------------------------------------------------

def summary(pred: Prediction) -> dict:
    """Per stack the trace summary (sigprop.model.trace.summary), each judged on its own; the
    encoder's gradient is the one its output receives from the decoder."""
    from sigprop.model.trace import num, summary as stack_summary

    out = {name: stack_summary(getattr(pred, name)) for name in STACKS}
    out["encoder_output"] = {"mean": num(pred.e_state.mean), "var": num(pred.e_state.var),
                             "corr": num(pred.e_state.corr)}
    out["encoder_output_grad"] = {"var": num(pred.e_grad.var), "corr": num(pred.e_grad.corr),
                                  "by_decoder_layer": [{"layer": l, "var": num(g.var), "corr": num(g.corr)}
                                                       for l, g in pred.contributions]}
    worst = max((out[s]["verdict_class"] for s in STACKS), key=("stable", "bounded", "drifting", "unstable").index)
    out["verdict_class"] = worst
    out["verdict"] = "; ".join(f"{s}: {out[s]['verdict']}" for s in STACKS)
    return out


def points_json(pred: Prediction, every: int = 1) -> list:
    from sigprop.model.trace import _with_log, point_json, thin

    out = []
    for name in STACKS:
        pts = getattr(pred, name)
        with_log = _with_log(pts)
        for p in thin(pts, every):
            out.append({**point_json(p, with_log), "stack": name})
    return out


def trace(pred: Prediction, every: int = 1) -> dict:
    from sigprop import __version__

    return {"schema": "sigprop.trace/1", "version": __version__, "model": pred.model.to_json(),
            "points": points_json(pred, every), "summary": summary(pred)}


def trace_text(pred: Prediction, every: int = 1) -> str:
    return json.dumps(trace(pred, every))


# ---------------------------------------------------------------------------------------
# from the model options (--encoder-layers N --decoder-layers M)
# ---------------------------------------------------------------------------------------

def with_cross_attention(dec_json: dict) -> dict:
    """A decoder stack's model object whose layers become [attention, cross_attention, ffn], the
    cross-attention a copy of the layer's self-attention sublayer (placement, scales, init)."""
    out = dict(dec_json)
    layers = []
    for layer in dec_json["layers"]:
        if "sublayers" in layer:
            subs = list(layer["sublayers"])
            k = next(i for i, s in enumerate(subs) if s["kind"] == "attention")
            subs.insert(k + 1, {**subs[k], "kind": "cross_attention"})
            layers.append({**layer, "sublayers": subs})
        else:
            layers.append({"sublayers": [{"kind": "attention", **layer["attention"]},
                                         {"kind": "cross_attention", **layer["attention"]},
                                         {"kind": "ffn", **layer["ffn"]}]})
    out["layers"] = layers
    return out


def _deepnorm_stack(js: dict, alpha: float, beta: float) -> dict:
    """A Post-LN stack's object with DeepNorm's skip scale ``alpha`` on every residual sublayer
    and its Xavier-normal gain ``beta`` on V, O, FFN in and out (Q and K gain 1), d the width."""
    import copy

    js = copy.deepcopy(js)
    d, w, f = js["d_model"], js["n_heads"] * js["d_head"], js["d_ff"]
    fans = {"q": (d, w), "k": (d, w), "v": (d, w), "o": (w, d), "in": (d, f), "out": (f, d)}
    for layer in js["layers"]:
        subs = layer["sublayers"] if "sublayers" in layer else [layer["attention"], layer["ffn"]]
        for s in subs:
            if "init" not in s:
                continue
            s["skip_scale"] = alpha
            for name, e in s["init"].items():
                gain = 1.0 if name in ("q", "k") else beta
                fi, fo = fans[name]
                e["std"] = gain * math.sqrt(2.0 / (fi + fo))
    return js


def from_options(resolve: dict, encoder_layers: int, decoder_layers: int, encoder_seq_len=None, *,
                 deepnorm_variant: str | None = None) -> EncoderDecoder:
    """An encoder-decoder model from the model options (sigprop.model.presets.resolve's keyword
    arguments, ``n_layers`` aside): the encoder (``encoder_layers`` layers, bidirectional, its own
    ``encoder_seq_len``, default the options' seq_len) and the decoder (``decoder_layers`` layers,
    causal as the options say, each layer self-attention, cross-attention, FFN, the cross-attention
    a copy of the layer's self-attention sublayer).  Arch "deepnorm": DeepNorm's encoder-decoder
    constants (sigprop.model.deepnorm.deepnorm_encoder_decoder; ``deepnorm_variant`` "paper", the
    default, or "torchscale") on both stacks; a variant with another arch is refused."""
    from sigprop.model import presets
    from sigprop.model.deepnorm import deepnorm_encoder_decoder
    kw = {k: v for k, v in resolve.items() if k != "n_layers"}
    for name, v in (("encoder_layers", encoder_layers), ("decoder_layers", decoder_layers)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DomainError(f"{name} must be a positive integer, got {v!r}")
    ekw = {**kw, "causal": False}
    if encoder_seq_len is not None:
        ekw["seq_len"] = encoder_seq_len
    enc = presets.resolve(n_layers=encoder_layers, **ekw).to_json()
    dec = presets.resolve(n_layers=decoder_layers, **kw).to_json()
    arch = enc["arch"]
    if deepnorm_variant is not None and arch != "deepnorm":
        raise DomainError(f"--deepnorm-variant chooses DeepNorm's encoder constants: it needs --arch deepnorm, "
                          f"not {arch!r}")
    if arch == "deepnorm":
        c = deepnorm_encoder_decoder(encoder_layers, decoder_layers, deepnorm_variant or "paper")
        enc = _deepnorm_stack(enc, *c["encoder"])
    dec = with_cross_attention(dec)
    if arch == "deepnorm":
        dec = _deepnorm_stack(dec, *c["decoder"])
    enc.pop("grad")
    return EncoderDecoder.from_json({"arch": arch, "encoder": enc, "decoder": dec})


# ---------------------------------------------------------------------------------------
# check: the prediction against the whole-model Monte Carlo (sigprop.mc.encdec)
# ---------------------------------------------------------------------------------------

def check(model: EncoderDecoder, tol: dict | None, *, trials: int, batch: int, seed: int, dtype: str = "float32"):
    """(prediction, {stack: ModelMeasurement}, CheckResult over both stacks' points, the
    encoder's first): every point judged by sigprop.model.checking.compare's rule; failures
    name their stack."""
    from types import SimpleNamespace

    from sigprop.mc import encdec as mc
    from sigprop.model.checking import compare, require_representable

    pred = predict(model)
    for name in STACKS:
        require_representable(getattr(pred, name), dtype)
    meas = mc.simulate(model, batch=batch, trials=trials, seed=seed, dtype=getattr(np, dtype))
    parts = {name: compare(getattr(pred, name), meas[name], tol) for name in STACKS}
    both = StackPoints(list(pred.encoder) + list(pred.decoder))
    both.approximation_notes = tuple(pred.encoder.approximation_notes) + tuple(pred.decoder.approximation_notes)
    me, md = meas["encoder"], meas["decoder"]
    joined = SimpleNamespace(forward=me.forward + md.forward, backward=me.backward + md.backward,
                             logit_var=me.logit_var + md.logit_var, points=None)
    res = compare(both, joined, tol)
    ne = len(pred.encoder)
    for k, (p, q) in enumerate(zip(res.predicted, res.measured)):
        p["stack"] = q["stack"] = "encoder" if k < ne else "decoder"
    res.failures = [f"{name}: {f}" for name in STACKS for f in parts[name].failures]
    res.passed = not res.failures
    res.parts = parts
    return pred, meas, res


def check_object(model: EncoderDecoder, res, meas: dict, seed: int, trials: int, batch: int) -> dict:
    """The check object (schema sigprop.check/1) of an encoder-decoder model: points carry their
    "stack"; timing sums both stacks' (one simulation)."""
    from sigprop.model.checking import check_object as one

    out = one(model.decoder, res, meas["decoder"], seed, trials, batch)
    out["model"] = model.to_json()
    out["timing"] = {"simulate_s": meas["decoder"].simulate_s,
                     "gflop": meas["encoder"].gflop + meas["decoder"].gflop}
    return out
