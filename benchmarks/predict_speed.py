"""Whole-process speed of `sigprop predict` (issue: whole-model prediction, item 7), as ratios
against baselines measured in the same run, medians of at least 5 repeats:

1. `sigprop predict --arch preln --layers 768 --json` vs `python -c "import numpy"`
   (goal: at most 2x);
2. 100,000 layers (`--every 1000`) vs 10 layers, both `sigprop predict --arch preln --json`
   (goal: at most 3x).

Every process starts cold: interpolation tables are built (and verified) inside each run.

    python benchmarks/predict_speed.py [--repeats 5] [--deep 100000]
"""

from __future__ import annotations

import argparse
import os
import sys

from _timing import median_wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--deep", type=int, default=100_000)
    a = ap.parse_args()
    py = sys.executable
    sp = [py, "-m", "sigprop", "predict", "--arch", "preln", "--json"]
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2-core machine; medians of {a.repeats})")
    base = median_wall([py, "-c", "import numpy"], a.repeats)
    t768 = median_wall(sp + ["--layers", "768"], a.repeats)
    print(f"python -c 'import numpy'          {base * 1000:8.0f} ms")
    print(f"predict --layers 768 --json        {t768 * 1000:8.0f} ms   ratio {t768 / base:.2f}x  (goal <= 2x)")
    t10 = median_wall(sp + ["--layers", "10"], a.repeats)
    tdeep = median_wall(sp + ["--layers", str(a.deep), "--every", "1000"], a.repeats)
    print(f"predict --layers 10 --json         {t10 * 1000:8.0f} ms")
    print(f"predict --layers {a.deep} --every 1000 {tdeep * 1000:8.0f} ms   ratio {tdeep / t10:.2f}x vs 10 layers  (goal <= 3x)")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
