"""A first run's cost: `sigprop predict` on an empty table
store, with the shipped one-row table of the attention statistics (sigprop/rules/row_table.py)
and without it (SIGPROP_ROW_TABLE=off: every statistic by its integral), and a second run on the
store the first one filled, as ratios against `python -c "import numpy"` measured in the same
run.  Medians of ``--repeats`` (default 3); the commands of a row are interleaved, each cold
run on a fresh store.

    python benchmarks/first_run.py [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _timing import wall

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "preln 12 layers": ["--arch", "preln", "--layers", "12"],
    "llama (130M, 12 layers)": ["--arch", "llama"],
    "gpt2 (causal, 12 layers)": ["--arch", "gpt2"],
    "olmo2 4 layers (QK-norm)": ["--arch", "olmo2", "--layers", "4"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the first two models only")
    a = ap.parse_args()
    base = {**os.environ, "PYTHONPATH": str(ROOT), "SIGPROP_PROGRESS": "0"}
    py = sys.executable
    models = dict(list(MODELS.items())[:2]) if a.quick else MODELS
    numpy_t = []
    print(f"{'model':28} {'table s':>8} {'no table s':>10} {'warm s':>7} {'table/np':>9} {'none/np':>8} "
          f"{'warm/np':>8} {'speed-up':>8}", flush=True)
    for label, args in models.items():
        cmd = [py, "-m", "sigprop", "predict", *args, "--json"]
        on, off, warm = [], [], []
        for _ in range(a.repeats):
            numpy_t.append(wall([py, "-c", "import numpy"], env=base))
            store = tempfile.mkdtemp(prefix="sigprop-bench-")
            on.append(wall(cmd, ok=None, env={**base, "SIGPROP_CACHE_DIR": store}))
            warm.append(wall(cmd, ok=None, env={**base, "SIGPROP_CACHE_DIR": store}))
            off.append(wall(cmd, ok=None, env={**base, "SIGPROP_ROW_TABLE": "off",
                                               "SIGPROP_CACHE_DIR": tempfile.mkdtemp(prefix="sigprop-bench-")}))
        npm = statistics.median(numpy_t)
        t_on, t_off, t_w = statistics.median(on), statistics.median(off), statistics.median(warm)
        print(f"{label:28} {t_on:8.2f} {t_off:10.2f} {t_w:7.2f} {t_on / npm:9.1f} {t_off / npm:8.1f} "
              f"{t_w / npm:8.1f} {t_off / t_on:7.2f}x", flush=True)
    print(f"python -c 'import numpy': median {statistics.median(numpy_t):.3f} s over {len(numpy_t)} runs")


if __name__ == "__main__":
    main()
