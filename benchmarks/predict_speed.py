"""Whole-process speed of `sigprop predict` (issue: whole-model prediction, item 7), as ratios
against baselines measured in the same run, medians of at least 5 repeats:

1. `sigprop predict --arch preln --layers 768 --json` vs `python -c "import numpy"`
   (goal: at most 2x);
2. 100,000 layers (`--every 1000`) vs 10 layers, both `sigprop predict --arch preln --json`
   (goal: at most 3x).

Set-up, as a user's installed copy sees it:

* the package is byte-compiled first (`compileall`, as `pip install` does; this machine sets
  PYTHONDONTWRITEBYTECODE, so otherwise every run would compile ~35 modules from source);
* the interpolation-table store (sigprop.model.store) lives in a fresh temporary directory:
  one untimed run fills it, as a user's first run does; "cold" rows time runs with the store
  disabled (SIGPROP_CACHE_DIR=off: every table is built and verified inside the run).

The commands of one comparison are interleaved (a, b, a, b, ...) so that a change of machine
load hits both sides alike.

An editable install (``pip install -e .``, the development set-up) adds a site hook that runs in
*every* process, the baseline's included: it imports pathlib, urllib and more, ~15 ms here.
That flatters the first ratio (it adds the same milliseconds to both sides).  The script says
so when it sees one; ``--python`` times another interpreter, e.g. a plain install
(``python -m venv /tmp/v && /tmp/v/bin/pip install .``), on this working tree's code
(PYTHONPATH is set to the repository).

    python benchmarks/predict_speed.py [--repeats 5] [--deep 100000] [--skip-deep] [--python PY] [--llama]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--deep", type=int, default=100_000)
    ap.add_argument("--skip-deep", action="store_true")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to time")
    ap.add_argument("--llama", action="store_true",
                    help="also `predict --arch llama --layers 768 --json` (pre-RMSNorm, SwiGLU, RoPE, causal) "
                         "beside --arch preln")
    a = ap.parse_args()
    py = a.python
    # byte-compiled by the interpreter that is timed (as its `pip install` would)
    subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "sigprop")], check=True, stdout=subprocess.DEVNULL)
    sp = [py, "-m", "sigprop", "predict", "--arch", "preln", "--json"]
    base_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    warm = dict(base_env, SIGPROP_CACHE_DIR=tempfile.mkdtemp(prefix="sigprop-bench-"))
    cold = dict(base_env, SIGPROP_CACHE_DIR="off")
    probe = subprocess.run([py, "-c", "import sys; print(any('__editable__' in m for m in sys.modules))"],
                           capture_output=True, text=True, env=base_env)
    editable = probe.stdout.strip() == "True"
    print(f"interpreter: {py}" + ("  (an editable install's site hook runs in every process, the baseline's "
                                  "too: the first ratio is flattered; see --python)" if editable else ""))
    wall(sp + ["--layers", "10"], env=warm)                      # a user's first run fills the store
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2-core machine; medians of {a.repeats}, "
          f"interleaved)")
    base, t768, t768c = interleaved([([py, "-c", "import numpy"], warm), (sp + ["--layers", "768"], warm),
                                     (sp + ["--layers", "768"], cold)], a.repeats)
    print(f"python -c 'import numpy'             {base * 1000:8.0f} ms")
    print(f"predict --layers 768 --json          {t768 * 1000:8.0f} ms   ratio {t768 / base:.2f}x  (goal <= 2x)")
    print(f"  the same, store disabled (cold)    {t768c * 1000:8.0f} ms   ratio {t768c / base:.2f}x")
    if a.llama:
        ll = [py, "-m", "sigprop", "predict", "--arch", "llama", "--layers", "768", "--json"]
        wall(ll, env=warm)                                       # its tables into the store
        base2, tpre, tll = interleaved([([py, "-c", "import numpy"], warm), (sp + ["--layers", "768"], warm),
                                        (ll, warm)], a.repeats)
        print(f"python -c 'import numpy'             {base2 * 1000:8.0f} ms")
        print(f"predict --arch preln --layers 768    {tpre * 1000:8.0f} ms   ratio {tpre / base2:.2f}x")
        print(f"predict --arch llama --layers 768    {tll * 1000:8.0f} ms   ratio {tll / base2:.2f}x")
    if not a.skip_deep:
        deep = sp + ["--layers", str(a.deep), "--every", "1000"]
        t10, tdeep = interleaved([(sp + ["--layers", "10"], warm), (deep, warm)], a.repeats)
        print(f"predict --layers 10 --json           {t10 * 1000:8.0f} ms")
        print(f"predict --layers {a.deep} --every 1000 {tdeep * 1000:8.0f} ms   ratio {tdeep / t10:.2f}x "
              f"vs 10 layers  (goal <= 3x)")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
