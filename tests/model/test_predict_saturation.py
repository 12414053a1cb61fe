"""Degenerate and unstable models: saturated softmax (diagnosed, the trace stops there),
branches that add nothing (zero-variance states), and zero or one-token inputs (refused)."""

import json
import math
import subprocess
import sys

import pytest

from sigprop.errors import DomainError
from sigprop.mc.model import simulate
from sigprop.model import resolve
from sigprop.model.checking import compare as check_points
from sigprop.model.predict import predict, row_logit_var
from sigprop.model.spec import Model
from sigprop.model.trace import summary, trace
from sigprop.rules import get
from sigprop.state import Backward, Forward

TINY = dict(d_model=64, n_heads=2, d_ff=256, seq_len=16)
TINY_ARGS = ["--d-model", "64", "--heads", "2", "--d-ff", "256", "--seq-len", "16"]


def _sigprop(*args):
    return subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, text=True)


def _one_line_exit_2(r):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _with_init(model: Model, changes: dict) -> Model:
    """``model`` with init stds replaced: changes[(layer index or None for all, kind, weight)] = std."""
    obj = model.to_json()
    for (layer, kind, w), v in changes.items():
        for i, lay in enumerate(obj["layers"]):
            if layer is None or layer == i:
                lay[kind]["init"][w]["std"] = v
    return Model.from_json(obj)


def _saturating(n_layers=4, at=2):
    """A small Pre-LN model whose layer ``at + 1`` (1-based) has q/k stds of 1: at d 64 its
    attention's row logit variance is ~3.3e3, beyond the attention rule's 100."""
    return _with_init(resolve("preln", n_layers=n_layers, **TINY), {(at, "attention", "q"): 1.0,
                                                                    (at, "attention", "k"): 1.0})


# -- saturation ------------------------------------------------------------------------------

def test_row_logit_var_is_the_quantity_the_attention_rule_bounds():
    """The predictor's stopping test and the rule's domain check agree: just above the bound the
    rule refuses, just below it evaluates."""
    from sigprop.rules.attention import ROW_LOGIT_VAR_MAX

    x = Forward(0.3, 1.7, 0.25)
    base = dict(d=64, n_heads=2, d_head=32, L=16, p=0.1, causal=0, q_std=0.1, k_std=0.1, v_std=0.1, o_std=0.1,
                q_bias_std=0.05, k_bias_std=0.0, v_bias_std=0.0, o_bias_std=0.0)
    # row_logit_var is quadratic in k_std: put it at 1.01 x and 0.99 x the bound
    k_at_bound = 0.1 * math.sqrt(ROW_LOGIT_VAR_MAX / row_logit_var(base, x))
    for f, refused in ((1.005, True), (0.995, False)):
        p = {**base, "k_std": k_at_bound * f}
        assert (row_logit_var(p, x) > ROW_LOGIT_VAR_MAX) == refused
        if refused:
            with pytest.raises(DomainError, match="row logit variance"):
                get("attention").evaluate(x, Backward(1.0, 0.0), **p)
        else:
            get("attention").evaluate(x, None, **p)


def test_saturating_model_stops_before_the_layer():
    m = _saturating()
    with pytest.raises(DomainError, match="row logit variance"):
        predict(m)                                   # the library default refuses, as before
    pts = predict(m, stop_at_saturation=True)
    assert pts.saturation_layer == 3 and "layer 3" in pts.domain_note and "row logit variance" in pts.domain_note
    assert [(p.layer, p.sublayer) for p in pts] == [(0, "input"), (1, "attention"), (1, "ffn"),
                                                    (2, "attention"), (2, "ffn")]
    # the points are those of the model cut off before layer 3, the upstream gradient given at
    # the output of layer 2 (tables may serve one and not the other: 1e-4)
    cut = predict(resolve("preln", n_layers=2, **TINY))
    for a, b in zip(pts, cut):
        assert a.log_var == pytest.approx(b.log_var, abs=1e-4) and a.corr == pytest.approx(b.corr, abs=1e-4)
        assert a.log_gvar == pytest.approx(b.log_gvar, abs=1e-4) and a.gcorr == pytest.approx(b.gcorr, abs=1e-4)
    assert pts[-1].gvar == m.grad.var
    s = summary(pts)
    assert s["saturation_layer"] == 3 and s["domain_note"] == pts.domain_note
    assert s["verdict"] == f"unstable: softmax saturates at layer 3 ({pts.domain_note})"
    tr = trace(m, pts)
    assert len(tr["points"]) == 5 < 1 + 2 * m.n_layers


