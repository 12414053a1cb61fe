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
not depend on the machine's number of cores (docs/benchmarks.md, "BLAS threads")."""

import gc
import os
import sys

#: the commands whose process runs BLAS on one thread (Monte Carlo commands keep the default)
ONE_BLAS_THREAD = frozenset({"predict", "solve-init", "compare", "export", "rules"})


def blas_threads(args: list[str]) -> None:
    """Before NumPy is imported: one BLAS thread for a command of :data:`ONE_BLAS_THREAD`
    (its name the first argument that is not an option), where the environment does not set
    the number."""
    cmd = next((a for a in args if not a.startswith("-")), None)
    if cmd in ONE_BLAS_THREAD:
        for k in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(k, "1")


def console() -> None:
    gc.disable()
    blas_threads(sys.argv[1:])
    try:
        from sigprop.cli import console as run
    except KeyboardInterrupt:       # Ctrl-C this early: end by SIGINT, as sigprop.cli.console does
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(130)
    run()


if __name__ == "__main__":
    console()
