"""The command line in-process, as the console script runs it (for tests)."""

from __future__ import annotations

import sys


def cli(capsys, *args):
    """Run ``sigprop ARGS`` in this process; (exit code, stdout, stderr)."""
    from sigprop.cli import main

    old = sys.argv
    sys.argv = ["sigprop", *args]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err
