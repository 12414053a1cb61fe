"""`sigprop audit`: a PyTorch model's own init against the init sigprop's prediction assumes.

The command tests need torch (and transformers for --hf-config): they skip without them,
unless SIGPROP_REQUIRE_TORCH=1, which turns the skip into a failure.  The sampling tolerance
(sigprop.torch.audit.judge) is pure Python and always runs."""

from __future__ import annotations

import importlib
import json
import math
import os

import numpy as np
import pytest

from tests._cli import cli
from tests._paths import DATA

GPT2 = DATA / "hf" / "gpt2-small.json"


def need(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("SIGPROP_REQUIRE_TORCH") == "1":
            pytest.fail(f"{module} is not installed but SIGPROP_REQUIRE_TORCH=1 (make test installs it)")
        pytest.skip(f"{module} not installed")


@pytest.fixture(autouse=True)
def _one_thread():
    try:
        import torch as t
    except ImportError:
        yield
        return
    old = t.get_num_threads()
    t.set_num_threads(1)
    yield
    t.set_num_threads(old)


@pytest.fixture
def torch():
    return need("torch")


@pytest.fixture
def transformers():
    need("torch")
    return need("transformers")


@pytest.fixture
def factories(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    return importlib.import_module("audit_factories")


# -- the sampling tolerance -------------------------------------------------------------

@pytest.mark.parametrize("n", [64, 4096, 65536])
def test_judge_passes_draws_of_the_assumed_law_and_flags_a_wrong_one(n):
    """Over 200 draws of n iid N(0, s^2) entries, none is flagged (5 standard errors: a false
    alarm has probability ~1e-6 per draw).  Draws whose std is 1% + 10 standard errors off, or
    whose mean is 1% + 8 standard errors off, are flagged in at least 98% of the draws (the
    sample's own spread leaves them 2.6 and 3 standard errors beyond the tolerance)."""
    from sigprop.torch.audit import judge

    rng = np.random.default_rng(n)
    s = 0.02
    off = 0.01 + 10 / math.sqrt(2 * n)
    shift = (0.01 + 8 / math.sqrt(n)) * s
    wide = shifted = 0
    for _ in range(200):
        x = rng.normal(0.0, s, n)
        assert judge(n, x.std(), x.mean(), np.abs(x).max(), s)[0]
        y = rng.normal(0.0, s * (1 + off), n)
        wide += not judge(n, y.std(), y.mean(), np.abs(y).max(), s)[0]
        z = x + shift
        shifted += not judge(n, z.std(), z.mean(), np.abs(z).max(), s)[0]
    assert wide >= 196 and shifted >= 196, (wide, shifted)


def test_judge_of_an_assumed_zero_is_exact():
    from sigprop.torch.audit import judge

    assert judge(10, 0.0, 0.0, 0.0, 0.0) == (True, 0.0)
    assert not judge(10, 1e-3, 0.0, 3e-3, 0.0)[0]


# -- Hugging Face configs ---------------------------------------------------------------

def test_gpt2_audits_clean_with_its_scaled_output_init(transformers, capsys, tmp_path, monkeypatch):
    """GPT-2 reduced to 2 layers: transformers draws both c_proj with initializer_range /
    sqrt(2 n_layer) (0.02 / sqrt(4) = 0.01) and the rest with 0.02; sigprop's hf mapping
    assumes the same (init 'scaled'), so every tensor matches (exit 0)."""
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    code, out, err = cli(capsys, "audit", "--hf-config", str(GPT2), "--layers", "2", "--seed", "7", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["schema"] == "sigprop.audit/1" and obj["passed"] is True and obj["seed"] == 7
    rows = {r["name"]: r for r in obj["tensors"]}
    for name in ("h.1.attn.c_proj.weight", "h.1.mlp.c_proj.weight"):
        assert rows[name]["assumed_std"] == pytest.approx(0.01)
        assert rows[name]["std"] == pytest.approx(0.01, rel=0.02)
        assert "scaled init" in rows[name]["why"]
    for part in ("q", "k", "v"):
        r = rows[f"h.0.attn.c_attn.weight[{part}]"]
        assert r["assumed_std"] == pytest.approx(0.02) and r["n"] == 768 * 768
    assert rows["h.0.attn.c_attn.bias[q]"]["assumed_std"] == 0.0 and rows["h.0.attn.c_attn.bias[q]"]["ok"]
    assert rows["ln_f.weight"]["assumed_mean"] == 1.0 and rows["ln_f.bias"]["assumed_mean"] == 0.0
    assert rows["ln_f.weight"]["layer"] is None and rows["h.1.ln_2.weight"]["layer"] == 2
    assert len([r for r in obj["tensors"] if r["group"] == "norm gain"]) == 5     # 2 x (ln_1, ln_2) + ln_f
    assert set(obj["not_compared"]) == {"wte.weight", "wpe.weight"}
    # the text: the verdict first, then the table
    code, out, err = cli(capsys, "audit", "--hf-config", str(GPT2), "--layers", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("audit: ok: all ") and "torch seed 0" in lines[0]
    assert any(line.split()[:3] == ["ffn.out", "2", "0"] for line in lines)


def test_gpt2_with_a_flat_init_is_named_at_every_output_weight(transformers, capsys, tmp_path, monkeypatch):
    """The same GPT-2 described to sigprop with the flat init ('normal': every weight 0.02)
    while transformers draws c_proj scaled: the audit names each c_proj weight (exit 1)."""
    from sigprop.model.options import build_hf

    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    spec = build_hf(str(GPT2), {"layers": 2}).model.to_json()
    for layer in spec["layers"]:
        layer["attention"]["init"]["o"]["std"] = 0.02
        layer["ffn"]["init"]["out"]["std"] = 0.02
    from sigprop.torch import audit as ta
    from sigprop.torch import measure as tm
    from sigprop.interop.torch_names import layout
    from sigprop.model.spec import Model

    res = build_hf(str(GPT2), {"layers": 2})
    src = tm.hf_source(res.transformers_config(), "gpt2", layout=layout("hf:gpt2"))
    result = ta.audit(Model.from_json(spec), src, seed=0)
    assert sorted(r.name for r in result.mismatches) == [f"h.{i}.{m}.c_proj.weight" for i in (0, 1)
                                                          for m in ("attn", "mlp")]
    assert all(r.std == pytest.approx(0.01, rel=0.02) for r in result.mismatches)


# -- your own module ----------------------------------------------------------------------

def _spec(tmp_path, factories) -> str:
    p = tmp_path / "m.json"
    p.write_text(json.dumps(factories.spec().to_json()))
    return str(p)


def test_module_clean_and_planted(torch, factories, capsys, tmp_path):
    spec = _spec(tmp_path, factories)
    code, out, err = cli(capsys, "audit", "--module", "audit_factories:clean", "--spec", spec)
    assert code == 0, err
    assert out.startswith("audit: ok")
    code, out, err = cli(capsys, "audit", "--module", "audit_factories:planted", "--spec", spec)
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0].startswith("audit: FAIL: 1 of ")
    bad = [line for line in lines if line.startswith("  layers.")]
    assert len(bad) == 1 and bad[0].startswith("  layers.1.ffn.out.weight: std ")
    shown = float(bad[0].split("std ")[1].split(",")[0])
    assert shown == pytest.approx(factories.WRONG_STD, rel=0.03)      # 16384 entries: 0.55% standard error
    assumed = factories.spec().sublayer_columns("ffn").std["out"][1]
    assert f"sigprop assumed {assumed:.3g}" in bad[0]
    code, out, err = cli(capsys, "audit", "--module", "audit_factories:planted", "--spec", spec, "--json")
    obj = json.loads(out)
    assert obj["passed"] is False and obj["mismatches"] == 1
    assert [r["name"] for r in obj["tensors"] if not r["ok"]] == ["layers.1.ffn.out.weight"]


def test_bad_input_is_one_line(torch, factories, capsys, tmp_path, monkeypatch):
    spec = _spec(tmp_path, factories)
    for args, what in ((["--layers", "2"], "--hf-config FILE or --module"),
                       (["--hf-config", str(GPT2), "--d-model", "64"], "drop --d-model (what applies: --init-std, --layers, --seq-len)"),
                       (["--hf-config", str(GPT2), "--module", "a:b"], "exclusive")):
        code, out, err = cli(capsys, "audit", *args)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and what in err, (args, err)
    # a model larger than the memory available: refused before anything is built
    from sigprop.mc import component

    monkeypatch.setattr(component, "available_memory", lambda: 1e4)
    code, out, err = cli(capsys, "audit", "--module", "audit_factories:clean", "--spec", spec)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "GiB available" in err
    need("transformers")
    code, out, err = cli(capsys, "audit", "--hf-config", str(GPT2))
    assert code == 2 and out == "" and "--layers N" in err


def test_without_torch_the_command_names_the_extra(capsys, monkeypatch):
    """(Runs with or without torch: the import check is made to see no torch.)"""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name in ("torch", "transformers") else real(name, *a, **k))
    code, out, err = cli(capsys, "audit", "--module", "x:y", "--layers", "2")
    assert code == 2 and out == "" and err.strip().endswith("sigprop audit needs PyTorch: pip install 'sigprop[torch]'")
