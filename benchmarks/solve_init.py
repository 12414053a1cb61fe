"""Benchmark: `sigprop solve-init` for 1,000 layers against `sigprop predict` of the same
(solved) model.  Goal: solving takes at most 3x as long as predicting.

Each figure is the median wall time of fresh processes (start-up and imports included, as a
user sees them), on the default DeepScaleLM figure model (d 1024, 16 heads, d_ff 4096,
seq 256):

* solve (library): ``sigprop.solve.solve("unit-forward", ..., verify=False)``: the solve alone;
* solve-init --no-verify (CLI): the command without its prediction of the solved model;
* solve-init (CLI): the command, which also predicts the solved model once for its verdict;
* predict (CLI): ``sigprop predict --spec`` on the solved model;
* ``sigprop solve-init`` as typed (unit-variance, 24 layers): one line, for reference.

Run: ``.venv/bin/python benchmarks/solve_init.py [--layers 1000] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _timing import median_wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    py = sys.executable
    n = a.layers
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "solved.json"
        lib = [py, "-c", "from sigprop.solve import solve; "
               f"solve('unit-forward', arch='preln', n_layers={n}, verify=False)"]
        cli = [py, "-m", "sigprop", "solve-init", "--target", "unit-forward", "--arch", "preln",
               "--layers", str(n), "--json", "-o", str(spec)]
        t_cli = median_wall(cli, a.repeats, ok=(0, 1))
        t_nov = median_wall(cli + ["--no-verify"], a.repeats, ok=(0, 1))
        t_lib = median_wall(lib, a.repeats, ok=(0, 1))
        t_pred = median_wall([py, "-m", "sigprop", "predict", "--spec", str(spec), "--json"], a.repeats, ok=(0, 1))
        t_typed = median_wall([py, "-m", "sigprop", "solve-init"], a.repeats, ok=(0,))
    print(f"solve-init benchmark, {n} layers, median of {a.repeats} fresh process(es):")
    print(f"  predict --spec (solved model)       {t_pred:8.1f} s")
    print(f"  solve (library, no verification)    {t_lib:8.1f} s   ratio {t_lib / t_pred:.3f}x")
    print(f"  solve-init --no-verify (CLI)        {t_nov:8.1f} s   ratio {t_nov / t_pred:.3f}x   (goal <= 3x)")
    print(f"  solve-init (CLI, with its predict)  {t_cli:8.1f} s   ratio {t_cli / t_pred:.3f}x")
    print(f"  solve-init as typed (unit-variance, 24 layers) {t_typed:8.1f} s")


if __name__ == "__main__":
    main()
