"""The rule commands' one-BLAS-thread default (sigprop/__main__.py), measured: whole `sigprop
predict` processes with the default (one thread) against ``OPENBLAS_NUM_THREADS=N`` (N = the
machine's cores unless ``--threads``), interleaved, medians of ``--repeats``, the ratio of the
two in the same run.  The table store is the user's (warm it first: one untimed run of each
command is made).  ``--law`` adds `predict --arch llama --init xavier --json`, whose sampled
logit law makes large matrix products (tens of seconds a run).

    python benchmarks/blas_threads.py [--repeats 3] [--threads N] [--law]
"""

from __future__ import annotations

import argparse
import os
import sys

from _timing import interleaved, wall

COMMANDS = {
    "predict --layers 768 --json": ["predict", "--layers", "768", "--json"],
    "predict --arch llama --json": ["predict", "--arch", "llama", "--json"],
}
LAW = {"predict --arch llama --init xavier --json": ["predict", "--arch", "llama", "--init", "xavier", "--json"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--law", action="store_true")
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    many = {**base, "OPENBLAS_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; medians of {a.repeats} interleaved runs")
    for label, args in {**COMMANDS, **(LAW if a.law else {})}.items():
        cmd = [sys.executable, "-m", "sigprop", *args]
        wall(cmd, env=base)                                    # untimed: the store
        one, more = interleaved([(cmd, base), (cmd, many)], a.repeats)
        print(f"  {label:45s} one thread {one:7.3f} s   {a.threads} threads {more:7.3f} s   "
              f"one / {a.threads}: {one / more:.2f}")


if __name__ == "__main__":
    main()