def test_complete_trace_says_so():
    m = resolve("preln", n_layers=2, **TINY)
    s = summary(predict(m, stop_at_saturation=True))
    assert s["saturation_layer"] is None and s["domain_note"] is None
    assert not s["verdict"].startswith("unstable: softmax")


def test_saturation_at_the_first_layer_leaves_the_input_point():
    m = resolve("postln", n_layers=3, init_std=1.0, **TINY)
    pts = predict(m, stop_at_saturation=True)
    assert len(pts) == 1 and pts.saturation_layer == 1
    assert pts[0].gvar == m.grad.var and pts[0].var == m.input.var
    s = summary(pts)
    assert s["max_logit_var"] is None and s["verdict"].startswith("unstable: softmax saturates at layer 1 (")


def test_predict_cli_saturated_model_exit_0_with_valid_json():
    r = _sigprop("predict", "--init-std", "1", "--layers", "48", "--json")
    assert r.returncode == 0, r.stderr
    tr = json.loads(r.stdout)
    s = tr["summary"]
    assert s["saturation_layer"] == 1 and s["verdict"].startswith("unstable: softmax saturates at layer 1 (")
    assert "beyond 100" in s["domain_note"]
    assert tr["schema"] == "sigprop.trace/1" and len(tr["points"]) == 1 and tr["model"]["n_layers"] == 48


