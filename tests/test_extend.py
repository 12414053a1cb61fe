"""Your own components (sigprop.extend): a pointwise function's derived rules against closed
forms and against its own Monte Carlo, the plugin files, and the registry staying clean."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sigprop import extend, registry
from sigprop.backend import numeric
from sigprop.state import Backward, Forward

from tests._cli import cli
from tests._paths import DATA

RELU2 = textwrap.dedent("""
    import numpy as np
    import sigprop.extend

    sigprop.extend.elementwise("relu2", lambda x: np.maximum(x, 0.0) ** 2, lambda x: 2.0 * np.maximum(x, 0.0),
                               title="ReLU^2")
""")
M = ["--layers", "4", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "16"]


@pytest.fixture
def scratch_registry():
    """Registrations made in a test are undone after it (the registries are process-wide)."""
    from sigprop.mc import components as C
    from sigprop.rules import REGISTRY

    saved = [(t, dict(t)) for t in (REGISTRY, C.COMPONENTS, C.SWEEPS, registry._ACTIVATIONS, registry._NORMS)]
    yield
    for t, old in saved:
        t.clear()
        t.update(old)


def _relu2():
    return extend.elementwise("relu2", lambda x: np.maximum(x, 0.0) ** 2, lambda x: 2.0 * np.maximum(x, 0.0))


def _arccos_kernel(n: int, s2: float, r: float) -> float:
    """E[relu(x)^n relu(y)^n] for (x, y) ~ N(0, s2) with correlation r (Cho & Saul's degree-n
    arc-cosine kernels, n = 1, 2): the independent oracle."""
    th = math.acos(max(-1.0, min(1.0, r)))
    j = {1: math.sin(th) + (math.pi - th) * math.cos(th),
         2: 3 * math.sin(th) * math.cos(th) + (math.pi - th) * (1 + 2 * math.cos(th) ** 2)}[n]
    return s2**n * j / (2 * math.pi)


@pytest.mark.parametrize("s2", [1e-3, 0.1, 1.0, 10.0, 1e3])
@pytest.mark.parametrize("r", [-0.9, 0.0, 0.3, 0.8, 0.999, 1.0])
def test_relu_squared_rules_match_the_arccos_kernels(scratch_registry, s2, r):
    """Forward and backward of ReLU^2 from f and f' alone against the closed forms (exact to
    rounding in the variances: the function is polynomial on each side of its kink, where the
    panels split)."""
    from sigprop.rules import get

    _relu2()
    y, gb = get("relu2").evaluate(Forward(0.0, s2, r), Backward(2.0, 0.5))
    mean, second = s2 / 2, 1.5 * s2**2
    var = second - mean**2
    assert y.mean == pytest.approx(mean, rel=1e-12)
    assert y.var == pytest.approx(var, rel=1e-12)
    # (the correlations to 1e-9: near r = 1 the conditional expectation bends within ~sqrt(1 - r^2)
    # of the kink, which the panels resolve to ~1e-11)
    assert y.corr == pytest.approx((_arccos_kernel(2, s2, r) - mean**2) / var, abs=1e-9)
    assert gb.var == pytest.approx(2.0 * 2 * s2, rel=1e-12)                      # E[(2 relu)^2] = 2 s2
    assert gb.corr == pytest.approx(0.5 * 4 * _arccos_kernel(1, s2, r) / (2 * s2), abs=1e-9)


def test_a_smooth_function_reproduces_the_closed_form_gelu(scratch_registry):
    """x Phi(x) registered as a plugin equals the built-in GeLU rule (closed forms) over a grid
    of variances and correlations, to the accuracy of the Phi it is given (numeric.Phi: the erfc
    approximation, 1.2e-7 relative)."""
    from sigprop.rules import get

    phi = lambda x: np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    extend.elementwise("xphi", lambda x: x * numeric.Phi(x), lambda x: numeric.Phi(x) + x * phi(x))
    worst = 0.0
    for s2 in (0.01, 0.1, 1.0, 10.0, 100.0):
        for r in (-0.9, 0.0, 0.5, 0.9, 1.0):
            a = get("gelu").evaluate(Forward(0.0, s2, r), Backward(1.0, 0.5))
            b = get("xphi").evaluate(Forward(0.0, s2, r), Backward(1.0, 0.5))
            for u, v, scale in zip((*a[0], *a[1]), (*b[0], *b[1]), (a[0].mean, a[0].var, 1, a[1].var, 1)):
                worst = max(worst, abs(u - v) / abs(scale))
    assert worst < 2e-6


def test_the_derived_rule_against_its_own_monte_carlo(scratch_registry):
    """A few points of the activation grid (the sweep every activation has): the derived ReLU^2
    rule against the simulation of the same f and f' (the full sweep: docs/extending.md)."""
    from sigprop.mc import components as C
    from sigprop.mc.sweep import run_sweep
    from sigprop.rules import get

    _relu2()
    res = run_sweep(C.SWEEPS["relu2"], get("relu2"), n=8, seed=3)
    for row in res.rows:
        for k, e in row["errors"].items():
            assert e < 0.03, (row["point"], k, e)


