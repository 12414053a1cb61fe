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


@pytest.mark.parametrize("arch", ["preln", "postln"])
def test_weights_whose_squares_underflow_predict_like_zero_weights(arch):
    """Weight stds of 1e-300 (their fourth powers underflow to 0 in the value path's scale)
    predict as the zero init does (a ZeroDivisionError, exit 3, before): the branches add
    nothing, the stream and the gradient pass unchanged."""
    tiny = predict(resolve(arch, n_layers=6, init_std=1e-300, **SMALL))
    zero = predict(resolve(arch, n_layers=6, init_std=0.0, **SMALL))
    for k in ("var", "corr", "gvar"):
        np.testing.assert_allclose(_series(tiny, k), _series(zero, k), rtol=1e-12, atol=1e-300)


def test_preln_forward_linear_backward_hyperbolic():
    m = resolve("preln", n_layers=96, **SMALL)
    tr = trace(m, predict(m))
    s = tr["summary"]
    assert s["forward_law"] == "linear"
    assert s["grad_law"] == "hyperbolic"
    assert s["grad_ratio_input_output"] > 1


def test_postln_unit_forward_and_geometric_gradient():
    m = resolve("postln", n_layers=48, init_std=0.05, **SMALL)   # strong branch: r settles fast
    pts = predict(m)
    v = _series(pts[1:], "var")
    assert np.all(np.abs(v - 1) < 0.01)       # LayerNorm output (eps and 1/d aside)
    # geometric once the correlation has settled: a constant per-layer factor at the top
    per_layer = [pts[0]] + [p for p in pts if p.sublayer == "ffn"]
    steps = np.diff(_series(per_layer, "log_gvar"))
    # (the direction depends on the gains: here the gradient vanishes towards the input)
    # the per-layer factor converges (its changes shrink geometrically) to a constant; the top
    # layer itself differs (the injected gradient is isotropic, not yet in the tangent space
    # of the LayerNorms below: LayerNorm g_generic)
    top = steps[-13:-1]
    changes = np.abs(np.diff(top))
    assert np.all(changes[1:] < changes[:-1])
    assert changes[-1] < 0.01 * abs(top[-1])


def test_lns_variance_grows_slower_than_preln():
    a = predict(resolve("preln", n_layers=48, init_std=0.04, **SMALL))
    b = predict(resolve("lns", n_layers=48, init_std=0.04, **SMALL))
    v0 = a[0].var
    assert b[-1].var - v0 < (a[-1].var - v0) / 5      # H_48 = 4.5 against 48
    assert trace(resolve("lns", n_layers=48, init_std=0.04, **SMALL), b)["summary"]["forward_law"] == "harmonic"


def test_overflow_is_carried_in_log_space():
    # skip scale 3 multiplies the stream variance (forward) and the gradient variance (backward,
    # through the skip path) by 9 per sublayer; starting at 1e300 both leave the double range
    m = resolve("preln", n_layers=6, skip_scale=3.0, input_var=1e300, grad_var=1e300,
                d_model=64, n_heads=2, seq_len=8)
    pts = predict(m)
    lv, lg = _series(pts, "log_var"), _series(pts, "log_gvar")
    assert np.all(np.isfinite(lv)) and np.all(np.isfinite(lg))
    # independent check: the skip path alone gives log var >= log(1e300) + k log 9
    k = np.arange(len(pts))
    assert np.all(lv >= math.log(1e300) + k * math.log(9) - 1e-9)
    assert np.all(np.diff(lg) < 0)          # the gradient grows towards the input
    tr = trace(m, pts)
    text = json.dumps(tr)
    assert "NaN" not in text
    top, bottom = tr["points"][-1], tr["points"][0]
    assert top["forward"]["var"] == "inf" and top["forward"]["log10_var"] > 308
    assert bottom["backward"]["var"] == "inf" and bottom["backward"]["log10_var"] > 308
    assert tr["summary"]["forward_law"] == "exponential"


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


