"""PyTorch interop: real Hugging Face models (transformers, their own random init) and plain
PyTorch modules measured with hooks against the prediction, apply_init, and the emitted init
code.

torch and transformers are test extras: these tests skip without them, unless
SIGPROP_REQUIRE_TORCH=1 (set by .ci/run), which turns the skip into a failure."""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests._cli import cli
from tests._torch_configs import CONFIGS


def need(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("SIGPROP_REQUIRE_TORCH") == "1":
            pytest.fail(f"{module} is not installed but SIGPROP_REQUIRE_TORCH=1 (make test installs it)")
        pytest.skip(f"{module} not installed")


@pytest.fixture(autouse=True)
def _one_thread():
    """Small models on a shared 2-core machine: torch's thread pool spin-waits (3 s against
    0.06 s per trial measured under load), so these tests run torch on one thread."""
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


def _resolved(family: str, seq_len: int = 32):
    from sigprop.interop import hf

    return hf.resolve(dict(CONFIGS[family]), seq_len=seq_len)


def _measure(r, model=None, **kw):
    """Measure the family's model (with ``init``: that init applied) against ``model``
    (default the resolved one): (measurement, comparison)."""
    from sigprop.interop.torch_names import layout
    from sigprop.torch.measure import compare_measured, hf_source, measure

    model = r.model if model is None else model
    src = hf_source(r.config, r.family, layout=layout("hf:" + r.family))
    opts = dict(trials=8, batch=4, seed=0)
    opts.update(kw)
    meas = measure(model, src, **opts)
    return meas, compare_measured(model, meas)[1]


# -- every family, its own init, against the prediction --------------------------------

@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_family_agrees_with_prediction(transformers, family):
    """A 4-layer d_model 128 model of the family, built by transformers from its config with its
    own random init, measured at every sublayer in training mode: within check's tolerance."""
    r = _resolved(family)
    meas, res = _measure(r)
    assert res.passed, res.failures
    n_points = 1 + (1 if r.model.block == "parallel" else 2) * r.model.n_layers
    assert len(res.measured) == n_points
    # the stream fed at layer 1 is the model's input, and every attention gave its logits
    assert meas.forward[0].var == pytest.approx(r.model.input.var, rel=0.02)
    att = [k for k, (_, s) in enumerate(meas.points) if s in ("attention", "block")]
    assert all(meas.logit_var[k] is not None for k in att)


def test_measurement_sees_a_wrong_description(transformers):
    """The comparison can fail: GPT-2 measured against a model whose output projections have
    transformers' plain std instead of its 1/sqrt(2 n_layer)-scaled one."""
    from sigprop.model.spec import Model

    r = _resolved("gpt2")
    obj = r.model.to_json()
    for layer in obj["layers"]:
        layer["attention"]["init"]["o"]["std"] = 0.02
        layer["ffn"]["init"]["out"]["std"] = 0.02
    wrong = Model.from_json(obj)
    from sigprop.interop.torch_names import layout
    from sigprop.torch.measure import compare_measured, hf_source, measure

    meas = measure(wrong, hf_source(r.config, "gpt2", layout=layout("hf:gpt2")), trials=8, batch=4, seed=0)
    assert not compare_measured(wrong, meas)[1].passed


def test_measure_is_seeded(transformers):
    r = _resolved("llama")
    a, _ = _measure(r, trials=2, batch=2, seed=5)
    b, _ = _measure(r, trials=2, batch=2, seed=5)
    c, _ = _measure(r, trials=2, batch=2, seed=6)
    assert a.forward[3].var == b.forward[3].var and a.backward[0].var == b.backward[0].var
    assert a.forward[3].var != c.forward[3].var
    assert a.seed == 5 and a.trials == 2 and a.batch == 2


def test_tokens_through_the_embedding(transformers):
    """--tokens: random ids through GPT-2's embedding; the input point is what the embedding
    hands to block 1 (token and position tables N(0, 0.02^2) each: variance 2 x 4e-4, after
    the embedding dropout 1/(1 - 0.1) of that), and the trace still agrees."""
    r = _resolved("gpt2")
    meas, res = _measure(r, tokens=True)
    assert meas.forward[0].var == pytest.approx(2 * 0.02**2 / 0.9, rel=0.05)
    assert res.passed, res.failures


# -- apply_init ----------------------------------------------------------------------------

def _stds(model, **stds):
    """``model`` with every layer's weight stds replaced (the others kept)."""
    from sigprop.model.spec import Model

    obj = model.to_json()
    for layer in obj["layers"]:
        for kind in ("attention", "ffn"):
            for name, s in stds.items():
                if name in layer[kind]["init"]:
                    layer[kind]["init"][name]["std"] = s
    return Model.from_json(obj)


def _fused_parts(torch, family, net, d):
    """q, k, v weight matrices of block 0 as transformers' own forward splits the fused
    projection (GPT-2: c_attn(x).split(d, dim=2); GPT-NeoX: the output viewed as
    (heads, 3 d_head), chunked in 3), read by feeding the identity."""
    eye = torch.eye(d).unsqueeze(0)
    with torch.no_grad():
        if family == "gpt2":
            out = net.h[0].attn.c_attn(eye)
            return out.split(d, dim=2)
        att = net.layers[0].attention
        out = att.query_key_value(eye) - att.query_key_value.bias
        out = out.view(1, d, -1, 3 * att.head_size).transpose(1, 2)
        return out.chunk(3, dim=-1)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_apply_init_fused_qkv(transformers, torch, family):
    """Distinct q, k, v stds land where transformers' forward reads q, k and v."""
    from sigprop.torch import apply_init

    r = _resolved(family)
    m = _stds(r.model, q=0.01, k=0.05, v=0.2)
    torch.manual_seed(0)
    net = transformers.AutoModel.from_config(_hf_config(transformers, r))
    apply_init(net, m, seed=1)
    q, k, v = _fused_parts(torch, family, net, m.d_model)
    n = q.numel()
    for got, want in ((q, 0.01), (k, 0.05), (v, 0.2)):
        assert float(got.std()) == pytest.approx(want, rel=5 / math.sqrt(2 * n))


def test_apply_init_phi3_fused_rows(transformers, torch):
    """Phi-3's qkv_proj (q, k, v stacked by rows, two key/value heads of four) and gate_up_proj
    (gate, then up): distinct stds land where its forward reads them (qkv[..., :H dh] q, the
    next Hkv dh k, the rest v; gate_up chunked in two, gate first)."""
    from sigprop.torch import apply_init

    r = _resolved("phi3")
    m = _stds(r.model, q=0.01, k=0.05, v=0.2, gate=0.03, up=0.3)
    net = transformers.AutoModel.from_config(_hf_config(transformers, r))
    apply_init(net, m, seed=1)
    att, mlp = net.layers[0].self_attn, net.layers[0].mlp
    W = att.qkv_proj.weight.detach()
    qp = m.n_heads * m.d_head
    kvp = m.n_kv_heads * m.d_head
    gate, up = mlp.gate_up_proj.weight.detach().chunk(2, dim=0)
    for got, want in ((W[:qp], 0.01), (W[qp:qp + kvp], 0.05), (W[qp + kvp:], 0.2), (gate, 0.03), (up, 0.3)):
        assert float(got.std()) == pytest.approx(want, rel=5 / math.sqrt(2 * got.numel()))


def test_granite_takes_no_sigprop_init(transformers):
    """Granite's multipliers act in its forward pass: writing a sigprop init into its modules
    (apply_init, the emitted code) is refused, naming why."""
    from sigprop.errors import DomainError
    from sigprop.export.torch_code import torch_init_code
    from sigprop.torch import apply_init

    r = _resolved("granite")
    net = transformers.AutoModel.from_config(_hf_config(transformers, r))
    with pytest.raises(DomainError, match="residual_multiplier"):
        apply_init(net, r.model)
    with pytest.raises(DomainError, match="attention_multiplier"):
        torch_init_code(r.model, "hf:granite")


def _hf_config(transformers, r):
    cfg = {k: v for k, v in r.config.items() if k != "model_type"}
    c = transformers.AutoConfig.for_model(r.family, **cfg)
    c._attn_implementation = "eager"
    return c


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "qwen2"])
def test_apply_init_then_measure(transformers, family):
    """apply_init with unequal stds per matrix (v and o far from the others: a wrong mapping
    moves the forward variance), then the measurement agrees with the prediction of that init,
    and not with that of another init."""
    r = _resolved(family)
    names = {"q": 0.04, "k": 0.03, "v": 0.3, "o": 0.15, "in": 0.05, "out": 0.08, "gate": 0.1, "up": 0.07,
             "down": 0.12}
    m = _stds(r.model, **names)
    meas, res = _measure(r, m, init=m)
    assert res.passed, res.failures
    from sigprop.torch.measure import compare_measured

    other = compare_measured(_stds(m, v=0.1, o=0.05), meas)[1]
    assert not other.passed