def test_gated_core_and_whole_model_check(scratch_registry, capsys):
    """The gated FFN core with the plugin's activation predicts, and `check` of a model with it
    passes at init xavier (where the branches matter)."""
    _relu2()
    assert registry.activation("relu2").glu == "relu2glu"
    code, out, err = cli(capsys, "predict", "--ffn", "relu2glu", *M)
    assert code == 0, err
    assert "relu2" in out
    # (at d_model 64 finite width fails the built-in ReLU too: 0.32 on the input gradient)
    code, out, err = cli(capsys, "check", "--arch", "postln", "--init", "xavier", "--activation", "relu2",
                         "--layers", "6", "--d-model", "128", "--heads", "4", "--d-ff", "512", "--seq-len", "16",
                         "--trials", "8", "--batch", "4")
    assert code == 0, out + err


def test_a_registered_name_is_not_replaced(scratch_registry):
    from sigprop.errors import DomainError

    _relu2()
    with pytest.raises(DomainError, match="already"):
        _relu2()
    with pytest.raises(DomainError, match="already"):
        extend.elementwise("gelu", np.tanh, lambda x: 1 - np.tanh(x) ** 2)
    with pytest.raises(DomainError, match="component name"):
        extend.elementwise("Bad Name", np.tanh, lambda x: 1 - np.tanh(x) ** 2)
    with pytest.raises(DomainError, match="finite values of its shape"):
        extend.elementwise("scalar", lambda x: 1.0, lambda x: x)


def test_a_plugins_code_is_part_of_the_table_keys(scratch_registry):
    """Two plugins of one name and different code never share a stored table."""
    from sigprop.model import store

    before = store.key("table", "chain")
    extend.elementwise("soft", np.tanh, lambda x: 1 - np.tanh(x) ** 2, kinks=())
    first = store.key("table", "chain")
    from sigprop.mc import components as C
    from sigprop.rules import REGISTRY

    for t in (REGISTRY, C.COMPONENTS, C.SWEEPS, registry._ACTIVATIONS, registry._NORMS):      # forget it
        t.pop("soft", None)
        t.pop("softglu", None)
    extend.elementwise("soft", lambda x: np.tanh(2 * x), lambda x: 2 * (1 - np.tanh(2 * x) ** 2), kinks=())
    assert len({before, first, store.key("table", "chain")}) == 3


def _run(args, env=None, cwd=None):
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, text=True, env=e,
                          cwd=cwd, timeout=300)


def test_plugin_file_and_environment(tmp_path):
    """--plugin FILE (anywhere on the line) and SIGPROP_PLUGINS import the file before the model
    is read; `rules NAME` lists the derived rule; a plugin that raises or is missing is one line,
    exit 2."""
    plug = tmp_path / "relu2.py"
    plug.write_text(RELU2)
    p = _run(["predict", *M, "--activation", "relu2", "--plugin", str(plug), "--json"])
    assert p.returncode == 0, p.stderr
    assert '"activation": "relu2"' in p.stdout
    p = _run(["predict", *M, "--activation", "relu2"], env={"SIGPROP_PLUGINS": str(plug)})
    assert p.returncode == 0, p.stderr
    p = _run(["rules", "relu2", f"--plugin={plug}"])
    assert p.returncode == 0, p.stderr
    assert "relu2" in p.stdout
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('no')\n")
    for args in (["predict", "--plugin", str(bad)], ["predict", "--plugin", str(tmp_path / "none.py")],
                 ["predict", "--plugin", str(tmp_path)], ["predict", "--activation", "relu2", *M]):
        p = _run(args)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stdout == ""
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr


# -- a pointwise function as a norm kind (DyT) ----------------------------------------------
DYT = str(DATA / "dyt.py")
#: a small model for the refusals (bidirectional)
SMALL = dict(layers=4, d_model=64, heads=4, d_ff=128, seq_len=16)


def _dyt():
    """DyT at initialisation (alpha 0.5, gamma 1, beta 0): tanh(0.5 x)."""
    return extend.elementwise("dyt", lambda x: np.tanh(0.5 * x), lambda x: 0.5 * (1.0 - np.tanh(0.5 * x) ** 2),
                              title="DyT", kinks=())


