"""The text output answers first: `predict` and `check` lead with the verdict (and the laws or
the errors), then the model, then a table thinned to a terminal's height (about 40 rows:
sigprop.cli._render_rows) unless --every K or --full choose; the whole-model commands end with
the time they took on stderr where progress is shown.  The expected layers here are written
out by hand."""

import json
import re

import pytest
from tests._cli import cli

from sigprop.errors import DomainError

TINY = ["--d-model", "32", "--heads", "2", "--d-ff", "64", "--seq-len", "8"]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    """No progress (nor the time line) unless a test asks for it."""
    monkeypatch.setenv("SIGPROP_PROGRESS", "0")


def points(n_layers: int, per_layer: int = 2) -> list[int]:
    """The layers of a trace's points: the input, then ``per_layer`` points per layer."""
    return [0] + [v for v in range(1, n_layers + 1) for _ in range(per_layer)]


# ---------------------------------------------------------------------------------------
# the selection
# ---------------------------------------------------------------------------------------

#: (layers, points per layer) -> (the layers shown, input included; the line)
GOLDEN = {
    (12, 2): (set(range(13)), None),
    (48, 2): ({0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48},
              "showing 37 of 97 points (layers 1-8, 10, 12, ..., 40, 48); --full for all"),
    (768, 2): ({0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768},
               "showing 39 of 1,537 points (layers 1-4, 6, 8, ..., 512, 768); --full for all"),
    (12, 1): (set(range(13)), None),
    (48, 1): ({0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48},   # parallel blocks
              "showing 19 of 49 points (layers 1-8, 10, 12, ..., 40, 48); --full for all"),
    (20, 2): (set(range(21)), None),                                 # 41 rows: within ROWS
    (768, 1): ({0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                160, 192, 224, 256, 320, 384, 448, 512, 640, 768},
               "showing 35 of 769 points (layers 1-8, 10, 12, ..., 640, 768); --full for all"),
    (24, 2): ({0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24},      # predict's default depth
              "showing 29 of 49 points (layers 1-8, 10, 12, ..., 20, 24); --full for all"),
    (1000, 2): ({0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1000},
                "showing 41 of 2,001 points (layers 1-4, 6, 8, ..., 768, 1000); --full for all"),
}


@pytest.mark.parametrize("n,per", list(GOLDEN))
def test_default_rows(n, per):
    from sigprop.cli._render_rows import ROWS, select

    layers, line = GOLDEN[n, per]
    s = select(points(n, per))
    assert set(s.layers) == layers and s.line == line
    assert 1 + per * (len(layers) - 1) <= ROWS


def test_more_layers_take_sparser_ladders_and_the_top_stays():
    from sigprop.cli._render_rows import ladder, select

    assert ladder(100, 3) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert ladder(100, 4) == [1, 4, 16, 64, 100]
    s = select(points(10 ** 6))
    assert set(s.layers) == {0, 1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 10 ** 6}
    assert s.line == "showing 23 of 2,000,001 points (layers 1, 4, 16, ..., 262144, 1000000); --full for all"


def test_every_and_full():
    from sigprop.cli._render_rows import select

    s = select(points(768), every=5)
    assert set(s.layers) == {0, *range(5, 766, 5), 768}
    assert s.line == "showing 309 of 1,537 points (layers 5, 10, 15, ..., 765, 768); --full for all"
    assert select(points(48), every=12).line == "showing 9 of 97 points (layers 12, 24, 36, 48); --full for all"
    assert select(points(48), every=1) == (frozenset(range(49)), None)
    assert select(points(768), full=True) == (frozenset(range(769)), None)
    with pytest.raises(DomainError, match="--full and --every"):
        select(points(4), every=2, full=True)


def test_a_trace_that_stops_early_keeps_its_last_layer():
    """A saturating softmax ends the trace before the model's top: the last layer there is kept."""
    from sigprop.cli._render_rows import select

    s = select(points(37))
    assert max(s.layers) == 37 and 37 in s.layers
    assert select([0]) == (frozenset({0}), None)


# ---------------------------------------------------------------------------------------
# predict's text
# ---------------------------------------------------------------------------------------

