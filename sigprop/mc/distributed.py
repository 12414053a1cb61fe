"""Independent Monte Carlo tasks (the trials of `sigprop check`, the accuracy floor's
configurations, the points of a component sweep) on a Dask cluster (``dask.distributed``, the
optional extra ``sigprop[dask]``).

Scheduling, placement and recovery are Dask's: every task is submitted as a future
(``Client.submit``) and collected in submission order.  A task that raises is retried
(``retries``); a task whose worker dies is rescheduled by the scheduler on another worker
(its ``allowed-failures`` setting, 3 by default).  Each task draws only from its own seed
(:func:`sigprop.mc.model.trial_seeds`, the floor's per-configuration seed, the sweep's
per-point seed), so the results do not depend on where, in which order or how many times a
task ran: they are those of the serial run.

The workers import sigprop: on a cluster of other machines it must be installed there (the
same version).  ``connect('local', n)`` starts a LocalCluster of ``n`` single-threaded worker
processes on this machine (BLAS limited to one thread each, so ``n`` workers use ``n`` cores;
glibc's allocator limited to one arena, see ``_PRE_SPAWN``).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Callable

from sigprop.errors import DomainError

#: task retries after an exception (a lost worker is handled by the scheduler besides)
RETRIES = 3
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: set in a local worker's environment before its process starts (glibc reads it only then).
#: A Dask worker runs its tasks in a thread of its own, and glibc gives such a thread its own
#: arena, whose freed pages go back to the kernel (and are faulted in again by the next
#: trial) whatever the trim threshold that sigprop.mc.model sets for the main heap; with one
#: arena the task thread shares the main heap and reuses its pages.  Measured on the floor
#: slice of benchmarks/backend_speed.py (2 workers against one process): 1.64-1.66x without,
#: 1.74x with (docs/benchmarks.md).  A cluster started elsewhere needs it in its workers'
#: environment (docs/guide.md, docs/benchmarks.md).
_PRE_SPAWN = {"MALLOC_ARENA_MAX": 1}


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise DomainError("--dask needs dask.distributed: pip install 'sigprop[dask]'") from None
    return distributed


class Distributor:
    """Runs lists of independent tasks on a Dask client."""

    def __init__(self, client, cluster=None, retries: int = RETRIES):
        self.client, self.cluster, self.retries = client, cluster, retries

    @property
    def n_workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def map(self, fn: Callable, args: list[tuple], *, progress: Callable[[int, int], None] | None = None,
            on_result: Callable[[int, object], None] | None = None, what: str = "tasks") -> list:
        """[fn(*a) for a in args], computed on the cluster; ``progress(done, total)`` and
        ``on_result(index, result)`` are called here as the futures complete."""
        distributed = _import_distributed()
        tag = uuid.uuid4().hex[:8]
        futures = [self.client.submit(fn, *a, key=f"sigprop-{what}-{tag}-{i}", pure=False, retries=self.retries)
                   for i, a in enumerate(args)]
        index = {f.key: i for i, f in enumerate(futures)}
        done = 0
        for fut in distributed.as_completed(futures):
            done += 1
            if on_result is not None:
                on_result(index[fut.key], fut.result())
            if progress is not None:
                progress(done, len(futures))
        return [f.result() for f in futures]

    def close(self):
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def connect(address: str, workers: int | None = None, timeout: float = 10.0) -> Distributor:
    """A :class:`Distributor` on the scheduler at ``address`` ('tcp://host:8786', ...), or on a
    new LocalCluster of ``workers`` processes (default: the CPU count) for ``address`` 'local'."""
    distributed = _import_distributed()
    if workers is not None and workers < 1:
        raise DomainError(f"--workers must be at least 1, got {workers}")
    if address == "local":
        import logging

        import dask

        n = workers or os.cpu_count() or 1
        with dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in _PRE_SPAWN.items()}):
            cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                               dashboard_address=None, silence_logs=logging.ERROR,
                                               env=dict(_ONE_THREAD))
        return Distributor(distributed.Client(cluster), cluster)
    if workers is not None:
        raise DomainError("--workers applies to --dask local only (an existing cluster has its own workers)")
    try:
        client = distributed.Client(address, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as e:
        raise DomainError(f"--dask {address}: cannot reach a Dask scheduler there ({type(e).__name__}: {e})") from None
    return Distributor(client)


def from_options(dask: str | None, workers: int | None) -> Distributor | None:
    """The distributor of the options --dask ADDRESS / --workers N (None when neither is given;
    --workers alone means a local cluster)."""
    if dask is None and workers is None:
        return None
    return connect(dask or "local", workers)


def stderr_progress(what: str, every_s: float = 0.0) -> Callable[[int, int], None]:
    """A progress callback that writes 'sigprop: WHAT done/total' lines to stderr."""
    last = [0.0]

    def tick(done: int, total: int):
        now = time.monotonic()
        if done == total or now - last[0] >= every_s:
            last[0] = now
            print(f"sigprop: {what} {done}/{total} done", file=sys.stderr, flush=True)
    return tick
