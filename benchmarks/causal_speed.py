"""Whole-process speed and memory of causal `sigprop predict` at long context, as ratios
against baselines measured in the same run (medians of ``--repeats`` runs, the commands
interleaved so that a change of machine load hits them alike):

1. `predict --arch preln --causal --layers 768 --seq-len 8192 --json` vs
   `python -c "import numpy"` (goal: at most 5x) and vs the same command at seq 256 (goal: at
   most 1.5x);
2. `predict --arch lns --causal --layers 768 --json` vs `python -c "import numpy"` (goal: at
   most 5x);
3. peak resident memory of `predict --arch preln --causal --layers 768 --seq-len 131072
   --json` (goal: under 300 MB), the child's ru_maxrss.

The table store lives in a fresh temporary directory, filled by one untimed run of every
command first (a user's first run); the package is byte-compiled first.

    python benchmarks/causal_speed.py [--repeats 3] [--skip-lns | --lns-only]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _timing import interleaved, wall

ROOT = Path(__file__).resolve().parents[1]


def peak_mb(cmd: list[str], env: dict) -> float:
    """Peak resident memory (MB) of one run of ``cmd`` in a fresh wrapper process."""
    code = ("import resource, subprocess, sys; "
            "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, env=env, check=True)
    return int(r.stdout.strip()) / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-lns", action="store_true")
    ap.add_argument("--lns-only", action="store_true", help="only item 2 (against import numpy)")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    py = a.python
    subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "sigprop")], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, PYTHONPATH=str(ROOT), SIGPROP_CACHE_DIR=tempfile.mkdtemp(prefix="sigprop-bench-"))
    sp = [py, "-m", "sigprop", "predict", "--causal", "--layers", "768", "--json"]
    cmds = {
        "import numpy": [py, "-c", "import numpy"],
        "preln seq 256": sp + ["--arch", "preln"],
        "preln seq 8192": sp + ["--arch", "preln", "--seq-len", "8192"],
    }
    if a.lns_only:
        cmds = {"import numpy": cmds["import numpy"]}
    if not a.skip_lns:
        cmds["lns seq 256"] = sp + ["--arch", "lns"]
    first = {k: wall(c, env=env) for k, c in cmds.items()}          # fills the store
    med = dict(zip(cmds, interleaved([(c, env) for c in cmds.values()], a.repeats)))
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores; "
          f"medians of {a.repeats} interleaved runs (first run, filling the store, in brackets)")
    base = med["import numpy"]
    for k, t in med.items():
        print(f"  {k:16s} {t:8.2f} s  ({first[k]:7.2f} s)  {t / base:7.1f} x import numpy")
    if a.lns_only:
        return
    print(f"  seq 8192 / seq 256: {med['preln seq 8192'] / med['preln seq 256']:.2f}")
    big = sp + ["--arch", "preln", "--seq-len", "131072"]
    print(f"  peak memory, preln seq 131072: {peak_mb(big, env):.0f} MB; "
          f"seq 256: {peak_mb(cmds['preln seq 256'], env):.0f} MB")


if __name__ == "__main__":
    main()
