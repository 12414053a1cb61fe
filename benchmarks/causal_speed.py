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

``--llama`` adds `predict --arch llama --layers 768 --json` (causal, rotary positions, GQA
where set) and LLaMA-7B's depth at seq 256 and 8192 (`--layers 32 --seq-len 256|8192`, with
their ratio), and ``--bidirectional`` `predict --arch preln --layers 768 --json` to the same
interleaved run.  ``--baseline DIR`` also times every predict command on the sigprop tree in
DIR (e.g. a `git worktree` or `git archive` of an earlier commit; its own table store),
interleaved with this tree's: before and after in one run.  Beside the wall-clock medians the
script prints the median CPU time (user + system) of each command, which a loaded machine
disturbs less.

The table store lives in a fresh temporary directory, filled by one untimed run of every
command first (a user's first run); the package is byte-compiled first.

    python benchmarks/causal_speed.py [--repeats 3] [--skip-lns | --lns-only] [--llama]
                                      [--bidirectional] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_mb(cmd: list[str], env: dict) -> float:
    """Peak resident memory (MB) of one run of ``cmd`` in a fresh wrapper process."""
    code = ("import resource, subprocess, sys; "
            "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, env=env, check=True,
                       cwd=env["PYTHONPATH"])
    return int(r.stdout.strip()) / 1024.0


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + system) of one run of ``cmd``, started in
    the directory of the tree it times (``python -m`` puts the working directory first on
    the module path, ahead of PYTHONPATH)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=env["PYTHONPATH"])
    t = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-300:]}")
    return t, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-lns", action="store_true")
    ap.add_argument("--lns-only", action="store_true", help="only item 2 (against import numpy)")
    ap.add_argument("--llama", action="store_true", help="also predict --arch llama --layers 768 --json, and 32 layers at seq 256 and 8192")
    ap.add_argument("--bidirectional", action="store_true", help="also predict --arch preln --layers 768 --json")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a sigprop tree (an earlier commit) timed beside this one, interleaved")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    py = a.python
    trees = {"": ROOT} if a.baseline is None else {"": ROOT, " (baseline)": a.baseline.resolve()}
    envs = {}
    for tag, root in trees.items():
        subprocess.run([py, "-m", "compileall", "-q", str(root / "sigprop")], check=True, stdout=subprocess.DEVNULL)
        envs[tag] = dict(os.environ, PYTHONPATH=str(root), SIGPROP_CACHE_DIR=tempfile.mkdtemp(prefix="sigprop-bench-"))
    sp = [py, "-m", "sigprop", "predict", "--layers", "768", "--json"]
    predicts = {"preln seq 256": sp + ["--arch", "preln", "--causal"],
                "preln seq 8192": sp + ["--arch", "preln", "--causal", "--seq-len", "8192"]}
    if a.lns_only:
        predicts = {}
    if not a.skip_lns:
        predicts["lns seq 256"] = sp + ["--arch", "lns", "--causal"]
    if a.llama:
        predicts["llama"] = sp + ["--arch", "llama"]
        l32 = [py, "-m", "sigprop", "predict", "--arch", "llama", "--layers", "32", "--json", "--seq-len"]
        predicts["llama 32 seq 256"] = l32 + ["256"]
        predicts["llama 32 seq 8192"] = l32 + ["8192"]
    if a.bidirectional:
        predicts["preln bidirectional"] = sp + ["--arch", "preln"]
    runs = {"import numpy": ([py, "-c", "import numpy"], envs[""])}
    for k, c in predicts.items():
        for tag in trees:
            runs[k + tag] = (c, envs[tag])
    first = {k: timed(c, e)[0] for k, (c, e) in runs.items()}          # fills the stores
    load0 = os.getloadavg()
    samples = {k: [] for k in runs}
    for _ in range(a.repeats):
        for k, (c, e) in runs.items():
            samples[k].append(timed(c, e))
    load = os.getloadavg()
    med = {k: statistics.median(t for t, _ in v) for k, v in samples.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in samples.items()}
    print(f"load average {load0[0]:.1f} -> {load[0]:.1f} (5 min {load[1]:.1f}) on {os.cpu_count()} cores; "
          f"medians of {a.repeats} interleaved runs (first run, filling the store, in brackets)")
    base, base_cpu = med["import numpy"], cpu["import numpy"]
    for k, t in med.items():
        print(f"  {k:32s} {t:7.2f} s ({first[k]:7.2f} s) {t / base:6.1f} x import numpy | "
              f"CPU {cpu[k]:6.2f} s {cpu[k] / base_cpu:6.1f} x")
    if a.lns_only:
        return
    for tag in trees:
        print(f"  seq 8192 / seq 256{tag}: {med['preln seq 8192' + tag] / med['preln seq 256' + tag]:.2f}")
        if a.llama:
            print(f"  llama 32 layers, seq 8192 / seq 256{tag}: "
                  f"{med['llama 32 seq 8192' + tag] / med['llama 32 seq 256' + tag]:.2f}")
    big = predicts["preln seq 256"] + ["--seq-len", "131072"]
    print(f"  peak memory, preln seq 131072: {peak_mb(big, envs['']):.0f} MB; "
          f"seq 256: {peak_mb(predicts['preln seq 256'], envs['']):.0f} MB")


if __name__ == "__main__":
    main()
