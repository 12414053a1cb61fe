"""docs/hf.md's table of every text model_type (docs/hf_table.py) says what
sigprop.interop.hf does: each listed model type under the status hf.py gives it, every text
model type of the installed transformers listed (where it is the version the table names), and
no model type called "predicted" that no test resolves."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from sigprop.errors import DomainError
from sigprop.interop import hf

from tests._paths import ROOT


def _table_module():
    spec = importlib.util.spec_from_file_location("hf_table", ROOT / "docs" / "hf_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


T = _table_module()
TABLE, VERSION, TYPES = T.in_doc((ROOT / "docs" / "hf.md").read_text(encoding="utf-8"))


def test_table_is_what_hf_py_says():
    """The table in docs/hf.md is the one rendered from hf.py for the model types it lists
    (regenerate it with python docs/hf_table.py --write)."""
    assert len(TYPES) == len(set(TYPES)) > 200
    assert TABLE == T.render(TYPES, VERSION)


def test_every_family_and_refusal_is_listed():
    assert set(hf.MODEL_TYPES) <= set(TYPES)
    assert set(hf.REFUSED) <= set(TYPES)


@pytest.mark.parametrize("model_type", ["falcon", "mixtral", "t5", "mamba", "camembert", "bloom"])
def test_status_is_what_resolve_does(model_type):
    """"predicted" resolves; "refused" exits with its reason; "not read" with the generic line."""
    s = T.status(model_type)
    if s.startswith("predicted"):
        # (the configuration class's defaults alone: a model resolves)
        assert hf.resolve({"model_type": model_type}, seq_len=16, n_layers=2).family == model_type
        return
    with pytest.raises(DomainError) as e:
        hf.resolve({"model_type": model_type})
    if s.startswith("refused: "):
        assert hf.REFUSED[model_type] in str(e.value) and hf.REFUSED[model_type] in s
    else:
        assert s.startswith("not read") and "is not supported" in str(e.value)


def test_lists_every_text_model_type_of_transformers():
    transformers = pytest.importorskip("transformers")
    if transformers.__version__ != VERSION:
        pytest.skip(f"the table lists transformers {VERSION}'s model types; {transformers.__version__} is installed")
    version, types = T.text_model_types()
    assert sorted(TYPES) == types


def test_predicted_model_types_are_tested():
    """Every model type the table calls predicted is resolved from a config in the tests (a
    model_type written in a test file or a config under tests/data/hf)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "tests").rglob("*"))
                     if p.is_file() and p.suffix in (".py", ".json") and p.name != Path(__file__).name)
    predicted = [t for t in TYPES if T.status(t).startswith("predicted")]
    assert "falcon" in predicted
    for t in predicted:
        pat = rf"""model_type(?:"\s*:\s*|\s*=\s*)["']{re.escape(t)}["']"""
        assert re.search(pat, text), f"{t} is called predicted but no test config has model_type {t!r}"
