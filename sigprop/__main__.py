"""The process entry (`python -m sigprop`, and the `sigprop` console script): the cyclic
garbage collector is paused before anything is imported, then :func:`sigprop.cli.console`.

Start-up imports NumPy and typer, which create tens of thousands of container objects; the
collector traversed them again and again while they were being made (~13 ms of a ~265 ms
`predict --layers 768 --json` run, medians of 7 interleaved runs, 254 against 267 ms).
:func:`sigprop.cli.main` turns it back on for every command but `predict`, whose passes make no
reference cycles (and pause it themselves when called as a library)."""

import gc


def console() -> None:
    gc.disable()
    from sigprop.cli import console as run

    run()


if __name__ == "__main__":
    console()
