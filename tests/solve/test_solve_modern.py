"""solve-init on the modern blocks: RMSNorm, gated FFNs (SwiGLU, ReGLU), SiLU, a final norm,
the placements peri and output and the parallel block, from models built directly (the
model object), checked against closed forms typed here, independent quadrature and Monte
Carlo, and the prediction of the solved model."""

import math

import numpy as np
import pytest
import sympy as sp

from sigprop.errors import DomainError
from sigprop.model.presets import resolve
from sigprop.model.spec import Model, Sublayers
from sigprop.solve import solve, steps
from sigprop.solve import equations as E

SMALL = dict(d_model=64, n_heads=2, d_ff=172, seq_len=16)
GLU = ("gate", "up", "down")


def modern(n_layers, *, placement="pre", block="sequential", norm="rmsnorm", ffn_kind="glu", activation="silu",
           final_norm=True, **kw):
    """A DeepScaleLM-scaled model (lambda^2 + beta^2 = 1, beta^2 = 1/N) with the given blocks."""
    m = resolve("dslm", init="normal", n_layers=n_layers, **{**SMALL, **kw})
    a, f = m.attention, m.ffn
    names = GLU if ffn_kind == "glu" else ("in", "out")
    ffn = Sublayers("ffn", placement, f.skip_scale if block == "sequential" else 1.0, f.branch_scale, f.norm_scale,
                    {w: 0.02 for w in names}, {w: 0.0 for w in names})
    att = Sublayers("attention", placement, a.skip_scale, a.branch_scale, a.norm_scale, a.std, a.bias_std)
    return m.replace(norm=norm, norm_eps=1e-6, ffn_kind=ffn_kind, activation=activation, attention=att, ffn=ffn,
                     final_norm=final_norm, block=block)


def silu_second_moment(var):
    """E[silu(h)^2], h ~ N(0, var), by the trapezoid rule on a wide grid (independent of the
    package's quadrature)."""
    z = np.linspace(-40, 40, 400001)
    h = math.sqrt(var) * z
    f = (h / (1 + np.exp(-h))) ** 2 * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    return float(np.trapezoid(f, z) if hasattr(np, "trapezoid") else np.trapz(f, z))


# -- pre-RMSNorm SwiGLU ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def swiglu12():
    return solve("unit-variance", model=modern(12))


def test_swiglu_unknowns_and_flat_forward(swiglu12):
    sol = swiglu12
    assert sol.feasible, sol.reason
    m = sol.model
    assert m.norm == "rmsnorm" and m.ffn_kind == "glu" and m.activation == "silu" and m.final_norm
    # the symmetric choice: one std for gate, up and down, one for v and o; zero biases
    for w in ("up", "down"):
        np.testing.assert_array_equal(m.ffn.std[w], m.ffn.std["gate"])
    np.testing.assert_array_equal(m.attention.std["v"], m.attention.std["o"])
    assert all(np.all(c == 0) for c in m.ffn.bias_std.values())
    # q = k = 1/sqrt(d S2) for logit variance 1: an RMSNorm output has S2 = 1 - O(eps)
    assert m.attention.std["q"][3] == pytest.approx(1 / 8, rel=1e-5)
    np.testing.assert_allclose([p.var for p in sol.points[1:]], 1.0, atol=1e-6)


def test_swiglu_std_against_independent_quadrature(swiglu12):
    """The solved s makes the SwiGLU branch deliver V_req: V = d_ff s^2 E[silu(g)^2] v_u /
    ((1-p_f)(1-p_h)) with g, u ~ N(0, d s^2 v), evaluated here by our own quadrature."""
    f = next(s for s in swiglu12.sublayers if s.kind == "ffn" and s.layer == 5)
    s, v = f.stds["gate"], f.branch_in.var
    d, dff = SMALL["d_model"], SMALL["d_ff"]
    vg = d * s * s * v
    V = dff * s * s * silu_second_moment(vg) * vg / ((1 - 0.0) * (1 - 0.1))
    assert V == pytest.approx(f.required, rel=1e-7)
    assert not f.homogeneous