def test_logit_moment_estimator_matches_brute_force():
    from sigprop.mc.model import _logit_moments

    rng = np.random.default_rng(0)
    Qs, K = rng.normal(size=(2, 3, 7, 5)), rng.normal(0.3, 1.0, size=(2, 3, 7, 5))
    S = Qs @ K.transpose(0, 1, 3, 2)
    first, second = _logit_moments(object(), (None, Qs, K))
    assert first == pytest.approx(S.mean()) and second == pytest.approx((S**2).mean())


def test_check_small_model_passes():
    r = subprocess.run([sys.executable, "-m", "sigprop", "check", "--arch", "preln", "--layers", "3",
                        "--d-model", "64", "--heads", "2", "--d-ff", "256", "--seq-len", "16",
                        "--trials", "4", "--batch", "4", "--json", "--seed", "2"], capture_output=True, text=True)
    out = json.loads(r.stdout)
    assert out["schema"] == "sigprop.check/1" and out["seed"] == 2
    assert len(out["predicted"]) == len(out["measured"]) == 7
    assert r.returncode == (0 if out["pass"] else 1)
    assert out["pass"], out["failures"]


@pytest.mark.parametrize("arch", ["postln", "deepnorm"])
def test_check_small_postln_gradient(arch):
    """Post-LN gradients pass through a LayerNorm per sublayer: at d 64 a 1/d error per
    LayerNorm (the Gaussian per-token assumption) would compound to ~25% over 12 sublayers;
    the stream's per-token statistics keep the prediction within a few percent."""
    r = subprocess.run([sys.executable, "-m", "sigprop", "check", "--arch", arch, "--layers", "6",
                        "--d-model", "64", "--heads", "2", "--d-ff", "256", "--seq-len", "32",
                        "--trials", "8", "--batch", "4", "--json", "--seed", "5", "--dropout", "0",
                        "--init-std", "0.02"], capture_output=True, text=True)
    out = json.loads(r.stdout)
    pred = np.array([p["backward"]["var"] for p in out["predicted"]])
    meas = np.array([p["backward"]["var"] for p in out["measured"]])
    se = np.array([p["se"]["backward"]["var"] for p in out["measured"]])
    assert np.all(np.abs(pred - meas) <= np.maximum(0.03 * meas, 4 * se)), (pred, meas, se)


def test_growth_laws_linear_over_decades_and_mixed():
    from sigprop.model.growth import classify

    l = np.arange(1, 769, dtype=float)
    assert classify(l, np.log(1 + 0.5 * l)).law == "linear"          # Pre-LN: spans 2.5 decades
    assert classify(l, np.log(1 / (1 + 0.01 * l))).law == "hyperbolic"
    assert classify(l, -0.02 * l).law == "exponential"
    # constant for a quarter of the depth, then linear (Mix-LN): no single law
    mixed = np.where(l < 192, 1.0, 1 + 0.5 * (l - 192))
    g = classify(l, np.log(mixed))
    assert g.law == "mixed" and g.best in ("linear", "exponential", "harmonic", "hyperbolic")