def test_an_elementwise_function_is_also_a_norm_kind(scratch_registry):
    """elementwise registers a norm entry of the same name: the activation's rule and component,
    no generic share, no per-token slope, no QK-norm code; the model names it as its norm."""
    import sigprop
    from sigprop.model.spec import Model

    _dyt()
    n = registry.norm("dyt")
    assert n.pointwise and n.rule == "dyt" and n.component == "dyt"
    assert n.generic_key is None and n.slope_key is None and n.qk_code is None
    assert n.params(128, 1e-5, (0.0, 1.0), 1.0) == {}
    assert "dyt" in registry.norms() and "dyt" in registry.activations()
    p = sigprop.predict(norm="dyt", arch="preln", init="xavier", **SMALL)
    assert p.model.norm == "dyt" and isinstance(p.model, Model)


def test_a_norm_sublayer_of_dyt_is_f_entry_by_entry(scratch_registry):
    """A norm sublayer x' = N(x) of DyT, on a stream of variance v, is the rule's forward at v:
    the stream after it has variance E[tanh(0.5 x)^2] by quadrature (here checked against a
    plain 20,000-node trapezoid of the Gaussian integral, independent of the panels)."""
    import sigprop

    _dyt()
    spec = sigprop.predict(norm="dyt", arch="preln", init="xavier", **{**SMALL, "layers": 2}).to_dict()["model"]
    spec["input"]["var"] = 3.0
    spec["layers"] = [{"sublayers": [{"kind": "norm"}, {**lay["attention"], "kind": "attention"},
                                     {**lay["ffn"], "kind": "ffn"}]} for lay in spec["layers"]]
    p = sigprop.predict(spec=spec)
    assert [pt.sublayer for pt in p.points[:4]] == ["input", "norm", "attention", "ffn"]
    z = np.linspace(-12, 12, 20001)
    w = np.exp(-z * z / 2) / math.sqrt(2 * math.pi) * (z[1] - z[0])
    expect = float(np.sum(w * np.tanh(0.5 * math.sqrt(3.0) * z) ** 2))
    first = p.points[1]
    assert first.var == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("what, options, match", [
    ("qk_norm", dict(qk_norm=True), "pointwise function, not a norm of the queries and keys"),
    ("causal", dict(causal=True), "bidirectional models only"),
    ("mean", dict(input_mean=1.0), "zero-mean input"),
    ("range", dict(input_var=1e290), "beyond e"),
])
def test_a_pointwise_norm_refuses_what_it_does_not_model(scratch_registry, what, options, match):
    """One line each: a pointwise norm as QK-norm, in a causal model, on a stream of nonzero mean
    (its rule is the zero-mean one) or beyond the range the stream is handed to a rule unclipped
    (it is not scale-invariant: clipping would change its output)."""
    import sigprop
    from sigprop.errors import DomainError

    _dyt()
    base = dict(norm="dyt", arch="preln", init="xavier", **SMALL)
    with pytest.raises(DomainError, match=match) as e:
        sigprop.predict(**{**base, **options})
    assert "\n" not in str(e.value)


def test_the_pointwise_norm_in_the_monte_carlo_is_f_and_its_backward_df(scratch_registry):
    """The Monte Carlo's norm component for DyT: f entry by entry forward, df * G backward."""
    from sigprop.mc.components import get as component

    _dyt()
    comp = component(registry.norm("dyt").component)
    X = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    G = np.random.default_rng(1).standard_normal((3, 5, 8)).astype(np.float32)
    Y, cache = comp.forward(X, {}, {"d": 8, "eps": 1e-5}, None)
    np.testing.assert_allclose(Y, np.tanh(0.5 * X), rtol=1e-6)
    np.testing.assert_allclose(comp.backward(G, cache), G * 0.5 / np.cosh(0.5 * X) ** 2, rtol=1e-5)


@pytest.mark.parametrize("arch", [
    {"--arch": "preln"}, {"--arch": "postln"}, {"--arch": "preln", "--placement": "peri", "--final-norm": None},
    # (the full default size, batch 8: the Gaussian rule right after the dropout, 6.8% high
    # there, passes within the standard errors of a smaller check)
    {"--arch": "preln", "--placement": "output", "--heads": "16", "--seq-len": "256", "--batch": "8"}])
def test_dyt_as_the_norm_passes_check(scratch_registry, capsys, arch):
    """DyT in place of LayerNorm (before the branch, after the sum; on both sides of the branch and
    after the last layer; on the branch output), init xavier, 6 layers, d_model 128: every point
    of `check` within its default tolerance (registered as the plugin file tests/data/dyt.py does)."""
    _dyt()
    opts = {"--init": "xavier", "--layers": "6", "--d-model": "128", "--heads": "4", "--d-ff": "512",
            "--seq-len": "16", "--trials": "8", "--batch": "4", **arch}
    args = [a for k, v in opts.items() for a in ((k,) if v is None else (k, v))]
    code, out, err = cli(capsys, "check", "--norm", "dyt", *args)
    assert code == 0, out + err
    assert "DyT (pointwise)" in out


