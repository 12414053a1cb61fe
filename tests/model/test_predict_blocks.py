"""The predictor on the block description's layouts (placements peri and output, parallel
blocks, RMSNorm, gated FFNs, the final norm): identities that hold exactly or to a known
order, independent of the Monte Carlo (which tests/mc/test_model*.py and docs/validation.md
compare against)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.model.predict import predict
from sigprop.model.presets import resolve
from sigprop.model.spec import Model, Sublayers

SMALL = dict(d_model=128, n_heads=4, d_ff=512, seq_len=16)


def _base(n=4, causal=False, **kw):
    return resolve("preln", "normal", n_layers=n, causal=causal, **{**SMALL, **kw})


def _relayout(m: Model, placement=None, **changes) -> Model:
    subs = {}
    for kind in ("attention", "ffn"):
        s = getattr(m, kind)
        subs[kind] = Sublayers(kind, placement if placement is not None else s.placement, s.skip_scale,
                               changes.pop(f"{kind}_branch", s.branch_scale), s.norm_scale, s.std, s.bias_std)
    return m.replace(**subs, **changes)


def _glu(m: Model) -> Model:
    s = m.ffn
    std = {"gate": s.std["in"], "up": s.std["in"], "down": s.std["out"]}
    bias = {"gate": s.bias_std["in"], "up": s.bias_std["in"], "down": s.bias_std["out"]}
    return m.replace(ffn=Sublayers("ffn", s.placement, s.skip_scale, s.branch_scale, s.norm_scale, std, bias),
                     ffn_kind="glu")


@pytest.mark.parametrize("causal", [False, True])
def test_parallel_block_with_a_silent_ffn_is_the_attention_sublayers_alone(causal):
    """A parallel block whose FFN branch scale is 0 computes x' = a x + b Att(n N(x)): the
    sequential model with the same attention and an FFN branch of scale 0 (x' = x)."""
    m = _base(causal=causal)
    seq = predict(_relayout(m, ffn_branch=0.0))
    par = predict(_relayout(m, ffn_branch=0.0, block="parallel"))
    assert len(par) == 1 + m.n_layers and {p.sublayer for p in par[1:]} == {"block"}
    after_ffn = [seq[0]] + [p for p in seq[1:] if p.sublayer == "ffn"]
    for p, q in zip(par, after_ffn):
        assert p.log_var == pytest.approx(q.log_var, abs=1e-12)
        assert p.corr == pytest.approx(q.corr, abs=1e-12)
        assert p.log_gvar == pytest.approx(q.log_gvar, abs=1e-10)
    att = [p.logit_var for p in seq[1:] if p.sublayer == "attention"]
    assert [p.logit_var for p in par[1:]] == pytest.approx(att, rel=1e-12)


def test_parallel_block_adds_both_branches():
    """Both branches see the same normalised input and have independent weights: the
    block's added variance is the sum of what each branch alone adds."""
    m = _base(n=1)
    both = predict(_relayout(m, block="parallel"))[-1].var
    att = predict(_relayout(m, ffn_branch=0.0, block="parallel"))[-1].var
    ffn = predict(_relayout(m, attention_branch=0.0, block="parallel"))[-1].var
    v0 = m.input.var
    assert both - v0 == pytest.approx((att - v0) + (ffn - v0), rel=1e-9)


@pytest.mark.parametrize("placement", ["peri", "output"])
def test_a_normalised_branch_adds_b_squared(placement):
    """peri and output: the branch output is a norm's output (variance s2/(s2 + eps), mean 0),
    so each sublayer adds b^2 to the stream variance, whatever the branch's weights: exactly
    1 at eps 0; with eps 1e-5 less by eps/s2 for the small branch outputs of a 0.02 init
    (s2 ~ 7e-4 for attention here: 1.4%)."""
    m = _base(n=3)
    exact = predict(_relayout(m, placement=placement, norm_eps=0.0))
    for prev, p in zip(exact, exact[1:]):
        assert p.var - prev.var == pytest.approx(1.0, rel=1e-9)
    pts = predict(_relayout(m, placement=placement))
    for prev, p in zip(pts, pts[1:]):
        assert 0.97 < p.var - prev.var < 1.0


def test_output_norm_removes_the_input_scale_of_a_homogeneous_branch():
    """output placement: N(F(x)) of a bias-free ReLU FFN is invariant to the scale of x."""
    m = _relayout(_base(n=1), placement="output", norm_eps=0.0)
    small, big = (predict(m.replace(input=m.input._replace(var=v)))[-1] for v in (1.0, 100.0))
    # the attention sublayer's logits see the scale (a small effect at std 0.02): compare the
    # variance each sublayer adds
    assert big.var - 100.0 == pytest.approx(small.var - 1.0, rel=1e-3)


def test_final_norm_backward():
    """final_norm: the upstream gradient is given at the norm's output; the last point's
    gradient is the LayerNorm's backward at the stream's variance s2, about g2 / (s2 + eps)
    less the removed directions and the per-token variance's spread (between (d - 3)/d and
    1 of it).  Below, a Pre-LN stack's backward is linear in the gradient's variance (token
    correlation 0 here): every point's gradient scales by that same factor, up to the per-token
    slope the final norm starts (GradState.slope), which raises the gradient below by O(1/d)
    per FFN norm and never lowers it."""
    m = _base(n=2)
    plain, fin = predict(m), predict(m.replace(final_norm=True))
    assert [p.var for p in fin] == [p.var for p in plain]      # forward points: the stream
    s2 = plain[-1].var
    k = fin[-1].gvar / plain[-1].gvar
    assert (m.d_model - 3) / m.d_model / s2 < k < (m.d_model + 3) / m.d_model / s2
    ratios = [p.gvar / q.gvar / k for p, q in zip(fin, plain)]
    assert ratios == pytest.approx([1.0] * len(fin), rel=1e-3)
    assert all(r >= 1 - 1e-12 for r in ratios) and ratios[-1] == 1.0


def test_rmsnorm_model_close_to_layernorm_for_a_zero_mean_stream():
    """With a zero-mean stream RMSNorm and LayerNorm differ only by LayerNorm's centring
    (relative 1/d on variances)."""
    m = _base(n=6)
    ln, rms = predict(m), predict(m.replace(norm="rmsnorm"))
    for p, q in zip(ln, rms):
        assert q.var == pytest.approx(p.var, rel=3.0 / m.d_model)
        assert q.gvar == pytest.approx(p.gvar, rel=3.0 / m.d_model)


def test_rmsnorm_keeps_an_input_mean():
    """LayerNorm removes the stream's mean before the branch; RMSNorm keeps it, and the
    following linear layers turn it into token correlation."""
    m = resolve("preln", "xavier", n_layers=1, skip_scale=0.0, input_mean=2.0, input_corr=0.0, **SMALL)
    ln, rms = predict(m), predict(m.replace(norm="rmsnorm"))
    centred = predict(m.replace(input=m.input._replace(mean=0.0)))
    # (the stream after the attention sublayer is its branch output: a = 0)
    assert ln[1].corr == pytest.approx(centred[1].corr, abs=1e-6)
    assert rms[1].corr > ln[1].corr + 0.5


def test_glu_ffn_uses_the_glu_rule():
    """A gated FFN's sublayer adds act-moment * up variance: with unit-variance projections
    after a norm, SwiGLU's output variance per unit down-projection gain is E[silu(g)^2]."""
    m = _glu(_base(n=1, d_ff=256)).replace(activation="silu")
    pts = predict(m)
    from sigprop.rules import get
    from sigprop.state import Forward

    g_std = float(m.ffn.std["gate"][0])
    vg = m.d_model * g_std**2 * 1.0          # the norm output has variance ~1
    a = get("silu").fast(Forward(0.0, vg, 0.0), None, {})[0]
    second = float(a.var + a.mean**2)
    want = second * vg * m.d_ff * float(m.ffn.std["down"][0]) ** 2 / (1 - m.dropout.hidden)
    assert pts[2].var - pts[1].var == pytest.approx(want, rel=0.02)


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_keeps_the_moments(causal):
    """Heads sharing keys and values: every cross-head term of the second moments is linear in
    two independent zero-mean W_o blocks, so the prediction does not depend on n_kv_heads
    (the attention rule's derivation; its Monte Carlo sweep checks it)."""
    m = _base(n=2, causal=causal)
    ref = predict(m)
    for kv in (1, 2):
        got = predict(m.replace(n_kv_heads=kv))
        assert [(p.log_var, p.corr, p.log_gvar) for p in got] == [(p.log_var, p.corr, p.log_gvar) for p in ref]


def test_qk_norm_fixes_the_logit_variance():
    """QK-norm: queries and keys normalised per head, so the logit variance no longer depends
    on the stream's scale or on W_q, W_k (RMSNorm: var(q) = var(k) = v/(v + eps) ~ 1)."""
    m = _base(n=1).replace(qk_norm="rmsnorm")
    big = resolve("preln", "xavier", n_layers=1, **SMALL).replace(qk_norm="rmsnorm")
    for model in (m, big, m.replace(input=m.input._replace(var=100.0))):
        assert predict(model)[1].logit_var == pytest.approx(1.0, rel=1e-3)
    assert predict(big.replace(qk_norm=None))[1].logit_var > 1.5


def test_rotary_positions_keep_a_single_logits_variance():
    """RoPE rotates q and k orthogonally: one logit's variance is unchanged, while the
    attention output changes (the key-shared part no longer cancels in the softmax)."""
    m = resolve("preln", "xavier", n_layers=1, input_corr=0.8, **SMALL)
    plain, rot = predict(m), predict(m.replace(rope=100.0))
    assert rot[1].logit_var == pytest.approx(plain[1].logit_var, rel=1e-12)
    assert abs(rot[1].corr - plain[1].corr) > 1e-3
