"""Monte Carlo tasks on a Dask cluster (sigprop.mc.distributed): a 2-worker LocalCluster gives
the serial run's measurements exactly, also when a worker dies in the middle of the run.

dask.distributed is a test extra: these tests skip without it, unless SIGPROP_REQUIRE_TORCH=1
(set by .ci/run with every optional test dependency), which turns the skip into a failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sigprop.model import resolve

DIMS = dict(d_model=32, n_heads=2, d_ff=64, seq_len=12)


def _need(module: str = "distributed"):
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("SIGPROP_REQUIRE_TORCH") == "1":
            pytest.fail(f"{module} is not installed but SIGPROP_REQUIRE_TORCH=1 (make test-deps installs it)")
        pytest.skip(f"{module} not installed")


_need_distributed = _need


@pytest.fixture(scope="module")
def dist():
    _need_distributed()
    from sigprop.mc.distributed import connect

    d = connect("local", 2)
    yield d
    d.close()


def _same(a, b):
    assert [(f.mean, f.var, f.cov) for f in a.forward] == [(f.mean, f.var, f.cov) for f in b.forward]
    assert [(f.var, f.cov) for f in a.backward] == [(f.var, f.cov) for f in b.backward]
    np.testing.assert_array_equal(a.logit_draws, b.logit_draws)


def test_trials_on_two_workers_equal_the_serial_run(dist):
    from sigprop.mc.model import simulate

    assert dist.n_workers == 2
    m = resolve("postln", n_layers=2, dropout=0.1, causal=True, **DIMS)
    ticks = []
    a = simulate(m, batch=2, trials=5, seed=7, distributor=dist, progress=lambda i, n: ticks.append((i, n)))
    b = simulate(m, batch=2, trials=5, seed=7)
    _same(a, b)
    assert ticks == [(i, 5) for i in range(1, 6)]


def test_floor_configurations_as_trial_tasks_equal_the_serial_run(dist, monkeypatch):
    """The floor on a cluster (every configuration's trials as tasks, judged as each
    configuration completes) gives run_one's serial results exactly."""
    from sigprop.mc import floor

    monkeypatch.setattr(floor, "DIMS", dict(DIMS))
    cfgs = [("preln", "torch-default", 2, 0.0, False), ("postln", "torch-default", 3, 0.1, True),
            ("preln", "normal", 2, 0.1, False, (("placement", "peri"),))]
    seen = []
    got = floor.run_many(cfgs, 3, 2, 5, dist, on_result=lambda i, r: seen.append(i))
    assert sorted(seen) == [0, 1, 2]
    for c, r in zip(cfgs, got):
        want = floor.run_one(*c[:5], 3, 2, 5, None, False, "numpy", "cpu", "host", c[5] if len(c) > 5 else ())
        for key in ("pass", "n_failures", "failures", "errors", "r2", "fwd_change", "grad_change", "gflop"):
            assert r[key] == want[key], key


def test_torch_trials_on_workers_equal_the_serial_run(dist):
    _need("torch")
    from sigprop.mc.backend import get_backend
    from sigprop.mc.model import simulate

    bk = get_backend("torch", "cpu")
    m = resolve("preln", n_layers=2, dropout=0.1, **DIMS)
    _same(simulate(m, batch=2, trials=3, seed=2, dtype=np.float64, backend=bk, distributor=dist),
          simulate(m, batch=2, trials=3, seed=2, dtype=np.float64, backend=bk))


def test_sweep_points_on_workers_equal_the_serial_run(dist):
    from sigprop import rules as R
    from sigprop.mc import components as C
    from sigprop.mc.sweep import run_sweep

    spec = C.SWEEPS["dropout"]
    grid = {**spec.grid, "d": (100,), "L": (100,)}
    a = run_sweep(spec, R.get("dropout"), n=4, seed=3, grid=grid, distributor=dist)
    b = run_sweep(spec, R.get("dropout"), n=4, seed=3, grid=grid)
    assert [r["measured"] for r in a.rows] == [r["measured"] for r in b.rows]
    assert a.percentiles == b.percentiles


def _die_once(marker, fn, *args):
    """Kill this worker process the first time any task runs (marker file absent)."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return fn(*args)
    os.close(fd)
    os._exit(1)


def test_a_worker_lost_mid_run_changes_nothing(dist, tmp_path):
    """A task kills its worker (the process exits); the scheduler gives the task to another
    worker (the nanny restarts the dead one) and the measurements are the serial run's."""
    import functools

    import cloudpickle

    from sigprop.mc.distributed import Distributor
    from sigprop.mc.model import simulate

    cloudpickle.register_pickle_by_value(sys.modules[__name__])    # workers cannot import tests/
    marker = str(tmp_path / "killed")

    class Killing(Distributor):
        def map(self, fn, args, **kw):
            return super().map(functools.partial(_die_once, marker, fn), args, **kw)

    m = resolve("preln", n_layers=2, dropout=0.1, **DIMS)
    got = simulate(m, batch=2, trials=4, seed=5, distributor=Killing(dist.client))
    assert Path(marker).exists()                                   # a worker did die
    _same(got, simulate(m, batch=2, trials=4, seed=5))


def test_cli_check_on_a_running_cluster_matches_serial(dist):
    address = dist.client.scheduler.address
    args = [sys.executable, "-m", "sigprop", "check", "--layers", "2", "--d-model", "32", "--heads", "2",
            "--d-ff", "64", "--seq-len", "12", "--trials", "3", "--batch", "2", "--json"]
    serial = subprocess.run(args, capture_output=True, text=True, timeout=300)
    on = subprocess.run(args + ["--dask", address], capture_output=True, text=True, timeout=300)
    assert serial.returncode == 0 and on.returncode == 0, (serial.stderr, on.stderr)
    assert json.loads(serial.stdout)["measured"] == json.loads(on.stdout)["measured"]
    assert "sigprop: trials 3/3 done" in on.stderr                    # progress on stderr
    assert "trials" not in serial.stderr


@pytest.mark.parametrize("extra", [["--workers", "0"], ["--dask", "tcp://127.0.0.1:1", "--workers", "2"]])
def test_bad_dask_options_exit_2(extra):
    _need_distributed()
    r = subprocess.run([sys.executable, "-m", "sigprop", "check", "--layers", "1", *extra],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr and r.stderr.strip(), r.stderr


def test_dask_on_one_configuration_of_check_component_exits_2():
    r = subprocess.run([sys.executable, "-m", "sigprop", "check-component", "relu", "-p", "d=8", "--workers", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and "--sweep" in r.stderr


def _worker_env(_):
    return os.environ.get("MALLOC_ARENA_MAX"), os.environ.get("OPENBLAS_NUM_THREADS")


def test_local_workers_start_with_one_malloc_arena_and_one_blas_thread(dist):
    # glibc reads MALLOC_ARENA_MAX only when the process starts: it must be in the worker's
    # environment from the start (Dask's pre-spawn environment), not set afterwards
    got = dist.map(_worker_env, [(i,) for i in range(4)])
    assert got == [("1", "1")] * 4
