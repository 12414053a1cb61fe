"""The Monte Carlo on other array backends (sigprop.mc.backend): the same measurements as the
NumPy backend for the same seed, the same component and whole-model checks passing, and the
core held to the array API standard by running it on array-api-strict's namespace.

PyTorch and array-api-strict are test extras: these tests skip without them, unless
SIGPROP_REQUIRE_TORCH=1 (set by .ci/run), which turns the skip into a failure."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from sigprop.mc import components as C
from sigprop.mc.backend import Rng, get_backend
from sigprop.mc.component import measure
from sigprop.mc.model import run_trial, simulate
from sigprop.model import resolve
from sigprop.model.checking import compare
from sigprop.model.predict import predict
from sigprop.state import Backward, Forward


def need(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("SIGPROP_REQUIRE_TORCH") == "1":
            pytest.fail(f"{module} is not installed but SIGPROP_REQUIRE_TORCH=1 (make test-deps installs it)")
        pytest.skip(f"{module} not installed")


@pytest.fixture(params=["torch", "array_api_strict"])
def other(request):
    need(request.param)
    return get_backend(request.param, "cpu")


@pytest.fixture
def torch_cpu():
    need("torch")
    return get_backend("torch", "cpu")


DIMS = dict(d_model=32, n_heads=2, d_ff=64, seq_len=12)
MODELS = [("preln", "relu", True, 0.1), ("postln", "relu", False, 0.1), ("mixln", "relu", True, 0.0),
          ("deepnorm", "relu", False, 0.2)]


def _moments(meas):
    """(values, scales): every moment with the scale its error is relative to: a variance or
    covariance its variance, a mean the root of the variance (a mean can be 0 to rounding, as
    after a LayerNorm, where a relative error of the mean itself means nothing)."""
    f = np.array([[x.mean, x.var, x.cov] for x in meas.forward])
    fs = np.array([[math.sqrt(x.var), x.var, x.var] for x in meas.forward])
    b = np.array([[x.var, x.cov] for x in meas.backward])
    bs = np.array([[x.var, x.var] for x in meas.backward])
    lg = meas.logit_draws
    ls = np.stack([np.sqrt(np.abs(lg[..., 1])), np.abs(lg[..., 1])], axis=-1)
    return (f, fs), (b, bs), (lg, ls)


def _assert_rel(a, b, rel, scale=None):
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a)
    np.testing.assert_array_equal(ok, np.isfinite(b))
    scale = np.abs(a) if scale is None else np.asarray(scale, float)
    worst = float(np.max(np.abs(a[ok] - b[ok]) / np.maximum(scale[ok], 1e-300)))
    assert worst <= rel, worst


def _assert_same(ref, got, rel):
    for (x, sx), (y, _) in zip(_moments(ref), _moments(got)):
        _assert_rel(x, y, rel, sx)


# --- the same numbers on every backend -------------------------------------------------------
@pytest.mark.parametrize("arch,act,causal,p", MODELS)
def test_float64_model_measurements_match_numpy(other, arch, act, causal, p):
    """Whole model, float64, same seed: every moment at every point (forward, backward, logits)
    within 1e-12 of the NumPy backend's, relative to its scale (see _moments) (the host stream gives both the same draws;
    what differs is the order of floating-point sums inside the libraries)."""
    m = resolve(arch, n_layers=3, dropout=p, causal=causal, activation=act, **DIMS)
    ref = simulate(m, batch=3, trials=2, seed=4, dtype=np.float64)
    got = simulate(m, batch=3, trials=2, seed=4, dtype=np.float64, backend=other)
    _assert_same(ref, got, 1e-12)


def test_float64_gelu_model_torch_within_erf_difference(torch_cpu):
    """GeLU: NumPy evaluates Phi by the erfc approximation (fractional error < 1.2e-7; NumPy has no
    erf), torch by torch.special.erf.  The moments then agree to ~2e-11, not 1e-12: checked at
    1e-9, and strictly tighter than the approximation's own error, so a wrong GeLU would fail."""
    m = resolve("postln", n_layers=3, dropout=0.1, activation="gelu", **DIMS)
    ref = simulate(m, batch=3, trials=2, seed=4, dtype=np.float64)
    got = simulate(m, batch=3, trials=2, seed=4, dtype=np.float64, backend=torch_cpu)
    _assert_same(ref, got, 1e-9)


