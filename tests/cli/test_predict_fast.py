"""`sigprop predict` without typer (sigprop.cli._predict): the plain command lines it parses
give exactly what typer's parsing gives (stdout, stderr, exit code), the others go to typer."""

import re
import subprocess
import sys

import pytest

from tests._cli import cli
from sigprop.cli import _predict


def _typer_path(monkeypatch, capsys, *args):
    """The same command line through typer (the fast parser declines every line)."""
    with monkeypatch.context() as m:
        m.setattr(_predict, "parse", lambda args: None)
        return cli(capsys, *args)


@pytest.mark.parametrize("args", [
    ["--layers", "3", "--json"],
    ["--layers=3", "--causal", "--json", "--every", "2"],
    ["--json", "--arch", "postln", "--layers", "2", "--no-bias", "--dropout", "0.1", "--input-mean", "-0.5"],
    ["--layers", "2", "--layers", "3", "--causal", "--no-causal", "--json"],
    ["--layers", " 3", "--d-model", "1_024", "--json"],
    ["--layers", "2"],                                          # the text trace
    ["--layers", "30", "--d-model", "32", "--heads", "2", "--seq-len", "8"],   # thinned to about 40 rows
    ["--layers", "30", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--full"],
    ["--layers", "30", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--every", "7"],
    ["--layers", "2", "--full", "--every", "2"],                # both choose the rows: exit 2
    ["--layers", "2", "--full", "--json"],
    ["--layers", "0", "--json"],                                # the library's bad input: exit 2
    ["--arch", "nope", "--layers", "2", "--json"],
    ["--layers", "2", "--dropout", "1.5", "--json"],
    ["--layers", "2", "--input-mean", "inf", "--json"],
])
def test_fast_path_matches_typer(monkeypatch, capsys, args):
    assert _predict.parse(args) is not None
    fast = cli(capsys, "predict", *args)
    assert fast == _typer_path(monkeypatch, capsys, "predict", *args)
    assert fast[0] in (0, 1, 2) and (fast[0] == 2) == (fast[1] == "")


@pytest.mark.parametrize("args", [
    ["--help"], ["-h"], ["--version"], ["--layers"], ["--layers", "x"], ["--layers", "2.0"],
    ["--every", "0"], ["--nope"], ["extra"], ["--json=1"], ["--full=1"], ["--causal=true"], ["--", "--json"],
    ["--layers", "2", "--arch", "--json"], ["--arch="],
])
def test_other_lines_go_to_typer(args):
    assert _predict.parse(args) is None


def test_parse_values():
    p = _predict.parse(["--layers", "768", "--arch=lns", "--causal", "--no-bias", "--every", "5",
                        "--dropout", "-0.0", "--json", "--config", "m.toml"])
    assert p["every"] == 5 and p["as_json"] is True and p["symbolic"] is False and p["full"] is False
    assert _predict.parse(["--full"])["full"] is True and _predict.parse([])["every"] is None
    assert p["model_opts"] == {"layers": 768, "arch": "lns", "causal": True, "bias": False, "dropout": -0.0,
                               "config": __import__("pathlib").Path("m.toml")}


def test_predict_json_does_not_import_typer():
    code = ("import sys\n"
            "sys.argv = ['sigprop', 'predict', '--layers', '2', '--json']\n"
            "from sigprop.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "sys.stderr.write(' '.join(m for m in ('typer', 'click', 'rich', 'sympy') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_fast_path_matches_typer_with_the_time_line(monkeypatch, capsys):
    """Where progress is shown, both paths end with the same time line (its number aside)."""
    monkeypatch.setenv("SIGPROP_PROGRESS", "1")
    args = ["predict", "--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "8"]
    fast, slow = cli(capsys, *args), _typer_path(monkeypatch, capsys, *args)
    assert fast[:2] == slow[:2]
    for r in (fast, slow):
        assert re.search(r"sigprop predict: done in \d+\.\d\d s\n\Z", r[2]), r[2]


def test_fast_path_matches_typer_with_a_config_file(monkeypatch, capsys, tmp_path):
    cfg = tmp_path / "m.toml"
    cfg.write_text('layers = 2\narch = "postln"\ncausal = true\n')
    for args in (["--config", str(cfg), "--json"], [f"--config={cfg}", "--layers", "3", "--json"],
                 ["--config", str(tmp_path / "missing.toml"), "--json"]):
        assert _predict.parse(args) is not None
        fast = cli(capsys, "predict", *args)
        assert fast == _typer_path(monkeypatch, capsys, "predict", *args)
    assert fast[0] == 2 and fast[1] == ""