def test_apply_init_then_measure_is_flat_plain(torch):
    """solve-init's unit-forward Pre-LN model (skip and branch scales as the plain blocks'
    attributes) built as a plain module: measured forward variance 1 at every point."""
    from sigprop.interop.torch_names import PLAIN
    from sigprop.model.presets import resolve
    from sigprop.solve import solve
    from sigprop.torch.measure import compare_measured, measure, module_source
    from sigprop.torch.plain import PlainTransformer

    sol = solve("unit-forward", arch="preln", n_layers=4, d_model=128, n_heads=4, seq_len=32)
    assert sol.feasible
    m = sol.model
    assert float(m.attention.skip_scale[0]) < 1
    # built with scales 1 and N(0, 0.02^2) weights: apply_init sets the solved stds and scales
    plain = resolve("preln", n_layers=4, d_model=128, n_heads=4, seq_len=32)
    meas = measure(m, module_source(lambda: PlainTransformer(plain), layout=PLAIN), trials=8, batch=4, seed=0,
                   init=m)
    res = compare_measured(m, meas)[1]
    assert res.passed, res.failures
    for f in meas.forward:
        assert f.var == pytest.approx(1.0, abs=max(0.05, 4 * f.var_se))
    # built with larger weights and not given the init, the same module is not flat
    big = resolve("preln", n_layers=4, d_model=128, n_heads=4, seq_len=32, init_std=0.2)
    bare = measure(big, module_source(lambda: PlainTransformer(big), layout=PLAIN), trials=2, batch=2, seed=0)
    assert bare.forward[-1].var > 2