def test_the_dyt_norm_rule_against_its_monte_carlo_over_the_stream_range(scratch_registry):
    """A few points of a grid over the stream variances a norm meets (input std 0.01 to 10,
    d 128): the norm's rule against the simulation of its component (the full grids:
    docs/extending.md)."""
    from sigprop.mc import components as C
    from sigprop.mc.sweep import run_sweep
    from sigprop.rules import get

    _dyt()
    n = registry.norm("dyt")
    grid = {"x_std": (0.01, 0.1, 1.0, 10.0), "x_corr": (0.0, 0.8, 0.95), "g_corr": (0.0, 0.9), "g_std": (1.0,),
            "d": (128,)}
    res = run_sweep(C.SWEEPS[n.component], get(n.rule), n=8, seed=5, grid=grid)
    for row in res.rows:
        for k, e in row["errors"].items():
            assert e < 0.03, (row["point"], k, e)


def test_the_dyt_plugin_file_names_a_norm_on_the_command_line():
    """tests/data/dyt.py (the file docs/extending.md shows): --norm dyt predicts; as QK-norm
    and in a causal model it is one line, exit 2, nothing on stdout."""
    p = _run(["predict", "--plugin", DYT, "--norm", "dyt", *M, "--json"])
    assert p.returncode == 0, p.stderr
    assert '"norm": "dyt"' in p.stdout
    for extra in (["--qk-norm"], ["--causal"]):
        p = _run(["predict", "--plugin", DYT, "--norm", "dyt", *M, *extra])
        assert p.returncode == 2, (extra, p.stderr)
        assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and "pointwise" in p.stderr, p.stderr


def test_a_pointwise_norm_of_the_stream_with_hidden_dropout_is_noted(scratch_registry):
    """With hidden dropout the stream a pointwise norm normalises is a mixture of Gaussians that
    its rule takes as Gaussian (measured with DyT, docs/extending.md): the prediction carries a
    note; without hidden dropout, with LayerNorm, and with the norm on the branch outputs only
    (the output placement, whose norm takes the dropout's mixture), none."""
    import sigprop

    _dyt()
    note = lambda **o: sigprop.predict(**SMALL, **o).points.approximation_notes
    assert note(norm="dyt", placement="pre", hidden_dropout=0.0) == () and note(norm="layernorm") == ()
    assert note(norm="dyt", placement="output") == ()
    for o in (dict(placement="pre"), dict(placement="peri"), dict(placement="output", final_norm=True)):
        got = note(norm="dyt", **o)
        assert len(got) == 1 and "mixture of Gaussians" in got[0], (o, got)


def test_a_pointwise_norm_after_the_hidden_dropout_takes_its_mixture(scratch_registry):
    """Right after the hidden dropout (p = 0.1) a pointwise norm's input is 0 or F/(1 - p): its
    output variance (1 - p) E[f(F/(1-p))^2] - mean^2 and token covariance (1 - p)^2 E[f(F'_t)
    f(F'_s)] against a plain trapezoid of the Gaussian integrals (independent of the panels)."""
    import sigprop
    from sigprop.model.predict import Predictor

    _dyt()
    pr = Predictor(sigprop.predict(norm="dyt", placement="output", **SMALL).model)
    p, v, c = 0.1, 2.0, 0.3                    # the dropout output's variance and correlation
    op, y = pr._pointwise_after_dropout(Forward(0.0, v, c), p)
    vf, cf = v / (1 - p), c / (1 - p)          # F' = F/(1 - p) where the mask keeps the entry
    z = np.linspace(-10, 10, 2001)
    w = np.exp(-z * z / 2) / math.sqrt(2 * math.pi) * (z[1] - z[0])
    f = lambda t: np.tanh(0.5 * t)
    second = float(np.sum(w * f(math.sqrt(vf) * z) ** 2))
    za, zb = np.meshgrid(z, z, indexing="ij")
    xa, xb = math.sqrt(vf) * za, math.sqrt(vf) * (cf * za + math.sqrt(1 - cf**2) * zb)
    cross = float(np.sum(np.outer(w, w) * f(xa) * f(xb)))
    assert y.mean == pytest.approx(0.0, abs=1e-12)
    assert y.var == pytest.approx((1 - p) * second, rel=1e-9)
    assert y.var * y.corr == pytest.approx((1 - p) ** 2 * cross, rel=1e-7)
    # the naive Gaussian of the dropout output's own variance is measurably different
    assert abs(float(np.sum(w * f(math.sqrt(v) * z) ** 2)) / y.var - 1) > 0.01
