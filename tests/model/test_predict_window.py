"""Whole models with sliding windows: the predictor threads each layer's window and rotary base
to its attention rule, refuses what it does not model, and agrees with the Monte Carlo
(sigprop check) on a bidirectional model with one windowed layer."""

from __future__ import annotations

import json
import math

import pytest

from tests._cli import cli

from sigprop.errors import DomainError
from sigprop.model import presets, sublayers
from sigprop.model.predict import predict
from sigprop.model.spec import Model


def _model(causal=False, seq_len=32, layers=3, **kw):
    m = presets.resolve(arch="preln", n_layers=layers, d_model=128, n_heads=4, seq_len=seq_len, causal=causal,
                        rope=True, rope_base=1e6, norm="rmsnorm", dropout=0.0)
    obj = m.to_json()
    for layer in obj["layers"]:
        for name in ("q", "k"):
            layer["attention"]["init"][name]["std"] = 1.4 / math.sqrt(128)
    return Model.from_json({**obj, **kw})


def test_each_layer_gets_its_window_and_rope():
    m = _model(window=[0, 9, 0], local_rope={"base": 1e4})
    chains = [dict(sublayers.attention_chain(m, m.attention, l)[0][1]) for l in range(3)]
    assert [c.get("window") for c in chains] == [None, 9, None]
    assert [c["rope"] for c in chains] == [1e6, 1e4, 1e6]
    # a window the sequence does not reach is not passed (its rows see every key)
    wide = _model(window=[0, 63, 0])
    assert "window" not in dict(sublayers.attention_chain(wide, wide.attention, 1)[0][1])


def test_the_trace_follows_the_layers_windows():
    """Layers with equal weights and different windows are different units (not one shared chain)."""
    g = predict(_model())
    first = predict(_model(window=[9, 0, 0]))
    second = predict(_model(window=[0, 9, 0]))
    assert first[1].gvar != g[1].gvar and first[1].corr != g[1].corr
    assert second[1].corr == g[1].corr and second[3].corr != g[3].corr


def test_refusals(capsys, tmp_path):
    with pytest.raises(DomainError, match="causal sliding-window"):
        predict(_model(causal=True, window=[8, 0, 0]))
    predict(_model(causal=True, window=[32, 0, 0]))            # (as long as the sequence: global)
    with pytest.raises(DomainError, match="in 2 layers"):
        predict(_model(window=[9, 0, 9]))
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps(_model(causal=True, window=[8, 8, 8]).to_json()))
    code, out, err = cli(capsys, "predict", "--spec", str(spec))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--seq-len 8" in err


def test_check_of_a_model_with_one_windowed_layer(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    m = _model(window=[9, 0, 0], local_rope={"base": 1e4})
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps(m.to_json()))
    code, out, err = cli(capsys, "check", "--spec", str(spec), "--trials", "6", "--batch", "6", "--json")
    assert code == 0, err
    assert json.loads(out)["pass"] is True