def test_swiglu_std_by_monte_carlo(swiglu12):
    """A seeded simulation of the solved SwiGLU FFN on RMS-normalised tokens: output variance
    V_req (1, here) within its sampling error."""
    f = next(s for s in swiglu12.sublayers if s.kind == "ffn" and s.layer == 5)
    s = f.stds["gate"]
    d, dff, p_h = SMALL["d_model"], SMALL["d_ff"], 0.1
    rng = np.random.default_rng(7)
    out = []
    for _ in range(64):
        x = rng.standard_normal((256, d))
        x /= np.sqrt(np.mean(x * x, axis=1, keepdims=True))          # RMSNorm, gain 1
        g, u = x @ rng.normal(0, s, (d, dff)), x @ rng.normal(0, s, (d, dff))
        y = (g / (1 + np.exp(-g)) * u) @ rng.normal(0, s, (dff, d))
        y *= (rng.random(y.shape) >= p_h) / (1 - p_h)
        out.append(np.mean(y * y))
    out = np.array(out)
    assert abs(out.mean() - f.required) < 4 * out.std(ddof=1) / math.sqrt(out.size) + 0.01


@pytest.mark.parametrize("n_layers", [12, 96])
def test_pre_rmsnorm_swiglu_forward_flat_at_depth(n_layers):
    sol = solve("unit-forward", model=modern(n_layers))
    assert sol.feasible, sol.reason
    assert len(sol.points) == 1 + 2 * n_layers
    assert max(abs(p.var - 1) for p in sol.points[1:]) < 1e-6
    # the solver's own stream correlation is the prediction's
    np.testing.assert_allclose([u[0].out.corr for u in sol.units()], [p.corr for p in sol.points[1:]], atol=1e-6)


def test_causal_model_refined_on_the_prediction():
    """A causal model: the prediction's position profile moves the stream off the mean-field
    recursion by ~1e-3; the solution is refined on the prediction until it is flat."""
    sol = solve("unit-forward", model=modern(3, causal=True, dropout=0.0, seq_len=8))
    assert sol.feasible, sol.reason
    ref = sol.extra["refined"]
    assert ref["rounds"] >= 1 and ref["forward_var_max_dev"][0] > 1e-4
    assert max(abs(p.var - 1) for p in sol.points[1:]) < 1e-4
    assert any("refined on the prediction" in s.text for s in steps(sol))


def test_swiglu_gradient_and_note(swiglu12):
    """The gated FFN passes the gradient back through gate and up: Gamma/V about 2, which more
    than offsets attention's loss; the final norm's gradient is not the target, the stream's is."""
    sol = swiglu12
    g = sol.extra["gradient"]
    assert 1.9 < g["ffn_gain_ratio"]["mean"] < 2.2
    assert g["attention_gain_ratio"]["mean"] < 1
    assert g["ratio_input_output"] == pytest.approx(sol.points[0].gvar / sol.points[-1].gvar, rel=1e-12)
    # the top point's gradient is below the final norm: not the model's upstream gradient
    assert sol.points[-1].gvar != sol.model.grad.var
    assert "gated FFN" in sol.note


def test_final_norm_sets_where_the_gradient_is_judged():
    """With a final norm the gradient deviation is taken relative to the stream below it: the
    same model with grad_var 4 gives the same relative numbers."""
    from sigprop.state import Backward

    m = modern(4)
    a = solve("unit-variance", model=m)
    b = solve("unit-variance", model=m.replace(grad=Backward(4.0, 0.0)))
    assert b.points[-1].gvar == pytest.approx(4 * a.points[-1].gvar, rel=1e-9)
    assert b.deviations()["grad_var_max_dev"] == pytest.approx(a.deviations()["grad_var_max_dev"], rel=1e-9)


def test_explain_swiglu_and_reglu(swiglu12):
    st = steps(swiglu12)
    text = " ".join(s.text for s in st)
    assert "gate" in text and "not homogeneous" in text and "numerically" in text
    assert "RMSNorm" in text and "final norm" in text
    for s in st:
        if s.expr is not None:
            sp.latex(s.expr)
    # ReGLU: homogeneous of degree 6, a closed form
    re = solve("unit-variance", model=modern(2, activation="relu"))
    st = steps(re)
    closed = [s for s in st if "homogeneous of degree 6" in s.text]
    assert closed and isinstance(closed[0].expr, sp.Eq)


