"""Encoder-decoder models (sigprop.model.encdec): the model object through --spec, the flags
--encoder-layers / --decoder-layers, the trace of both stacks, the encoder's gradient as the sum of
every decoder layer's cross-attention contribution, against the whole-model Monte Carlo; the
commands that do not take such a model refuse it in one line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.model import encdec as ED
from tests._cli import cli


class _R:
    def __init__(self, code, out, err):
        self.exit_code, self.stdout, self.stderr = code, out, err


@pytest.fixture
def run_cli(capsys):
    def run(*args):
        return _R(*cli(capsys, *args))
    return run


def _model(arch="preln", n=2, m=3, d=128, causal=False, dropout=0.0, lk=12, seq=8, init="xavier"):
    return ED.from_options(dict(arch=arch, init=init, d_model=d, n_heads=4, d_ff=4 * d, seq_len=seq,
                                dropout=dropout, causal=causal), n, m, encoder_seq_len=lk)


def _write(tmp_path, obj, name="ed.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def test_model_object_round_trip():
    m = _model()
    obj = m.to_json()
    assert set(obj) == {"arch", "encoder", "decoder"}
    assert "grad" not in obj["encoder"] and "grad" in obj["decoder"]
    kinds = [s["kind"] for s in obj["decoder"]["layers"][0]["sublayers"]]
    assert kinds == ["attention", "cross_attention", "ffn"]
    assert obj["encoder"]["seq_len"] == 12 and obj["decoder"]["seq_len"] == 8
    assert ED.EncoderDecoder.from_json(json.loads(json.dumps(obj))) == m


@pytest.mark.parametrize("change, message", [
    (lambda o: o["encoder"].__setitem__("grad", {"var": 1.0, "corr": 0.0}), "encoder.grad"),
    (lambda o: o["encoder"].__setitem__("d_model", 64), "d_model"),
    (lambda o: o.pop("decoder"), "decoder"),
    (lambda o: [L["sublayers"].pop(1) for L in o["decoder"]["layers"]], "no cross_attention"),
    (lambda o: o["decoder"]["layers"][0]["sublayers"][1]["init"].pop("k"), "init"),
])
def test_model_object_refusals(change, message):
    obj = _model().to_json()
    change(obj)
    with pytest.raises(DomainError, match=message):
        ED.EncoderDecoder.from_json(obj)


def test_cross_attention_outside_an_encoder_decoder_model_is_refused(tmp_path, run_cli):
    """A plain model object with a cross_attention sublayer: nothing to read from."""
    dec = _model().to_json()["decoder"]
    r = run_cli("predict", "--spec", _write(tmp_path, dec))
    assert r.exit_code == 2 and r.stdout == "" and "encoder-decoder" in r.stderr and len(r.stderr.splitlines()) == 1


def test_trace_lists_both_stacks(tmp_path, run_cli):
    m = _model(n=2, m=3)
    r = run_cli("predict", "--spec", _write(tmp_path, m.to_json()), "--json")
    assert r.exit_code == 0, r.stderr
    t = json.loads(r.stdout)
    stacks = [p["stack"] for p in t["points"]]
    assert stacks == ["encoder"] * 5 + ["decoder"] * 10
    assert [(p["layer"], p["sublayer"]) for p in t["points"][5:9]] == [
        (0, "input"), (1, "attention"), (1, "cross_attention"), (1, "ffn")]
    s = t["summary"]
    for name in ("encoder", "decoder"):
        assert s[name]["verdict_class"] in ("stable", "bounded", "drifting", "unstable")
        assert s[name]["n_layers"] == (2 if name == "encoder" else 3)
    assert len(s["encoder_output_grad"]["by_decoder_layer"]) == 3
    # the same model through the flags
    r2 = run_cli("predict", "--arch", "preln", "--init", "xavier", "--d-model", "128", "--heads", "4",
                 "--d-ff", "512", "--seq-len", "8", "--dropout", "0", "--encoder-layers", "2",
                 "--decoder-layers", "3", "--encoder-seq-len", "12", "--json")
    assert r2.exit_code == 0, r2.stderr
    assert json.loads(r2.stdout)["points"] == t["points"]
    # text: a section per stack
    r3 = run_cli("predict", "--spec", _write(tmp_path, m.to_json()))
    assert r3.exit_code == 0 and "encoder (2 layers" in r3.stdout and "decoder (3 layers" in r3.stdout


def test_encoder_gradient_is_the_sum_over_decoder_layers():
    """The gradient at the encoder's top is the sum of every cross-attention's key/value
    gradient: predicted as the sum of the per-layer contributions (independent weights, cross
    terms taken to vanish), measured by the Monte Carlo of the whole model, where the layers'
    contributions meet in one array.  With contributions of comparable size (the largest under
    half of the sum) the measured variance agrees with the sum (5% or 4 SE), and is far from the
    largest contribution alone and from the sum with twice-counted cross terms' bound."""
    from sigprop.mc import encdec as mc

    m = _model(arch="preln", n=2, m=4, d=128)
    pred = ED.predict(m)
    parts = [g.var for _, g in pred.contributions]
    assert max(parts) < 0.5 * sum(parts)
    assert pred.e_grad.var == pytest.approx(sum(parts), rel=1e-12)
    meas = mc.simulate(m, batch=8, trials=16, seed=3)
    got = meas["encoder"].backward[-1]
    assert abs(pred.e_grad.var - got.var) <= max(0.05 * got.var, 4 * got.var_se), (pred.e_grad.var, got.var, got.var_se)
    assert abs(max(parts) - got.var) > 4 * got.var_se + 0.05 * got.var


