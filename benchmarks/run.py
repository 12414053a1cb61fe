"""Benchmarks, run on demand (`make bench`).  Every figure is a ratio against a baseline
measured in the same run; medians over repeats, because these machines are shared and noisy.

1. start-up: a numbers-only command vs `python -c "import numpy"` (goal: about 1x; sympy is
   never imported on the numeric path);
2. Monte Carlo throughput: the linear component's simulation (forward + hand-written backward)
   vs a bare float32 matrix multiply of the same shapes (goal: close to 1x, i.e. BLAS-bound).

The whole-model simulation of `sigprop check` has its own script, benchmarks/check_speed.py
(also run by `make bench`; results in docs/benchmarks.md).
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from _timing import median_wall


def startup(repeats: int = 7) -> None:
    py = sys.executable
    base = median_wall([py, "-c", "import numpy"], repeats, ok=None)
    rows = [
        ("numeric rule evaluation (library)", [py, "-c", "import sigprop.rules as R; from sigprop.state import Forward; "
                                               "R.get('linear').evaluate(Forward(0.,1.,0.), None, d_in=4, d_out=4, w_std=1.)"]),
        ("sigprop check-component dropout (tiny)", [py, "-m", "sigprop", "check-component", "dropout", "-p", "d=8",
                                                   "--trials", "2", "--batch", "1", "--json"]),
    ]
    print(f"start-up, median of {repeats}: python -c 'import numpy' = {base * 1000:.0f} ms")
    for label, cmd in rows:
        t = median_wall(cmd, repeats, ok=None)   # verdict irrelevant here
        print(f"  {label:45s} {t * 1000:6.0f} ms   ratio {t / base:.2f}x")


def mc_throughput(repeats: int = 5) -> None:
    from sigprop.mc.components import get
    from sigprop.mc.component import measure
    from sigprop.state import Backward, Forward

    comp = get("linear")
    params = {"d_in": 1024, "d_out": 1024, "w_std": 1 / 32, "L": 256}
    batch, runs = 8, 2
    flop = runs * comp.flops(params, batch)
    t_sim = statistics.median(
        measure(comp, params, Forward(0.0, 1.0, 0.2), Backward(1.0, 0.0), runs=runs, batch=batch, seed=i).seconds
        for i in range(repeats))
    rng = np.random.default_rng(0)
    A = rng.standard_normal((batch * 256, 1024), dtype=np.float32)
    W = rng.standard_normal((1024, 1024), dtype=np.float32)

    def bare():
        t0 = time.perf_counter()
        for _ in range(runs):
            A @ W
            A @ W.T
        return time.perf_counter() - t0

    t_mm = statistics.median(bare() for _ in range(repeats))
    print(f"Monte Carlo throughput, median of {repeats}: linear simulation {flop / t_sim / 1e9:.1f} GFLOP/s, "
          f"bare float32 matmul {flop / t_mm / 1e9:.1f} GFLOP/s, ratio {t_mm / t_sim:.2f} of matmul peak "
          f"(the simulation also samples inputs and measures moments)")


if __name__ == "__main__":
    startup()
    mc_throughput()
