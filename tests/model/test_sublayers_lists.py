"""Layers given as lists of sublayers (docs/formats.md, "A layer as a list of sublayers"): the
model form, its refusals, and the predictor against the Monte Carlo on layouts the ordinary
layer cannot express (the macaron layer; a parallel layer of three branches)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from sigprop import api
from sigprop.errors import DomainError
from sigprop.model import predict, presets
from sigprop.model.spec import Model, StreamNorms

from tests._cli import cli

#: the sizes of the Monte Carlo comparisons (at d_model 64 the ordinary 12-layer Pre-LN layer
#: already measures an input gradient 0.89 +- 0.03 of the prediction, a finite-width effect
#: that the macaron layer's twelve norms of the stream double, 0.71 +- 0.14)
SMALL = dict(d_model=128, n_heads=4, d_ff=512, seq_len=16, init="xavier")


def _ordinary(n: int, place: str = "pre", causal: bool = False, **kw) -> dict:
    return presets.resolve("preln" if place == "pre" else "postln", n_layers=n, causal=causal,
                           **{**SMALL, **kw}).to_json()


def macaron(n: int, place: str = "pre", causal: bool = False, norm_scale: float | None = None, **kw) -> dict:
    """The macaron layer: half-step FFN, attention, half-step FFN, then a norm of the stream."""
    obj = _ordinary(n, place, causal, **kw)
    layers = []
    for layer in obj["layers"]:
        att, ffn = layer["attention"], layer["ffn"]
        half = dict(ffn, branch_scale=0.5 * ffn["branch_scale"])
        norm = {"kind": "norm"} if norm_scale is None else {"kind": "norm", "norm_scale": norm_scale}
        layers.append({"sublayers": [dict(half, kind="ffn"), dict(att, kind="attention"), dict(half, kind="ffn"),
                                     norm]})
    obj["layers"], obj["arch"] = layers, "macaron"
    return obj


# -- the model form ---------------------------------------------------------------------------

def test_macaron_round_trip_and_slots():
    m = Model.from_json(macaron(3))
    assert [s.kind for s in m.slots()] == ["ffn", "attention", "ffn", "norm"]
    assert m.ffn is m.slots()[0] and m.attention is m.slots()[1]
    assert isinstance(m.slots()[3], StreamNorms)
    assert "sublayers" in m.features()
    back = Model.from_json(json.loads(json.dumps(m.to_json())))
    assert back == m
    assert m.to_json()["layers"][0]["sublayers"][3] == {"kind": "norm", "norm_scale": 1.0}
    # the second FFN is its own column object: changing it changes the model
    obj = macaron(3)
    obj["layers"][1]["sublayers"][2]["branch_scale"] = 0.25
    other = Model.from_json(obj)
    assert other != m and other.slots()[2].branch_scale.tolist() == [0.5, 0.25, 0.5]


def test_ordinary_list_is_the_ordinary_layer():
    """[attention, ffn] as a list is the ordinary layer: the same model, the same trace."""
    obj = _ordinary(4, causal=True)
    listed = copy.deepcopy(obj)
    listed["layers"] = [{"sublayers": [dict(l["attention"], kind="attention"), dict(l["ffn"], kind="ffn")]}
                        for l in obj["layers"]]
    a, b = Model.from_json(obj), Model.from_json(listed)
    assert a == b and b.sublayers is None and b.to_json() == a.to_json()
    pa, pb = predict.predict(a), predict.predict(b)
    assert [tuple(p) for p in pa] == [tuple(p) for p in pb]


def test_parallel_list_is_the_parallel_block():
    obj = presets.resolve("preln", n_layers=3, block="parallel", **SMALL).to_json()
    listed = {k: v for k, v in obj.items() if k != "block"}
    listed["layers"] = [{"sublayers": [dict(l["attention"], kind="attention"), dict(l["ffn"], kind="ffn")],
                         "parallel": True} for l in obj["layers"]]
    assert Model.from_json(listed) == Model.from_json(obj)


@pytest.mark.parametrize("edit, message", [
    (lambda o: o["layers"][1]["sublayers"].pop(), "every layer must have the same list of sublayer kinds"),
    (lambda o: o["layers"][0]["sublayers"][3].update(kind="dyt"), "kind must be one of"),
    (lambda o: [l["sublayers"].__setitem__(3, dict(l["sublayers"][1], kind="cross_attention")) for l in o["layers"]],
     "it belongs in the decoder of an encoder-decoder model"),
    (lambda o: o["layers"][0]["sublayers"][3].update(skip_scale=1), "unknown key 'skip_scale'"),
    (lambda o: o["layers"][2]["sublayers"][3].update(norm_scale="x"), "layers[2].sublayers[3].norm_scale must be a number"),
    (lambda o: o["layers"][2]["sublayers"][0]["init"]["in"].update(std=-1), "layers[2].sublayers[0].init.in.std must be >= 0"),
    (lambda o: [l["sublayers"].pop(1) for l in o["layers"]], "without an attention sublayer"),
    (lambda o: [l.update(parallel=True) for l in o["layers"]], "a norm sublayer has no place"),
    (lambda o: o["layers"][0].update(parallel=1), "parallel must be true or false"),
    (lambda o: o["layers"][0].update(sublayers=[]), "must be a non-empty array"),
    (lambda o: o.update(block="parallel"), "its layers do not say"),
])
def test_bad_lists_refused_with_their_path(edit, message):
    obj = macaron(3)
    edit(obj)
    with pytest.raises(DomainError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        Model.from_json(obj)


def test_consumers_without_lists_refuse(tmp_path, capsys):
    spec = tmp_path / "macaron.json"
    spec.write_text(json.dumps(macaron(3)))
    code, out, err = cli(capsys, "predict", "--spec", str(spec), "--symbolic")
    assert code == 2 and "--symbolic does not implement sublayers" in err and not out
    code, out, err = cli(capsys, "export", "latex", "--what", "model", "--spec", str(spec), "-o", str(tmp_path / "m.tex"))
    assert code == 2 and "does not implement sublayers" in err
    from sigprop.interop.torch_names import init_plan
    with pytest.raises(DomainError, match="lists of sublayers"):
        init_plan(Model.from_json(macaron(3)))


def test_predict_command_prints_every_sublayer(tmp_path, capsys):
    spec = tmp_path / "macaron.json"
    spec.write_text(json.dumps(macaron(2)))
    code, out, err = cli(capsys, "predict", "--spec", str(spec), "--json")
    assert code in (0, 1), err
    pts = json.loads(out)["points"]
    assert [(p["layer"], p["sublayer"]) for p in pts] == [(0, "input")] + [
        (l, k) for l in (1, 2) for k in ("ffn", "attention", "ffn", "norm")]
    # a norm of the stream: unit variance (eps aside) after every norm point
    assert all(abs(p["forward"]["var"] - 1) < 1e-3 for p in pts if p["sublayer"] == "norm")


# -- against the Monte Carlo ------------------------------------------------------------------

def _check(obj, trials=8, seed=0):
    res = api.check(obj, trials=trials, seed=seed)
    d = res.to_dict()
    assert d["pass"], d["failures"]
    return d


@pytest.mark.parametrize("place", ["pre", "post"])
@pytest.mark.parametrize("causal", [False, True])
def test_macaron_matches_monte_carlo(place, causal):
    """The macaron layer, 12 layers, Pre-LN and Post-LN, bidirectional and causal: every point
    within check's default tolerance (5% or 4 standard errors; 0.03 on correlations)."""
    d = _check(macaron(12, place, causal))
    # the norm of the stream is not the identity: without its backward the gradient would be
    # off by its 1/sigma factor at every norm point
    assert d["errors"]["grad_var_relerr"]["median"] < 0.05