def test_strict_namespace_runs_gelu_model_exactly():
    """array-api-strict has no erf: the shim's erfc approximation written with standard functions
    is NumPy's own Phi, so the GeLU model matches to 1e-12 too."""
    need("array_api_strict")
    bk = get_backend("array_api_strict", "cpu")
    m = resolve("preln", n_layers=2, dropout=0.1, activation="gelu", **DIMS)
    ref = simulate(m, batch=2, trials=2, seed=1, dtype=np.float64)
    got = simulate(m, batch=2, trials=2, seed=1, dtype=np.float64, backend=bk)
    _assert_same(ref, got, 1e-12)


COMPONENT_CASES = {
    "linear": ({"d_in": 16, "d_out": 24, "w_std": 0.3, "b_std": 0.1, "L": 6}, 0.3),
    "dropout": ({"p": 0.3, "d": 16, "L": 6}, 0.3),
    "residual": ({"a": 0.7, "b": 1.1, "y_mean": 0.2, "y_var": 0.5, "y_corr": 0.3, "d": 16, "L": 6}, 0.3),
    "relu": ({"d": 16, "L": 6}, 0.0),
    "gelu": ({"d": 16, "L": 6}, 0.0),
    "layernorm": ({"d": 16, "eps": 1e-5, "L": 6}, 0.3),
    "softmax": ({"L": 12}, 0.0),
    "attention": ({"d": 16, "n_heads": 2, "d_head": 8, "L": 10, "q_std": 0.3, "k_std": 0.3, "v_std": 0.25,
                   "o_std": 0.25, "p": 0.2, "causal": 1, "q_bias_std": 0.1, "o_bias_std": 0.2}, 0.0),
    "embedding": ({"word_std": 1.0, "pos_std": 0.5, "seg_std": 0.3, "zipf_s": 1.0, "V": 300, "d": 16, "L": 12}, 0.0),
}


@pytest.mark.parametrize("name", sorted(COMPONENT_CASES))
def test_component_measurements_match_numpy(other, name):
    prm, mean = COMPONENT_CASES[name]
    comp = C.get(name)
    x, g = Forward(mean, 1.2, 0.25), Backward(0.8, 0.2)
    ref = measure(comp, prm, x, g, runs=3, batch=4, seed=5, dtype=np.float64)
    got = measure(comp, prm, x, g, runs=3, batch=4, seed=5, dtype=np.float64, backend=other)
    # GeLU on torch: torch's erf against NumPy's erfc approximation (fractional error < 1.2e-7)
    rel = 1e-7 if (name == "gelu" and other.name == "torch") else 1e-12
    for a, b in ((ref.x, got.x), (ref.g, got.g)):
        _assert_rel([a.mean, a.var, a.cov], [b.mean, b.var, b.cov], rel, [math.sqrt(a.var), a.var, a.var])


@pytest.mark.parametrize("name", ["linear", "layernorm", "attention", "relu", "softmax"])
def test_component_float32_matches_numpy_to_rounding(torch_cpu, name):
    prm, mean = COMPONENT_CASES[name]
    comp = C.get(name)
    x, g = Forward(mean, 1.2, 0.25), Backward(0.8, 0.2)
    ref = measure(comp, prm, x, g, runs=3, batch=4, seed=6)
    got = measure(comp, prm, x, g, runs=3, batch=4, seed=6, backend=torch_cpu)
    for a, b in ((ref.x, got.x), (ref.g, got.g)):
        assert b.var == pytest.approx(a.var, rel=1e-5)
        assert b.cov == pytest.approx(a.cov, rel=1e-4, abs=1e-5 * a.var)


# --- the same checks pass on every backend ---------------------------------------------------
@pytest.mark.parametrize("name,prm", [
    ("linear", {"d_in": 64, "d_out": 32, "w_std": 0.125}),
    ("layernorm", {"d": 64}),
    ("gelu", {"d": 64}),
    ("attention", {"d": 32, "n_heads": 2, "d_head": 16, "L": 20, "q_std": 0.2, "k_std": 0.2, "v_std": 0.2,
                   "o_std": 0.2, "p": 0.1}),
])
@pytest.mark.parametrize("stream", ["host", "device"])
def test_component_rule_check_passes_on_torch(torch_cpu, name, prm, stream):
    from sigprop import rules as R
    from sigprop.mc.sweep import errors

    rule = R.get(name)
    x, g = Forward(0.0, 1.0, 0.2), Backward(1.0, 0.1)
    params = {q.name: q.default for q in rule.params if q.default is not None}
    params.update(prm)
    px, pg = rule.evaluate(x, g, **{k: v for k, v in params.items() if k in {q.name for q in rule.params}})
    meas = measure(C.get(name), params, x, g, runs=8, batch=16, seed=2, backend=torch_cpu, stream=stream)
    err = errors(px, pg, meas)
    se = {"x_var": meas.x.var_se / meas.x.var, "g_var": meas.g.var_se / meas.g.var}
    for k in ("x_var", "g_var"):
        assert err[k] <= max(0.05, 4 * se[k]), (k, err[k], se[k])


