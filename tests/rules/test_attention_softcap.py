"""Soft-capped attention logits (Gemma 2's attn_logit_softcapping: s -> c tanh(s / c) after the
scaling, before the mask): the attention rule's capped statistics against direct sampling of
capped rows, the rule against the attention component's Monte Carlo over a grid of caps and
logit variances, the model field through predict, check, measure and --hf-config."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests._cli import cli

from sigprop.backend import numeric as nm
from sigprop.errors import DomainError
from sigprop.mc.component import measure
from sigprop.mc.components.attention import COMPONENT, SWEEP
from sigprop.model import presets
from sigprop.model.spec import Model
from sigprop.rules.attention import _ROW_CAP, Attention, _cap_row_stats, _row_value
from sigprop.state import Backward, Forward
from tests import _paths

DATA = _paths.DATA / "hf"
RULE = Attention()
NAMES = tuple(_ROW_CAP)


# -- the capped one-row statistics ----------------------------------------------------------

@pytest.mark.parametrize("v", [0.1, 1.0, 5.0])
def test_a_cap_far_above_the_logits_gives_the_gaussian_statistics(v):
    """At a cap 10^5 times the logit scale the capped integrals are the uncapped softmax
    moments (computed by the Gaussian-smoothing integrals, another code path), and a row's
    gradient sum Sc vanishes."""
    st = _cap_row_stats(v, 0.0, 32.0, 1e5, 0.0, NAMES)
    for name in ("A2", "m1", "Bz", "Cz", "T2", "Ajj2", "Ra", "T2e2"):
        assert float(st[name]) == pytest.approx(float(_row_value(nm, name, v, 32.0)), rel=1e-6), name
    assert float(st["trA2"]) == pytest.approx(1 + float(_row_value(nm, "trA2m1", v, 32.0)), rel=1e-6)
    assert abs(float(st["Sc"])) < 1e-9


def _sampled_rows(v, ro, n, cap, rows, rng):
    """The statistics of _ROW_CAP by direct sampling of capped rows: offset o ~ N(0, ro v)
    shared by the row, z_j iid N(0, v), logits cap tanh((o + z) / cap); (mean, se) each."""
    o = rng.standard_normal((rows, 1)) * math.sqrt(ro * v)
    z = rng.standard_normal((rows, n)) * math.sqrt(v)
    t = np.tanh((o + z) / cap)
    y, fp = cap * t, 1 - t * t
    P = np.exp(y - y.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    sp2 = (P**2).sum(axis=1, keepdims=True)
    fbar = (P * fp).sum(axis=1, keepdims=True)
    w = fp * z
    wbar = (P * w).sum(axis=1, keepdims=True)
    per_row = {
        "A2": sp2[:, 0], "m1": (P * z).sum(axis=1),
        "T2": (fp**2 * (P**2 - 2 * P**3 + P**2 * sp2)).sum(axis=1),
        "trA2": (fp * (P - P**2)).sum(axis=1) ** 2,
        "Ra": (P**2 * (w - wbar) ** 2).sum(axis=1) / v,
        "Sc": (P**2 * (fp - fbar) ** 2).sum(axis=1),
        "Bz": (P * z).sum(axis=1) ** 2 / v,
    }
    return {k: (a.mean(), a.std() / math.sqrt(rows)) for k, a in per_row.items()}


@pytest.mark.parametrize("v,ro,n,cap", [(3.0, 1.0, 64, 5.0), (13.0, 1.0, 64, 5.0), (13.0, 9.0, 16, 5.0),
                                        (4.0, 0.0, 64, 2.0), (13.0, 1.0, 64, 20.0), (1.0, 4.0, 8, 1.0)])
def test_capped_row_statistics_against_sampling(v, ro, n, cap):
    rng = np.random.default_rng(7)
    sampled = _sampled_rows(v, ro, n, cap, 40000, rng)
    st = _cap_row_stats(v, ro, float(n), cap, 0.0, NAMES)
    for name, (mean, se) in sampled.items():
        got = float(st[name])
        assert abs(got - mean) <= 4.5 * se + 2e-3 * abs(mean), (name, got, mean, se)


# -- the rule against the attention component's Monte Carlo --------------------------------

def _case(cap, w, r, causal, p=0.0, L=32):
    pt = dict(x_std=1.0, g_std=1.0, wv_std_sqrt_d=1.0, d=256, n_heads=4, d_head=64, L=L, p=p, g_corr=0.5,
              x_corr=r, causal=causal, wqk_std_sqrt_d=w, budget=4096, max_seq=256, min_runs=8)
    if cap:
        pt["softcap"] = cap
    return SWEEP.make_case(pt)


GRID = [(cap, w, r, causal) for cap in (5.0, 20.0, 50.0) for w, r in ((1.0, 0.0), (1.9, 0.5), (1.9, 0.9))
        for causal in (0, 1)]


@pytest.fixture(scope="module")
def measured():
    """The component measured on GRID (16 weight draws x 8 sequences of 32 tokens each)."""
    out = {}
    for i, key in enumerate(GRID):
        c = _case(*key)
        out[key] = (c, measure(COMPONENT, c.sim_params, c.x, c.g, runs=16, batch=8, seed=100 + i))
    return out


def _rel(pred, meas):
    return abs(float(pred) / float(meas) - 1)


@pytest.mark.parametrize("key", GRID)
def test_rule_matches_the_capped_component(measured, key):
    c, ms = measured[key]
    px, pg = RULE.evaluate(c.x, c.g, **c.rule_params)
    assert _rel(px.var, ms.x.var) < max(0.04, 4 * ms.x.var_se / ms.x.var)
    assert _rel(pg.var, ms.g.var) < max(0.08, 4 * ms.g.var_se / ms.g.var)
    assert abs(float(px.corr) - ms.x.corr) < 0.02
    assert abs(float(pg.corr) - ms.g.corr) < 0.03


def test_the_cap_moves_the_moments_beyond_the_tolerance(measured):
    """The comparison can fail: at the cap 5 points with logit variance ~13 the uncapped rule
    is far outside the tolerance the capped rule meets."""
    for key in [k for k in GRID if k[0] == 5.0 and k[1] == 1.9]:
        c, ms = measured[key]
        plain = {k: v for k, v in c.rule_params.items() if k != "softcap"}
        px, pg = RULE.evaluate(c.x, c.g, **plain)
        assert _rel(pg.var, ms.g.var) > 0.2 or _rel(px.var, ms.x.var) > 0.2, key


def test_no_cap_is_the_uncapped_rule():
    """softcap 0 is the rule without the parameter, bit for bit, and a huge cap its limit."""
    c = _case(0.0, 1.4, 0.5, 1)
    a = RULE.evaluate(c.x, c.g, **c.rule_params)
    b = RULE.evaluate(c.x, c.g, **c.rule_params, softcap=0.0)
    assert a == b
    big = RULE.evaluate(c.x, c.g, **c.rule_params, softcap=1e5)
    for u, w in zip((*a[0], *a[1]), (*big[0], *big[1])):
        assert float(w) == pytest.approx(float(u), rel=1e-4, abs=1e-9)


def test_mixed_arrays_of_caps():
    """An array of configurations with and without a cap: each entry as evaluated alone."""
    c = _case(0.0, 1.9, 0.5, 0)
    caps = np.array([0.0, 5.0, 50.0])
    xs = Forward(np.full(3, c.x.mean), np.full(3, c.x.var), np.full(3, c.x.corr))
    gs = Backward(np.full(3, c.g.var), np.full(3, c.g.corr))
    fx, fg = RULE.evaluate(xs, gs, **c.rule_params, softcap=caps)
    for i, cap in enumerate(caps):
        ox, og = RULE.evaluate(c.x, c.g, **c.rule_params, softcap=float(cap))
        assert float(fx.var[i]) == pytest.approx(float(ox.var), rel=1e-9)
        assert float(fg.var[i]) == pytest.approx(float(og.var), rel=1e-9)


def test_symbolic_form_is_refused_with_a_cap():
    import sigprop.backend.symbolic as sm

    c = _case(5.0, 1.0, 0.5, 0)
    p = RULE.param_values(c.rule_params)
    with pytest.raises(DomainError, match="softcap"):
        RULE.forward(sm, Forward(0, c.x.var, c.x.corr), p)
    with pytest.raises(DomainError, match="softcap"):
        RULE.backward(sm, Forward(0, c.x.var, c.x.corr), Backward(c.g.var, c.g.corr), p)


# -- the model field -------------------------------------------------------------------------

def _capped_model(cap, w=1.9, layers=3, seq_len=32, causal=True):
    m = presets.resolve(arch="preln", n_layers=layers, d_model=128, n_heads=4, seq_len=seq_len, causal=causal,
                        dropout=0.0)
    obj = m.to_json()
    for layer in obj["layers"]:
        for name in ("q", "k"):
            layer["attention"]["init"][name]["std"] = w / math.sqrt(128)
        for name in ("v", "o"):
            layer["attention"]["init"][name]["std"] = 1 / math.sqrt(128)
    if cap is not None:
        obj["attn_softcap"] = cap
    return Model.from_json(obj)


def test_model_field_round_trip_and_checks():
    m = _capped_model(5)
    assert m.attn_softcap == 5.0 and "attn_softcap" in m.features()
    obj = m.to_json()
    assert obj["attn_softcap"] == 5.0 and Model.from_json(obj) == m
    assert "attn_softcap" not in _capped_model(None).to_json()
    assert Model.from_json({**obj, "attn_softcap": None}).attn_softcap is None
    for bad in (0, -1.0, "5", True, float("inf")):
        with pytest.raises(DomainError, match="attn_softcap"):
            Model.from_json({**obj, "attn_softcap": bad})


def test_predict_threads_the_cap():
    """The capped model's trace differs from the uncapped one's (the attention rule gets the
    cap), and its logit variance is the uncapped logits'."""
    from sigprop.model.predict import predict

    a, b = predict(_capped_model(5)), predict(_capped_model(None))
    assert abs(a[0].gvar / b[0].gvar - 1) > 0.05 and abs(a[-1].var / b[-1].var - 1) > 0.05
    assert a[1].logit_var == b[1].logit_var                  # (the first attention: the same input)