def test_norm_scale_and_rmsnorm_against_monte_carlo():
    """A norm sublayer with norm_scale 0.7 in an RMSNorm model: x' = 0.7 RMSNorm(x)."""
    obj = macaron(6, "pre", True, norm_scale=0.7, norm="rmsnorm")
    d = _check(obj)
    pts = d["predicted"]
    assert all(abs(p["forward"]["var"] - 0.49) < 1e-2 for p in pts if p["sublayer"] == "norm")


def test_parallel_three_branches_against_monte_carlo():
    """A parallel layer of attention and two FFNs on one norm (not expressible in the
    ordinary layer)."""
    obj = _ordinary(8, causal=True)
    obj["layers"] = [{"sublayers": [dict(l["attention"], kind="attention"), dict(l["ffn"], kind="ffn"),
                                    dict(l["ffn"], kind="ffn", skip_scale=1.0, branch_scale=0.5)],
                      "parallel": True} for l in obj["layers"]]
    m = Model.from_json(obj)
    assert m.block == "parallel" and len(m.slots()) == 3
    d = _check(obj)
    assert [p["sublayer"] for p in d["predicted"][1:3]] == ["block", "block"]


@pytest.mark.parametrize("place", ["pre", "post"])
@pytest.mark.parametrize("causal", [False, True])
def test_macaron_48_layers_matches_monte_carlo(place, causal):
    """48 layers (193 points each; 13 to 26 s each on one core)."""
    _check(macaron(48, place, causal), seed=1)


def test_simulation_counts_every_sublayer():
    """The Monte Carlo's work and memory estimates count the list's sublayers: the macaron
    layer's two FFNs (its estimate bounds the measured peak as the ordinary layer's does,
    tests/mc/test_model.py) and its floating-point work."""
    import tracemalloc

    from sigprop.mc.backend import Rng, numpy_backend
    from sigprop.mc.model import _flops, run_trial, trial_memory

    small = dict(d_model=64, n_heads=4, d_ff=128, seq_len=16, init="xavier")
    mac, plain = Model.from_json(macaron(4, **small)), Model.from_json(_ordinary(4, **small))
    assert _flops(mac, 8) > _flops(plain, 8)
    # two FFNs and one attention against one of each: the difference is one FFN's work
    one_ffn = 2 * (2.0 * 8 * 16 * 64 * 128) * 2 * 4
    assert _flops(mac, 8) - _flops(plain, 8) == pytest.approx(one_ffn)
    run_trial(plain, 1, Rng(np.random.SeedSequence(1), numpy_backend(), "host"))
    tracemalloc.start()
    try:
        run_trial(mac, 8, Rng(np.random.SeedSequence(0), numpy_backend(), "host"), np.float32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 1.0 <= trial_memory(mac, 8, np.float32) / peak <= 1.7


def test_sublayer_counts_bounded():
    obj = macaron(2)
    obj["layers"][0]["sublayers"] = [{"kind": "norm"}] * 65
    with pytest.raises(DomainError, match=r"layers\[0\]\.sublayers has 65 entries: sigprop takes at most 64"):
        Model.from_json(obj)
