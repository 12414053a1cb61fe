"""tests/ mirrors the package (docs/design.md, "Tests"): a test file tests/<path>/test_<name>.py
belongs to sigprop/<path>/, and <name> is, or begins with "<m>_" for, one of that folder's
modules (leading underscores dropped: ``__main__`` is ``main``, ``_predict`` is ``predict``),
one of its sub-folders, or the folder itself; so a module's tests are found by its name.  A
few files test the whole checkout and are listed here by name."""

from __future__ import annotations

import pytest

from tests._paths import ROOT

TESTS = ROOT / "tests"
PACKAGE = ROOT / "sigprop"
#: the tests of the checkout as a whole, not of one module
CROSS_CUTTING = {"test_text.py", "test_layout.py", "test_docs.py"}
#: sub-folders of tests/ that hold no tests
NOT_MIRRORED = {"data"}


def _names(folder):
    """What a test file in the mirror of ``folder`` may be named after."""
    names = {folder.name}
    for p in folder.iterdir():
        if p.suffix == ".py" and p.name != "__init__.py":
            names.add(p.stem.strip("_"))
        elif p.is_dir() and (p / "__init__.py").is_file():
            names.add(p.name)
    return names


def _owner(test):
    """The part of the package ``test`` (a path under tests/) belongs to, or None."""
    folder = PACKAGE.joinpath(*test.relative_to(TESTS).parent.parts)
    if not folder.is_dir():
        return None
    stem = test.stem[len("test_"):]
    for name in sorted(_names(folder), key=len, reverse=True):
        if stem == name or stem.startswith(name + "_"):
            return folder / name
    return None


def _tests():
    return sorted(p for p in TESTS.rglob("test_*.py") if not NOT_MIRRORED & set(p.relative_to(TESTS).parts))


@pytest.mark.parametrize("test", _tests(), ids=lambda p: str(p.relative_to(TESTS)))
def test_every_test_file_is_named_after_what_it_tests(test):
    if test.relative_to(TESTS).as_posix() in CROSS_CUTTING:
        return
    assert _owner(test) is not None, (
        f"tests/{test.relative_to(TESTS)}: name it tests/<path>/test_<module>[_<topic>].py after the module or "
        f"folder sigprop/<path>/<module> it tests (or list it in CROSS_CUTTING in {__name__})")


def test_every_test_folder_mirrors_a_package_folder():
    for folder in sorted(p for p in TESTS.rglob("*") if p.is_dir()):
        rel = folder.relative_to(TESTS)
        if NOT_MIRRORED & set(rel.parts) or "__pycache__" in rel.parts or rel.parts[0].startswith("."):
            continue
        assert PACKAGE.joinpath(*rel.parts).is_dir(), f"tests/{rel}: no sigprop/{rel} to mirror"
        assert (folder / "__init__.py").is_file(), f"tests/{rel}: a package (tests import tests._cli and the like)"


def test_the_rule_can_fail():
    assert _owner(TESTS / "test_nothing_here.py") is None
    assert _owner(TESTS / "model" / "test_predictor.py") is None          # a prefix, not a word
    assert _owner(TESTS / "nowhere" / "test_predict.py") is None
    assert _owner(TESTS / "model" / "test_predict_causal.py") == PACKAGE / "model" / "predict"
    assert _owner(TESTS / "test_main.py") == PACKAGE / "main"


def test_no_test_loads_a_benchmark():
    """benchmarks/ holds timing scripts run on demand; what a test needs lives in the package
    or in tests/ (a benchmark script loaded by its path would make a test of it)."""
    for test in sorted(TESTS.rglob("*.py")):
        text = test.read_text(encoding="utf-8")
        assert "benchmarks" not in text or test.name == "test_layout.py", f"tests/{test.relative_to(TESTS)}"