def test_reglu_closed_form_typed_by_hand():
    """ReGLU: V = d_ff s_d^2 E[relu(g)^2] var(u) / ((1-p_f)(1-p_h)) = d^2 d_ff s^6 v^2 / (2 (1-p_f)(1-p_h)),
    so s = (2 V (1-p_f)(1-p_h) / (d^2 d_ff v^2))^(1/6)."""
    eqs = E.SublayerEquations(modern(2, activation="relu"))
    eq, closed = eqs.ffn_solution()
    assert closed is not None
    hand = (2 * E.R * (1 - E.p_f) * (1 - E.p_h) / (E.d**2 * E.dff * E.v_in**2)) ** sp.Rational(1, 6)
    nums = {E.R: 1.3, E.p_f: 0.1, E.p_h: 0.2, E.d: 64, E.dff: 172, E.v_in: 0.9}
    assert float(closed.subs(nums)) == pytest.approx(float(hand.subs(nums)), rel=1e-13)
    # and the solved model uses it
    sol = solve("unit-forward", model=modern(2, activation="relu"), verify=False)
    f = sol.sublayers[1]
    assert f.homogeneous
    nums = {E.R: f.required, E.p_f: 0.0, E.p_h: 0.1, E.d: 64, E.dff: 172, E.v_in: f.branch_in.var}
    assert f.stds["gate"] == pytest.approx(float(hand.subs(nums)), rel=1e-12)


def test_glu_split_probes():
    """ReGLU is homogeneous in each weight: moving scale between gate and up, or gate and down,
    leaves Gamma/V; SwiGLU's gate sets the SiLU's pre-activation variance, so it moves."""
    from sigprop.solve.explain import split_probes

    re = solve("unit-forward", model=modern(1, activation="relu"), verify=False)
    pr = split_probes(re.equations, re.sublayers[0], re.sublayers[1])
    assert pr["gate_up_split"] == pytest.approx(1.0, rel=1e-9)
    assert pr["in_out_split"] == pytest.approx(1.0, rel=1e-9)
    sw = solve("unit-forward", model=modern(1), verify=False)
    pr = split_probes(sw.equations, sw.sublayers[0], sw.sublayers[1])
    assert abs(pr["gate_up_split"] - 1) > 1e-3


def test_mlp_silu_and_layernorm_glu():
    """The other combinations go through the same path: a SiLU MLP, a LayerNorm GeGLU."""
    for m in (modern(3, ffn_kind="mlp", activation="silu"), modern(3, norm="layernorm", activation="gelu")):
        sol = solve("unit-forward", model=m)
        assert sol.feasible, sol.reason
        assert max(abs(p.var - 1) for p in sol.points[1:]) < 1e-6


# -- placements peri, output and the parallel block -------------------------------------------

@pytest.mark.parametrize("placement", ["peri", "output"])
def test_normalised_branch_outputs(placement):
    """peri and output: the branch output is normalised, so the residual scales alone set the
    stream's variance; the init is solved for V = 1 at the output norm's input."""
    from sigprop.solve.blocks import branch

    sol = solve("unit-variance", model=modern(6, placement=placement))
    assert sol.feasible, sol.reason
    assert max(abs(p.var - 1) for p in sol.points[1:]) < 1e-4
    for sub in sol.sublayers[:4]:
        assert sub.out_norm and sub.required == 1.0
        y, _ = branch(sol.equations.chains.chain(sub.kind, sub.layer - 1, sub.stds), sub.branch_in, None)
        assert float(y.var) == pytest.approx(1.0, rel=1e-7)
    # peri normalises the branch input as pre does: the first attention sublayer sees the same input
    if placement == "peri":
        pre = solve("unit-forward", model=modern(6), verify=False)
        assert sol.model.attention.std["v"][0] == pytest.approx(pre.model.attention.std["v"][0], rel=1e-12)


