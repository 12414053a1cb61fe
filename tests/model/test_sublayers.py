"""The sublayer kinds (sigprop.model.sublayers): every kind a layer's list may name has an
entry, and the interpreter's kind-specific steps follow the entries' declarations."""

from __future__ import annotations

import pytest

from sigprop import registry
from sigprop.model import blocks, presets, sublayers
from sigprop.model.spec import SUBLAYER_KINDS


def test_every_list_kind_has_an_entry():
    for kind in SUBLAYER_KINDS:
        assert sublayers.get(kind).name == kind


def test_a_kind_registers_once():
    with pytest.raises(ValueError, match="registered already"):
        sublayers.register(sublayers.Sublayer("ffn", lambda m, c, l: []))


def test_unit_chain_follows_the_declarations():
    m = presets.resolve("preln", n_layers=2, d_model=64, n_heads=4, d_ff=128, seq_len=8, init="xavier")
    att = blocks.unit_chain(m, 0, 1, True, 0.5)
    ffn = blocks.unit_chain(m, 1, 1, False, 1.0)
    assert [r for r, _ in att] == ["residual", "attention", "dropout"] and att[0][1]["a"] == 0.5
    assert [r for r, _ in ffn] == ["linear", "relu", "dropout", "linear", "dropout"]
    assert att[1][1]["q_std"] == float(m.attention.std["q"][1])
    # the FFN's Post-LN Euler term: the activation's (ReLU has one); attention: none
    assert sublayers.FFN.euler_var(m, m.ffn, 1, registry.activation("relu")) is not None
    assert sublayers.ATTENTION.euler_var is None and sublayers.ATTENTION.mixes_tokens
    assert not sublayers.NORM.hidden_dropout and sublayers.NORM.chain(m, None, 0) == []
