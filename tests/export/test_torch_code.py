"""The PyTorch init code `sigprop solve-init --emit torch` prints (sigprop.export.torch_code):
golden text for small models (read line by line against the model they describe), and the
command line."""

from __future__ import annotations

import ast

from sigprop.export.torch_code import torch_init_code
from sigprop.model.presets import resolve
from sigprop.model.spec import Model
from tests import _paths
from tests._cli import cli

DATA = _paths.DATA / "hf"


def _neox_model():
    """2 layers, d_model 64, 4 heads of 16, branch scale 0.5 (folded into o and out: 0.01), no
    biases, layer 2's q std 0.1."""
    obj = resolve("preln", n_layers=2, d_model=64, n_heads=4, seq_len=8, init="normal", branch_scale=0.5,
                  bias=False).to_json()
    obj["layers"][1]["attention"]["init"]["q"]["std"] = 0.1
    return Model.from_json(obj)


def _plain_model():
    """2 layers, layer 1's v std 0.3, layer 2's FFN-in bias std 0.01 and attention skip scale 0.5."""
    obj = resolve("preln", n_layers=2, d_model=64, n_heads=4, seq_len=8, init="normal").to_json()
    obj["layers"][0]["attention"]["init"]["v"]["std"] = 0.3
    obj["layers"][1]["ffn"]["init"]["in"]["bias_std"] = 0.01
    obj["layers"][1]["attention"]["skip_scale"] = 0.5
    return Model.from_json(obj)


GPT_NEOX = '''import torch


def apply_sigprop_init(model, generator=None):
    """Set the weights of a Hugging Face gpt_neox PyTorch model (2 blocks "layers.{}") to sigprop's init:
    each matrix iid N(0, std^2) with its layer's std, biases 0, norm gains 1 and biases 0.
    Written by sigprop (preln, 2 layers, d_model 64)."""
    std = {
        "q": [0.02, 0.1],
        "k": [0.02] * 2,
        "v": [0.02] * 2,
        "o": [0.01] * 2,
        "in": [0.02] * 2,
        "out": [0.01] * 2,
    }
    # (module under block i, sigprop weight, fused part: (how, index, parts) or None)
    targets = [
        ("attention.query_key_value", "q", ('heads', 0, 3)),
        ("attention.query_key_value", "k", ('heads', 1, 3)),
        ("attention.query_key_value", "v", ('heads', 2, 3)),
        ("attention.dense", "o", None),
        ("mlp.dense_h_to_4h", "in", None),
        ("mlp.dense_4h_to_h", "out", None),
    ]
    modules = dict(model.named_modules())
    first = next((k for k in modules if k == "layers.0" or k.endswith(".layers.0")), None)
    if first is None:
        raise ValueError("no module 'layers.0': not a hf:gpt_neox model")
    prefix = first[: len(first) - 8]
    block = prefix + "layers.{}"
    if block.format(2) in modules or block.format(1) not in modules:
        raise ValueError("the model does not have 2 blocks")
    d_head = 16
    with torch.no_grad():
        for i in range(2):
            for path, name, split in targets:
                m = modules[block.format(i) + "." + path]
                w, b = m.weight, m.bias
                if split is not None:
                    how, k, parts = split
                    if how == "heads":  # (out, in) weight, rows interleaved per head
                        heads = w.shape[0] // (parts * d_head)
                        w = w.view(heads, parts, d_head, w.shape[1])[:, k]
                        b = None if b is None else b.view(heads, parts, d_head)[:, k]
                w.normal_(0.0, std[name][i], generator=generator)
                if b is not None:
                    b.zero_()
        for m in model.modules():
            if type(m).__name__.endswith(("LayerNorm", "RMSNorm")):
                if getattr(m, "weight", None) is not None:
                    m.weight.fill_(1.0)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
    return model
'''

