"""Shared by the benchmark scripts: median wall time of fresh processes."""

from __future__ import annotations

import statistics
import subprocess
import time


def wall(cmd: list[str], ok: tuple[int, ...] | None = (0,), env: dict | None = None) -> float:
    """Wall seconds of one run of ``cmd``; exits with the command's stderr if its exit code is
    not in ``ok`` (``ok=None``: any exit code, the verdict is irrelevant)."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if ok is not None and r.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-300:]}")
    return dt


def median_wall(cmd: list[str], repeats: int, ok: tuple[int, ...] | None = (0,)) -> float:
    """Median wall seconds of ``repeats`` runs of ``cmd``."""
    return statistics.median(wall(cmd, ok) for _ in range(repeats))


def interleaved(cmds: list[tuple[list[str], dict]], repeats: int) -> list[float]:
    """Median wall seconds of each (command, environment), the commands run in turn
    ``repeats`` times (a change of machine load hits them alike)."""
    times = [[] for _ in cmds]
    for _ in range(repeats):
        for i, (c, env) in enumerate(cmds):
            times[i].append(wall(c, env=env))
    return [statistics.median(t) for t in times]