def test_check_of_a_capped_causal_model(monkeypatch, tmp_path, capsys):
    """The whole-model Monte Carlo of a capped causal model agrees with the prediction
    (sigprop check), and the capped simulation against the uncapped prediction does not."""
    from sigprop.mc.model import simulate
    from sigprop.model.checking import compare
    from sigprop.model.predict import predict

    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    m = _capped_model(2.0)
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps(m.to_json()))
    code, out, err = cli(capsys, "check", "--spec", str(spec), "--trials", "6", "--batch", "6", "--json")
    assert code == 0, err
    assert json.loads(out)["pass"] is True
    meas = simulate(m, batch=6, trials=6, seed=0)
    assert not compare(predict(_capped_model(None)), meas).passed


def test_symbolic_and_solve_refuse_the_cap(tmp_path, capsys):
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps(_capped_model(5).to_json()))
    code, out, err = cli(capsys, "predict", "--spec", str(spec), "--symbolic")
    assert code == 2 and out == "" and "attn_softcap" in err
    code, out, err = cli(capsys, "solve-init", "--hf-config", str(DATA / "gemma2-2b.json"), "--layers", "2",
                         "--seq-len", "32", "--target", "unit-forward")
    assert code == 2 and out == "" and "attn_softcap" in err


# -- --hf-config -----------------------------------------------------------------------------

