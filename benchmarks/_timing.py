"""Shared by the benchmark scripts: median wall time of fresh processes."""

from __future__ import annotations

import statistics
import subprocess
import time


def median_wall(cmd: list[str], repeats: int, ok: tuple[int, ...] | None = (0,)) -> float:
    """Median wall seconds of ``repeats`` runs of ``cmd``; exits with the command's stderr if
    its exit code is not in ``ok`` (``ok=None``: any exit code, the verdict is irrelevant)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if ok is not None and r.returncode not in ok:
            raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-300:]}")
    return statistics.median(times)
