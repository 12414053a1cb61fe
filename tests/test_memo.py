"""sigprop.memo: the one bounded map, the memos passed as an object, and that whatever was
memoised before a prediction does not change its numbers."""

from __future__ import annotations

import ast
import json

import pytest

from sigprop import memo
from sigprop.model import tables
from sigprop.model.predict import predict
from sigprop.model.presets import resolve
from tests import _paths

ROOT = _paths.ROOT / "sigprop"


def test_bounded_drops_the_oldest_entry_first():
    b = memo.Bounded(3)
    for k in range(5):
        assert b.get(k, lambda k=k: -k) == -k
    assert [b.peek(k) for k in range(5)] == [None, None, -2, -3, -4]
    # a hit computes nothing, and re-storing a present key drops nothing
    assert b.get(3, lambda: pytest.fail("computed on a hit")) == -3
    b.put(4, 40)
    assert len(b) == 3 and b.peek(2) == -2 and b.peek(4) == 40
    with pytest.raises(ValueError):
        memo.Bounded(0)
    # at the limit the oldest half goes at once (the map rebuilt without them)
    b = memo.Bounded(8)
    for k in range(9):
        b.put(k, k)
    assert sorted(b.data) == [4, 5, 6, 7, 8]


def test_bounded_keeps_a_none_value():
    b = memo.Bounded(2)
    calls = []
    for _ in range(3):
        assert b.get("k", lambda: calls.append(1)) is None
    assert calls == [1]


def test_bounded_by_identity_never_serves_another_object():
    """Keyed by an object's identity: the entry keeps the object, so a new object with an
    equal value (or, after the old one is gone, the same id) gets its own value."""
    b = memo.Bounded(8)
    a = {"x": 1}
    first = b.for_object(a, lambda: object())
    assert b.for_object(a, lambda: pytest.fail("computed on a hit")) is first
    twin = {"x": 1}
    assert b.for_object(twin, lambda: "twin") == "twin"
    assert b.for_object(a, lambda: None, extra="other") is None          # qualifiers are keys too
    assert b.peek(id(a))[0] is a                                   # the entry keeps its object


def test_kinds_have_unique_names_and_values_live_in_the_memos_in_effect():
    kind = memo.KINDS["attention.rope_rows"]
    with pytest.raises(ValueError):
        memo.Kind("attention.rope_rows", 4)
    mine = memo.Memos()
    before = len(memo.process().map(kind))
    with memo.using(mine):
        assert memo.current() is mine
        kind.get(("test-key",), lambda: 1)
        assert mine.sizes() == {"attention.rope_rows": 1}
    assert memo.current() is memo.process()
    assert len(memo.process().map(kind)) == before
    assert memo.process().map(kind).peek(("test-key",)) is None
    mine.clear()
    assert mine.sizes() == {}


def test_memoised_function_keys_on_its_arguments():
    calls = []
    kind = memo.Kind("test.memoised", 4)
    try:
        @memo.memoised(kind)
        def f(a, b):
            calls.append((a, b))
            return a + b

        with memo.using(memo.Memos()):
            assert f(1, 2) == 3 and f(1, 2) == 3 and f(2, 1) == 3
        assert calls == [(1, 2), (2, 1)]
        assert f.kind is kind
    finally:
        del memo.KINDS["test.memoised"]


def _trace(model, memos=None) -> str:
    pts = predict(model, tables=tables.TableCache(memos=memos))
    return json.dumps([list(p) for p in pts])


@pytest.mark.parametrize("arch, kw", [
    ("preln", dict(causal=True, seq_len=256)),           # the node grid, the per-key weights
    ("llama", dict(seq_len=128)),                        # rotary positions, RMSNorm, SwiGLU
    ("postln", dict(causal=True, seq_len=32, dropout=0.1)),   # the exact position model
])
def test_a_prediction_does_not_depend_on_what_was_memoised_before(arch, kw, tmp_path, monkeypatch):
    """The same model predicted (1) with fresh memos and an empty table store, (2) again
    with those memos, now filled, (3) with the process's memos after other predictions
    filled them: bit for bit the same trace.  (1) fills its own memos only."""
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    model = resolve(arch, None, n_layers=8, d_model=64, n_heads=2, d_ff=256, **kw)
    process_before = memo.process().sizes()
    fresh = memo.Memos()
    first = _trace(model, fresh)
    assert fresh.sizes(), "the prediction memoised nothing in the memos passed to it"
    assert memo.process().sizes() == process_before
    again = _trace(model, fresh)
    other = resolve(arch, None, n_layers=4, d_model=64, n_heads=2, d_ff=256, **kw)
    _trace(other)
    _trace(model)
    warm = _trace(model)
    assert first == again == warm


def _memo_dicts(tree: ast.Module) -> list[str]:
    """Module-level caches written by hand: an empty dict at module level, or a functools
    cache decorator."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            v = node.value
            if (isinstance(v, ast.Dict) and not v.keys) or (
                    isinstance(v, ast.Call) and getattr(v.func, "id", "") in ("dict", "OrderedDict")
                    and not v.args and not v.keywords):
                out.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if "cache" in ast.unparse(d):
                    out.append(f"line {node.lineno}: @{ast.unparse(d)} {node.name}")
    return out


#: module-level dicts that are registries, not memos: every entry is needed for the program
#: to work (dropping one changes behaviour, not only speed)
REGISTRIES = {"rules/base.py": 1, "backend/symbolic.py": 2, "model/sublayers.py": 1}


@pytest.mark.parametrize("pkg", ["model", "rules", "solve", "backend", "export", "interop", "cli"])
def test_no_module_level_memo_outside_sigprop_memo(pkg):
    for path in sorted((ROOT / pkg).rglob("*.py")):
        found = _memo_dicts(ast.parse(path.read_text()))
        rel = str(path.relative_to(ROOT))
        assert len(found) == REGISTRIES.get(rel, 0), f"{rel}: {found}"