def table_rows(out: str) -> list[tuple[int, str]]:
    """(layer, sublayer) of each row of predict's table."""
    return [(int(m[1]), m[2]) for m in re.finditer(r"^│\s+(\d+) │ (\w+)", out, re.M)]


def expected(layers, subs=("attention", "ffn")) -> list[tuple[int, str]]:
    return [(0, "input")] + [(v, s) for v in sorted(layers) if v > 0 for s in subs]


def test_predict_leads_with_the_verdict_and_thins_the_table(capsys):
    code, out, err = cli(capsys, "predict", "--layers", "48", *TINY)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("verdict: ")
    body = [ln for ln in lines if ln and not ln.startswith(" ") and ":" in ln]
    heads = [ln.split(":")[0] for ln in body[:4]]
    assert heads == ["verdict", "forward variance", "gradient", "token correlation at the top"]
    model = lines.index("model     preln, 48 layers, d_model 32, d_ff 64, relu")
    assert model > lines.index(body[3])                              # the summary, then the model
    shown = "showing 37 of 97 points (layers 1-8, 10, 12, ..., 40, 48); --full for all"
    assert lines.index(shown) > model and lines.index(shown) < lines.index(next(ln for ln in lines if "┏" in ln))
    assert table_rows(out) == expected(GOLDEN[48, 2][0])


def test_predict_768_layers_is_a_screenful(capsys):
    code, out, err = cli(capsys, "predict", "--arch", "preln", "--layers", "768")
    assert (code, err) == (0, "")
    assert out.startswith("verdict: drifting: ")
    assert "showing 39 of 1,537 points (layers 1-4, 6, 8, ..., 512, 768); --full for all" in out.splitlines()
    assert table_rows(out) == expected(GOLDEN[768, 2][0])
    assert len(out.splitlines()) < 70


def test_predict_small_models_whole_and_full_every(capsys):
    code, out, _ = cli(capsys, "predict", "--layers", "12", *TINY)
    assert code == 0 and "showing" not in out and table_rows(out) == expected(range(13))
    code, out, _ = cli(capsys, "predict", "--layers", "48", *TINY, "--full")
    assert code == 0 and "showing" not in out and table_rows(out) == expected(range(49))
    code, out, _ = cli(capsys, "predict", "--layers", "48", *TINY, "--every", "12")
    assert code == 0 and table_rows(out) == expected({12, 24, 36, 48})
    assert "showing 9 of 97 points (layers 12, 24, 36, 48); --full for all" in out.splitlines()
    code, out, _ = cli(capsys, "predict", "--layers", "48", *TINY, "--every", "1")
    assert code == 0 and table_rows(out) == expected(range(49))
    code, out, _ = cli(capsys, "predict", "--layers", "48", *TINY, "--block", "parallel")
    assert code == 0 and table_rows(out) == expected(GOLDEN[48, 1][0], ("block",))


def test_predict_json_stays_whole(capsys):
    code, out, _ = cli(capsys, "predict", "--layers", "48", *TINY, "--json")
    assert code == 0 and len(json.loads(out)["points"]) == 97
    code, out, _ = cli(capsys, "predict", "--layers", "48", *TINY, "--json", "--full")
    assert code == 0 and len(json.loads(out)["points"]) == 97
    code, out, _ = cli(capsys, "predict", "--layers", "48", *TINY, "--json", "--every", "12")
    assert code == 0 and [p["layer"] for p in json.loads(out)["points"]] == [0, 12, 12, 24, 24, 36, 36, 48, 48]


@pytest.mark.parametrize("command", ["predict", "check"])
def test_full_and_every_together_are_bad_input(capsys, command):
    code, out, err = cli(capsys, command, "--layers", "2", *TINY, "--full", "--every", "2")
    assert (code, out) == (2, "")
    assert err == f"sigprop {command}: error: --full and --every both choose the rows shown: give one of them\n"


# ---------------------------------------------------------------------------------------
# check's text
# ---------------------------------------------------------------------------------------

CHECK = ["check", "--layers", "24", *TINY, "--trials", "2", "--batch", "2"]


