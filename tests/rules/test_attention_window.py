"""The attention rule with a sliding window (``window``): its limits, its refusals, and its
agreement with the Monte Carlo component's band mask on a few points of the window grid
(the whole grid: docs/validation.md, attention grid ``window``)."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.mc.component import measure
from sigprop.mc.components.attention import COMPONENT, SWEEP
from sigprop.rules.attention import Attention, row_moments
from sigprop.state import Backward, Forward

RULE = Attention()


def _params(L, W, causal, rope=0.0, w=1.4):
    d = 256
    return dict(d=d, n_heads=4, d_head=64, L=L, q_std=w / 16, k_std=w / 16, v_std=1 / 16, o_std=1 / 16, p=0.0,
                causal=causal, window=W, rope=rope)


X, G = Forward(0.0, 1.0, 0.5), Backward(1.0, 0.5)


@pytest.mark.parametrize("causal, W", [(1, 32), (1, 200), (0, 63), (0, 100)])
def test_a_window_that_changes_no_row_is_global_attention(causal, W):
    """Causal W >= L, bidirectional W >= 2 L - 1: bit for bit the rule without a window."""
    a = RULE.evaluate(X, G, **_params(32, W, causal))
    b = RULE.evaluate(X, G, **_params(32, 0, causal))
    assert a == b


def test_one_key_rows():
    """W = 1: every row attends to its own key with weight 1: the output is the value path of one
    token (variance d_model sv^2 so^2 H dh s2, correlation r), A2 = 1."""
    for causal in (0, 1):
        y, g = RULE.evaluate(X, G, **_params(32, 1, causal))
        assert float(y.var) == pytest.approx(256 * (1 / 256) * (1 / 256) * 256, rel=1e-9)
        assert float(y.corr) == pytest.approx(0.5, abs=1e-9)
        assert float(g.var) == pytest.approx(1.0, rel=1e-6)
        p = _params(32, 1, causal)
        assert row_moments(p, X)[0].ravel()[0] == pytest.approx(1.0) if causal else \
            row_moments(p, X)[0] == pytest.approx(1.0)


def test_the_window_moves_the_moments():
    """A narrow window against global attention: the gradient variance and the correlations
    differ by far more than the rule's error on the grid."""
    for causal in (0, 1):
        a = RULE.evaluate(X, G, **_params(256, 16, causal))
        b = RULE.evaluate(X, G, **_params(256, 0, causal))
        assert abs(float(a[1].var) / float(b[1].var) - 1) > 0.1


def test_refusals():
    p = _params(32, 8, 1)
    with pytest.raises(DomainError, match="window"):
        RULE.rows(__import__("sigprop.backend.numeric", fromlist=["x"]), X, G, RULE.param_values(p), np.arange(1.0, 4))
    with pytest.raises(DomainError, match="one \\(L, window, causal\\)"):
        RULE.evaluate(Forward(0.0, 1.0, np.array([0.1, 0.2])), G, **{**p, "window": np.array([4, 8])})
    with pytest.raises(DomainError):
        RULE.evaluate(X, G, **{**p, "window": -1})


def test_symbolic_form_keeps_the_global_rule():
    """The symbolic form is the rule's without a window (window is numeric only)."""
    out = RULE.symbolic()
    assert "window" not in {str(s) for e in out.values() for s in e.free_symbols}


POINTS = [dict(window=5, L=64, causal=0, rope=0.0, x_corr=0.5, wqk_std_sqrt_d=1.4),
          dict(window=5, L=64, causal=1, rope=1e4, x_corr=0.5, wqk_std_sqrt_d=1.4),
          dict(window=24, L=64, causal=0, rope=1e4, x_corr=0.0, wqk_std_sqrt_d=1.4),
          dict(window=24, L=64, causal=1, rope=0.0, x_corr=0.5, wqk_std_sqrt_d=0.6)]


@pytest.mark.parametrize("i", range(len(POINTS)))
def test_rule_against_the_band_masked_component(i):
    pt = dict(x_std=1.0, g_std=1.0, g_corr=0.5, wv_std_sqrt_d=1.0, d=256, n_heads=4, d_head=64, p=0.0,
              budget=2048, max_seq=64, min_runs=6, **POINTS[i])
    c = SWEEP.make_case(pt)
    ms = measure(COMPONENT, c.sim_params, c.x, c.g, runs=6, batch=8, seed=10 + i)
    px, pg = RULE.evaluate(c.x, c.g, **c.rule_params)
    assert abs(float(px.var) / ms.x.var - 1) < max(0.03, 4 * ms.x.var_se / ms.x.var)
    assert abs(float(pg.var) / ms.g.var - 1) < max(0.05, 4 * ms.g.var_se / ms.g.var)
    assert abs(float(px.corr) - ms.x.corr) < 0.02
    assert abs(float(pg.corr) - ms.g.corr) < 0.03
    # and the global rule is outside that (the window matters at these points)
    gx, gg = RULE.evaluate(c.x, c.g, **{**c.rule_params, "window": 0})
    assert abs(float(gg.var) / ms.g.var - 1) > 0.05 or abs(float(gx.corr) - ms.x.corr) > 0.02
