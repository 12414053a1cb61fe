"""`sigprop compare` and `sigprop plot`: rows against the per-arch predictions, the plotted
data against predict() and the Monte Carlo measurement, the written files, and the exit-2
paths (bad input, matplotlib missing)."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
from tests._cli import cli

from sigprop.compare import DEFAULT_ARCHS, compare, parse_archs, row, to_json
from sigprop.errors import DomainError
from sigprop.model import resolve
from sigprop.model.predict import predict
from sigprop.model.trace import summary

TINY = dict(d_model=32, n_heads=2, d_ff=64, seq_len=8)
TINY_FLAGS = ["--d-model", "32", "--heads", "2", "--d-ff", "64", "--seq-len", "8"]


def same_summary(a: dict, b: dict) -> bool:
    """Equal keys, equal words, numbers equal to 1e-9 (repeated predictions may differ in the
    last bits when interpolation tables are cached)."""
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], float) and isinstance(b[k], float):
            assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12), k
        elif k == "verdict":
            assert a[k].split(":")[0] == b[k].split(":")[0], k
        else:
            assert a[k] == b[k], k
    return True




# ---------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------

def test_parse_archs():
    assert parse_archs("preln, postln,dslm") == ("preln", "postln", "dslm")
    for bad, words in [("preln,nope", "unknown arch 'nope'"), ("preln,", "empty"), ("lns,lns", "twice")]:
        with pytest.raises(DomainError, match=words):
            parse_archs(bad)


def test_rows_are_the_per_arch_predictions_with_their_own_inits():
    # (the dslm and deepnorm inits give logit variances near 1, where the attention rule is
    # slow: those two are resolved, not predicted)
    from sigprop.compare import Row

    models = [resolve(a, n_layers=3, **TINY) for a in ("preln", "lns")]
    rows = compare(models)
    assert [r.arch for r in rows] == ["preln", "lns"]
    assert [r.init for r in rows] == ["normal", "normal"]
    assert [r.label for r in rows] == ["Pre-LN", "LayerNorm Scaling"]
    for arch, init, label in [("dslm", "dslm", "Pre-LN DeepScaleLM"), ("deepnorm", "deepnorm", "DeepNorm")]:
        r = Row(arch, resolve(arch, n_layers=3, **TINY), [], {})
        assert (r.init, r.label) == (init, label)
    for r, m in zip(rows, models):
        ref = predict(m)
        np.testing.assert_allclose([p.log_var for p in r.points], [p.log_var for p in ref], rtol=1e-9, atol=1e-12)
        assert same_summary(r.summary, summary(ref))
    assert row(resolve("preln", n_layers=3, init="xavier", **TINY)).label == "Pre-LN, xavier init"


def test_compare_json_shape_and_values(capsys):
    code, out, err = cli(capsys, "compare", "--arch", "postln,lns", "--layers", "3", *TINY_FLAGS, "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["schema"] == "sigprop.compare/1" and isinstance(obj["version"], str)
    assert [r["arch"] for r in obj["rows"]] == ["postln", "lns"]
    for r in obj["rows"]:
        m = resolve(r["arch"], n_layers=3, **TINY)
        assert r["model"] == m.to_json() and r["init"] == "normal"
        assert same_summary(r["summary"], summary(predict(m)))
    # the JSON equals the library's object (no NaN, round-trips)
    lib = json.loads(json.dumps(to_json(compare([resolve("postln", n_layers=3, **TINY)]))))
    assert same_summary(obj["rows"][0]["summary"], lib["rows"][0]["summary"])


def test_compare_defaults_init_override_config_and_spec(capsys, tmp_path):
    from sigprop.cli._model_options import build_models

    opts = {"layers": 2, "d_model": 32, "heads": 2, "d_ff": 64, "seq_len": 8}
    models = build_models(opts)                                  # no --arch: all six, own inits
    assert [m.arch for m in models] == list(DEFAULT_ARCHS) == ["preln", "postln", "dslm", "deepnorm", "lns", "mixln"]
    assert [m.notes["init"] for m in models] == ["normal", "normal", "dslm", "deepnorm", "normal", "normal"]
    assert [m.to_json() for m in models] == [resolve(a, n_layers=2, **TINY).to_json() for a in DEFAULT_ARCHS]
    code, out, _ = cli(capsys, "compare", "--arch", "dslm,deepnorm", "--init", "normal", "--layers", "2", *TINY_FLAGS, "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and [r["init"] for r in rows] == ["normal", "normal"]
    assert rows[1]["model"] == resolve("deepnorm", init="normal", n_layers=2, **TINY).to_json()
    assert rows[1]["model"] != resolve("deepnorm", n_layers=2, **TINY).to_json()
    cfg = tmp_path / "m.toml"
    cfg.write_text('arch = "postln"\nlayers = 2\nd-model = 32\nheads = 2\nd-ff = 64\nseq-len = 8\n')
    code, out, _ = cli(capsys, "compare", "--config", str(cfg), "--json")
    assert code == 0 and [r["arch"] for r in json.loads(out)["rows"]] == ["postln"]
    code, out, _ = cli(capsys, "compare", "--config", str(cfg), "--arch", "preln,lns", "--json")
    assert code == 0 and [r["arch"] for r in json.loads(out)["rows"]] == ["preln", "lns"]
    spec = tmp_path / "model.json"
    spec.write_text(json.dumps(resolve("lns", n_layers=2, **TINY).to_json()))
    code, out, _ = cli(capsys, "compare", "--spec", str(spec), "--json")
    assert code == 0 and [r["arch"] for r in json.loads(out)["rows"]] == ["lns"]


def test_compare_table(capsys):
    code, out, _ = cli(capsys, "compare", "--arch", "preln,postln", "--layers", "2", *TINY_FLAGS)
    assert code == 0
    assert "grad in/out" in out and "preln (init normal):" in out and "postln (init normal):" in out


@pytest.mark.parametrize("args", [
    ["compare", "--arch", "preln,nope"],
    ["compare", "--arch", "preln,,postln"],
    ["compare", "--arch", "preln,preln"],
    ["compare", "--arch", "preln", "--spec", "missing.json"],
    ["predict", "--arch", "preln,postln"],          # predict keeps a single --arch
    ["plot", "--arch", "nope", "-o", "x.png"],
    ["plot", "--arch", "preln", "-o", "x.jpg"],
])
def test_bad_input_exits_2(capsys, args):
    code, out, err = cli(capsys, *args, "--layers", "2", *TINY_FLAGS)
    assert code == 2 and out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_arch_help_says_comma_list():
    from typer.testing import CliRunner

    from sigprop.cli import app

    r = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "Comma-separated" in r.output


# ---------------------------------------------------------------------------------------
# plot: data and figure
# ---------------------------------------------------------------------------------------

def _depth(p):
    return {"input": 0.0, "attention": p.layer - 0.5, "ffn": float(p.layer)}[p.sublayer]


def _lines(ax, prefix):
    return [l for l in ax.get_lines() if (l.get_gid() or "").startswith(prefix)]


def test_figure_lines_are_the_prediction_and_markers_the_measurement():
    from sigprop import plot
    from sigprop.mc.model import simulate

    models = [resolve(a, n_layers=4, **TINY) for a in ("preln", "postln", "lns")]
    rows = compare(models)
    meas = [simulate(models[0], trials=2, batch=2, seed=11), None, simulate(models[2], trials=2, batch=2, seed=11)]
    data = plot.figure_data(rows, meas, mark_every=2)
    fig = plot.make_figure(data)
    axes = fig.axes[:4]
    assert [ax.get_title(loc="left") for ax in axes] == [p.title for p in plot.PANELS]
    for i, (r, m) in enumerate(zip(rows, models)):
        pts = predict(m)
        x = np.array([_depth(p) for p in pts])
        expected = {
            "forward_var": (x, np.log10([p.var for p in pts])),
            "grad_var": (x, np.log10([p.gvar for p in pts])),
            "corr": (x, np.array([p.corr for p in pts])),
            "logit_var": (np.array([p.layer - 0.5 for p in pts if p.sublayer == "attention"]),
                          np.log10([p.logit_var for p in pts if p.sublayer == "attention"])),
        }
        for ax, panel in zip(axes, plot.PANELS):
            lines = _lines(ax, f"prediction-{panel.key}-")
            assert len(lines) == 3                       # one line per arch
            (line,) = [l for l in lines if l.get_gid() == f"prediction-{panel.key}-{i}"]
            ex, ey = expected[panel.key]
            np.testing.assert_allclose(line.get_xdata(), ex)
            np.testing.assert_allclose(line.get_ydata(), ey, rtol=1e-9, atol=1e-12)
            assert line.get_label() == r.label
    # markers: rows 0 and 2 only, at the input, layers 1, 2, 4 (FFN outputs) and their attention logits
    k_ffn = [0, 2, 4, 8]
    for ax, panel in zip(axes, plot.PANELS):
        marks = _lines(ax, f"mc-{panel.key}-")
        assert sorted(l.get_gid() for l in marks) == [f"mc-{panel.key}-0", f"mc-{panel.key}-2"]
    for i in (0, 2):
        ms = meas[i]
        (fw,) = [l for l in _lines(axes[0], "mc-") if l.get_gid().endswith(f"-{i}")]
        np.testing.assert_allclose(fw.get_xdata(), [0, 1, 2, 4])
        np.testing.assert_allclose(fw.get_ydata(), np.log10([ms.forward[k].var for k in k_ffn]), rtol=1e-9)
        (gw,) = [l for l in _lines(axes[1], "mc-") if l.get_gid().endswith(f"-{i}")]
        np.testing.assert_allclose(gw.get_ydata(), np.log10([ms.backward[k].var for k in k_ffn]), rtol=1e-9)
        (cw,) = [l for l in _lines(axes[2], "mc-") if l.get_gid().endswith(f"-{i}")]
        np.testing.assert_allclose(cw.get_ydata(), [ms.forward[k].corr for k in k_ffn], rtol=1e-9)
        (lw,) = [l for l in _lines(axes[3], "mc-") if l.get_gid().endswith(f"-{i}")]
        np.testing.assert_allclose(lw.get_xdata(), [0.5, 1.5, 3.5])
        np.testing.assert_allclose(lw.get_ydata(), np.log10([ms.logit_var[k][0] for k in (1, 3, 7)]), rtol=1e-9)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:3] == ["Pre-LN", "Post-LN", "LayerNorm Scaling"]
    assert "seed 11" in legend[3] and "2 trials" in legend[3]


def test_overflowing_variance_is_plotted_from_log_var(tmp_path):
    from sigprop import plot

    from sigprop.compare import Row

    m = resolve("preln", n_layers=14, skip_scale=1e6, **TINY)
    rows = [Row("preln", m, predict(m), {})]             # the figure needs no summary
    assert math.isinf(rows[0].points[-1].var)         # the variance itself overflows a double
    fig = plot.make_figure(plot.figure_data(rows))
    (line,) = _lines(fig.axes[0], "prediction-forward_var-")
    y = np.asarray(line.get_ydata())
    assert np.all(np.isfinite(y)) and y[-1] > 308
    np.testing.assert_allclose(y, [p.log_var / math.log(10) for p in rows[0].points])
    # the top of the forward-variance axis is labelled as a power of ten
    assert any("10^" in t.get_text() for t in fig.axes[0].get_yticklabels())
    plot.save(fig, tmp_path / "inf.pdf")                # drawing does not choke on it either
    assert (tmp_path / "inf.pdf").read_bytes()[:5] == b"%PDF-"


def test_log_ticks():
    from sigprop.plot import log_ticks

    pos, labels = log_ticks(-3.2, 12.5)
    assert all(float(p).is_integer() and -3.2 <= p <= 12.5 for p in pos) and len(pos) >= 3
    assert labels == [f"$10^{{{int(p)}}}$" for p in pos]
    pos, labels = log_ticks(0.0, math.log10(6.0))        # 1 .. 6: 1, 2, 5
    assert labels == ["1", "2", "5"]
    pos, labels = log_ticks(math.log10(0.9), math.log10(1.1))
    assert labels == ["0.9", "1", "1.1"] and np.allclose(pos, np.log10([0.9, 1, 1.1]))
    pos, labels = log_ticks(math.log10(0.96), math.log10(1.04))
    assert labels == ["0.96", "0.98", "1", "1.02", "1.04"] and np.allclose(pos, np.log10([0.96, 0.98, 1, 1.02, 1.04]))
    pos, labels = log_ticks(-4.2, -3.0)                  # 6.3e-5 .. 1e-3
    assert labels == ["$10^{-4}$", "$2\\times10^{-4}$", "$5\\times10^{-4}$", "0.001"]


# ---------------------------------------------------------------------------------------
# plot: the command and its files
# ---------------------------------------------------------------------------------------

def test_plot_command_writes_png_and_svg(capsys, tmp_path):
    from matplotlib.image import imread

    from sigprop.plot import STYLE

    png = tmp_path / "f.png"
    code, out, err = cli(capsys, "plot", "--arch", "preln,postln,lns", "--layers", "3", *TINY_FLAGS,
                         "-o", str(png), "--dpi", "200", "--width", "5", "--height", "4")
    assert code == 0, err
    assert out.startswith(f"wrote {png}") and "preln, postln, lns" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = imread(png)[..., :3]
    assert img.shape[:2] == (800, 1000)                       # 5 x 4 inches at 200 dpi
    for arch in ("preln", "postln", "lns"):                  # every line (and legend entry) in its colour
        rgb = np.array([int(STYLE[arch][0][k:k + 2], 16) for k in (1, 3, 5)]) / 255
        assert np.sum(np.all(np.abs(img - rgb) < 0.03, axis=-1)) > 40, arch
    svg = tmp_path / "f.svg"
    code, out, err = cli(capsys, "plot", "--arch", "preln,lns", "--layers", "3", *TINY_FLAGS, "-o", str(svg),
                         "--check", "--trials", "2", "--batch", "1", "--seed", "7", "--title", "")
    assert code == 0, err
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for key in ("forward_var", "grad_var", "corr", "logit_var"):
        for i in (0, 1):
            assert f'id="prediction-{key}-{i}"' in text and f'id="mc-{key}-{i}"' in text
    assert "seed 7" in out
    assert "preln: Monte Carlo" in err and "lns: Monte Carlo" in err
    for bad, total in re.findall(r"(\d+) of (\d+) points outside", err):
        assert int(bad) <= int(total) == 7                    # points, not failed moments


def test_plot_without_matplotlib_exits_2(capsys, tmp_path, monkeypatch):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # `import matplotlib` -> ImportError
    out_file = tmp_path / "f.png"
    code, out, err = cli(capsys, "plot", "--arch", "preln", "--layers", "2", *TINY_FLAGS, "-o", str(out_file))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "sigprop[plot]" in err and "matplotlib" in err
    assert not out_file.exists()


def test_other_commands_never_import_matplotlib():
    code = ("import sys\n"
            "sys.argv = ['sigprop', 'compare', '--arch', 'preln', '--layers', '2', '--d-model', '32', '--heads', '2',"
            " '--d-ff', '64', '--seq-len', '8', '--json']\n"
            "import sigprop.plot, sigprop.compare\n"
            "from sigprop.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"][0]["arch"] == "preln"


def test_overlapping_lines_stay_distinguishable():
    """Two architectures with the same curve (Post-LN and DeepNorm both hold the forward
    variance at 1): the lower line's colour must still show (line styles differ); with one
    solid style for all, the upper line hid it completely."""
    from sigprop.plot import PANELS, STYLE, Curve, FigureData, make_figure

    x = np.linspace(0.0, 4.0, 9)
    lines = {p.key: [Curve("postln", x, np.zeros(9), None, 0), Curve("deepnorm", x, np.zeros(9), None, 1)]
             for p in PANELS}
    fig = make_figure(FigureData(PANELS, lines, {}, ["postln", "deepnorm"], ""))
    fig.set_dpi(300)
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255
    bb = fig.axes[0].get_window_extent()
    h = img.shape[0]
    panel = img[int(h - bb.y1):int(h - bb.y0), int(bb.x0):int(bb.x1)]      # panel (a), no legend
    for arch in ("postln", "deepnorm"):
        rgb = np.array([int(STYLE[arch][0][k:k + 2], 16) for k in (1, 3, 5)]) / 255
        assert np.sum(np.all(np.abs(panel - rgb) < 0.05, axis=-1)) > 100, arch
    assert len({STYLE[a][2] for a in STYLE}) == len(STYLE)


def test_png_size_is_bounded(capsys, tmp_path):
    from sigprop.plot import check_size

    out = tmp_path / "f.png"
    code, stdout, err = cli(capsys, "plot", "--arch", "preln", "--layers", "2", *TINY_FLAGS, "-o", str(out),
                            "--dpi", "2400", "--width", "20", "--height", "20")
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1
    assert "2.3e+09 pixels, more than the 50 million" in err and not out.exists()
    code, stdout, err = cli(capsys, "plot", "--arch", "preln", "--layers", "2", *TINY_FLAGS, "-o", str(out),
                            "--dpi", "100000")
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1 and "--dpi" in err
    check_size(tmp_path / "f.svg", 20, 20, 2400)          # vector output: the resolution draws nothing


def test_failed_points_count_points_not_moments():
    """A prediction 10x off in both variances fails every point twice: `plot --check` reported
    the failed moments as points ('14 of 9 points')."""
    import dataclasses

    from sigprop.mc.model import simulate
    from sigprop.model.checking import compare as check_points

    m = resolve("preln", n_layers=2, **TINY)
    pts = predict(m)
    meas = simulate(m, batch=1, trials=2, seed=0)
    off = [p._replace(log_var=p.log_var + math.log(10), log_gvar=p.log_gvar + math.log(10)) for p in pts]
    res = check_points(off, meas)
    assert len(res.failures) >= 2 * len(pts) and res.failed_points == [True] * len(pts)
    res = check_points(pts, meas, {"z": 1e9})
    assert res.failed_points == [False] * len(pts) and res.passed
    # the per-point flags are a field of the result (after the failures' texts), and a
    # prediction without approximation notes gives an empty tuple of them
    names = [f.name for f in dataclasses.fields(res)]
    assert names.index("failed_points") == names.index("failures") + 1
    assert res.approximation_notes == ()
