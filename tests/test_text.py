"""User-facing text stays inside the checkout and speaks of the software, not of how it was
made: the package's docstrings and messages, the docs, the README and every command's help."""

from __future__ import annotations

import re

import pytest

from tests._paths import ROOT

#: phrases that point outside the checkout or narrate the development process
FORBIDDEN = [
    (re.compile(r"\bcontract\b", re.I), "refers to an outside specification ('contract')"),
    (re.compile(r"\bsessions?\b", re.I), "speaks of development sessions"),
    (re.compile(r"\bissue(?:'s|s)?\b", re.I), "speaks of issues"),
    (re.compile(r"shared/reference|theory\.md|modern\.md"), "points outside the checkout"),
]


def _texts():
    for path in sorted((ROOT / "sigprop").rglob("*.py")):
        yield path
    yield ROOT / "README.md"
    for path in sorted((ROOT / "docs").rglob("*.md")):
        yield path


def _hits(text: str):
    for lineno, line in enumerate(text.splitlines(), 1):
        for pat, why in FORBIDDEN:
            if pat.search(line):
                yield lineno, why, line.strip()


@pytest.mark.parametrize("path", list(_texts()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_outside_references(path):
    hits = list(_hits(path.read_text(encoding="utf-8")))
    assert not hits, "\n".join(f"{path.relative_to(ROOT)}:{n}: {why}: {line}" for n, why, line in hits)


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("path", [p for p in _texts() if p.suffix == ".md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_checkout(path):
    bad = []
    for target in _LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        resolved = (path.parent / target).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            bad.append(target)
    assert not bad, f"{path.relative_to(ROOT)}: links outside the checkout or to nothing: {bad}"


def test_command_help_text():
    from typer.testing import CliRunner

    from sigprop.cli import COMMANDS, load

    app = load()
    runner = CliRunner()
    for args in [["--help"]] + [[name, "--help"] for name in COMMANDS]:
        res = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert res.exit_code == 0, (args, res.output)
        hits = list(_hits(res.output))
        assert not hits, f"sigprop {' '.join(args)}: {hits}"
