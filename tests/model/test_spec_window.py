"""The model object's sliding-window fields: ``window`` (one window per layer, 0 = global) and
``local_rope`` (the rotary base of the layers with a window)."""

from __future__ import annotations

import pytest

from sigprop.errors import DomainError
from sigprop.model import presets
from sigprop.model.spec import Model
from sigprop.rope import RopeFreqs


def _model(**kw):
    m = presets.resolve(arch="preln", n_layers=4, d_model=64, n_heads=2, seq_len=32, causal=False, rope=True,
                        rope_base=1e6, norm="rmsnorm")
    return Model.from_json({**m.to_json(), **kw})


def test_round_trip():
    m = _model(window=[8, 0, 8, 0], local_rope={"base": 1e4})
    assert m.window == (8, 0, 8, 0) and m.local_rope == 1e4
    assert {"window", "local_rope"} <= set(m.features())
    obj = m.to_json()
    assert obj["window"] == [8, 0, 8, 0] and obj["local_rope"] == {"base": 1e4}
    assert Model.from_json(obj) == m
    # one window for every layer is written as one number; all zeros is no window
    u = _model(window=5)
    assert u.window == (5,) * 4 and u.to_json()["window"] == 5
    z = _model(window=[0, 0, 0, 0])
    assert z.window is None and "window" not in z.to_json() and "window" not in z.features()
    # per layer: the local layers rotate with local_rope
    assert [m.window_of(i) for i in range(4)] == [8, 0, 8, 0]
    assert [m.rope_of(i) for i in range(4)] == [1e4, 1e6, 1e4, 1e6]
    assert [u.rope_of(i) for i in range(4)] == [1e6] * 4


def test_frequency_vector_local_rope():
    f = RopeFreqs([1.0] * 16)
    m = _model(window=[8, 0, 0, 0], local_rope=f.to_json())
    assert m.local_rope == f and m.rope_of(0) == f and Model.from_json(m.to_json()) == m


def test_truncated_keeps_its_layers_windows():
    m = _model(window=[0, 0, 8, 0], local_rope={"base": 1e4})
    assert m.truncated(3).window == (0, 0, 8)
    t = m.truncated(2)
    assert t.window is None and t.local_rope is None


@pytest.mark.parametrize("bad, word", [
    ({"window": -1}, "window"), ({"window": 1.5}, "window"), ({"window": [1, 2]}, "window"),
    ({"window": [1, 2, 3, True]}, "window"), ({"window": "8"}, "window"),
    ({"window": [8, 0, 0, 0], "local_rope": {"base": 1.0}}, "local_rope"),
    ({"local_rope": {"base": 1e4}}, "local_rope"),
    ({"window": [8, 0, 0, 0], "local_rope": {"inv_freq": [1.0, 2.0]}}, "local_rope"),
])
def test_bad_values(bad, word):
    with pytest.raises(DomainError, match=word):
        _model(**bad)