def test_apply_init_refuses_what_weights_cannot_hold(transformers):
    from sigprop.errors import DomainError
    from sigprop.model.spec import Sublayers
    from sigprop.torch import apply_init

    r = _resolved("llama")
    a = r.model.attention
    m = r.model.replace(attention=Sublayers("attention", a.placement, [0.9] * 4, a.branch_scale, a.norm_scale,
                                            a.std, a.bias_std))
    net = transformers.AutoModel.from_config(_hf_config(transformers, r))
    with pytest.raises(DomainError, match="skip_scale 0.9"):
        apply_init(net, m)
    with pytest.raises(DomainError, match="blocks"):
        apply_init(net, r.model.truncated(3))


# -- the emitted code ------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["plain", "gpt2", "gpt_neox", "llama", "gemma2", "bert"])
def test_emitted_code_sets_the_same_stds(transformers, torch, family):
    """The code `solve-init --emit torch` prints, exec'd, gives every matrix the std apply_init
    gives it (each within 5 sampling standard errors of the target), zero biases and the
    norms' gain-1 weights."""
    from sigprop.export.torch_code import torch_init_code
    from sigprop.torch import apply_init
    from sigprop.torch.init import find_blocks, is_norm, submodule, weight_view
    from sigprop.interop.torch_names import init_plan, layout

    if family == "plain":
        from sigprop.model.presets import resolve
        from sigprop.torch.plain import PlainTransformer

        m = resolve("preln", n_layers=3, d_model=64, n_heads=4, seq_len=8, init_std=0.05)
        m = _stds(m, q=0.01, v=0.2, out=0.3)

        def build():
            return PlainTransformer(resolve("preln", n_layers=3, d_model=64, n_heads=4, seq_len=8))
        lay = layout("plain")
    else:
        r = _resolved(family)
        m = _stds(r.model, q=0.01, k=0.04, v=0.2, o=0.07, out=0.3, down=0.3)

        def build():
            return transformers.AutoModel.from_config(_hf_config(transformers, r))
        lay = layout("hf:" + family)
    ns = {}
    exec(compile(torch_init_code(m, lay.name), "<emitted>", "exec"), ns)
    torch.manual_seed(0)
    a = ns["apply_sigprop_init"](build(), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    b = apply_init(build(), m, layout=lay.name, seed=2)
    plan = init_plan(m, scales=lay.scales is not None)
    for net in (a, b):
        prefix, blocks = find_blocks(net, lay)
        for step in plan:
            w = lay.weights[step["kind"]][step["name"]]
            mod = submodule(blocks[step["layer"]], w.path, "")
            view, bias = weight_view(mod, w, *m.fans(step["kind"], step["name"]), m.d_head, "")
            n = view.numel()
            assert float(view.detach().std()) == pytest.approx(step["std"], rel=5 / math.sqrt(2 * n)), step
            if bias is not None:
                assert float(bias.detach().abs().max()) == 0.0
        for mod in net.modules():
            if is_norm(mod) and getattr(mod, "weight", None) is not None:
                assert torch.all(mod.weight == lay.norm_gain_weight)
        if lay.scales:
            assert blocks[0].attn_skip == float(m.attention.skip_scale[0])


# -- the command line --------------------------------------------------------------------------

def _plain_factory(tmp_path, monkeypatch, spec: Path) -> str:
    """A module file (named after the test's directory: imported modules are cached by name)
    whose build() returns the plain reference model of ``spec``."""
    name = "plain_model_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)
    (tmp_path / f"{name}.py").write_text(
        "from sigprop.torch.plain import PlainTransformer\n\n\n"
        f"def build():\n    return PlainTransformer({str(spec)!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:build"


def test_measure_cli_module(torch, tmp_path, monkeypatch, capsys):
    from sigprop.model.presets import resolve

    spec = tmp_path / "m.json"
    spec.write_text(json.dumps(resolve("preln", n_layers=3, d_model=64, n_heads=4, seq_len=16,
                                       causal=True).to_json()))
    fac = _plain_factory(tmp_path, monkeypatch, spec)
    code, out, err = cli(capsys, "measure", "--module", fac, "--spec", str(spec), "--trials", "4", "--batch", "4",
                         "--seed", "3", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["schema"] == "sigprop.check/1" and obj["source"] == "torch" and obj["pass"] is True
    assert obj["seed"] == 3 and obj["trials"] == 4 and obj["batch"] == 4
    assert len(obj["measured"]) == 7 and obj["measured"][1]["logit_var"] is not None
    # the same module described wrongly: exit 1
    wrong = tmp_path / "w.json"
    wrong.write_text(json.dumps(resolve("preln", n_layers=3, d_model=64, n_heads=4, seq_len=16, causal=True,
                                        init_std=0.2).to_json()))
    code, out, err = cli(capsys, "measure", "--module", fac, "--spec", str(wrong), "--trials", "4")
    assert code == 1
    assert "torch:" in out


def test_measure_cli_bad_input(torch, tmp_path, monkeypatch, capsys):
    (tmp_path / "bad_factories_xyz.py").write_text(
        "import torch\n\ndef linear():\n    return torch.nn.Linear(3, 3)\n\n"
        "def boom():\n    raise RuntimeError('no\\nway')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    small = ["--layers", "2", "--d-model", "16", "--heads", "2", "--seq-len", "4"]
    for args, what in ((["--module", "bad_factories_xyz:linear", *small], "no module 'layers.0'"),
                       (["--module", "bad_factories_xyz:boom", *small], "building the model failed: RuntimeError: no way"),
                       (["--module", "no_such_module_xyz:build", "--layers", "2"], "cannot import"),
                       (["--module", "nocolon", "--layers", "2"], "package.module:factory"),
                       (["--layers", "2"], "--hf-config FILE or --module")):
        code, out, err = cli(capsys, "measure", *args)
        assert code == 2 and out == "" and what in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1


def test_measure_cli_without_torch(tmp_path, monkeypatch, capsys):
    """Without torch: one line naming the extra, exit 2."""
    monkeypatch.setitem(sys.modules, "torch", None)
    code, out, err = cli(capsys, "measure", "--module", "x:y", "--layers", "2")
    assert code == 2 and out == ""
    assert "pip install 'sigprop[torch]'" in err and len(err.strip().splitlines()) == 1


def test_core_does_not_import_torch():
    """The core (prediction, solving, the code printer, the name maps) never imports torch."""
    import subprocess

    code = ("import sys; import sigprop.api, sigprop.solve, sigprop.export.torch_code, "
            "sigprop.interop.torch_names, sigprop.cli.measure; "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_measure_cli_hf_config(transformers, tmp_path, capsys):
    """--hf-config: transformers builds the model from the file (a directory holding
    config.json here), --seq-len and the input options apply, the structure options do not."""
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIGS["llama"]))
    code, out, err = cli(capsys, "measure", "--hf-config", str(d), "--seq-len", "32", "--trials", "8", "--batch",
                         "4", "--threads", "1", "--json")
    obj = json.loads(out)
    assert code == 0, obj["failures"]
    assert obj["source"] == "torch" and obj["hf"]["family"] == "llama" and obj["model"]["seq_len"] == 32
    assert obj["measured_model"]["layout"] == "hf:llama" and len(obj["measured"]) == 9
    code, out, err = cli(capsys, "measure", "--hf-config", str(d), "--skip-scale", "0.5")
    assert code == 2 and out == "" and "drop --skip-scale" in err
    # what the config can say is written into the one transformers builds: 2 layers, no dropout
    (d / "config.json").write_text(json.dumps(CONFIGS["gpt2"]))
    code, out, err = cli(capsys, "measure", "--hf-config", str(d), "--seq-len", "32", "--layers", "2",
                         "--hidden-dropout", "0", "--attn-dropout", "0", "--trials", "8", "--threads", "1", "--json")
    obj = json.loads(out)
    assert code == 0, obj["failures"]
    assert len(obj["measured"]) == 5 and obj["model"]["dropout"]["hidden"] == 0
    code, out, err = cli(capsys, "measure", "--hf-config", str(d), "--module", "a:b")
    assert code == 2 and "exclusive" in err


def test_measure_cli_init_from_solution(torch, tmp_path, monkeypatch, capsys):
    """solve-init -o, then measure --init-from on a plain module: the solved flat variance."""
    from sigprop.model.presets import resolve

    sol = tmp_path / "sol.json"
    code, out, err = cli(capsys, "solve-init", "--target", "unit-forward", "--layers", "3", "--d-model", "64",
                         "--heads", "4", "--seq-len", "16", "-o", str(sol))
    assert code == 0, err
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps(resolve("preln", n_layers=3, d_model=64, n_heads=4, seq_len=16).to_json()))
    fac = _plain_factory(tmp_path, monkeypatch, spec)
    code, out, err = cli(capsys, "measure", "--module", fac, "--spec", str(spec), "--init-from", str(sol),
                         "--trials", "4", "--batch", "4", "--threads", "1", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert [round(p["forward"]["var"], 6) for p in obj["predicted"]] == [1.0] * 7
    assert all(abs(p["forward"]["var"] - 1) < 0.1 for p in obj["measured"])
    # a solution of another shape is refused
    code, out, err = cli(capsys, "solve-init", "--target", "unit-forward", "--layers", "2", "--d-model", "64",
                         "--heads", "4", "--seq-len", "16", "-o", str(sol))
    code, out, err = cli(capsys, "measure", "--module", fac, "--spec", str(spec), "--init-from", str(sol))
    assert code == 2 and "n_layers" in err


def test_measure_cli_factory_not_a_module(torch, tmp_path, monkeypatch, capsys):
    (tmp_path / "not_a_module_xyz.py").write_text("def build():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = cli(capsys, "measure", "--module", "not_a_module_xyz:build", "--layers", "2", "--d-model", "16",
                         "--heads", "2", "--seq-len", "4")
    assert code == 2 and out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "returned int, not a torch.nn.Module" in err


def test_module_factories_import_from_the_current_directory(tmp_path, monkeypatch):
    # the console script's sys.path holds its own directory, not the current one
    from sigprop.torch.measure import load_factory

    (tmp_path / "cwd_factory_xyz.py").write_text("def build():\n    return 'built'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    assert load_factory("cwd_factory_xyz:build")() == "built"
    assert sys.path[0] == str(tmp_path)


def test_measure_refuses_sizes_beyond_memory(torch, tmp_path, monkeypatch, capsys):
    (tmp_path / "never_built_xyz.py").write_text("def build():\n    raise AssertionError('built')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = cli(capsys, "measure", "--module", "never_built_xyz:build", "--layers", "2", "--d-model", "16",
                         "--heads", "2", "--seq-len", "4", "--batch", "1000000000")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "batch 1000000000" in err and "GiB available" in err