@pytest.mark.parametrize("stream", ["host", "device"])
def test_whole_model_check_passes_on_torch(torch_cpu, stream):
    m = resolve("preln", n_layers=4, dropout=0.1, causal=True, d_model=64, n_heads=2, d_ff=128, seq_len=16)
    meas = simulate(m, batch=4, trials=6, seed=0, backend=torch_cpu, stream=stream)
    res = compare(predict(m), meas)
    assert res.passed, res.failures[:3]


def test_device_stream_is_seeded_and_differs_from_host(torch_cpu):
    m = resolve("preln", n_layers=2, dropout=0.1, **DIMS)
    a = simulate(m, batch=2, trials=2, seed=3, backend=torch_cpu, stream="device")
    b = simulate(m, batch=2, trials=2, seed=3, backend=torch_cpu, stream="device")
    h = simulate(m, batch=2, trials=2, seed=3, backend=torch_cpu, stream="host")
    assert [f.var for f in a.forward] == [f.var for f in b.forward]
    assert [f.var for f in a.forward] != [f.var for f in h.forward]


# --- the generator shim ----------------------------------------------------------------------
def test_host_stream_gives_numpys_numbers_on_torch(torch_cpu):
    a, b = Rng(7), Rng(7, torch_cpu)
    for draw in (lambda r: r.normal((3, 5)), lambda r: r.normal((4,), np.float64), lambda r: r.keep((6, 7), 0.3),
                 lambda r: r.standard_normal((2, 3), np.float32)):
        x, y = draw(a), draw(b)
        np.testing.assert_array_equal(x, torch_cpu.to_numpy(y))
        assert str(y.dtype).endswith(str(x.dtype))


def test_device_stream_keep_rate_and_normal_moments(torch_cpu):
    r = Rng(11, torch_cpu, "device")
    k = torch_cpu.to_numpy(r.keep((400, 500), 0.3))
    assert abs(k.mean() - 0.7) < 4 * math.sqrt(0.21 / k.size)
    z = torch_cpu.to_numpy(r.normal((400, 500)))
    assert abs(z.mean()) < 4 / math.sqrt(z.size) and abs(z.var() - 1) < 4 * math.sqrt(2 / z.size)


def test_erf_shims_against_math_erf(other):
    xs = np.linspace(-6, 6, 241)
    got = other.to_numpy(other.erf(other.asarray(xs)))
    want = np.array([math.erf(v) for v in xs])
    tol = 1e-15 if other.name == "torch" else 1.2e-7        # torch's erf; the approximation
    assert np.max(np.abs(got - want)) <= tol


def test_softmax_is_exp_minus_max_over_sum(other):
    """Large logits (exp overflows without the shift) give the exact softmax."""
    comp = C.get("softmax")
    X = np.array([[[800.0], [799.0], [-5.0]], [[0.1], [0.2], [0.3]]])
    P, _ = comp.forward(other.asarray(X), {}, {"L": 3}, None)
    P = other.to_numpy(P)
    e = np.exp(X - X.max(axis=1, keepdims=True))
    np.testing.assert_allclose(P, e / e.sum(axis=1, keepdims=True), rtol=1e-14)


# --- per-trial seeds -------------------------------------------------------------------------
def test_trial_results_depend_on_their_own_seed_only():
    m = resolve("preln", n_layers=2, dropout=0.1, **DIMS)
    a = simulate(m, batch=2, trials=2, seed=9)
    b = simulate(m, batch=2, trials=3, seed=9)
    np.testing.assert_array_equal(a.logit_draws, b.logit_draws[:2])
    seeds = np.random.SeedSequence(9).spawn(3)
    fw, _, lg = run_trial(m, 2, Rng(seeds[2]), np.float32)          # trial 2 by itself
    np.testing.assert_array_equal(lg, b.logit_draws[2])
    assert not np.array_equal(fw, run_trial(m, 2, Rng(seeds[1]), np.float32)[0])


