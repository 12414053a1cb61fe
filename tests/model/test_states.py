"""The predictor threads immutable states through its residual units (sigprop.model.states):
each unit maps the stream state entering it to the one after it and, backward, the gradient
state after it to the one entering it; trace points are made from the states.  Structural
checks that a unit is a function of its state alone (no hidden carry-over in the predictor),
and that the backward pass only reads the forward pass's records and ops."""

import math

import numpy as np
import pytest

from sigprop.model import blocks, resolve
from sigprop.model.predict import Op, Predictor, _points, predict, with_gains
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
    "output-causal": lambda: resolve("preln", "normal", n_layers=3, placement="output", causal=True, **SMALL),
    "parallel-causal": lambda: resolve("preln", "normal", n_layers=3, block="parallel", causal=True, **SMALL),
}


def _passes(m):
    pr = Predictor(m)
    recs = pr.forward()
    grads, gains = pr.backward(recs)
    return pr, with_gains(recs, gains), grads


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
        assert s_out == rec.s_out and new.s_out == rec.s_out and new.gains is None
        again.append(new)
    below = grads[1:] + [pr.top_grad]
    for i in reversed(range(len(recs))):
        g, gains = fresh._unit_backward(again[i], below[i])
        assert g == grads[i]
        assert gains == recs[i].gains


def _snapshot(obj):
    """A deep copy of what a record holds, for comparison: tuples (records, ops, states)
    field by field, dicts item by item, arrays copied; anything else (an interpolation table)
    by identity."""
    if isinstance(obj, tuple):
        return (type(obj), tuple(_snapshot(v) for v in obj))
    if isinstance(obj, dict):
        return (dict, tuple((k, _snapshot(v)) for k, v in obj.items()))
    if isinstance(obj, np.ndarray):
        return (np.ndarray, obj.copy())
    if isinstance(obj, (float, int, str, bool, type(None), np.floating)):
        return obj
    return ("id", id(obj))


def _same(a, b) -> bool:
    if isinstance(a, tuple) and len(a) == 2 and a[0] is np.ndarray:
        return isinstance(b, tuple) and b[0] is np.ndarray and np.array_equal(a[1], b[1], equal_nan=True)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", sorted(MODELS))
def test_backward_leaves_the_records_as_the_forward_pass_made_them(name):
    # every field of every record, op and state (parameter dicts item by item, arrays by
    # value) is the same after the backward pass as before it; the records and ops are
    # immutable (assignment raises); the backward pass's results come back beside them
    m = MODELS[name]()
    pr = Predictor(m)
    recs = pr.forward()
    before = _snapshot(tuple(recs))
    grads, gains = pr.backward(recs)
    assert _same(before, _snapshot(tuple(recs)))
    assert len(gains) == len(recs) and all(r.gains is None for r in recs)
    ops = [op for r in recs for part in (r.parts or (r,))
           for op in (r.pre_ops or ()) + (part.branch_ops or ()) + (part.out_ops or ())]
    assert ops and all(isinstance(op, Op) for op in ops)
    for obj in [recs[0], ops[0]] + list(recs[0].parts or ()):
        with pytest.raises(AttributeError):
            obj.layer = 0 if not isinstance(obj, Op) else None      # frozen
        with pytest.raises(AttributeError):
            obj.params = {}
    joined = with_gains(recs, gains)
    assert [r.gains for r in joined] == gains
    assert all(j[:-1] == r[:-1] for j, r in zip(joined, recs))
    # a second backward pass over the same records gives the same numbers
    again, gains2 = pr.backward(recs)
    assert again == grads and len(gains2) == len(gains)
    for g1, g2 in zip(gains, gains2):
        assert g1[:3] == g2[:3] and g1.norm_params == g2.norm_params
        assert (g1.g_prof is None) == (g2.g_prof is None)
        if g1.g_prof is not None:
            assert np.array_equal(g1.g_prof, g2.g_prof)