def test_gemma2_maps_attn_logit_softcapping():
    """Gemma 2 2B's config.json (attn_logit_softcapping 50, final_logit_softcapping 30): the
    model is the uncapped config's with attn_softcap 50; the final cap is named in the notes."""
    from sigprop.interop.hf import read_config, resolve

    capped = resolve(read_config(DATA / "gemma2-2b.json"))
    plain = resolve(read_config(DATA / "gemma2-2b-uncapped.json"))
    assert capped.model.attn_softcap == 50.0 and plain.model.attn_softcap is None
    assert capped.model.replace(attn_softcap=None) == plain.model
    notes = " ".join(capped.notes)
    assert "attn_logit_softcapping 50" in notes and "final_logit_softcapping" in notes


def test_gemma2_softcap_cli(tmp_path, capsys):
    cfg = json.loads((DATA / "gemma2-2b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, err = cli(capsys, "predict", "--hf-config", str(path), "--layers", "2", "--seq-len", "32", "--json")
    assert code == 0, err
    assert json.loads(out)["model"]["attn_softcap"] == 50.0
    path.write_text(json.dumps({**cfg, "attn_logit_softcapping": -1.0}))
    code, out, err = cli(capsys, "predict", "--hf-config", str(path), "--layers", "2", "--seq-len", "32")
    assert code == 2 and out == "" and "attn_logit_softcapping" in err and len(err.strip().splitlines()) == 1


# -- torch: the plain reference model and transformers' Gemma 2 ------------------------------

def _need(module):
    import importlib
    import os

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("SIGPROP_REQUIRE_TORCH") == "1":
            pytest.fail(f"{module} is not installed but SIGPROP_REQUIRE_TORCH=1")
        pytest.skip(f"{module} not installed")


@pytest.fixture
def one_thread():
    torch = _need("torch")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(old)


def test_plain_torch_model_with_a_cap(one_thread):
    from sigprop.interop.torch_names import PLAIN
    from sigprop.torch.measure import compare_measured, measure as torch_measure, module_source
    from sigprop.torch.plain import PlainTransformer

    m = _capped_model(2.0)
    meas = torch_measure(m, module_source(lambda: PlainTransformer(m), layout=PLAIN), trials=6, batch=4, seed=0)
    assert compare_measured(m, meas)[1].passed
    assert not compare_measured(_capped_model(None), meas)[1].passed


def test_transformers_gemma2_with_a_cap(one_thread):
    """transformers' own Gemma 2 (2 layers, d_model 128, its random init at initializer_range
    0.1, so that the logits reach variance ~1.6), attn_logit_softcapping 1: measured against
    the prediction of --hf-config, and against the same model without the cap."""
    _need("transformers")
    from tests._torch_configs import CONFIGS
    from sigprop.interop import hf
    from sigprop.interop.torch_names import layout
    from sigprop.torch.measure import compare_measured, hf_source, measure as torch_measure

    cfg = dict(CONFIGS["gemma2"], attn_logit_softcapping=1.0, initializer_range=0.1, num_hidden_layers=2)
    r = hf.resolve(cfg, seq_len=32)
    assert r.model.attn_softcap == 1.0
    src = hf_source(r.config, r.family, layout=layout("hf:" + r.family))
    meas = torch_measure(r.model, src, trials=4, batch=4, seed=0)
    assert compare_measured(r.model, meas)[1].passed
    assert not compare_measured(r.model.replace(attn_softcap=None), meas)[1].passed


def test_long_capped_causal_rotary_sequences_refused_in_one_line(capsys):
    """The capped rule's per-row-length integrals make a long causal rotary prediction take
    minutes (Gemma 2 2B at 256 tokens: more than 5): refused before anything runs."""
    import time

    from tests._cli import cli
    t = time.perf_counter()
    code, out, err = cli(capsys, "predict", "--hf-config", "tests/data/hf/gemma2-2b.json", "--seq-len", "256")
    assert code == 2 and not out and err.count("\n") == 1
    assert "soft-capped causal attention with rotary positions is predicted up to 64 tokens" in err
    assert time.perf_counter() - t < 30
