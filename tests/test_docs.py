"""The documentation stays true: the generated pages equal what their scripts write now
(docs/reference.py: every command and option, from the command-line application;
docs/rules.py: every rule's metadata, formulas and measured accuracy), the README's and the
tutorial's examples are what the commands print, and the README keeps the test command CI runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fresh(name: str) -> str:
    """What ``python docs/NAME.py`` prints, in a new process with no plugins: the pages describe
    a fresh process, not this worker's (the command-line help is built when a command's module
    is imported, from the registries of that moment; another test may have had a plugin then)."""
    env = {k: v for k, v in os.environ.items() if k != "SIGPROP_PLUGINS"}
    run = subprocess.run([sys.executable, str(ROOT / "docs" / f"{name}.py")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_reference_page_is_the_generated_one():
    committed = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert committed == _fresh("reference"), "docs/reference.md is stale: run python docs/reference.py --write"


def test_reference_names_every_command_and_option():
    # independent of the generator's formatting: every visible option of every command is in
    # that command's section, or (a model option) in the shared section
    import typer

    from sigprop.cli import load

    text = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    sections = {m.group(1): m.group(2) for m in re.finditer(r"^## `?([^`\n]+)`?\n(.*?)(?=^## |\Z)", text, re.S | re.M)}
    root = typer.main.get_command(load())
    for name, cmd in root.commands.items():
        cmds = getattr(cmd, "commands", None) or {"": cmd}
        for sub, c in cmds.items():
            section = sections[f"sigprop {name}{' ' + sub if sub else ''}"]
            for p in c.params:
                if getattr(p, "hidden", False) or p.name in ("_version", "_plugin") or not p.opts[0].startswith("-"):
                    continue
                where = section + (sections["Model options"] if getattr(p, "rich_help_panel", None) == "Model" else "")
                assert f"`{max(p.opts, key=len)}" in where, (name, sub, p.opts)


def _without_formulas(text: str) -> str:
    text = re.sub(r"sympy [0-9][^ ]*\.\n", "sympy VERSION.\n", text)
    return re.sub(r"```math\n.*?```\n", "```math```\n", text, flags=re.S)


def test_rules_page_is_the_generated_one():
    # the formulas are sympy's printing: compared in full under the sympy version the page
    # names, the rest (parameters, assumptions, references, measured accuracy) always
    import sympy

    committed = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    fresh = _fresh("rules")
    if f"sympy {sympy.__version__}." in committed:
        assert committed == fresh, "docs/rules.md is stale: run python docs/rules.py --write"
    else:
        assert _without_formulas(committed) == _without_formulas(fresh), "docs/rules.md is stale"


def test_rules_page_lists_every_rule_and_assumption():
    from sigprop.rules import REGISTRY

    text = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    for rule in REGISTRY.values():
        assert f"## {rule.name}\n" in text
        for a in rule.assumptions:
            assert " ".join(a.split()) in text, (rule.name, a)


def test_readme_keeps_the_ci_test_command():
    # .ci/run runs `make test`, the README's test command
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()


def _sigprop(*args: str, cwd: Path = ROOT) -> str:
    import os
    import subprocess
    import sys

    env = dict(os.environ, COLUMNS="80", SIGPROP_PROGRESS="0", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "sigprop", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_readme_compare_example_is_what_the_command_prints():
    out = _sigprop("compare", "--arch", "preln,postln,dslm", "--layers", "768")
    table = out[out.index("arch     var out"):].split("\n\n")[0].rstrip()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n".join(line.rstrip() for line in table.splitlines()) in readme


def test_tutorial_verdict_is_what_predict_says():
    import sigprop

    text = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    block = text.split("$ sigprop predict --hf-config gpt2/config.json --every 3\n", 1)[1]
    shown = " ".join(block.split("\nforward variance:", 1)[0].split())
    p = sigprop.predict(hf_config=ROOT / "docs" / "examples" / "gpt2" / "config.json")
    assert shown == "verdict: " + " ".join(p.summary["verdict"].split())
    assert f"forward variance: final {p.summary['forward_var_final']:.4g}," in block


def test_validation_page_is_the_assembled_one(tmp_path):
    # docs/validation.md is assembled from the stored results (python -m sigprop.mc.validate
    # --assemble); a hand edit, or a stored result changed without re-assembling, fails here
    from sigprop.mc import validate

    out = tmp_path / "validation.md"
    validate.write_markdown(str(out), ROOT / "docs" / "validation")
    committed = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    assert committed == out.read_text(encoding="utf-8"), \
        "docs/validation.md differs from its stored results: python -m sigprop.mc.validate --assemble"


def test_site_navigation_lists_every_page():
    # mkdocs.yml (the documentation site, built with --strict by .ci/run): every page of docs/
    # is in the navigation, and every navigation entry is a page
    nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert nav == pages, (sorted(pages - nav), sorted(nav - pages))