def check_rows(out: str) -> list[str]:
    return [m[1] for m in re.finditer(r"^(\d+ (?:in|att|ffn|blk)) ", out, re.M)]


def check_expected(layers) -> list[str]:
    return ["0 in"] + [f"{v} {s}" for v in sorted(layers) if v > 0 for s in ("att", "ffn")]


def test_check_leads_with_the_verdict_and_thins_the_table(capsys):
    code, out, err = cli(capsys, *CHECK)
    assert code in (0, 1) and err == ""
    lines = out.splitlines()
    assert re.match(r"pass: every point within tolerance$|\d+ of 49 points outside tolerance; the first:$", lines[0])
    assert lines.index("model     preln, 24 layers, d_model 32, d_ff 64, relu") > \
        next(i for i, ln in enumerate(lines) if ln.startswith("R^2 of log variance"))
    assert "showing 29 of 49 points (layers 1-8, 10, 12, ..., 20, 24); --full for all" in lines
    assert check_rows(out) == check_expected(GOLDEN[24, 2][0])
    code, out, _ = cli(capsys, *CHECK, "--full")
    assert "showing" not in out and check_rows(out) == check_expected(range(25))
    code, out, _ = cli(capsys, *CHECK, "--every", "8")
    assert check_rows(out) == check_expected({8, 16, 24})


# ---------------------------------------------------------------------------------------
# the time each command took
# ---------------------------------------------------------------------------------------

DONE = r"sigprop {}: done in \d+\.\d\d s\n\Z"


@pytest.mark.parametrize("args", [
    ["predict", "--layers", "3", *TINY],
    ["predict", "--layers", "3", *TINY, "--json"],
    ["compare", "--arch", "preln,postln", "--layers", "3", *TINY],
    ["check", "--layers", "2", *TINY, "--trials", "2", "--batch", "1", "--json"],
])
def test_the_time_taken_is_the_last_line_on_stderr_where_progress_shows(capsys, monkeypatch, args):
    code, out, err = cli(capsys, *args)
    assert code in (0, 1) and err == ""                        # stderr not a terminal: nothing
    monkeypatch.setenv("SIGPROP_PROGRESS", "1")
    code2, out2, err2 = cli(capsys, *args)
    assert code2 == code and re.search(DONE.format(args[0]), err2), err2
    if "--json" in args:
        json.loads(out2)                                        # stdout: the result alone
    else:
        assert out2.splitlines()[0] == out.splitlines()[0]


def test_no_time_line_after_bad_input(capsys, monkeypatch):
    monkeypatch.setenv("SIGPROP_PROGRESS", "1")
    code, out, err = cli(capsys, "predict", "--layers", "0")
    assert (code, out) == (2, "") and err == "sigprop predict: error: --layers must be an integer in [1, 1000000], got 0\n"


def test_check_table_keeps_the_first_failing_layers(capsys):
    """Points outside tolerance off the ladder: the first three's layers are shown too (marked x)."""
    import dataclasses

    from sigprop.cli._render_model import render_check
    from sigprop.model.checking import DEFAULT_TOL, check_model
    from sigprop.model.presets import resolve

    m = resolve("preln", "normal", n_layers=24, d_model=32, n_heads=2, d_ff=64, seq_len=8)
    _, meas, res = check_model(m, dict(DEFAULT_TOL), trials=2, batch=1, seed=0)
    failed = [p["layer"] in (9, 11, 13, 22) and p["sublayer"] == "ffn" for p in res.predicted]
    res = dataclasses.replace(res, failed_points=failed, passed=False, failures=["layer 9 ffn: ..."])
    render_check(m, res, meas)
    out = capsys.readouterr().out
    assert check_rows(out) == check_expected(GOLDEN[24, 2][0] | {9, 11, 13})
    assert "showing 35 of 49 points (layers 1-14, 16, 20, 24); --full for all" in out.splitlines()
    assert [ln.split()[:2] for ln in out.splitlines() if ln.rstrip().endswith(" x")] == [
        ["9", "ffn"], ["11", "ffn"], ["13", "ffn"]]
    render_check(m, res, meas, every=12)
    assert check_rows(capsys.readouterr().out) == check_expected({9, 11, 12, 13, 24})