@pytest.mark.parametrize("arch, n, m, causal", [("postln", 3, 2, False), ("preln", 2, 3, True), ("postln", 2, 3, True)])
def test_check_passes(arch, n, m, causal, tmp_path, run_cli):
    """sigprop check of an encoder-decoder model: every point of both stacks within the default
    tolerance (d 128, dropout 0.1)."""
    model = _model(arch=arch, n=n, m=m, causal=causal, dropout=0.1)
    r = run_cli("check", "--spec", _write(tmp_path, model.to_json()), "--json", "--trials", "8")
    assert r.exit_code == 0, (r.stdout[-2000:], r.stderr)
    obj = json.loads(r.stdout)
    assert obj["pass"] and obj["schema"] == "sigprop.check/1"
    assert [p["stack"] for p in obj["measured"]] == ["encoder"] * (1 + 2 * n) + ["decoder"] * (1 + 3 * m)
    assert set(obj["model"]) == {"arch", "encoder", "decoder"}
    # the cross-attention's logit variance (queries from the decoder, keys from E) is reported and judged
    cross = [(p, q) for p, q in zip(obj["predicted"], obj["measured"]) if p["sublayer"] == "cross_attention"]
    assert len(cross) == m and all(p["logit_var"] is not None and q["logit_var"] is not None for p, q in cross)


def test_deepnorm_encoder_decoder_constants():
    """arch deepnorm: the encoder-decoder constants of [DeepNet] Table 1 on both stacks
    (encoder alpha 0.81 (N^4 M)^(1/16), beta 0.87 (N^4 M)^(-1/16); decoder alpha (3M)^(1/4),
    beta (12M)^(-1/4)); Xavier-normal gain beta on V, O and the FFN, 1 on Q and K."""
    n, mm, d = 6, 12, 64
    m = ED.from_options(dict(arch="deepnorm", d_model=d, n_heads=2, d_ff=4 * d, seq_len=8), n, mm)
    enc, dec = m.to_json()["encoder"], m.to_json()["decoder"]
    ea, eb = 0.81 * (n**4 * mm) ** (1 / 16), 0.87 * (n**4 * mm) ** (-1 / 16)
    da, db = (3 * mm) ** 0.25, (12 * mm) ** -0.25
    att = enc["layers"][0]["attention"]
    assert att["placement"] == "post" and att["skip_scale"] == pytest.approx(ea)
    assert att["init"]["v"]["std"] == pytest.approx(eb * math.sqrt(2 / (2 * d)))
    assert att["init"]["q"]["std"] == pytest.approx(math.sqrt(2 / (2 * d)))
    assert enc["layers"][0]["ffn"]["init"]["in"]["std"] == pytest.approx(eb * math.sqrt(2 / (5 * d)))
    for s in dec["layers"][0]["sublayers"]:
        assert s["skip_scale"] == pytest.approx(da)
    cross = dec["layers"][0]["sublayers"][1]
    assert cross["kind"] == "cross_attention" and cross["init"]["o"]["std"] == pytest.approx(db * math.sqrt(2 / (2 * d)))
    assert dec["layers"][0]["sublayers"][2]["init"]["out"]["std"] == pytest.approx(db * math.sqrt(2 / (5 * d)))


