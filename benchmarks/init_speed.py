"""Whole-process time of `sigprop predict` across initialisation scales, cold and warm.

For every (architecture, init std, depth) of the grid: "cold" runs `sigprop predict ... --json`
against a fresh, empty table store (every interpolation table it uses is built inside the run,
as on a user's first run), "warm" runs the same command again on that store (the tables are
loaded).  Each is the median of ``--repeats`` runs (a fresh store for every cold run), and
the ratio is against `python -c "import numpy"` timed in the same run (median of as many
runs, interleaved with the grid so that a change of machine load hits both).  The exit code
is printed as well: beyond the attention rule's domain (row logit variance 100; init std
~0.1 at d_model 1024) a prediction ends quickly with a message rather than a trace.

Run on demand (not a unit test):

    python benchmarks/init_speed.py [--repeats 3] [--stds 0.02,0.05,0.08,0.1,0.2]
                                    [--layers 2,4,12,48] [--archs preln,postln] [--timeout 600]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _run(cmd: list[str], env: dict, timeout: float | None = None) -> tuple[float, int]:
    """Wall seconds and exit code of one run (124 where it ran past ``timeout``)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, 124
    return time.perf_counter() - t0, r.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stds", default="0.02,0.05,0.08,0.1,0.2")
    ap.add_argument("--layers", default="2,4,12,48")
    ap.add_argument("--archs", default="preln,postln")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=600, help="seconds before a run is stopped (exit 124)")
    a = ap.parse_args()
    py = a.python
    base_env = {**os.environ, "SIGPROP_PROGRESS": "0"}
    numpy_times = []
    rows = []
    print(f"{'arch':7} {'std':>5} {'N':>3} {'rc':>2} {'cold s':>8} {'warm s':>8} {'cold/np':>8} {'warm/np':>8}",
          flush=True)
    for arch in a.archs.split(","):
        for std in a.stds.split(","):
            for n in a.layers.split(","):
                cmd = [py, "-m", "sigprop", "predict", "--arch", arch, "--init-std", std, "--layers", n, "--json"]
                cold, warm, codes = [], [], set()
                for _ in range(a.repeats):
                    numpy_times.append(_run([py, "-c", "import numpy"], base_env)[0])
                    env = {**base_env, "SIGPROP_CACHE_DIR": tempfile.mkdtemp(prefix="sigprop-bench-")}
                    t, rc = _run(cmd, env, a.timeout)
                    cold.append(t)
                    codes.add(rc)
                    t, rc = _run(cmd, env, a.timeout)
                    warm.append(t)
                    codes.add(rc)
                np_med = statistics.median(numpy_times)
                c, w = statistics.median(cold), statistics.median(warm)
                rc = ",".join(str(x) for x in sorted(codes))
                rows.append((arch, std, n, rc, c, w))
                print(f"{arch:7} {std:>5} {n:>3} {rc:>2} {c:8.2f} {w:8.2f} {c / np_med:8.1f} {w / np_med:8.1f}",
                      flush=True)
    np_med = statistics.median(numpy_times)
    print(f"python -c 'import numpy': median {np_med:.3f} s over {len(numpy_times)} runs")
    worst = max(rows, key=lambda r: r[4])
    print(f"slowest cold: {worst[0]} --init-std {worst[1]} --layers {worst[2]}: {worst[4]:.2f} s "
          f"({worst[4] / np_med:.0f}x import numpy)")


if __name__ == "__main__":
    main()
