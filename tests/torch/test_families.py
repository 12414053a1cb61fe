"""The family accuracy table's configs and its page (sigprop/torch/families.py); the
measurement itself is tested per family in tests/torch/test_torch_interop.py."""

from __future__ import annotations

import pytest

from sigprop.errors import DomainError
from sigprop.interop import hf
from sigprop.torch import families


def _resolved(family, size):
    try:
        return hf.resolve(families.reduced(family, size), seq_len=families.SIZES[size][2]).model
    except DomainError:
        return None


@pytest.mark.parametrize("family", sorted(families.SMALL))
def test_the_larger_size_keeps_the_head_shape(family):
    """B doubles width, heads and key-value heads and sets 8 layers: head_dim and the heads /
    kv-heads ratio of A stay (what the issue asks a reduced size to keep)."""
    a, b = _resolved(family, "A"), _resolved(family, "B")
    assert a is not None
    if b is None:                              # refused at B: named in the table, not silently dropped
        pytest.skip(f"{family} B refused")
    assert (a.n_layers, b.n_layers) == (4, 8)
    assert b.d_model == 2 * a.d_model
    assert b.d_head == a.d_head
    assert b.n_heads == 2 * a.n_heads
    assert (b.n_kv_heads or b.n_heads) * a.n_heads == (a.n_kv_heads or a.n_heads) * b.n_heads
    assert b.d_ff == 2 * a.d_ff
    assert (a.seq_len, b.seq_len) == (32, 64)


def test_the_page_names_every_row_and_every_failure():
    err = {k: {"median": 0.01, "p90": 0.02, "max": 0.03} for k in
           ("forward_var_relerr", "grad_var_relerr", "forward_corr_abserr", "grad_corr_abserr", "logit_var_relerr")}
    rows = [dict(family="gpt2", size="A", inputs="unit", heads="4/4", passed=True, errors=err, failures=[],
                 trials=8, batch=4, seed=0, measure_s=3.2, predict_s=1.1),
            dict(family="llama", size="B", inputs="embedding", heads="8/4", passed=False, errors=err,
                 failures=["layer 2 ffn: grad var predicted 1, measured 2 ± 0.1"], trials=8, batch=4, seed=0,
                 measure_s=5, predict_s=2),
            dict(family="gemma3_text", size="B", inputs="unit", refused="two rotary bases", passed=None)]
    text = families.markdown(rows, "python -m sigprop.torch.families")
    assert "1 of 2 rows measured pass" in text and "1 refused" in text
    assert "| gpt2 | A | unit | 4/4 | pass | 1.0 / 3.0 | 1.0 / 3.0 | 0.030 | 0.030 | 3.0 | 3 / 1 |" in text
    assert "| llama | B | embedding | 8/4 | FAIL |" in text
    assert "- llama B embedding: layer 2 ffn: grad var predicted 1" in text
    assert "- gemma3_text B unit: two rotary bases" in text


def test_unknown_selection_is_one_line_and_exit_2(capsys):
    assert families.main(["--families", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown family 'nosuch'" in err


def test_a_rows_file_resumes_a_run(tmp_path, monkeypatch, capsys):
    """--rows: a row already in the file (same family, size, input, trials, batch, seed) is
    taken from it, a line a killed run left half-written is skipped, new rows are appended."""
    import json

    err = {k: {"median": 0.01, "p90": 0.02, "max": 0.03} for k in
           ("forward_var_relerr", "grad_var_relerr", "forward_corr_abserr", "grad_corr_abserr", "logit_var_relerr")}
    row = dict(family="gpt2", size="A", inputs="unit", heads="4/4", passed=True, errors=err, failures=[],
               trials=8, batch=4, seed=0, measure_s=1.0, predict_s=1.0)
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps({"key": ["gpt2", "A", "unit", 8, 4, 0], **row}) + "\n" + '{"key": ["bert", "A"', encoding="utf-8")
    measured = []

    def fake(family, size, inputs, **kw):
        measured.append((family, size, inputs))
        return dict(row, family=family, inputs=inputs)

    monkeypatch.setattr(families, "measure_one", fake)
    assert families.main(["--families", "gpt2,bert", "--sizes", "A", "--inputs", "unit", "--rows", str(f)]) == 0
    assert measured == [("bert", "A", "unit")]
    assert "| gpt2 | A | unit |" in capsys.readouterr().out
    lines = f.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[-1])["key"] == ["bert", "A", "unit", 8, 4, 0]
    assert families.main(["--families", "gpt2,bert", "--sizes", "A", "--inputs", "unit", "--rows", str(f)]) == 0
    assert measured == [("bert", "A", "unit")]                 # both from the file now