def test_normalised_branch_cannot_absorb_the_input_variance():
    sol = solve("unit-forward", model=modern(3, placement="peri", input_var=2.0))
    assert not sol.feasible
    assert "residual scales alone" in sol.reason


def test_parallel_block():
    """x' = a x + b_A Att + b_F FFN: both branches deliver V = (1 - a^2 sigma^2)/(b_A^2 + b_F^2),
    1/2 with a^2 = 1 - 1/N and b^2 = 1/N; one trace point per layer."""
    sol = solve("unit-variance", model=modern(8, block="parallel"))
    assert sol.feasible, sol.reason
    assert len(sol.points) == 1 + 8
    for sub in sol.sublayers[2:]:
        assert sub.required == pytest.approx(0.5, rel=1e-9)
    assert max(abs(p.var - 1) for p in sol.points[1:]) < 1e-6
    assert "block_gain_ratio" in sol.extra["gradient"]
    text = " ".join(s.text for s in steps(sol))
    assert "parallel" in text


def test_post_rmsnorm():
    sol = solve("unit-forward", model=modern(4, placement="post", final_norm=False))
    assert sol.feasible, sol.reason
    np.testing.assert_allclose([p.var for p in sol.points[1:]], 1.0, rtol=1e-5)


# -- what is refused, and the chain's parameters ------------------------------------------------

@pytest.mark.parametrize("change", [dict(qk_norm="rmsnorm"), dict(qk_norm="layernorm", rope=10000.0)])
def test_refuses_what_it_does_not_solve(change):
    m = modern(2).replace(**change)
    with pytest.raises(DomainError, match="solve-init does not implement"):
        solve("unit-forward", model=m, verify=False)
    with pytest.raises(DomainError, match="solve-init does not implement"):
        solve("logit-var", value=1.0, model=m, verify=False)


def test_model_and_options_exclude_each_other():
    with pytest.raises(DomainError):
        solve("unit-forward", model=modern(2), n_layers=3)
    with pytest.raises(DomainError):
        solve("max-depth", max_ratio=2.0, model=modern(2))


def test_model_from_json_file(tmp_path):
    p = tmp_path / "m.json"
    import json

    p.write_text(json.dumps({"model": modern(2).to_json()}))
    a = solve("unit-forward", model=str(p), verify=False)
    b = solve("unit-forward", model=Model.load(p), verify=False)
    np.testing.assert_array_equal(a.model.ffn.std["gate"], b.model.ffn.std["gate"])


def test_attention_parameters_pass_through(monkeypatch):
    """The solver evaluates the attention chain the block description gives, with whatever
    parameters it carries: an added parameter reaches the chain unchanged, and a chain whose
    weight stds cannot be located is refused."""
    from sigprop.model import blocks as model_blocks
    from sigprop.solve.blocks import Chains

    orig = model_blocks.branch_chain

    def with_extra(model, kind, l):
        ch = orig(model, kind, l)
        if kind == "attention":
            ch[0][1]["extra_setting"] = 0.125
        return ch

    monkeypatch.setattr(model_blocks, "branch_chain", with_extra)
    ch = Chains(modern(2))
    chain = ch.chain("attention", 0, {"q": 0.1, "k": 0.2, "v": 0.3, "o": 0.4})
    prm = chain[0][1]
    assert prm["extra_setting"] == 0.125
    assert (prm["q_std"], prm["k_std"], prm["v_std"], prm["o_std"]) == (0.1, 0.2, 0.3, 0.4)
    assert chain[-1] == ("dropout", {"p": 0.1})

    def renamed(model, kind, l):
        ch = orig(model, kind, l)
        if kind == "attention":
            ch[0][1]["value_scale"] = ch[0][1].pop("v_std")
        return ch

    monkeypatch.setattr(model_blocks, "branch_chain", renamed)
    with pytest.raises(RuntimeError, match="do not match its weights"):
        Chains(modern(2)).chain("attention", 0, {"q": 0.1, "k": 0.2, "v": 0.3, "o": 0.4})