def test_predict_and_compare_cli_with_a_spec_saturating_mid_model(tmp_path):
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({"model": _saturating().to_json()}))
    r = _sigprop("predict", "--spec", str(spec), "--json")
    assert r.returncode == 0, r.stderr
    tr = json.loads(r.stdout)
    assert tr["summary"]["saturation_layer"] == 3 and len(tr["points"]) == 5
    r = _sigprop("predict", "--spec", str(spec))
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "trace stops after layer 2" in text and "verdict: unstable: softmax saturates at layer 3" in text
    r = _sigprop("compare", "--spec", str(spec), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"][0]["summary"]["saturation_layer"] == 3
    r = _sigprop("compare", "--spec", str(spec))
    assert r.returncode == 0 and "preln*" in r.stdout
    # check cannot compare beyond the prediction: one line, exit 2
    r = _sigprop("check", "--spec", str(spec), "--trials", "2", "--batch", "1")
    _one_line_exit_2(r)
    assert "stops before layer 3" in r.stderr


def test_compare_row_label_names_the_saturation():
    from sigprop.compare import row

    r = row(_saturating())
    assert r.saturation_layer == 3 and r.label.endswith("(saturates at layer 3)")
    assert row(resolve("preln", n_layers=2, **TINY)).label == "Pre-LN"


# -- branches that add nothing ---------------------------------------------------------------

@pytest.mark.parametrize("name,params,mean", [
    ("linear", dict(d_in=64, d_out=32, w_std=0.1, b_std=0.0), 0.0),
    ("linear", dict(d_in=64, d_out=32, w_std=0.1, b_std=0.3), 0.0),
    ("dropout", dict(p=0.1), 0.0),
    ("relu", {}, 0.0),
    ("gelu", {}, 0.0),
    ("layernorm", dict(d=64), 0.0),
    ("layernorm", dict(d=64), 2.0),
    ("residual", dict(a=1.0, b=0.0), 0.0),
])
def test_rules_take_zero_variance_states(name, params, mean):
    """A zero-variance signal (an all-zero branch output) is a state: finite image, correlation
    0 where the variance is 0, never NaN."""
    y, g = get(name).evaluate(Forward(mean, 0.0, 0.4), Backward(1.0, 0.2), **params)
    assert all(math.isfinite(float(v)) for v in (*y, *g))
    if float(y.var) == 0:
        assert float(y.corr) == 0.0
    if name == "linear":
        # the output is the bias alone: variance b_std^2, shared by every token
        assert float(y.var) == pytest.approx(params["b_std"] ** 2, abs=0)
        if params["b_std"]:
            assert float(y.corr) == 1.0
    if name in ("dropout", "relu", "gelu", "layernorm"):
        assert float(y.var) == 0.0      # (LayerNorm of a constant row: x - mean(x) = 0)


def _zero_branch_models():
    pre = resolve("preln", n_layers=3, **TINY)
    post = resolve("postln", n_layers=3, **TINY)
    out0 = {(None, "attention", "o"): 0.0, (None, "ffn", "out"): 0.0}
    return {
        "preln init 0": resolve("preln", n_layers=3, init_std=0.0, **TINY),
        "postln init 0": resolve("postln", n_layers=3, init_std=0.0, **TINY),
        "preln zero output projections": _with_init(pre, out0),
        "postln zero output projections": _with_init(post, out0),
        "postln branch scale 0": resolve("postln", n_layers=3, branch_scale=0.0, **TINY),
        "preln init 0 causal": resolve("preln", n_layers=3, init_std=0.0, causal=True, **TINY),
        "postln zero output projections causal": _with_init(resolve("postln", n_layers=3, causal=True, **TINY), out0),
    }


@pytest.mark.parametrize("name", list(_zero_branch_models()))
def test_zero_branches_predict_and_match_monte_carlo(name):
    m = _zero_branch_models()[name]
    pts = predict(m)
    tr = trace(m, pts)
    json.dumps(tr, allow_nan=False)
    assert len(pts) == 1 + 2 * m.n_layers
    meas = simulate(m, batch=4, trials=4, seed=11)
    res = check_points(pts, meas)
    assert res.passed, res.failures[:3]
    if name.startswith("preln"):
        # a branch that adds nothing leaves the stream and passes no gradient through it: the
        # skip (scale 1) alone, exactly
        assert all(p.var == pytest.approx(m.input.var, rel=1e-12) for p in pts)
        assert all(p.corr == pytest.approx(m.input.corr, rel=1e-12) for p in pts)
        assert all(p.gvar == pytest.approx(m.grad.var, rel=1e-12) for p in pts)


def test_postln_zero_branch_is_layernorm_of_the_skip():
    """x' = LN(a x + 0): every point is the LayerNorm of the one before; from the second on,
    the LayerNorm of a LayerNorm output (centred rows of fixed norm): variance v / (v + eps),
    correlation unchanged."""
    m = resolve("postln", n_layers=4, branch_scale=0.0, **TINY)
    pts = predict(m)
    for prev, p in zip(pts[1:], pts[2:]):
        assert p.var == pytest.approx(prev.var / (prev.var + 1e-5), rel=1e-12)
        assert p.corr == pytest.approx(prev.corr, rel=1e-12)
    assert 0.99 < pts[-1].var < 1.0


def test_zero_branch_cli_predict_and_check():
    r = _sigprop("predict", "--init-std", "0", "--layers", "3", "--json", *TINY_ARGS)
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr
    json.loads(r.stdout)
    r = _sigprop("check", "--arch", "postln", "--init-std", "0", "--layers", "3", "--trials", "4", "--batch", "4",
                 "--json", *TINY_ARGS)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["pass"] and out["errors"]["logit_var_relerr"]["max"] == 0.0   # predicted 0, measured 0


# -- degenerate inputs -----------------------------------------------------------------------

@pytest.mark.parametrize("cmd", ["predict", "check", "compare"])
@pytest.mark.parametrize("args,word", [
    (["--seq-len", "1"], "a token correlation needs two tokens"),
    (["--grad-var", "0"], "grad"),
    (["--input-var", "0"], "input"),
    (["--skip-scale", "0", "--branch-scale", "0"], "vanishes"),
    (["--skip-scale", "0", "--init-std", "0"], "vanishes"),
])
def test_degenerate_values_are_bad_input(cmd, args, word):
    r = _sigprop(cmd, "--layers", "2", "--d-model", "64", "--heads", "2", "--d-ff", "256",
                 *(["--trials", "2", "--batch", "1"] if cmd == "check" else []), *args)
    _one_line_exit_2(r)
    assert word in r.stderr


@pytest.mark.parametrize("args", [["--qk-norm", "--input-corr", "1"], ["--arch", "olmo2", "--input-mean", "1e8"]])
def test_fully_correlated_keys_under_qk_norm_are_predicted(args):
    # (rank-collapsed tokens, or a mean that swamps the variance: the keys' correlation is 1,
    # where QK-norm's backward read a statistic it had not computed: a traceback)
    r = _sigprop("predict", "--layers", "2", "--json", *args)
    assert r.returncode == 0, r.stderr
    pts = json.loads(r.stdout, parse_constant=pytest.fail)["points"]      # (no NaN or Infinity)
    assert all(p["backward"]["var"] > 0 for p in pts)


@pytest.mark.parametrize("arch", ["preln", "llama", "gpt2", "olmo2"])
def test_one_token_is_refused_alike_with_and_without_a_token_embedding(arch):
    # (a preset with a token embedding met the embedding rule's own bound first, worded
    # "embedding: L must lie in [2, inf]")
    r = _sigprop("predict", "--arch", arch, "--seq-len", "1", "--layers", "2")
    _one_line_exit_2(r)
    assert "seq-len must be an integer in [2, " in r.stderr and "(a token correlation needs two tokens), got 1" in r.stderr


@pytest.mark.parametrize("path,value,word", [(("seq_len",), 1, "seq_len must be >= 2"),
                                             (("grad", "var"), 0.0, "grad.var must be > 0")])
def test_spec_degenerate_values_are_bad_input(tmp_path, path, value, word):
    obj = resolve("preln", n_layers=2, **TINY).to_json()
    target = obj
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({"model": obj}))
    r = _sigprop("predict", "--spec", str(spec))
    _one_line_exit_2(r)
    assert word in r.stderr