def test_per_trial_streams_judge_like_the_former_single_stream():
    """simulate used one generator for all trials; now each trial has its own child seed (so
    trials can run anywhere).  Both samples of the same reference model pass the same check, and
    their measured variances agree within the combined standard errors."""
    from sigprop.mc.model import ModelMeasurement, logit_stats
    from sigprop.mc.stats import pool

    m = resolve("postln", n_layers=4, dropout=0.1, d_model=64, n_heads=2, d_ff=128, seq_len=16)
    trials, batch = 8, 4
    new = simulate(m, batch=batch, trials=trials, seed=0)
    rng = Rng(0)                                             # the former single stream
    out = [run_trial(m, batch, rng, np.float32) for _ in range(trials)]
    fw, bw, lg = (np.stack([o[i] for o in out]) for i in range(3))
    old = ModelMeasurement([pool(fw[:, k]) for k in range(fw.shape[1])],
                           [pool(bw[:, k], centred=False) for k in range(fw.shape[1])],
                           logit_stats(lg), trials, batch, 0, "float32", 0.0, 0.0, lg)
    pts = predict(m)
    assert compare(pts, new).passed and compare(pts, old).passed
    for a, b in zip(new.forward + new.backward, old.forward + old.backward):
        assert abs(a.var - b.var) <= 4 * math.hypot(a.var_se, b.var_se)


# --- command line ----------------------------------------------------------------------------
def run(*args):
    return subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, text=True, timeout=300)


SMALL = ["--layers", "2", "--d-model", "32", "--heads", "2", "--d-ff", "64", "--seq-len", "12", "--trials", "3",
         "--batch", "2", "--dtype", "float64", "--json"]


def test_cli_check_torch_backend_reports_it_and_matches_numpy(torch_cpu):
    a, b = run("check", *SMALL), run("check", *SMALL, "--backend", "torch")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert (ja["backend"], ja["device"], ja["rng"]) == ("numpy", "cpu", "host")
    assert (jb["backend"], jb["device"], jb["rng"]) == ("torch", "cpu", "host")
    for pa, pb in zip(ja["measured"], jb["measured"]):
        assert pb["forward"]["var"] == pytest.approx(pa["forward"]["var"], rel=1e-12)
        assert pb["backward"]["var"] == pytest.approx(pa["backward"]["var"], rel=1e-12)


def test_cli_check_component_torch(torch_cpu):
    r = run("check-component", "layernorm", "-p", "d=64", "--backend", "torch", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pass"] is True


@pytest.mark.parametrize("args", [
    ["check", "--layers", "2", "--backend", "cupy"],                      # cupy is cuda-only
    ["check", "--layers", "2", "--device", "cuda"],                       # numpy is cpu-only
    ["check", "--layers", "2", "--backend", "nope"],
    ["check", "--layers", "2", "--rng", "nope"],
    ["check-component", "relu", "-p", "d=8", "--device", "cuda"],
])
def test_bad_backend_options_exit_2(args):
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr and r.stderr.strip()


def test_torch_without_cuda_exits_2(torch_cpu):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = run("check", "--layers", "2", "--backend", "torch", "--device", "cuda")
    assert r.returncode == 2 and r.stdout == "" and "CUDA" in r.stderr and "Traceback" not in r.stderr


def test_numpy_backend_needs_no_optional_package():
    """The default backend imports neither torch nor dask."""
    code = ("import sys; from sigprop.model import resolve; from sigprop.mc.model import simulate; "
            "simulate(resolve('preln', n_layers=1, d_model=16, n_heads=2, d_ff=32, seq_len=4), batch=1, trials=2); "
            "print(sorted(m for m in ('torch', 'dask', 'distributed', 'cupy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_numpy_only_component_is_refused_on_other_backends(other):
    """A component not marked array_api (NumPy code) gets one clear error, not a crash inside."""
    from sigprop.errors import DomainError
    from sigprop.mc.component import Component

    class NumpyOnly(Component):
        name = "numpy-only"

        def dims(self, params):
            return 4, 3, 3

        def forward(self, X, W, params, rng):
            return np.tanh(X), None

        def backward(self, GY, cache):
            return GY

    comp = NumpyOnly()
    measure(comp, {}, Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), runs=2, batch=1)      # NumPy: fine
    with pytest.raises(DomainError, match="numpy backend only"):
        measure(comp, {}, Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), runs=2, batch=1, backend=other)
