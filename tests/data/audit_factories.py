"""Factories for the init audit's tests: the plain reference model of a small Pre-LN model
(spec: :func:`spec`), drawn from sigprop's own init, once as is and once with one weight
re-drawn with a wrong std."""

from __future__ import annotations

#: the std written into layers.1.ffn.out.weight by :func:`planted`
WRONG_STD = 0.2


def spec():
    from sigprop.model.presets import resolve

    return resolve("preln", n_layers=3, d_model=64, n_heads=4, seq_len=16, causal=True)


def clean():
    from sigprop.torch.plain import PlainTransformer

    return PlainTransformer(spec())


def planted():
    import torch

    net = clean()
    with torch.no_grad():
        net.layers[1].ffn["out"].weight.normal_(0.0, WRONG_STD)
    return net