def test_truncated_model_and_plot_data_of_a_saturated_row():
    from sigprop.compare import row
    from sigprop.plot import figure_data

    m = _saturating()
    cut = m.truncated(2)
    assert cut.n_layers == 2 and cut.to_json()["layers"] == m.to_json()["layers"][:2]
    assert cut.grad == m.grad and cut.input == m.input
    with pytest.raises(DomainError):
        m.truncated(0)
    r = row(m)
    data = figure_data([r], [simulate(cut, batch=1, trials=2, seed=0)])
    (curve,) = data.lines["forward_var"]
    assert curve.label.endswith("(saturates at layer 3)") and curve.x.max() == 2
    (marks,) = data.markers["forward_var"]
    assert marks.x.max() == 2


@pytest.mark.parametrize("arch", ["preln", "postln"])
def test_two_token_causal_model_predicts_and_matches_monte_carlo(arch):
    """seq_len 2 (the fewest tokens a correlation needs), causal: row 0 has one key, so no
    two rows share a key's logit path (the position profile used to divide 0 by 0: exit 3)."""
    m = resolve(arch, n_layers=2, causal=True, **{**TINY, "seq_len": 2})
    pts = predict(m)
    res = check_points(pts, simulate(m, batch=64, trials=8, seed=3))
    assert res.passed, res.failures[:3]


def test_saturation_met_inside_a_sublayer_ends_the_trace_too(monkeypatch):
    """The rule's own refusal inside the sublayer (here with the predictor's check disabled)
    ends the pass at the same layer, with the rule's words as the note."""
    import sigprop.model.predict as pr

    monkeypatch.setattr(pr, "row_logit_var", lambda p, x: 0.0)
    pts = predict(_saturating(), stop_at_saturation=True)
    assert pts.saturation_layer == 3 and len(pts) == 5
    assert pts.domain_note.startswith("attention row logit variance") and pts.domain_note.endswith("at layer 3")


def test_check_object_writes_an_infinite_relative_error_as_inf():
    # (a measured logit variance of 0 against a nonzero prediction: its relative error is inf,
    # which the check's JSON wrote as the non-JSON token Infinity)
    import dataclasses

    from sigprop.model.checking import check_object

    m = resolve("preln", n_layers=1, **TINY)
    meas = simulate(m, batch=2, trials=2, seed=0)
    assert meas.logit_var[1] is not None
    meas = dataclasses.replace(meas, logit_var=[None, (0.0, 0.0), *meas.logit_var[2:]])
    res = check_points(predict(m), meas)
    assert res.errors["logit_var_relerr"]["max"] == float("inf")
    obj = check_object(m, res, meas, 0, 2, 2)
    assert obj["errors"]["logit_var_relerr"]["max"] == "inf"
    json.dumps(obj, allow_nan=False)


def test_summary_of_a_trace_stopped_in_layer_1_names_no_law():
    # (with only the input point the laws read "constant", beside the verdict "unstable")
    m = resolve("preln", n_layers=2, init_std=10.0, **TINY)
    pts = predict(m, stop_at_saturation=True)
    assert pts.saturation_layer == 1 and len(pts) == 1
    s = summary(pts)
    assert s["forward_law"] == s["grad_law"] == "undetermined"
    assert s["n_layers"] == 0 and s["verdict_class"] == "unstable"
