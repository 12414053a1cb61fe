"""The mixture-of-experts FFN in the model object (ffn_kind "moe" and the model's "moe":
docs/formats.md): parsing, the JSON round trip, and every refusal naming its reason."""

import copy
import json
import subprocess
import sys

import pytest

from sigprop.errors import DomainError
from sigprop.model.spec import Model, MoE


def _obj(shared=0, mix=False, **moe):
    names = ["router", "gate", "up", "down"] + (["shared_gate", "shared_up", "shared_down"] if shared else []) \
        + (["shared_mix"] if mix else [])
    att = {"placement": "pre", "skip_scale": 1.0, "branch_scale": 1.0, "norm_scale": 1.0,
           "init": {w: {"std": 0.02, "bias_std": 0.0} for w in "qkvo"}}
    ffn = {"placement": "pre", "skip_scale": 1.0, "branch_scale": 1.0, "norm_scale": 1.0,
           "init": {w: {"std": 0.02, "bias_std": 0.0} for w in names}}
    return {"arch": "moe", "n_layers": 2, "d_model": 64, "n_heads": 4, "d_head": 16, "d_ff": 128, "seq_len": 8,
            "activation": "silu", "norm": "rmsnorm", "causal": True,
            "dropout": {"attention": 0.0, "hidden": 0.0, "ffn_inner": 0.0},
            "input": {"mean": 0.0, "var": 1.0, "corr": 0.2}, "grad": {"var": 1.0, "corr": 0.0},
            "ffn_kind": "moe", "moe": {"n_experts": 8, "top_k": 2, "d_ff_expert": 32, "d_ff_shared": shared,
                                       "shared_mix": mix, **moe},
            "layers": [{"attention": att, "ffn": copy.deepcopy(ffn)} for _ in range(2)]}


def test_parses_and_round_trips():
    obj = _obj(shared=48, mix=True, router="sigmoid", norm_topk_prob=True, route_scale=2.5, n_group=4,
               topk_group=2)
    m = Model.from_json(obj)
    assert m.ffn_kind == "moe"
    assert m.moe == MoE(n_experts=8, top_k=2, d_ff_expert=32, router="sigmoid", norm_topk_prob=True,
                        route_scale=2.5, n_group=4, topk_group=2, d_ff_shared=48, shared_mix=True)
    assert m.ffn.names == ("router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down", "shared_mix")
    assert "ffn_kind moe" in m.features()
    out = m.to_json()
    assert out["moe"] == {"n_experts": 8, "top_k": 2, "d_ff_expert": 32, "router": "sigmoid", "norm_topk_prob": True,
                          "route_scale": 2.5, "n_group": 4, "topk_group": 2, "d_ff_shared": 48, "shared_mix": True}
    assert Model.from_json(json.loads(json.dumps(out))) == m
    assert m.fans("ffn", "router") == (64, 8)
    assert m.fans("ffn", "down") == (32, 64)
    assert m.fans("ffn", "shared_up") == (64, 48)
    # the defaults are not written
    assert Model.from_json(_obj()).to_json()["moe"] == {"n_experts": 8, "top_k": 2, "d_ff_expert": 32}


def _refused(obj, match):
    with pytest.raises(DomainError, match=match):
        Model.from_json(obj)


def test_refusals():
    _refused({**_obj(), "ffn_kind": "glu"}, "init")       # (the weights of a gated FFN are gate, up, down)
    o = _obj()
    del o["moe"]
    _refused(o, "go together")
    o = _obj()
    o["ffn_kind"] = "glu"
    for layer in o["layers"]:
        layer["ffn"]["init"] = {w: {"std": 0.02, "bias_std": 0.0} for w in ("gate", "up", "down")}
    _refused(o, "moe object but ffn_kind 'glu'")
    _refused(_obj(top_k=9), "top_k 9 exceeds")
    _refused(_obj(n_group=3), "must divide")
    _refused(_obj(router="relu"), "moe.router must be one of")
    _refused(_obj(shared_mix=True), "has none")
    _refused(_obj(bogus=1), "unknown field 'bogus'")
    o = _obj()
    del o["moe"]["top_k"]
    _refused(o, r"moe\.top_k is required")
    o = _obj(shared=16)
    for layer in o["layers"]:
        del layer["ffn"]["init"]["shared_up"]
    _refused(o, "shared_up")                               # a shared expert's weight missing
    o = _obj()
    o["layers"][1]["ffn"]["init"]["gate"]["bias_std"] = 0.1
    _refused(o, "no biases")
    o = _obj()
    o["layers"][0]["ffn"]["placement"] = "peri"
    _refused(o, "placement 'peri'")
    o = _obj()
    o["dropout"]["ffn_inner"] = 0.1
    _refused(o, "no inner dropout")


def test_cli_refuses_in_one_line(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"model": _obj(top_k=9)}))
    r = subprocess.run([sys.executable, "-m", "sigprop", "predict", "--spec", str(f)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "top_k 9 exceeds" in r.stderr
