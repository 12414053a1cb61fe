"""The console's ending when it is interrupted or its output cannot be written (sigprop.cli
._streams, docs/formats.md "Exit codes"): Ctrl-C ends the process by SIGINT with nothing on
stderr; a reader that goes away ends it by SIGPIPE, quietly; stdout that cannot be written
(a full disk, a closed descriptor) is one line on stderr and exit code 2.  Each test runs
`python -m sigprop` in a subprocess, as a shell would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

M = ["--layers", "4", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "16"]


def _env(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    return dict(os.environ, SIGPROP_CACHE_DIR=str(cache))


def _popen(tmp_path, *args, **kw):
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "sigprop", *args], env=_env(tmp_path), **kw)


def _wait_running(p, seconds: float) -> None:
    """Let the command get past its start-up (imports) into its work; it must still run."""
    time.sleep(seconds)
    assert p.poll() is None, "the command ended before it could be interrupted"


@pytest.mark.parametrize("args", [
    # the typer-free fast path of predict; llama's tables are built on a first run (empty
    # store): seconds of work to interrupt
    ["predict", "--arch", "llama", *M, "--json"],
    # a command that goes through typer
    ["compare", "--arch", "llama,preln", *M],
])
def test_ctrl_c_ends_the_process_by_sigint_quietly(tmp_path, args):
    """Was: `predict` printed a 32-141 line traceback (the other commands exited 130)."""
    p = _popen(tmp_path, *args)
    _wait_running(p, 2.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT, (p.returncode, err[-2000:])
    assert err == b"" and out == b""


def test_ctrl_c_during_start_up_is_quiet_too(tmp_path):
    """Interrupted while NumPy is imported (NumPy turns it into an ImportError) or typer builds
    the command: still the end by SIGINT, nothing on stderr."""
    for delay in (0.25, 0.4, 0.6):
        p = _popen(tmp_path, "solve-init", *M)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        if p.returncode == 0:        # finished first (a fast machine): nothing was interrupted
            continue
        assert p.returncode == -signal.SIGINT, (delay, p.returncode, err[-2000:])
        assert err == b"", (delay, err[-2000:])


@pytest.mark.parametrize("args", [["predict", *M, "--json"], ["predict", *M], ["rules"],
                                  ["predict", "--help"]])
def test_a_reader_that_goes_away_ends_the_process_by_sigpipe_quietly(tmp_path, args):
    """`sigprop predict --json | head -c 100`: was a BrokenPipeError traceback (the reader here
    closes its end before anything is written, so every write meets the broken pipe)."""
    r, w = os.pipe()
    os.close(r)
    p = _popen(tmp_path, *args, stdout=w)
    os.close(w)
    _, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGPIPE, (p.returncode, err[-2000:])
    assert err == b""


def test_a_reader_that_goes_away_midway_through_a_large_trace(tmp_path):
    """`head -c 100` of a trace of several MB (more than a pipe holds): the reader leaves while
    sigprop still writes."""
    p = _popen(tmp_path, "predict", "--layers", "3000", "--json", "--d-model", "64", "--heads", "2",
               "--seq-len", "8")
    first = p.stdout.read(100)
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=120)
    assert first.startswith(b'{"schema": "sigprop.trace/1"')
    assert p.returncode == -signal.SIGPIPE and err == b"", (p.returncode, err[-2000:])


def _one_line(err: bytes, command: str) -> str:
    lines = err.decode().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"sigprop {command}: error: cannot write to stdout: "), lines[0]
    return lines[0]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args,command", [(["predict", *M, "--json"], "predict"), (["predict", *M], "predict"),
                                          (["rules"], "rules")])
def test_stdout_on_a_full_disk_is_one_line_and_exit_2(tmp_path, args, command):
    """Was an OSError traceback (ENOSPC)."""
    with open("/dev/full", "w") as full:
        p = _popen(tmp_path, *args, stdout=full)
        _, err = p.communicate(timeout=120)
    assert p.returncode == 2, (p.returncode, err[-2000:])
    assert "No space left on device" in _one_line(err, command)


@pytest.mark.parametrize("args", [["predict", *M, "--json"], ["predict", *M]])
def test_stdout_closed_is_one_line_and_exit_2(tmp_path, args):
    """`sigprop predict >&-`: was an AttributeError traceback ('NoneType' has no 'flush')."""
    p = _popen(tmp_path, *args, stdout=None, preexec_fn=lambda: os.close(1))
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, (p.returncode, err[-2000:])
    _one_line(err, "predict")


def test_closed_stdout_is_not_reused_by_a_file_the_command_opens(tmp_path):
    """With stdout closed at start, the first file the process opens would get descriptor 1:
    the -o file of solve-init (its content must be the solution alone) while the report goes
    nowhere."""
    out = tmp_path / "sol.json"
    p = _popen(tmp_path, "solve-init", *M, "-o", str(out), stdout=None, preexec_fn=lambda: os.close(1))
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, (p.returncode, err[-2000:])
    _one_line(err, "solve-init")
    import json

    assert json.loads(out.read_text())["target"] == "unit-variance"


def test_stderr_closed_keeps_the_exit_code(tmp_path):
    """Bad input with stderr closed: the line is lost, the exit code stays 2, stdout empty."""
    p = _popen(tmp_path, "predict", "--layers", "0", stderr=None, preexec_fn=lambda: os.close(2))
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and out == b""
    p = _popen(tmp_path, "predict", *M, "--json", stderr=None, preexec_fn=lambda: os.close(2))
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and out.startswith(b'{"schema"')


def test_main_in_process_turns_ctrl_c_into_exit_130_without_notes(capsys, monkeypatch):
    """sigprop.cli.main (the in-process entry): a KeyboardInterrupt inside the typer-free
    predict path is SystemExit(130), as typer's own commands give, and the notes waiting for
    the end of the command are dropped."""
    from sigprop.cli import _predict, _report
    from tests._cli import cli

    def interrupted(**kw):
        _report.note("a note that must not appear")
        raise KeyboardInterrupt

    monkeypatch.setattr(_predict, "run", interrupted)
    code, out, err = cli(capsys, "predict", *M, "--json")
    assert (code, out, err) == (130, "", "")


def test_main_in_process_ctrl_c_in_a_typer_command(capsys, monkeypatch):
    """The same through typer (which ends a KeyboardInterrupt as exit code 130 itself): no
    notes, nothing on stderr."""
    import importlib

    from sigprop.cli import _report
    from tests._cli import cli

    def interrupted(models):
        _report.note("a note that must not appear")
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module("sigprop.compare"), "compare", interrupted)
    code, out, err = cli(capsys, "compare", "--arch", "preln,postln", *M)
    assert (code, out, err) == (130, "", "")