def test_solve_scale_on_a_known_function():
    from sigprop.solve.solver import solve_scale

    # s^6 + s^2 = 10 has the positive root s^2 = t with t^3 + t - 10 = 0, t = 2 exactly
    s = solve_scale(lambda s: s**6 + s**2, 10.0, 0.3, 6)
    assert s == pytest.approx(math.sqrt(2), rel=1e-12)


def test_logit_var_on_modern_blocks():
    for m in (modern(3), modern(3, placement="output"), modern(3, block="parallel")):
        sol = solve("logit-var", value=2.0, model=m)
        assert sol.feasible, sol.reason
        lv = [p.logit_var for p in sol.points if p.logit_var is not None]
        np.testing.assert_allclose(lv, 2.0, rtol=1e-4)


def test_latex_export_of_a_swiglu_derivation():
    from sigprop.export.solve import solve_latex

    tex = solve_latex(solve("unit-forward", model=modern(2)), fragment_only=True)
    assert r"\sigma_{\mathrm{gate}}" in tex and r"\int" in tex


def test_solved_model_forward_by_monte_carlo():
    """A seeded NumPy simulation of the solved pre-RMSNorm SwiGLU model (written here from the
    model object's semantics, bidirectional softmax attention, no dropout): the stream's
    variance stays at 1 through every sublayer, within the draws' spread."""
    sol = solve("unit-forward", model=modern(4, dropout=0.0))
    m = sol.model
    d, h, dh, L, dff, eps = m.d_model, m.n_heads, m.d_head, m.seq_len, m.d_ff, m.norm_eps
    r0 = m.input.corr
    rng = np.random.default_rng(11)

    def rms(x):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)

    draws = []
    for _ in range(24):
        shared = rng.standard_normal((1, d))
        x = math.sqrt(r0) * shared + math.sqrt(1 - r0) * rng.standard_normal((L, d))
        out = []
        for l in range(m.n_layers):
            at, ff = m.attention, m.ffn
            W = {w: rng.normal(0, at.std[w][l], (d, h * dh)) for w in ("q", "k", "v")}
            Wo = rng.normal(0, at.std["o"][l], (h * dh, d))
            u = at.norm_scale[l] * rms(x)
            q, k, v = (u @ W[w] for w in ("q", "k", "v"))
            heads = []
            for i in range(h):
                sl = slice(i * dh, (i + 1) * dh)
                a = q[:, sl] @ k[:, sl].T / math.sqrt(dh)
                p = np.exp(a - a.max(axis=1, keepdims=True))
                heads.append((p / p.sum(axis=1, keepdims=True)) @ v[:, sl])
            x = at.skip_scale[l] * x + at.branch_scale[l] * (np.concatenate(heads, axis=1) @ Wo)
            out.append(np.mean(x * x))
            u = ff.norm_scale[l] * rms(x)
            g = u @ rng.normal(0, ff.std["gate"][l], (d, dff))
            up = u @ rng.normal(0, ff.std["up"][l], (d, dff))
            y = (g / (1 + np.exp(-g)) * up) @ rng.normal(0, ff.std["down"][l], (dff, d))
            x = ff.skip_scale[l] * x + ff.branch_scale[l] * y
            out.append(np.mean(x * x))
        draws.append(out)
    draws = np.array(draws)
    mean, se = draws.mean(axis=0), draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
    assert np.all(np.abs(mean - 1) < 4 * se + 0.02), (mean, se)
    # and the prediction says the same
    np.testing.assert_allclose([p.var for p in sol.points[1:]], 1.0, atol=1e-6)


def test_rotary_and_grouped_query_pass_through():
    """RoPE and grouped-query heads enter the attention rule's parameters (the block
    description's chain); the solved model's predicted forward variance is flat with them."""
    m = modern(3).replace(rope=10000.0, n_kv_heads=1)
    sol = solve("unit-forward", model=m)
    assert sol.feasible, sol.reason
    assert sol.model.rope == 10000.0 and sol.model.n_kv_heads == 1
    np.testing.assert_allclose([p.var for p in sol.points[1:]], 1.0, rtol=1e-5)
