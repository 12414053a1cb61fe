"""The step's Monte Carlo as `check --step` reports it (sigprop.mc.step_check, and the module,
weight and logit measurements of sigprop.mc.step): each new quantity against a direct
computation from the same draw, Adam's sign step in the weights, the eps note, and the
``sigprop.step/1`` object (points, summary, JSON without NaN)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.mc import step as st
from sigprop.mc import step_check as sc
from sigprop.mc.sampling import correlated
from sigprop.model.presets import resolve
from sigprop.model.update import settings


def _tiny(arch="postln", **kw):
    return resolve(arch, **{"n_layers": 2, "d_model": 32, "n_heads": 4, "seq_len": 8, **kw})


def _var(x):
    return float(np.mean(x * x) - np.mean(x) ** 2)


def test_first_layer_module_and_logits_against_a_direct_computation():
    """Post-LN: layer 1's attention reads the input itself, which the step does not change, so
    its q map's output changes by X dW_q + db_q exactly, and its logits are those of X."""
    m = _tiny()
    kw = dict(optimizer="sgd", lr=0.5, batch_size=2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
              dtype=np.float64, bias=True, select=None)
    rows, detail = st._trial(m, np.random.default_rng(7), **kw)
    rng = np.random.default_rng(7)                      # the same draws, in _trial's order
    P = st.init_params(m, rng)
    shape = (2, m.seq_len, m.d_model)
    X = correlated(rng, shape, m.input.mean, m.input.var, m.input.corr, np.float64)
    U = correlated(rng, shape, 0.0, m.grad.var, m.grad.corr, np.float64)
    P2 = st.optimizer_step(P, st.gradients(m, P, X, U), "sgd", 0.5)
    key = "layers.0.attn.q"
    Y0 = X @ P[key + ".weight"] + P[key + ".bias"]
    Y1 = X @ P2[key + ".weight"] + P2[key + ".bias"]
    v0, vd = detail["modules"][key]
    assert v0 == pytest.approx(_var(Y0), rel=1e-12) and vd == pytest.approx(_var(Y1 - Y0), rel=1e-10)
    K0 = X @ P["layers.0.attn.k.weight"] + P["layers.0.attn.k.bias"]
    Qh, Kh = (t.reshape(2, m.seq_len, m.n_heads, m.d_head).transpose(0, 2, 1, 3) for t in (Y0, K0))
    S = Qh @ Kh.transpose(0, 1, 3, 2) / np.sqrt(m.d_head)
    assert detail["logits"]["layers.0.attn"][0] == pytest.approx(_var(S), rel=1e-12)
    d, w0, g_rms, share = detail["weights"][key + ".weight"]
    dW = P2[key + ".weight"] - P[key + ".weight"]
    assert d == pytest.approx(np.linalg.norm(dW)) and w0 == pytest.approx(np.linalg.norm(P[key + ".weight"]))
    assert np.isnan(share)                              # (no eps under SGD)


def test_adam_moves_every_weight_by_lr_per_entry():
    """Adam's first step is lr sign(g) where |g| >> eps: ||dW|| / ||W|| = lr / std for a weight
    drawn N(0, std^2); the key bias (zero gradient in exact arithmetic) has no eps share."""
    m = _tiny()
    r = st.simulate_step(m, "adam", lr=1e-3, batch_size=2, trials=2, seed=0)
    for k in ("layers.0.attn.v", "layers.1.ffn.in", "layers.1.ffn.out"):
        assert r.weights[k]["rel"].mean == pytest.approx(1e-3 / 0.02, rel=0.03), k
        assert r.weights[k]["eps_share"].mean == 0.0
    assert np.isnan(r.weights["layers.0.attn.k.bias"]["eps_share"].mean)
    assert np.isnan(r.weights["layers.0.attn.q.bias"]["rel"].mean)      # starts at 0: no ratio
    assert r.weights["layers.0.attn.q.bias"]["abs"].mean > 0
    assert set(r.logits) == {"layers.0.attn", "layers.1.attn"}
    assert all(v["after"].mean > 0 for v in r.logits.values())