PLAIN = '''import torch


def apply_sigprop_init(model, generator=None):
    """Set the weights of a plain-layout PyTorch model (2 blocks "layers.{}") to sigprop's init:
    each matrix iid N(0, std^2) with its layer's std, biases N(0, bias_std^2), norm gains 1 and biases 0.
    Written by sigprop (preln, 2 layers, d_model 64)."""
    std = {
        "q": [0.02] * 2,
        "k": [0.02] * 2,
        "v": [0.3, 0.02],
        "o": [0.02] * 2,
        "in": [0.02] * 2,
        "out": [0.02] * 2,
    }
    bias_std = {
        "q": [0.0] * 2,
        "k": [0.0] * 2,
        "v": [0.0] * 2,
        "o": [0.0] * 2,
        "in": [0.0, 0.01],
        "out": [0.0] * 2,
    }
    scales = {  # block attributes: residual and norm scales
        "attn_skip": [1.0, 0.5],
        "attn_branch": [1.0] * 2,
        "attn_norm": [1.0] * 2,
        "ffn_skip": [1.0] * 2,
        "ffn_branch": [1.0] * 2,
        "ffn_norm": [1.0] * 2,
    }
    # (module under block i, sigprop weight, fused part: (how, index, parts) or None)
    targets = [
        ("attn.q", "q", None),
        ("attn.k", "k", None),
        ("attn.v", "v", None),
        ("attn.o", "o", None),
        ("ffn.in", "in", None),
        ("ffn.out", "out", None),
    ]
    modules = dict(model.named_modules())
    first = next((k for k in modules if k == "layers.0" or k.endswith(".layers.0")), None)
    if first is None:
        raise ValueError("no module 'layers.0': not a plain model")
    prefix = first[: len(first) - 8]
    block = prefix + "layers.{}"
    if block.format(2) in modules or block.format(1) not in modules:
        raise ValueError("the model does not have 2 blocks")
    for i in range(2):
        for attr, vals in scales.items():
            if hasattr(modules[block.format(i)], attr):
                setattr(modules[block.format(i)], attr, vals[i])
            elif vals[i] != 1.0:
                raise ValueError(f"block {i} has no attribute {attr} for the scale {vals[i]}")
    with torch.no_grad():
        for i in range(2):
            for path, name, split in targets:
                m = modules[block.format(i) + "." + path]
                w, b = m.weight, m.bias
                w.normal_(0.0, std[name][i], generator=generator)
                if b is not None:
                    b.normal_(0.0, bias_std[name][i], generator=generator)
        for m in model.modules():
            if type(m).__name__.endswith(("LayerNorm", "RMSNorm")):
                if getattr(m, "weight", None) is not None:
                    m.weight.fill_(1.0)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
    return model
'''


def test_golden_gpt_neox():
    assert torch_init_code(_neox_model(), "hf:gpt_neox") == GPT_NEOX


def test_golden_plain():
    assert torch_init_code(_plain_model(), "plain") == PLAIN


def test_other_layouts():
    """GPT-2's fused Conv1D splits by columns, Gemma's norms hold w of (1 + w), LLaMA's gated FFN
    names; every text is valid Python with one function."""
    from sigprop.interop import hf

    m = resolve("preln", n_layers=2, d_model=64, n_heads=4, seq_len=8, init="normal")
    gpt2 = torch_init_code(m, "hf:gpt2")
    assert '("attn.c_attn", "k", (\'cols\', 1, 3)),' in gpt2 and "w = w[:, k * c:(k + 1) * c]" in gpt2
    assert 'first = next((k for k in modules if k == "h.0" or k.endswith(".h.0")), None)' in gpt2
    g = hf.resolve(hf.read_config(DATA / "gemma2-2b-uncapped.json"), seq_len=16, n_layers=2).model
    gemma = torch_init_code(g, "hf:gemma2")
    assert "m.weight.fill_(0.0)  # (1 + w) norms: w = 0 is gain 1" in gemma
    assert '("mlp.gate_proj", "gate", None),' in gemma and '"down": [' in gemma
    for text in (gpt2, gemma, GPT_NEOX, PLAIN):
        tree = ast.parse(text)
        assert [type(n).__name__ for n in tree.body] == ["Import", "FunctionDef"]


def test_refuses_what_weights_cannot_hold():
    import pytest

    from sigprop.errors import DomainError

    obj = _plain_model().to_json()
    with pytest.raises(DomainError, match="skip_scale 0.5"):
        torch_init_code(Model.from_json(obj), "hf:llama")
    with pytest.raises(DomainError, match="unknown layout"):
        torch_init_code(Model.from_json(obj), "hf:t5")


def test_cli_emit(capsys):
    from sigprop.solve import solve

    args = ["solve-init", "--layers", "3", "--d-model", "64", "--heads", "4", "--seq-len", "8"]
    code, out, err = cli(capsys, *args, "--emit", "torch")
    assert code == 0, err
    sol = solve("unit-variance", arch="preln", n_layers=3, d_model=64, n_heads=4, seq_len=8)
    assert out == torch_init_code(sol.model, "plain")
    code, out, err = cli(capsys, "solve-init", "--hf-config", str(DATA / "gpt-neox-full-rotary.json"), "--layers", "2",
                         "--seq-len", "16", "--target", "logit-var", "--value", "1", "--emit", "torch")
    assert code == 0, err
    assert "a Hugging Face gpt_neox PyTorch model (2 blocks" in out and "(\'heads\', 0, 3)" in out


def test_cli_emit_bad_input(capsys):
    base = ["solve-init", "--layers", "2", "--d-model", "64", "--heads", "4"]
    for extra, what in ((["--emit", "json"], "only output is torch"),
                        (["--layout", "plain"], "--layout goes with --emit torch"),
                        (["--emit", "torch", "--layout", "hf:t5"], "unknown layout"),
                        (["--emit", "torch", "--json"], "prints the code alone")):
        code, out, err = cli(capsys, *base, *extra)
        assert code == 2 and out == "" and what in err, (extra, err)
    # infeasible: exit 1, no code
    code, out, err = cli(capsys, "solve-init", "--hf-config", str(DATA / "gpt2-small.json"), "--layers", "2",
                         "--seq-len", "16", "--emit", "torch")
    assert code == 1 and out == ""