def test_growth_law_of_a_series_spanning_more_than_a_double():
    from sigprop.model.growth import classify

    l = np.arange(1, 61, dtype=float)
    g = classify(l, 27.6 * l)                      # x1e12 per layer, e^1656 overall
    assert g.law == "exponential" and g.slope == pytest.approx(27.6)
    r = subprocess.run([sys.executable, "-m", "sigprop", "predict", "--arch", "preln", "--skip-scale", "1e3",
                        "--layers", "30", "--d-model", "32", "--heads", "2", "--d-ff", "64", "--seq-len", "8",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["forward_law"] == "exponential"


@pytest.mark.parametrize("every", [1, 3])
def test_trace_text_equals_json_dumps_of_trace(every):
    """`predict --json` writes the trace text directly (trace_text); it must be exactly
    json.dumps of the trace dict: uniform stacks, per-layer parameters (DeepScaleLM's
    per-layer scales, LayerNorm Scaling's norm scales), overflowing values ("inf" strings
    and log10 fields), None logit variances."""
    from sigprop.model.trace import trace_text

    models = [
        resolve("preln", n_layers=7, **SMALL),
        resolve("dslm", n_layers=5, **SMALL),
        resolve("lns", n_layers=5, **SMALL),
        resolve("mixln", n_layers=8, **SMALL),
        resolve("preln", n_layers=6, skip_scale=3.0, input_var=1e300, grad_var=1e300,
                d_model=64, n_heads=2, seq_len=8),
    ]
    for m in models:
        pts = predict(m)
        assert trace_text(m, pts, every) == json.dumps(trace(m, pts, every))


def test_huge_skip_and_branch_scales_stay_in_log_space():
    """A skip scale of 1e200 squares beyond float64: the stream and gradient are carried in
    logs, so the prediction works; the skip path alone multiplies the variance by a^2 per
    sublayer, 10^400, and the stream's own term dominates so completely that the total is
    that to rounding (2 sublayers x 3 layers x 400 = 2400 in log10), for the gradient too."""
    from sigprop.model.trace import summary

    m = resolve("preln", n_layers=3, skip_scale=1e200, d_model=64, n_heads=2, seq_len=8)
    s = summary(predict(m))
    assert s["log10_forward_var_growth"] == pytest.approx(2400, abs=1e-9)
    assert s["log10_grad_ratio_input_output"] == pytest.approx(2400, abs=1e-9)
    assert s["forward_var_growth"] == "inf"
    assert "1e+2400" in s["verdict"] and "10e+" not in s["verdict"]
    # a huge branch scale: the branch term dominates: b^2 = 1e400 times branch output
    # variances of order 1e-3 .. 1 (init std 0.02 at width 64)
    m = resolve("preln", n_layers=3, branch_scale=1e200, d_model=64, n_heads=2, seq_len=8)
    lv = _series(predict(m), "log_var") / math.log(10)
    assert np.all(np.isfinite(lv)) and 397 < lv[-1] < 401


@pytest.mark.parametrize("kw", [dict(branch_scale=1e200), dict(skip_scale=1e200, causal=True),
                                dict(branch_scale=1e200, causal=True)], ids=["b", "a-causal", "b-causal"])
def test_post_ln_attention_terms_stay_finite_at_huge_scales(kw):
    """Post-LN attention's gradient share and cross term take b^2 and a^2 + gain as a ratio of
    logarithms: with a or b squared beyond float64 the trace has no NaN (it had, exit 3)."""
    m = resolve("postln", n_layers=3, d_model=64, n_heads=2, d_ff=256, seq_len=8, **kw)
    pts = predict(m)
    for name in ("log_var", "log_gvar", "corr", "gcorr"):
        assert np.all(np.isfinite(_series(pts, name))), name


def test_weights_beyond_float_range_fail_with_one_line():
    """Inside one branch sigprop does not carry logs: stds whose squares overflow are a
    numerical failure (exit 3), one line on stderr, no traceback."""
    r = subprocess.run([sys.executable, "-m", "sigprop", "predict", "--init-std", "1e200", "--layers", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_sci_log10_rounds_the_mantissa_into_range():
    from sigprop.model.growth import sci_log10

    assert sci_log10(2399.9999999999995) == "1e+2400"
    assert sci_log10(2399.5) == "3.16e+2399"
    assert sci_log10(-0.5) == "3.16e-1"


def test_postln_relu_ffn_hands_down_no_gradient_along_the_stream():
    # x' = LN(a x + b F(x)) with F a ReLU FFN without biases is scale-invariant in x, so the
    # gradient below it has no component along x (Euler).  Monte Carlo (dslm-post, 12 layers,
    # dropout 0.1, the top two layers on an LN-output input, 48 draws x batch 4, float64):
    # share along x below the FFNs 0.0000 (the skip/branch split gave 0.167), along the
    # all-ones vector 0.081-0.085 (predicted b^2 = 0.083); below the attentions 0.085-0.089
    # along x (attention is not homogeneous: left to the split, 0.094).
    from sigprop.model.predict import Predictor, _generic_below, with_gains
    m = resolve("dslm-post", "dslm", n_layers=12, dropout=0.1, **SMALL)
    pr = Predictor(m)
    recs = pr.forward()
    recs = with_gains(recs, pr.backward(recs)[1])
    for rec in recs[-4:]:
        share_1, share_x = _generic_below(rec, (1.0, 1.0))
        if rec.kind == "ffn":
            assert share_x < 0.01
            assert abs(share_1 - 0.083) < 0.006
        else:
            assert 0.07 < share_x < 0.11
    # biases make the FFN affine, not homogeneous (Euler departure variance > 0); Pre-LN has
    # no such record (homogeneous: euler_var exactly 0)
    pr = Predictor(resolve("postln", "torch-default", n_layers=2, **SMALL))
    assert not any(r.euler_var == 0 for r in pr.forward())
    pr = Predictor(resolve("preln", "normal", n_layers=2, **SMALL))
    assert not any(r.euler_var == 0 for r in pr.forward())


def test_postln_ffn_backward_euler_share_and_cross_term():
    # Post-LN ReLU FFN with biases (torch-default), against Monte Carlo numbers measured
    # outside the predictor (96 layers, d 256, /work/scratch/causal0 probes, helper runs of
    # sigprop.mc.model's draws): the gradient above the next attention LayerNorm (= below the
    # FFN) has share 0.000-0.001 along the stream direction (12 draws each, bidirectional and
    # causal; the old skip/branch split gave 0.106), and the skip-branch cross term
    # 2 a E[g_z . J^T g_z] / E|g_x|^2 per FFN sublayer is -0.39e-3 and -0.44e-3 (causal,
    # positions >= 32, two runs of 40 draws x batch 4; the old predictor: 0).
    import math
    from sigprop.model.predict import Predictor, _generic_below, with_gains
    from sigprop.rules.residual import post_norm_cross_log_factor
    pr = Predictor(resolve("postln", "torch-default", n_layers=4, **SMALL))
    recs = pr.forward()
    recs = with_gains(recs, pr.backward(recs)[1])
    ffns = [r for r in recs if r.kind == "ffn"]
    for rec in ffns:
        _, share_x = _generic_below(rec, (1.0, 1.0))
        assert share_x < 0.005
        la2 = 2 * math.log(abs(rec.a))
        lsum = max(la2, rec.log_branch_gain) + math.log1p(math.exp(-abs(la2 - rec.log_branch_gain)))
        cross = math.expm1(post_norm_cross_log_factor(rec.log_b2, rec.x_log_var, lsum,
                                                      float(rec.branch_out.var), rec.euler_var, pr.d))
        assert -0.50e-3 < cross < -0.35e-3
    # attention and Pre-LN keep the independent sum
    assert all(r.euler_var is None for r in recs if r.kind == "attention")
    pr = Predictor(resolve("preln", "normal", n_layers=2, **SMALL))
    assert all(r.euler_var is None for r in pr.forward())


def _attention_sublayer_mc(r, rg, causal, trials, d=64, L=32, H=2, seed=5):
    """One Post-LN attention sublayer z = x + F(x), y = LN(z) of torch-default (Monte Carlo
    components of sigprop.mc.model, float64): input an LN output with token correlation r, the
    gradient above the LayerNorm Gaussian with token correlation rg.  Returns the share of the
    gradient below it along each token's stream direction, (x_t . g_x,t)^2 / (|g_x,t|^2 / d)
    averaged, and the skip-branch cross term 2 E[g_z . J^T g_z] / E|g_z|^2; also the model."""
    from sigprop.mc import model as mcm
    from sigprop.mc.sampling import correlated
    m = resolve("postln", "torch-default", n_layers=1, dropout=0.0, causal=causal, d_model=d, n_heads=H,
                d_ff=4 * d, seq_len=L, input_corr=r, grad_corr=rg)
    rng = np.random.default_rng(seed)
    along, cross = [], []
    for _ in range(trials):
        tr = mcm._Trial(m, rng, np.float64)
        X = correlated(rng, (4, L, d), 0.0, 1.0, r, np.float64)
        X = (X - X.mean(2, keepdims=True)) / X.std(2, keepdims=True)
        Y, bwd, _ = tr.branch_forward("attention", 0, X, 1.0, 1.0)
        _, c_ln = tr.ln.forward(X + Y, {}, mcm._ln_params(m), tr.rng)
        Gz = tr.ln.backward(correlated(rng, X.shape, 0.0, 1.0, rg, np.float64), c_ln)
        Gb = bwd(Gz)
        Gx = Gz + Gb
        xh = X / np.linalg.norm(X, axis=2, keepdims=True)
        along.append(((Gx * xh).sum(2) ** 2).mean() / (Gx ** 2).mean())
        cross.append(2 * (Gz * Gb).mean() / (Gz ** 2).mean())
    return float(np.mean(along)), float(np.mean(cross)), float(np.std(cross) / np.sqrt(trials)), m


@pytest.mark.parametrize("r, rg, causal", [(0.26, 0.8, False), (0.95, 0.9, False), (0.99, 0.95, True)])
def test_postln_attention_share_along_the_stream_matches_monte_carlo(r, rg, causal):
    # the gradient handed below a Post-LN attention has a share along the stream direction
    # that the skip/branch split put at 0.17-0.3; per token, x_t . g_x,t = b [sum_s g_s . E_st
    # - g_t . F_t] (rules.attention.euler_terms).  Measured here (one sublayer, d 64, L 32,
    # 3000 draws x batch 4): 0.1474 +- 0.0006 (bidirectional, r 0.26, rg 0.8: mostly the
    # token-specific part, with the key path's mean m1), 0.0222 +- 0.0001 (bidirectional, r 0.95,
    # rg 0.9: the gradient's shared part cancels the value path) and 0.0981 +- 0.0012 (causal,
    # r 0.99, rg 0.95); predicted 0.145, 0.021, 0.098; the split 0.170, 0.25, 0.32.
    from sigprop.model.predict import Predictor, with_gains
    mc, cross_mc, cross_se, m = _attention_sublayer_mc(r, rg, causal, trials=1000)
    pr = Predictor(m)
    recs = pr.forward()[:1]            # the attention sublayer alone, the model's gradient above it
    recs = with_gains(recs, pr.backward(recs)[1])
    rec = recs[0]
    share = rec.att_along
    assert abs(share - mc) < 0.06 * mc, (share, mc)
    # the old split (skip: b^2 v_F / a^2 of the skip part; branch: isotropic) is far off
    a2, g = rec.a ** 2, rec.branch_gain
    split = a2 / (a2 + g) * min(1.0, rec.b ** 2 * float(rec.branch_out.var) / a2) + g / (a2 + g)
    assert abs(split - mc) > 2.5 * abs(share - mc) and abs(split - mc) > 0.1 * mc, (split, share, mc)


def test_postln_attention_euler_sums_match_direct_evaluation():
    # the causal share and cross term are O(L^2) suffix sums over a covariance W of the
    # gradient over positions: check them against the defining double sums, O(L^3), with the
    # uniform causal weights U_sj = 1/n_s (j <= s), the rule's A2 and m1 per row length, and a
    # random positive-definite W (mean diagonal 1)
    from sigprop.model.predict import Predictor, with_gains
    m = resolve("postln", "torch-default", n_layers=1, dropout=0.1, causal=True, d_model=64, n_heads=2,
                d_ff=256, seq_len=16, input_corr=0.6, grad_corr=0.3)
    pr = Predictor(m)
    recs = pr.forward()[:1]
    recs = with_gains(recs, pr.backward(recs)[1])
    rec = recs[0]
    L = m.seq_len
    rng = np.random.default_rng(0)
    A = rng.normal(size=(L, L))
    W = A @ A.T / L + 0.5
    W /= np.mean(np.diag(W))
    along, cross = pr._attention_euler(rec, 0.3, W)
    # direct: every term of the docstring as an explicit sum
    op = pr._chain(0, 0, False, 1.0)[0][1]      # (sublayer 0: the attention; Post-LN, no norm scale)
    pa = ph = 0.1
    gg, q = 1 / (1 - ph), pa / (1 - pa)
    A2, m1 = np.asarray(rec.att_rows)
    A2d, E1 = A2 / (1 - pa), 1 + q * A2
    n = np.arange(1.0, L + 1)
    Wt = W + np.diag(np.diag(W)) * (gg - 1)
    x = rec.x
    S2, c2, tau = 1 + x.mean ** 2, x.corr + x.mean ** 2, 1 - x.corr
    vx = math.exp(rec.x_log_var)
    d = m.d_model
    Qd = d * op["q_std"] ** 2 * vx * S2
    Qo = d * op["q_std"] ** 2 * vx * c2
    Kx, Ku = d * op["k_std"] ** 2 * vx * S2, d * op["k_std"] ** 2 * vx * tau
    gv = d * op["n_heads"] * op["d_head"] * op["v_std"] ** 2 * op["o_std"] ** 2
    vF = float(rec.branch_out.var)
    pi = vF / (vx * S2 + vF)
    share = np.zeros(L)
    cr = np.zeros(L)
    for t in range(L):
        rows = range(t, L)
        T1 = sum(Wt[s, s] * A2d[s] / n[s] if s == s2 else W[s, s2] / (n[s] * n[s2]) for s in rows for s2 in rows)
        T1u = sum(Wt[s, s] * A2d[s] * (1 + m1[s]) ** 2 / n[s] if s == s2
                  else W[s, s2] * (1 + m1[s]) * (1 + m1[s2]) / (n[s] * n[s2]) for s in rows for s2 in rows)
        ph_ = np.sqrt(1 - 1 / n)
        Lam = sum(Wt[s, s2] * (Qd if s == s2 else Qo) * ph_[s] * ph_[s2] / (n[s] * n[s2]) for s in rows for s2 in rows)
        T2c = Wt[t, t] * E1[t] / n[t] + sum(W[s, t] / n[s] for s in range(t + 1, L))
        T2t = Wt[t, t] * A2d[t] / n[t] + sum(W[s, t] * (1 + m1[s]) / n[s] for s in range(t + 1, L)) / n[t]
        T3c, T3t = Wt[t, t] * E1[t], Wt[t, t] * A2d[t]
        br = (1 - pi) * gv * c2 * (T1 - 2 * T2c + T3c + Lam * Ku) + gv * tau * (T1u - 2 * T2t + T3t + Lam * (Kx + 3 * Ku))
        share[t] = br / (S2 * (1 + rec.branch_gain))
        cr[t] = -2 * gv * ((1 - pi) * c2 * T2c + tau * T2t) / (d * S2)
    assert along == pytest.approx(float(np.mean(share)), rel=1e-10)
    assert np.allclose(cross, cr, rtol=1e-10, atol=0)


def test_postln_attention_euler_limits():
    # bidirectional, no dropout: with the gradient tokens independent (rg 0) the share is the
    # F_t term alone, (1 - pi) b^2 v_F / (v_x (a^2 + gain)) up to O(1/L) and the logit terms;
    # when they are as correlated as a collapsed stream (r = rg = 1) the terms cancel to O(1/L)
    from sigprop.model.predict import Predictor, with_gains
    for r in (0.9999999, 0.5):
        m = resolve("postln", "torch-default", n_layers=1, dropout=0.0, causal=False, input_corr=r, **SMALL)
        pr = Predictor(m)
        recs = pr.forward()[:1]
        recs = with_gains(recs, pr.backward(recs)[1])
        rec = recs[0]
        tot = rec.a ** 2 + rec.branch_gain
        vF = float(rec.branch_out.var)
        pi = vF / (1 + vF)
        along0, _ = pr._attention_euler(rec, 0.0, None)
        if r > 0.99:
            assert along0 == pytest.approx((1 - pi) * vF / tot, rel=3.0 / m.seq_len)
            along1, cross1 = pr._attention_euler(rec, 1.0, None)
            assert along1 < 0.02 * along0
            assert cross1 < 0
        else:
            assert along0 > (1 - pi) * vF / tot        # the token-specific part adds