def test_eps_note_where_eps_dominates():
    m = _tiny()
    step = settings({"step": "adam", "lr": 1e-3, "batch_size": 2, "adam_eps": 1.0})
    obj = sc.step_object(m, sc.run(m, step, trials=2), step)
    assert obj["summary"]["eps_note"] and "less than lr/2" in obj["summary"]["eps_note"]
    assert all(p["eps_share"] == 1.0 for p in obj["measured"][1:])
    small = settings({"step": "adam", "lr": 1e-3, "batch_size": 2})
    assert sc.step_object(m, sc.run(m, small, trials=2), small)["summary"]["eps_note"] is None
    sgd = settings({"step": "sgd", "lr": 0.1, "batch_size": 2})
    obj = sc.step_object(m, sc.run(m, sgd, trials=2), sgd)
    assert obj["summary"]["eps_note"] is None and all(p["eps_share"] is None for p in obj["measured"][1:])


@pytest.mark.parametrize("kw", [dict(), dict(block="parallel", arch="preln", final_norm=True)])
def test_step_object(kw):
    arch = kw.pop("arch", "postln")
    m = _tiny(arch, **kw)
    step = settings({"step": "adamw", "lr": 1e-3, "batch_size": 2, "weight_decay": 0.1})
    meas = sc.run(m, step, trials=2, seed=4)
    obj = sc.step_object(m, meas, step)
    json.dumps(obj, allow_nan=False)
    assert obj["schema"] == "sigprop.step/1" and obj["seed"] == 4 and obj["predicted"] is None
    assert obj["step"] == {"optimizer": "adamw", "lr": 1e-3, "batch_size": 2, "adam_betas": [0.9, 0.999],
                           "adam_eps": 1e-8, "weight_decay": 0.1, "bias": True, "dropout": "off"}
    pts = obj["measured"]
    assert [(p["layer"], p["sublayer"]) for p in pts] == meas.points[:-1]
    assert set(pts[1]["update"]) == {"var", "rel", "fresh_var", "fresh_rel"}
    assert pts[-1]["update"]["rel"] == pytest.approx(meas.rel_top)
    assert obj["summary"]["update_rel_top"] == pytest.approx(meas.rel_top)
    assert obj["summary"]["update_fresh_rel_top"] == pytest.approx(meas.fresh_rel_top)
    att = [p for p in pts if p["logit_var"] is not None]
    assert len(att) == m.n_layers and all(p["logit_var_after"] > 0 for p in att)
    names = set().union(*(p["weights"] for p in pts[1:]))
    if m.block == "parallel":
        assert {"attn.q", "ffn.in", "norms.attention_in"} <= names and "modules" in pts[1]
        assert obj["summary"]["update_rel_output"] != obj["summary"]["update_rel_top"]
    else:
        assert {"attn.q", "attn.o.bias", "norms.attention_out", "ffn.out", "norms.ffn_out.bias"} <= names
        assert set(pts[1]["modules"]) == {"attn.q", "attn.k", "attn.v", "attn.o"}
        assert set(pts[2]["modules"]) == {"ffn.in", "ffn.out"}
    assert obj["summary"]["largest_weight_rel"]["rel"] > 0


def test_linear_biases():
    assert sc.linear_biases(_tiny()) is True
    assert sc.linear_biases(_tiny(bias=False)) is False
    assert sc.linear_biases(resolve("llama", n_layers=1, d_model=32, n_heads=4, seq_len=8)) is False


def test_hf_biases(tmp_path):
    from sigprop.model.options import build_model
    from tests._paths import ROOT

    hf = ROOT / "tests" / "data" / "hf"
    assert sc.linear_biases(build_model({"hf_config": hf / "gpt2-small.json", "n_layers": 1, "seq_len": 8})) is True
    assert sc.linear_biases(build_model({"hf_config": hf / "tinyllama", "n_layers": 1, "seq_len": 8})) is False
    with pytest.raises(DomainError, match="a bias or none"):
        sc.linear_biases(build_model({"hf_config": hf / "qwen2-0.5b.json", "n_layers": 1, "seq_len": 8}))


def test_memory_guard(monkeypatch):
    import sigprop.mc.component as comp

    monkeypatch.setattr(comp, "available_memory", lambda: 1e6)
    with pytest.raises(DomainError, match="GiB of memory"):
        sc.require_memory(_tiny(d_model=256, seq_len=256), 8)
