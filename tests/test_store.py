"""The on-disk table store: a loaded table gives bit-identical predictions; a corrupt,
missing or disabled store falls back to building; edits to the rules invalidate keys."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.model import presets, store, tables
from sigprop.model.predict import predict


def _fresh_predict(model):
    """Predict with an empty in-memory table cache (so tables come from the store or a build)."""
    import sigprop.model.predict as pm

    saved = pm._TABLES
    pm._TABLES = tables.TableCache()
    try:
        return predict(model)
    finally:
        pm._TABLES = saved


def _values(points):
    return np.array([[p.log_var, p.corr, p.log_gvar, p.gcorr, p.logit_var or 0.0] for p in points])


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_loaded_tables_give_identical_predictions(cache_dir):
    model = presets.resolve("preln", n_layers=6, d_model=64, n_heads=2, d_ff=256, seq_len=16)
    built = _values(_fresh_predict(model))
    files = sorted(cache_dir.glob("*.npy"))
    assert files, "building the tables should have stored them"
    stamps = [f.stat().st_mtime_ns for f in files]
    loaded = _values(_fresh_predict(model))
    assert [f.stat().st_mtime_ns for f in files] == stamps      # read, not rebuilt
    assert np.array_equal(built, loaded)


def test_disabled_store_gives_the_same_numbers(cache_dir, monkeypatch):
    model = presets.resolve("postln", n_layers=4, d_model=64, n_heads=2, d_ff=256, seq_len=16)
    with_store = _values(_fresh_predict(model))
    monkeypatch.setenv("SIGPROP_CACHE_DIR", "off")
    assert store.directory() is None
    assert np.array_equal(_values(_fresh_predict(model)), with_store)


def test_corrupt_entries_are_rebuilt(cache_dir):
    model = presets.resolve("preln", n_layers=4, d_model=64, n_heads=2, d_ff=256, seq_len=16)
    good = _values(_fresh_predict(model))
    for f in cache_dir.glob("*.npy"):
        f.write_bytes(b"not a table")
    assert np.array_equal(_values(_fresh_predict(model)), good)
    for f in cache_dir.glob("*.npy"):
        assert store.load(f.stem) is not None                      # rewritten


def test_unwritable_directory_is_harmless(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(blocker / "sub"))   # cannot be created
    model = presets.resolve("preln", n_layers=3, d_model=64, n_heads=2, d_ff=256, seq_len=16)
    assert np.all(np.isfinite(_values(_fresh_predict(model))))


def test_keys_depend_on_inputs_and_sources(monkeypatch):
    k = store.key("table", ("attention", 1.0), 0.0)
    assert k == store.key("table", ("attention", 1.0), 0.0)
    assert k != store.key("table", ("attention", 1.0 + 1e-15), 0.0)
    monkeypatch.setattr(store, "_digest", "another source tree")
    assert k != store.key("table", ("attention", 1.0), 0.0)


def test_a_stored_table_that_could_not_be_built_loads_as_such(cache_dir):
    """A table whose build failed is stored as its header alone (no nodes, not ok); loading it
    gives the same prediction as the run that built it (a 3-layer DeepScaleLM model at d 32
    stores one: its second run died on a ZeroDivisionError, exit 3)."""
    model = presets.resolve("dslm", n_layers=3, d_model=32, n_heads=2, d_ff=64, seq_len=8)
    built = _values(_fresh_predict(model))
    assert any(store.load(f.stem) is not None and store.load(f.stem).size == 3 for f in cache_dir.glob("*.npy"))
    assert np.array_equal(_values(_fresh_predict(model)), built)
