"""The README's examples are what the commands print, and the README keeps the test command
CI runs."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