def test_deepnorm_torchscale_variant(run_cli):
    """--deepnorm-variant torchscale: the encoder's Xavier gain 1.15 (N^4 M)^(-1/16) (torchscale
    divides by (N^4 M)^(1/16) / 1.15) where the paper has 0.87; alpha and the decoder unchanged;
    the variant with another arch is refused in one line."""
    n, mm, d = 12, 3, 64
    kw = dict(arch="deepnorm", d_model=d, n_heads=2, d_ff=4 * d, seq_len=8)
    paper = ED.from_options(kw, n, mm).to_json()
    ts = ED.from_options(kw, n, mm, deepnorm_variant="torchscale").to_json()
    q = n**4 * mm
    pv, tv = (m["encoder"]["layers"][0]["attention"] for m in (paper, ts))
    assert tv["skip_scale"] == pv["skip_scale"] == pytest.approx(0.81 * q ** (1 / 16))
    assert tv["init"]["v"]["std"] == pytest.approx(1.15 * q ** (-1 / 16) * math.sqrt(2 / (2 * d)))
    assert pv["init"]["v"]["std"] == pytest.approx(0.87 * q ** (-1 / 16) * math.sqrt(2 / (2 * d)))
    assert ts["decoder"] == paper["decoder"]
    with pytest.raises(DomainError, match="needs --arch deepnorm"):
        ED.from_options(dict(kw, arch="postln"), n, mm, deepnorm_variant="torchscale")
    r = run_cli("predict", "--arch", "postln", "--encoder-layers", "2", "--decoder-layers", "2",
                "--deepnorm-variant", "torchscale", "--d-model", "64", "--heads", "2", "--seq-len", "8")
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and "--arch deepnorm" in r.stderr
    r = run_cli("predict", "--arch", "deepnorm", "--encoder-layers", "2", "--decoder-layers", "2",
                "--deepnorm-variant", "torchscale", "--d-model", "64", "--heads", "2", "--seq-len", "8", "--json")
    assert r.exit_code in (0, 1), r.stderr
    enc = json.loads(r.stdout)["model"]["encoder"]["layers"][0]["attention"]
    assert enc["init"]["v"]["std"] == pytest.approx(1.15 * (2**5) ** (-1 / 16) * math.sqrt(2 / (2 * d)))


def test_compare_marks_both_stacks(tmp_path, run_cli):
    """compare: a row per stack, marked ("[encoder]", "[decoder]"; JSON "stack"), the same
    summaries as the trace's; plot --check (its Monte Carlo markers) refuses the model."""
    m = _model(n=2, m=3)
    spec = _write(tmp_path, m.to_json())
    r = run_cli("compare", "--spec", spec, "--json")
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["stack"] for row in rows] == ["encoder", "decoder"]
    s = ED.summary(ED.predict(m))
    assert rows[0]["summary"] == json.loads(json.dumps(s["encoder"]))
    assert rows[1]["summary"] == json.loads(json.dumps(s["decoder"]))
    r = run_cli("compare", "--spec", spec)
    assert r.exit_code == 0 and "[encoder]" in r.stdout and "[decoder]" in r.stdout
    r = run_cli("plot", "--spec", spec, "--check", "-o", str(tmp_path / "x.png"))
    assert r.exit_code == 2 and "encoder-decoder" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("args", [
    ("predict", "--symbolic"), ("solve-init",),
    ("export", "latex", "--what", "model", "-o", "m.tex"),
])
def test_commands_without_encoder_decoder_models_refuse_them(args, tmp_path, run_cli):
    spec = _write(tmp_path, _model(n=1, m=1).to_json())
    if args[0] == "solve-init":
        extra = ("--encoder-layers", "1", "--decoder-layers", "1")
    else:
        extra = ("--spec", spec)
    r = run_cli(*args, *extra)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "encoder-decoder" in r.stderr, r.stderr


def test_config_file_gives_the_same_model(tmp_path, run_cli):
    """encoder-layers / decoder-layers in a --config file: the same model as the flags."""
    cfg = tmp_path / "ed.toml"
    cfg.write_text('arch = "postln"\nencoder-layers = 2\ndecoder_layers = 3\nd-model = 64\nheads = 2\nseq-len = 8\n')
    a = run_cli("predict", "--config", str(cfg), "--json")
    b = run_cli("predict", "--arch", "postln", "--encoder-layers", "2", "--decoder-layers", "3", "--d-model", "64",
                "--heads", "2", "--seq-len", "8", "--json")
    assert a.exit_code == 0 and b.exit_code == 0, (a.stderr, b.stderr)
    assert json.loads(a.stdout)["points"] == json.loads(b.stdout)["points"]
    r = run_cli("predict", "--config", str(cfg), "--layers", "3")
    assert r.exit_code == 2 and "give the latter only" in r.stderr
