"""The predictor threads immutable states through its residual units (sigprop.model.states):
each unit maps the stream state entering it to the one after it and, backward, the gradient
state after it to the one entering it; trace points are made from the states.  Structural
checks that a unit is a function of its state alone (no hidden carry-over in the predictor)."""

import math

import pytest

from sigprop.model import blocks, resolve
from sigprop.model.predict import Predictor, _points, predict
from sigprop.model.states import GradState, StreamState, UnitGains

SMALL = dict(d_model=64, n_heads=2, d_ff=256, seq_len=16)
MODELS = {
    "preln": lambda: resolve("preln", "normal", n_layers=3, **SMALL),
    "postln": lambda: resolve("postln", "torch-default", n_layers=3, **SMALL),
    "parallel-rms": lambda: resolve("preln", "normal", n_layers=3, block="parallel", norm="rmsnorm",
                                    final_norm=True, **SMALL),
    "peri": lambda: resolve("preln", "normal", n_layers=3, placement="peri", **SMALL),
    "output-swiglu": lambda: resolve("preln", "normal", n_layers=3, placement="output", ffn="swiglu", **SMALL),
    "postln-causal": lambda: resolve("postln", "torch-default", n_layers=3, causal=True, **SMALL),
    "preln-causal-final": lambda: resolve("preln", "normal", n_layers=3, causal=True, final_norm=True, **SMALL),
}


def _passes(m):
    pr = Predictor(m)
    recs = pr.forward()
    return pr, recs, pr.backward(recs)


def _units(m):
    cols = blocks.columns(m)
    return [u for l in range(m.n_layers) for u in blocks.layer_units(m, l, cols)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_units_map_one_state_to_the_next(name):
    m = MODELS[name]()
    pr, recs, grads = _passes(m)
    assert len(recs) == len(_units(m)) and len(grads) == len(recs)
    s0 = recs[0].s_in
    assert isinstance(s0, StreamState)
    assert s0.log_var == pytest.approx(math.log(m.input.var), abs=1e-15) and s0.x.var == 1.0
    assert s0.tok == blocks.GAUSSIAN_TOKENS and s0.logit_var is None
    for prev, rec in zip(recs, recs[1:]):
        assert rec.s_in is prev.s_out          # the state after a unit is the next one's input
    for rec in recs:
        s = rec.s_out
        assert isinstance(s, StreamState) and s.x.var == 1.0
        assert s.dev is None                   # the records keep no L x L matrix
        assert (s.prof is not None) == m.causal
        assert (rec.s_sum is not None) == rec.post
        if rec.post:
            assert s.tok == blocks.NORM_TOKENS
        assert (s.logit_var is not None) == (rec.kind in ("attention", "block"))
        assert isinstance(rec.gains, UnitGains) and rec.branch_gain == math.exp(rec.gains.log_branch_gain)
        with pytest.raises(AttributeError):
            s.log_var = 0.0                    # frozen
    assert all(isinstance(g, GradState) and g.w is None for g in grads)
    assert isinstance(pr.top_grad, GradState)
    assert all((r.g_prof is not None) == m.causal for r in recs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_trace_points_are_the_states(name):
    m = MODELS[name]()
    pr, recs, grads = _passes(m)
    pts = _points(m, recs, grads, pr.top_grad)
    assert list(predict(m)) == pts
    assert pts[0].mean == m.input.mean and pts[0].log_gvar == grads[0].log_gvar
    below = grads[1:] + [pr.top_grad]
    for p, rec, g in zip(pts[1:], recs, below):
        assert (p.layer, p.sublayer) == (rec.layer, rec.kind)
        assert p.log_var == rec.s_out.log_var and p.corr == rec.s_out.x.corr
        assert p.logit_var == rec.s_out.logit_var
        assert (p.log_gvar, p.gcorr) == (g.log_gvar, g.gcorr)


@pytest.mark.parametrize("name", ["preln", "postln", "parallel-rms", "peri", "output-swiglu"])
def test_a_unit_is_a_function_of_its_states(name):
    # bidirectional models (their states carry no position matrices, which the records drop):
    # each unit run on its own, on a fresh predictor, from the recorded state entering it
    # gives the recorded state after it, forward and backward, bit for bit (in the passes'
    # order: the predictor's table cache builds a shared table at its first use)
    m = MODELS[name]()
    pr, recs, grads = _passes(m)
    fresh = Predictor(m)
    fresh._end = recs[-1].s_out
    again = []
    for unit, rec in zip(_units(m), recs):
        new, s_out = fresh._unit(rec.layer, unit, rec.s_in, rec.s_in)
        assert s_out == rec.s_out
        new.s_out = s_out                      # as the forward pass records it (the backward reads it)
        again.append(new)
    below = grads[1:] + [pr.top_grad]
    for i in reversed(range(len(recs))):
        assert fresh._unit_backward(again[i], below[i]) == grads[i]
        assert again[i].gains == recs[i].gains
