"""Whole-model prediction: structure, growth laws, log-space robustness, the trace contract."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from sigprop.model import resolve
from sigprop.model.predict import predict
from sigprop.model.trace import trace

SMALL = dict(d_model=256, n_heads=4, d_ff=1024, seq_len=128)


def _series(points, attr):
    return np.array([getattr(p, attr) for p in points])


def test_trace_has_contract_shape():
    m = resolve("preln", n_layers=3, **SMALL)
    tr = trace(m, predict(m))
    assert tr["schema"] == "sigprop.trace/1"
    assert len(tr["points"]) == 1 + 2 * 3
    assert [p["sublayer"] for p in tr["points"]] == ["input", "attention", "ffn"] * 1 + ["attention", "ffn"] * 2 \
        or [p["sublayer"] for p in tr["points"]][0] == "input"
    p1 = tr["points"][1]
    assert set(p1) >= {"layer", "sublayer", "forward", "backward", "logit_var"}
    assert set(p1["forward"]) == {"mean", "var", "corr"} and set(p1["backward"]) == {"var", "corr"}
    assert tr["points"][2]["logit_var"] is None and isinstance(p1["logit_var"], float)
    json.dumps(tr)  # serialisable, no NaN
    assert tr["model"]["n_layers"] == 3 and len(tr["model"]["layers"]) == 3


def test_input_and_top_points_carry_the_given_states():
    m = resolve("preln", n_layers=2, input_var=2.5, input_corr=0.3, grad_var=0.7, grad_corr=0.1, **SMALL)
    pts = predict(m)
    assert pts[0].var == pytest.approx(2.5) and pts[0].corr == pytest.approx(0.3)
    assert pts[-1].gvar == pytest.approx(0.7) and pts[-1].gcorr == pytest.approx(0.1)


def test_zero_branch_scale_is_the_identity():
    m = resolve("preln", n_layers=5, branch_scale=0.0, input_var=1.7, input_corr=0.4, **SMALL)
    pts = predict(m)
    np.testing.assert_allclose(_series(pts, "var"), 1.7, rtol=1e-12)
    np.testing.assert_allclose(_series(pts, "corr"), 0.4, rtol=1e-12)
    np.testing.assert_allclose(_series(pts, "gvar"), 1.0, rtol=1e-12)


def test_preln_forward_linear_backward_hyperbolic():
    m = resolve("preln", n_layers=96, **SMALL)
    tr = trace(m, predict(m))
    s = tr["summary"]
    assert s["forward_law"] == "linear"
    assert s["grad_law"] == "hyperbolic"
    assert s["grad_ratio_input_output"] > 1


def test_postln_unit_forward_and_geometric_gradient():
    m = resolve("postln", n_layers=96, **SMALL)
    pts = predict(m)
    v = _series(pts[1:], "var")
    assert np.all(np.abs(v - 1) < 0.01)       # LayerNorm output (eps and 1/d aside)
    s = trace(m, pts)["summary"]
    assert s["grad_law"] == "exponential"


def test_lns_variance_grows_slower_than_preln():
    a = predict(resolve("preln", n_layers=192, **SMALL))
    b = predict(resolve("lns", n_layers=192, **SMALL))
    assert b[-1].var < a[-1].var / 5
    assert trace(resolve("lns", n_layers=192, **SMALL), b)["summary"]["forward_law"] == "harmonic"


def test_deep_postln_gradient_stays_finite_in_log_space():
    m = resolve("postln", n_layers=20000, init_std=0.2, d_model=256, n_heads=4, seq_len=64)
    pts = predict(m)
    lg = _series(pts, "log_gvar")
    assert np.all(np.isfinite(lg))
    tr = trace(m, pts, every=1000)
    text = json.dumps(tr)
    assert "NaN" not in text
    if not math.isfinite(pts[0].gvar):
        assert tr["points"][0]["backward"]["var"] == "inf" and "log10_var" in tr["points"][0]["backward"]


def test_predict_cli_json_and_every():
    r = subprocess.run([sys.executable, "-m", "sigprop", "predict", "--arch", "preln", "--layers", "10",
                        "--every", "5", "--json", "--d-model", "256", "--heads", "4"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tr = json.loads(r.stdout)
    assert [p["layer"] for p in tr["points"]] == [0, 5, 5, 10, 10]


@pytest.mark.parametrize("args", [["--arch", "nope"], ["--layers", "0"], ["--dropout", "1.5"],
                                  ["--input-corr", "2"], ["--spec", "/nonexistent.json"], ["--init", "bogus"]])
def test_predict_bad_input(args):
    r = subprocess.run([sys.executable, "-m", "sigprop", "predict", *args], capture_output=True, text=True)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr
