"""The process entry (`python -m sigprop`, and the `sigprop` console script): the cyclic
garbage collector is paused before anything is imported, then :func:`sigprop.cli.console`.

Start-up imports NumPy and typer, which create tens of thousands of container objects; the
collector traversed them again and again while they were being made (~13 ms of a ~265 ms
`predict --layers 768 --json` run, medians of 7 interleaved runs, 254 against 267 ms).
:func:`sigprop.cli.main` turns it back on for every command but `predict`, whose passes make no
reference cycles (and pause it themselves when called as a library).

The commands that evaluate the rules (:data:`ONE_BLAS_THREAD`) run their BLAS on one thread
unless the environment already says how many (``OPENBLAS_NUM_THREADS``,
``MKL_NUM_THREADS``): their matrices are small to medium and come one after another, where
OpenBLAS's threads cost more than they bring on a shared machine, and their results then do
not depend on the machine's number of cores (docs/benchmarks.md, "BLAS threads").

glibc's allocator is tuned here too (:func:`keep_freed_memory`), for the commands whose
passes allocate and free the same large arrays again and again.  These are process-wide
settings, so they belong to the process entry alone: the library (``import sigprop``) leaves
the collector, the allocator and the environment as it found them."""

import gc
import os
import sys

#: the commands whose process runs BLAS on one thread (Monte Carlo commands keep the default)
ONE_BLAS_THREAD = frozenset({"predict", "solve-init", "compare", "export", "rules"})


def command(args: list[str]) -> str | None:
    """The command's name: the first argument that is not an option (None: none, e.g. ``-h``)."""
    return next((a for a in args if not a.startswith("-")), None)


def blas_threads(args: list[str]) -> None:
    """Before NumPy is imported: one BLAS thread for a command of :data:`ONE_BLAS_THREAD`
    (its name the first argument that is not an option), where the environment does not set
    the number."""
    if command(args) in ONE_BLAS_THREAD:
        for k in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(k, "1")


#: glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: the Monte Carlo commands: their trials allocate ~100 MB of fresh arrays each (the backward's
#: caches) and free them at the end; by default glibc hands that memory back to the kernel and
#: the next trial faults all of it in again (~25k faults, ~20% of a reference trial's CPU time)
SIMULATING = frozenset({"check", "plot", "measure", "check-component"})
#: the commands that run causal predictions, which allocate and free several position matrices
#: (0.3-2 MB) per operation, thousands per model: glibc serves them from the heap once its
#: dynamic mmap threshold has risen above their size, but gives the heap's top back to the
#: system whenever more than twice that is free (system time was ~1/3 of a 768-layer run at
#: seq 8192, 1.1 of 3.4 s CPU)
PREDICTING = frozenset({"predict", "compare", "solve-init"})


def keep_freed_memory(args: list[str]) -> bool:
    """Keep freed heap memory in the process for reuse (glibc only; elsewhere nothing happens;
    returns whether it applied).  For :data:`SIMULATING`: the mmap threshold fixed at glibc's
    own dynamic maximum (32 MiB, so arrays up to that size come from the heap) and a 1 GiB trim
    threshold; for :data:`PREDICTING`: a 4 MiB block is allocated and freed first (mapped on its
    own, never written, so none of its pages is faulted in; freeing it raises the dynamic mmap
    threshold to its size, above the position matrices'), then a 64 MiB trim threshold.  The
    process keeps at most its peak heap, which it needed anyway."""
    cmd = command(args)
    if cmd not in SIMULATING and cmd not in PREDICTING:
        return False
    try:
        import ctypes                                # (NumPy imports it anyway)

        libc = ctypes.CDLL(None)                     # the process's own symbols
        if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
            return False
        if cmd in SIMULATING:
            return bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)) & bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        libc.free(libc.malloc(4 << 20))
        return bool(libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20))
    except (OSError, AttributeError, TypeError):
        return False


def console() -> None:
    gc.disable()
    blas_threads(sys.argv[1:])
    keep_freed_memory(sys.argv[1:])
    try:
        if command(sys.argv[1:]) is not None:
            from sigprop.model import store

            store.use_default()      # the CLI keeps its tables on disk; the library only when asked
        from sigprop.cli import console as run
    except KeyboardInterrupt:       # Ctrl-C this early: end by SIGINT, as sigprop.cli.console does
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(130)
    run()


if __name__ == "__main__":
    console()
