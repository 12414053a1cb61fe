"""The floor's stored measurements (``python -m sigprop.mc.floor --raw DIR``) are data: a
planted pickle is refused without running it, an .npz is read without pickle, a stored
measurement judges exactly as the simulated one."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sigprop.mc import floor

SMALL = dict(d_model=32, n_heads=2, d_ff=64, seq_len=8)
CFG = ("preln", "normal", 1, 0.0, False)          # trials 2, batch 1, seed 0 below


class _Plant:
    """Unpickling this writes ``path`` (what a planted pickle can do: anything)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "pwned"))


def _planted(tmp_path) -> tuple[bytes, Path]:
    marker = tmp_path / "marker"
    data = pickle.dumps(_Plant(marker))
    pickle.loads(data)                              # the pickle does what it says ...
    assert marker.exists()
    marker.unlink()                                 # ... so its absence below means it never ran
    return data, marker


def test_a_planted_pickle_is_refused_and_never_run(tmp_path):
    """`--raw DIR` with a pickle where a configuration's measurement would be: exit non-zero
    with one line naming the file and why, before simulating anything; the pickle's code
    (writing a marker file) never runs, nor under --convert-pickles (its restricted
    unpickler refuses the foreign global)."""
    data, marker = _planted(tmp_path)
    raw = tmp_path / "raw"
    raw.mkdir()
    pkl = floor.raw_path(raw, *CFG, 2, 1, 0).with_suffix(".pkl")
    pkl.write_bytes(data)
    args = [sys.executable, "-m", "sigprop.mc.floor", "--raw", str(raw), "--out", str(tmp_path / "out"),
            "--only", "preln", "--inits", "normal", "--depths", "1", "--dropouts", "0", "--causal", "0",
            "--trials", "2", "--batch", "1"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and not marker.exists()
    assert "Traceback" not in r.stderr and str(pkl) in r.stderr and "pickle" in r.stderr, r.stderr
    assert not list((tmp_path / "out").glob("*.json"))
    assert not list(raw.glob("*.npz"))              # nothing simulated, nothing stored
    r = subprocess.run(args[:5] + ["--convert-pickles"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and not marker.exists(), r.stdout + r.stderr
    assert "pathlib" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not list(raw.glob("*.npz"))
    with pytest.raises(floor.RawError):             # and from Python: run_one refuses too
        floor.run_one(*CFG, 2, 1, 0, raw)
    assert not marker.exists()


def test_an_npz_holding_a_pickle_is_refused(tmp_path):
    """An .npz whose array is an object array (a pickle inside the zip) is not unpickled."""
    data, marker = _planted(tmp_path)
    f = tmp_path / "m.npz"
    np.savez(f, format=np.array(floor.RAW_FORMAT), forward=np.array([_Plant(marker)], dtype=object))
    with pytest.raises(floor.RawError, match="not a stored measurement"):
        floor.load_measurement(f)
    assert not marker.exists()
    f.write_bytes(data)                             # a bare pickle named .npz
    with pytest.raises(floor.RawError, match="not a stored measurement"):
        floor.load_measurement(f)
    assert not marker.exists()


def test_a_stored_measurement_judges_as_the_simulated_one(tmp_path, monkeypatch):
    """run_one with --raw: the first run simulates and stores an .npz, the second loads it;
    both judge exactly as run_one without a store; the file reads with allow_pickle=False."""
    monkeypatch.setattr(floor, "DIMS", dict(SMALL))
    cfg = ("postln", "torch-default", 2, 0.1, True)
    want = floor.run_one(*cfg, 3, 2, 5)
    raw = tmp_path / "raw"
    first = floor.run_one(*cfg, 3, 2, 5, raw)
    f = floor.raw_path(raw, *cfg, 3, 2, 5)
    assert f.exists() and not list(raw.glob(".*.tmp"))
    stamp = f.stat().st_mtime_ns
    second = floor.run_one(*cfg, 3, 2, 5, raw)
    assert f.stat().st_mtime_ns == stamp            # loaded, not simulated again
    keep = ("pass", "n_failures", "failures", "errors", "r2", "fwd_change", "grad_change", "gflop")
    for res in (first, second):
        assert {k: res[k] for k in keep} == {k: want[k] for k in keep}
    with np.load(f, allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def test_load_round_trips_every_field(tmp_path, monkeypatch):
    from sigprop.mc.model import simulate
    from sigprop.model import resolve

    m = resolve("preln", n_layers=2, **SMALL)
    meas = simulate(m, batch=1, trials=2, seed=3)
    f = tmp_path / "m.npz"
    floor.save_measurement(f, meas)
    back = floor.load_measurement(f)
    for k in ("trials", "batch", "seed", "dtype", "simulate_s", "gflop", "backend", "device", "rng", "workers",
              "points", "forward", "backward"):
        assert getattr(back, k) == getattr(meas, k), k
    np.testing.assert_array_equal(back.logit_draws, meas.logit_draws)
    assert [x is None for x in back.logit_var] == [x is None for x in meas.logit_var]
    np.testing.assert_array_equal(np.array([x for x in back.logit_var if x is not None], dtype=float),
                                  np.array([x for x in meas.logit_var if x is not None], dtype=float))


def test_a_pickle_you_wrote_converts_only_when_asked(tmp_path, monkeypatch):
    """--convert-pickles turns a real measurement's pickle into the .npz it would have stored
    (the restricted unpickler admits its classes and NumPy's arrays), leaving the pickle."""
    from sigprop.mc.model import simulate
    from sigprop.model import resolve

    monkeypatch.setattr(floor, "DIMS", dict(SMALL))
    meas = simulate(resolve(*CFG[:2], n_layers=1, dropout=0.0, causal=False, **SMALL), batch=1, trials=2, seed=0)
    raw = tmp_path / "raw"
    raw.mkdir()
    npz = floor.raw_path(raw, *CFG, 2, 1, 0)
    for proto in (2, pickle.HIGHEST_PROTOCOL):
        for f in raw.iterdir():
            f.unlink()
        npz.with_suffix(".pkl").write_bytes(pickle.dumps(meas, protocol=proto))
        with pytest.raises(floor.RawError, match="convert-pickles"):
            floor.run_one(*CFG, 2, 1, 0, raw)
        assert floor.convert_pickles(raw, out=lambda s: None) == 1
        assert npz.with_suffix(".pkl").exists()
        back = floor.load_measurement(npz)
        assert back.forward == meas.forward and back.backward == meas.backward and back.points == meas.points
        assert floor.run_one(*CFG, 2, 1, 0, raw) == floor.judge(
            resolve(*CFG[:2], n_layers=1, dropout=0.0, causal=False, **SMALL), meas, *CFG, 2, 1, 0)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX file kinds")
def test_a_stored_measurement_that_is_not_a_small_regular_npz_is_refused_at_once(tmp_path):
    """A FIFO (no writer: a blocking open would wait forever), a directory, a .npy, a broken
    zip and a small archive whose arrays unpack past RAW_MAX_BYTES (2 MiB here): RawError, not a hang or
    a traceback of another kind (in a subprocess with a timeout, so a regression fails)."""
    import zipfile

    os.mkfifo(tmp_path / "fifo.npz")
    (tmp_path / "dir.npz").mkdir()
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "array.npy").rename(tmp_path / "array.npz")
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04" + bytes(100))
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("forward.npy", "w") as w:      # 3 MiB of zeros, 3 kB deflated, over the cap below
            w.write(bytes(3 << 20))
    names = ["fifo", "dir", "array", "broken", "bomb"]
    code = ("import sys\nfrom pathlib import Path\nfrom sigprop.mc import floor\nfloor.RAW_MAX_BYTES = 1 << 21\n"
            f"for n in {names!r}:\n"
            "    try:\n"
            f"        floor.load_measurement(Path({str(tmp_path)!r}) / (n + '.npz'))\n"
            "    except floor.RawError as e:\n"
            "        print(n, 'refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == names, r.stdout
    assert "would take over 2 MiB" in r.stdout.splitlines()[-1], r.stdout


def test_a_broken_stored_measurement_stops_the_floor_with_one_line(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    floor.raw_path(raw, *CFG, 2, 1, 0).write_bytes(b"not an archive")
    r = subprocess.run([sys.executable, "-m", "sigprop.mc.floor", "--raw", str(raw), "--out", str(tmp_path / "out"),
                        "--only", "preln", "--inits", "normal", "--depths", "1", "--dropouts", "0", "--causal", "0",
                        "--trials", "2", "--batch", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "not a stored measurement" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
