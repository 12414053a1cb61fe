"""`sigprop check --step` on the command line (sigprop.cli.check, sigprop.cli._step,
sigprop.cli._render_step): the text (verdict first, thinned table), --json (sigprop.step/1),
and bad input (one line on stderr, exit 2, nothing on stdout), also from predict, compare and
plot, which have no step analysis."""

from __future__ import annotations

import json

import pytest

from tests._cli import cli

TINY = ["--arch", "postln", "--layers", "2", "--d-model", "32", "--heads", "4", "--seq-len", "8",
        "--batch-size", "2", "--trials", "2"]


def test_text_verdict_first_and_table(capsys):
    code, out, err = cli(capsys, "check", "--step", "adam", "--lr", "1e-3", *TINY, "--seed", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("verdict: measured, not predicted: one adam step at lr 0.001")
    assert any(l.startswith("largest module change: layer") for l in lines[:6])
    assert any(l.startswith("largest logit variance after the step") for l in lines[:6])
    assert "seed 3, float64" in out and "no prediction" in out
    assert "step      adam, lr 0.001, batch 2, betas 0.9,0.999, eps 1e-08, weight decay 0" in out
    rows = [l for l in lines if l[:1].isdigit() and (" att " in l or " ffn " in l or " in " in l)]
    assert len(rows) == 5 and "attn.o" in out


def test_table_is_thinned(capsys):
    code, out, _ = cli(capsys, "check", "--step", "sgd", "--lr", "0.1", *TINY[:3], "48", *TINY[4:])
    assert code == 0
    assert "showing" in out and "--full for all" in out


def test_json_is_the_step_object(capsys):
    code, out, err = cli(capsys, "check", "--step", "sgd", "--lr", "0.1", *TINY, "--json", "--seed", "5")
    assert code == 0 and err.count("\n") <= 1
    obj = json.loads(out)
    assert obj["schema"] == "sigprop.step/1" and obj["seed"] == 5 and obj["dtype"] == "float64"
    assert obj["step"]["optimizer"] == "sgd" and obj["step"]["batch_size"] == 2
    assert len(obj["measured"]) == 5 and obj["measured"][-1]["update"]["rel"] > 0
    again = json.loads(cli(capsys, "check", "--step", "sgd", "--lr", "0.1", *TINY, "--json", "--seed", "5")[1])
    assert again["measured"] == obj["measured"]


def test_float32_on_request(capsys):
    code, out, _ = cli(capsys, "check", "--step", "adam", "--lr", "1e-3", *TINY, "--dtype", "float32", "--json")
    assert code == 0 and json.loads(out)["dtype"] == "float32"


@pytest.mark.parametrize("args,match", [
    (["predict", "--step", "adam", "--lr", "1e-3"], "no analytic prediction"),
    (["compare", "--step", "sgd", "--lr", "0.1"], "only `sigprop check --step`"),
    (["plot", "--step", "adam", "--lr", "1e-3", "-o", "x.png"], "no analytic prediction"),
    (["predict", "--lr", "1e-3"], "give --step"),
    (["check", "--step", "adam", *TINY], "needs --lr"),
    (["check", "--batch-size", "3", *TINY[:-4]], "give --step"),
    (["check", "--step", "adam", "--lr", "1e-3", "--batch", "3", *TINY], "drop --batch"),
    (["check", "--step", "adam", "--lr", "1e-3", "--backend", "torch", *TINY], "drop --backend"),
    (["check", "--step", "adam", "--lr", "1e-3", "--dask", "local", *TINY], "drop --dask"),
    (["check", "--step", "adam", "--lr", "1e-3", "--tol-var", "0.2", *TINY], "drop the tolerance"),
    (["check", "--step", "adam", "--lr", "0", *TINY], "--lr must be"),
    (["check", "--step", "adam", "--lr", "1e-3", "--adam-betas", "0.9", *TINY], "two numbers"),
    (["check", "--step", "lion", "--lr", "1", *TINY], "lion"),
    (["check", "--step", "adam", "--lr", "1e-3", "--encoder-layers", "1", "--decoder-layers", "1", "--d-model",
      "32", "--heads", "4", "--seq-len", "8"], "encoder-decoder"),
    (["check", "--step", "adam", "--lr", "1e-3", "--hf-config", "tests/data/hf/gemma2-2b.json", "--layers", "1",
      "--seq-len", "8"], "attn_softcap"),
])
def test_bad_input(capsys, args, match):
    import re

    code, out, err = cli(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(match, err), err
