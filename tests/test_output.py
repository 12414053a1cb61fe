"""Output files (``-o`` of export, plot and solve-init) go through sigprop.output.replacing: a
temporary file beside the target, moved over it only when complete, so a failure keeps the old
content; a symbolic link at the target is replaced, not followed."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading

import pytest

from sigprop.output import replacing, write_text
from tests._cli import cli

M = ["--layers", "4", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "16"]
OLD = "old content\n"


def _left(tmp_path, keep=()):
    """Files in tmp_path besides ``keep`` (temporary files left behind)."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in keep)


def test_a_failure_midway_keeps_the_old_content_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text(OLD)
    with pytest.raises(OSError, match="No space"):
        with replacing(target) as f:
            f.write("half of the new")
            f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_text() == OLD
    assert _left(tmp_path) == ["out.txt"]
    write_text(target, "new\n")
    assert target.read_text() == "new\n" and _left(tmp_path) == ["out.txt"]


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text(OLD)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_text(link, "new\n")
    assert not link.is_symlink() and link.read_text() == "new\n"
    assert real.read_text() == OLD


def test_permissions_kept_or_from_the_umask(tmp_path):
    old = tmp_path / "old.txt"
    old.write_text(OLD)
    old.chmod(0o640)
    write_text(old, "new\n")
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    mask = os.umask(0o027)
    try:
        write_text(tmp_path / "new.txt", "new\n")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640


def test_a_target_that_is_not_a_regular_file_is_written_in_place(tmp_path):
    """A FIFO (as /dev/stdout or a terminal would be): written into, never replaced (the
    directory of /dev/stdout is not the user's to put a file in)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    write_text(fifo, "through the pipe\n")
    reader.join(10)
    assert got == ["through the pipe\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _left(tmp_path) == ["pipe"]


def test_an_unwritable_directory_is_one_error_line(capsys, tmp_path):
    code, out, err = cli(capsys, "solve-init", *M, "-o", str(tmp_path / "missing" / "sol.json"))
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "cannot write" in err, err


# ---------------------------------------------------------------------------------------
# each command's -o
# ---------------------------------------------------------------------------------------

def test_plot_failing_midway_keeps_the_old_figure(capsys, tmp_path, monkeypatch):
    """matplotlib writes part of the figure, then the disk is full: the old file stays (was: the
    partial figure in its place)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def savefig(self, fname, **kw):
        if isinstance(fname, (str, os.PathLike)):
            with open(fname, "wb") as f:
                f.write(b"<svg partial")
        else:
            fname.write(b"<svg partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", savefig)
    target = tmp_path / "fig.svg"
    target.write_text(OLD)
    code, out, err = cli(capsys, "plot", *M, "-o", str(target))
    assert code == 2 and out == "" and "No space left on device" in err and len(err.splitlines()) == 1, err
    assert target.read_text() == OLD and _left(tmp_path) == ["fig.svg"]


def test_plot_replaces_a_symlink(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    real = tmp_path / "real.svg"
    real.write_text(OLD)
    link = tmp_path / "fig.svg"
    link.symlink_to(real)
    code, out, err = cli(capsys, "plot", *M, "-o", str(link))
    assert code == 0, err
    assert real.read_text() == OLD and not link.is_symlink() and link.read_text().lstrip().startswith("<?xml")


def _limited(max_bytes: int):
    """In the child: files larger than ``max_bytes`` cannot be written (EFBIG; SIGXFSZ ignored)."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, resource.RLIM_INFINITY))
    return limit


@pytest.mark.parametrize("args,name", [
    (["solve-init", *M], "sol.json"),
    (["export", "latex", "--rule", "dropout"], "doc.tex"),
    pytest.param(["plot", *M], "fig.svg", marks=pytest.mark.skipif(
        __import__("importlib").util.find_spec("matplotlib") is None, reason="needs matplotlib")),
])
def test_a_file_size_limit_midway_keeps_the_old_content(tmp_path, args, name):
    """A real failure in the middle of the write (the file-size limit, as a full disk): exit 2
    with one line, the old content intact and no temporary file (was: a truncated file)."""
    target = tmp_path / name
    target.write_text(OLD)
    cache = tmp_path / "cache"
    cache.mkdir()
    r = subprocess.run([sys.executable, "-m", "sigprop", *args, "-o", str(target)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, SIGPROP_CACHE_DIR=str(cache)),
                       preexec_fn=_limited(100))
    assert r.returncode == 2, (r.returncode, r.stderr[-1000:])
    assert len(r.stderr.splitlines()) == 1 and "File too large" in r.stderr, r.stderr
    assert target.read_text() == OLD
    assert _left(tmp_path, keep={"cache"}) == [name]


def test_solve_init_writes_the_solution_through_a_symlinked_path_by_replacing_it(capsys, tmp_path):
    real = tmp_path / "real.json"
    real.write_text(OLD)
    link = tmp_path / "sol.json"
    link.symlink_to(real)
    code, out, err = cli(capsys, "solve-init", *M, "-o", str(link))
    assert code == 0, err
    assert real.read_text() == OLD and not link.is_symlink()
    assert json.loads(link.read_text())["target"] == "unit-variance"
