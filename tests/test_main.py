"""The process entry (sigprop.__main__) owns every process-wide setting; the library leaves the
process as it found it: the cyclic collector, the C allocator, the disk store."""

from __future__ import annotations

import ctypes
import gc
import platform

import pytest

from sigprop import __main__ as entry
from sigprop.model import presets, store
from sigprop.model.predict import predict
from sigprop.model.spec import Model


def test_the_library_keeps_the_collector_running(monkeypatch):
    """The predictor's passes, a model's JSON parsing and the solver's refinement run with the
    collector as the caller left it (they paused it before)."""
    from sigprop.model import predict as P
    from sigprop.model import spec
    from sigprop.solve import solver

    seen = []

    def spy(fn):
        def wrapped(*a, **k):
            seen.append((fn.__name__, gc.isenabled()))
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(P.Predictor, "backward", spy(P.Predictor.backward))
    monkeypatch.setattr(P.Predictor, "forward", spy(P.Predictor.forward))
    monkeypatch.setattr(spec, "_parse_model", spy(spec._parse_model))
    model = presets.resolve("preln", n_layers=3, d_model=64, n_heads=2, d_ff=128, seq_len=16)
    assert gc.isenabled()
    predict(model)
    Model.from_json(model.to_json())
    solver.solve_unit("preln", n_layers=3, d_model=64, n_heads=2, d_ff=128, seq_len=16)
    assert gc.isenabled()
    names = {n for n, _ in seen}
    assert {"forward", "backward", "_parse_model"} <= names
    assert all(on for _, on in seen), seen


def test_the_library_does_not_tune_the_allocator(monkeypatch):
    """Neither a causal prediction nor a Monte Carlo trial loads libc to call mallopt."""
    from sigprop.mc.model import simulate

    opened = []
    real = ctypes.CDLL

    def spy(*a, **k):
        opened.append(a)
        return real(*a, **k)

    monkeypatch.setattr(ctypes, "CDLL", spy)
    model = presets.resolve("preln", n_layers=2, d_model=32, n_heads=2, d_ff=64, seq_len=8, causal=True)
    predict(model)
    simulate(model, batch=1, trials=1)
    assert opened == []


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="glibc's mallopt")
def test_the_entry_tunes_the_allocator_for_its_heavy_commands():
    assert entry.keep_freed_memory(["predict", "--causal"])
    assert entry.keep_freed_memory(["check"])
    assert not entry.keep_freed_memory(["rules"])
    assert not entry.keep_freed_memory(["-h"])


def test_a_library_call_reads_and_writes_no_store_unless_asked(monkeypatch, tmp_path):
    """Without SIGPROP_CACHE_DIR, a library prediction leaves the default directory alone; the
    command line (store.use_default) and the variable ask for it."""
    monkeypatch.delenv("SIGPROP_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(store._DEFAULT, "on", False)
    model = presets.resolve("preln", n_layers=6, d_model=64, n_heads=2, d_ff=128, seq_len=16)
    assert store.directory() is None
    predict(model)
    assert not (tmp_path / "sigprop").exists()
    store.use_default()
    assert store.directory() == tmp_path / "sigprop"
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path / "asked"))
    assert store.directory() == tmp_path / "asked"


def test_command_names_the_first_non_option():
    assert entry.command(["--json", "predict", "--layers", "4"]) == "predict"
    assert entry.command(["-h"]) is None
