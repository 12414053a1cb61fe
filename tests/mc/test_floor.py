"""The accuracy floor's driver (sigprop.mc.floor): it writes its results only where it is told
(``--out DIR``, or ``--docs`` for the checkout's docs/validation/), and its reports append the
run notes stored beside the results (``NOTES.md``)."""

import json
import sys
from pathlib import Path

import pytest

from sigprop.mc import floor

ROW = dict(arch="preln", init="normal", n_layers=12, dropout=0.0, causal=False, options={}, n_failures=0,
           errors={k: {"max": 0.01} for k in ("forward_var_relerr", "grad_var_relerr", "forward_corr_abserr",
                                              "grad_corr_abserr")},
           r2={"forward_var": None, "grad_var": None}, fwd_change=1.0, grad_change=1.0, trials=2, batch=1, seed=0,
           failures=[])
ROW["pass"] = True
ARGS = ["--only", "preln", "--depths", "12", "--default-init-only", "--dropouts", "0", "--causal", "0", "--redo"]


def _main(monkeypatch, *args):
    calls = []

    def run_one(*a, **kw):
        calls.append(a)
        return dict(ROW)

    monkeypatch.setattr(floor, "run_one", run_one)
    monkeypatch.setattr(sys, "argv", ["floor", *args])
    floor.main()
    return calls


def test_nothing_is_written_without_a_store(monkeypatch):
    with pytest.raises(SystemExit) as e:
        _main(monkeypatch, *ARGS)
    assert "--out DIR, or --docs" in str(e.value)


def test_out_dir_gets_the_results(monkeypatch, tmp_path, capsys):
    calls = _main(monkeypatch, *ARGS, "--out", str(tmp_path / "store"))
    assert len(calls) == 1
    files = sorted((tmp_path / "store").iterdir())
    assert [f.name for f in files] == ["preln_normal_12_p0_bidir.json"]
    assert json.loads(files[0].read_text())["arch"] == "preln"


def test_out_and_docs_together_are_refused(monkeypatch, tmp_path):
    with pytest.raises(SystemExit, match="--out and --docs"):
        _main(monkeypatch, *ARGS, "--out", str(tmp_path), "--docs")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("report", [floor.report, floor.layouts_report, floor.modern_report])
def test_reports_end_with_the_notes_beside_the_results(tmp_path, report):
    (tmp_path / "a.json").write_text(json.dumps(ROW))
    bare = report(tmp_path)
    assert bare and "NOTES" not in bare
    (tmp_path / "NOTES.md").write_text("What was run: one row.\n")
    assert report(tmp_path) == bare + "\n\nWhat was run: one row."


def test_the_docs_stores_hold_their_notes():
    for store in (floor.OUT, floor.OUT_LAYOUTS, floor.OUT_MODERN):
        text = (store / "NOTES.md").read_text(encoding="utf-8")
        assert text.strip() and text.rstrip("\n") in {floor.OUT: floor.report, floor.OUT_LAYOUTS: floor.layouts_report,
                                                     floor.OUT_MODERN: floor.modern_report}[store]()
