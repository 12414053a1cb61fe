"""The on-disk table store: a loaded table gives bit-identical predictions; a corrupt,
missing or disabled store falls back to building; edits to the rules invalidate keys."""

from __future__ import annotations

import numpy as np
import pytest

import os
import subprocess
import sys

from sigprop.model import presets, store, tables
from sigprop.model.predict import predict


def _fresh_predict(model):
    """Predict with an empty in-memory table cache (so tables come from the store or a build)."""
    return predict(model, tables=tables.TableCache())


def _values(points):
    return np.array([[p.log_var, p.corr, p.log_gvar, p.gcorr, p.logit_var or 0.0] for p in points])


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_loaded_tables_give_identical_predictions(cache_dir):
    model = presets.resolve("preln", n_layers=6, d_model=64, n_heads=2, d_ff=256, seq_len=16)
    built = _values(_fresh_predict(model))
    files = sorted(cache_dir.glob("*.tbl"))
    assert files, "building the tables should have stored them"
    stamps = [f.stat().st_mtime_ns for f in files]
    loaded = _values(_fresh_predict(model))
    assert [f.stat().st_mtime_ns for f in files] == stamps      # read, not rebuilt
    assert np.array_equal(built, loaded)


def test_disabled_store_gives_the_same_numbers(cache_dir, monkeypatch):
    model = presets.resolve("postln", n_layers=4, d_model=64, n_heads=2, d_ff=256, seq_len=16)
    with_store = _values(_fresh_predict(model))
    monkeypatch.setenv("SIGPROP_CACHE_DIR", "off")
    assert store.directory() is None
    assert np.array_equal(_values(_fresh_predict(model)), with_store)


def test_corrupt_entries_are_rebuilt(cache_dir):
    model = presets.resolve("preln", n_layers=4, d_model=64, n_heads=2, d_ff=256, seq_len=16)
    good = _values(_fresh_predict(model))
    for f in cache_dir.glob("*.tbl"):
        f.write_bytes(b"not a table")
    assert np.array_equal(_values(_fresh_predict(model)), good)
    for f in cache_dir.glob("*.tbl"):
        assert store.load(f.stem) is not None                      # rewritten


def test_unwritable_directory_is_harmless(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(blocker / "sub"))   # cannot be created
    model = presets.resolve("preln", n_layers=3, d_model=64, n_heads=2, d_ff=256, seq_len=16)
    assert np.all(np.isfinite(_values(_fresh_predict(model))))


def test_keys_depend_on_inputs_and_sources(monkeypatch):
    k = store.key("table", ("attention", 1.0), 0.0)
    assert k == store.key("table", ("attention", 1.0), 0.0)
    assert k != store.key("table", ("attention", 1.0 + 1e-15), 0.0)
    monkeypatch.setattr(store, "_digest", "another source tree")
    assert k != store.key("table", ("attention", 1.0), 0.0)


@pytest.mark.parametrize("rel", ["model/predict.py", "model/tables.py", "model/profile.py", "model/positions.py",
                                 "model/blocks.py", "model/spec.py", "rules/attention.py", "backend/numeric.py",
                                 "state.py", "solve/blocks.py"])
def test_changing_a_covered_file_changes_every_key(rel, monkeypatch):
    """The digest reads every covered file through store._read: one changed byte in any of
    them (the predictor's own table code included) gives new keys."""
    from pathlib import Path

    root = Path(store.__file__).resolve().parent.parent
    target = root / rel
    assert target in store.source_files()
    monkeypatch.setattr(store, "_digest", None)
    k = store.key("table", ("attention", 1.0), 0.0)
    real = store._read

    def edited(path):
        data = real(path)
        return data + b"\n# edited\n" if path == target else data

    monkeypatch.setattr(store, "_read", edited)
    monkeypatch.setattr(store, "_digest", None)
    assert store.key("table", ("attention", 1.0), 0.0) != k
    monkeypatch.setattr(store, "_read", real)
    monkeypatch.setattr(store, "_digest", None)
    assert store.key("table", ("attention", 1.0), 0.0) == k


def test_every_module_a_prediction_imports_is_covered(tmp_path):
    """Whatever sigprop module a prediction loads (bidirectional, causal exact and graded,
    LayerNorm Scaling, Post-LN) is in the store's digest, or named as unable to change a
    number (store._NOT_NUMERIC)."""
    code = ("import sys\n"
            "from sigprop.model import presets, predict as p\n"
            "small = dict(d_model=32, n_heads=2, d_ff=64)\n"
            "p.predict(presets.resolve('preln', n_layers=3, seq_len=8, **small))\n"
            "p.predict(presets.resolve('postln', n_layers=3, seq_len=8, causal=True, **small))\n"
            "p.predict(presets.resolve('lns', n_layers=3, seq_len=600, causal=True, **small))\n"
            "print('\\n'.join(m.__file__ for n, m in list(sys.modules.items())\n"
            "                 if n.split('.')[0] == 'sigprop' and getattr(m, '__file__', None)))\n")
    env = {**os.environ, "SIGPROP_CACHE_DIR": str(tmp_path), "SIGPROP_PROGRESS": "0"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    from pathlib import Path

    root = Path(store.__file__).resolve().parent.parent
    covered = set(store.source_files())
    loaded = {Path(f).resolve() for f in r.stdout.split()}
    assert Path(store.__file__).resolve() in loaded
    missing = [str(f.relative_to(root)) for f in loaded
               if f not in covered and str(f.relative_to(root)) not in store._NOT_NUMERIC]
    assert not missing, missing


# -- a stored table never changes an answer -------------------------------------------------

import os
import subprocess
import sys
import tempfile

from hypothesis import HealthCheck, example, given, settings, strategies as st

_SMALL = ["--d-model", "32", "--heads", "2", "--seq-len", "8"]


def _cli(args, cache):
    env = {**os.environ, "SIGPROP_CACHE_DIR": str(cache), "SIGPROP_PROGRESS": "0"}
    r = subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, env=env, timeout=300)
    return r.returncode, r.stdout, r.stderr


_INIT_STD = st.one_of(st.sampled_from([0.0, 1e-3, 0.02, 0.08, 0.1, 0.2, 0.5, 1.0]),
                      st.floats(0.0, 1.0, allow_nan=False))
_SCALE = st.sampled_from([None, 0.0, 1e-6, 0.5, 2.0, 1e6, 1e200])


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(command=st.sampled_from([["predict"], ["predict", "--json"], ["compare", "--arch", "preln,postln"]]),
       arch=st.sampled_from(["preln", "postln", "dslm", "deepnorm", "mixln"]),
       layers=st.integers(1, 3), init_std=_INIT_STD, branch=_SCALE, skip=_SCALE,
       causal=st.booleans())
# the init once answered exit 2 cold (out of the attention rule's domain) and exit 3 warm
@example(command=["predict", "--json"], arch="preln", layers=3, init_std=1.0, branch=None, skip=None, causal=False)
def test_every_command_twice_on_a_fresh_store_answers_the_same(command, arch, layers, init_std, branch, skip,
                                                                causal):
    """Run a command twice against one fresh store (the first run builds and stores its tables,
    the second loads them): the same exit code and byte-identical stdout and stderr, whatever
    the model (zero, tiny, ordinary and saturating inits; tiny and huge scales; and whether
    the command succeeds or refuses it)."""
    args = list(command) + _SMALL + ["--layers", str(layers), "--init", "normal", "--init-std", repr(init_std)]
    if command[0] == "predict":
        args += ["--arch", arch]
    if branch is not None:
        args += ["--branch-scale", repr(branch)]
    if skip is not None:
        args += ["--skip-scale", repr(skip)]
    if causal:
        args += ["--causal"]
    cache = tempfile.mkdtemp(prefix="sigprop-twice-")
    first = _cli(args, cache)
    second = _cli(args, cache)
    assert second == first, f"{args}: first run {first[0]}, second {second[0]}"
    assert b"Traceback" not in first[2]


def test_a_stored_failure_is_remembered_not_misread(cache_dir):
    """A table whose build fails (a costly-to-evaluate or out-of-domain range) is stored as
    a failure; loading it means direct evaluation, as after the failed build (it once read as
    a table of zero nodes and divided by zero)."""
    k = store.key("test", "failure")
    assert store.save(k, np.zeros(3))
    t = tables.Table(tables.Chain([("dropout", dict(p=0.1))]), {}, 0.0, 1.0, store_key=k)
    assert t.loaded and not t.ok
    assert not t.covers(tables.Forward(0.0, 1.0, 0.5))


def test_entries_are_sealed_to_their_key(cache_dir):
    a, b = store.key("test", "a"), store.key("test", "b")
    assert store.save(a, np.arange(5.0))
    assert np.array_equal(store.load(a), np.arange(5.0))
    store.path(a).rename(store.path(b))                 # another key's file: not b's entry
    assert store.load(b) is None
    assert not store.save(a, np.array([1.0, np.nan]))   # non-finite: never written
    assert store.load(a) is None
    assert not list(cache_dir.glob(".*.tmp"))             # no temporary file left behind


def test_a_tampered_table_is_rebuilt_not_used(cache_dir):
    """An entry with a valid seal but numbers that fail the build's own acceptance test (its
    interpolant against the stored midpoint evaluations) is rebuilt."""
    chain = tables.Chain([("dropout", dict(p=0.1)), ("residual", dict(a=2.0, b=0.0))])
    k = store.key("test", "tamper")
    built = tables.Table(chain, {}, 0.0, 1.0, store_key=k)
    assert built.ok and not built.loaded
    arr = store.load(k)
    # the entry: [ndim 1, n nodes, 7 rows, 0 extra blocks, node values (7 x n), ...]
    assert arr[0] == 1 and arr[2] == len(tables.ROWS)
    arr[4 + int(arr[1]) + 5] *= 1.5                     # one node value of the variance row
    assert store.save(k, arr)
    again = tables.Table(chain, {}, 0.0, 1.0, store_key=k)
    assert again.ok and not again.loaded                # rebuilt
    assert np.array_equal(again.vals, built.vals)


def test_costly_attention_is_evaluated_directly_unless_widely_shared():
    att = dict(d=64, n_heads=2, d_head=32, L=16, q_std=0.3, k_std=0.3, v_std=0.1, o_std=0.1, p=0.0, causal=0)
    ops = [("attention", att)]
    x = tables.Forward(0.0, 1.0, 0.3)
    assert tables.table_logit_var(ops, x) > tables.COSTLY_LOGIT_VAR
    assert not tables.worth_tabulating(ops, x, tables.COSTLY_USES - 1)
    assert tables.worth_tabulating(ops, x, tables.COSTLY_USES)
    cheap = [("attention", {**att, "q_std": 0.05, "k_std": 0.05})]
    assert tables.worth_tabulating(cheap, x, tables.BUILD_AFTER)
    assert not tables.worth_tabulating(cheap, x, tables.BUILD_AFTER - 1)


def test_predictions_in_one_process_do_not_depend_on_earlier_ones(monkeypatch):
    """Which layers an interpolation table serves is decided per prediction (a table cache per
    run): the same model predicted again, or after another model, gives the same bytes.  (With
    one cache for the whole process, the first DSLM prediction differed from the second by
    ~1e-8, and LNS's second from its third.)"""
    monkeypatch.setenv("SIGPROP_CACHE_DIR", "off")
    import sigprop

    small = dict(layers=24, d_model=64, heads=2, d_ff=128, seq_len=16)
    for arch in ("dslm", "lns"):
        runs = [sigprop.predict(arch=arch, **small).to_json() for _ in range(3)]
        assert runs[0] == runs[1] == runs[2], arch
    first = sigprop.predict(arch="preln", **small).to_json()
    sigprop.predict(arch="postln", **small)
    assert sigprop.predict(arch="preln", **small).to_json() == first
    # causal: the position profile's row tables are per prediction too (with a module-level
    # dict, a Pre-LN model's tables served a later Post-LN model: 3.8e-10 in log gradient var)
    causal = dict(d_model=256, heads=4, seq_len=64, causal=True)
    post = dict(arch="postln", layers=12, activation="gelu", dropout=0.1, **causal)
    alone = subprocess.run([sys.executable, "-c", f"import sigprop; print(sigprop.predict(**{post!r}).to_json())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    sigprop.predict(arch="preln", layers=24, **causal)
    assert sigprop.predict(**post).to_json() == alone
    # causal LayerNorm Scaling with its tables over the variance (the attention op's VarTable,
    # the profile's RowsVarTable), alone and after another causal model with the same widths
    code = ("import sigprop\nfrom sigprop.model import predict as p\np.VAR_TABLE_AFTER = 8\n"
            "if {first}:\n    sigprop.predict(arch='preln', layers=12, **{small!r})\n"
            "print(sigprop.predict(arch='lns', layers=12, **{small!r}).to_json())\n")
    small = dict(d_model=64, heads=2, d_ff=128, seq_len=16, causal=True)
    outs = [subprocess.run([sys.executable, "-c", code.format(first=first, small=small)], capture_output=True,
                           text=True, check=True, env={**os.environ, "SIGPROP_CACHE_DIR": "off"}).stdout
            for first in (False, True)]
    assert outs[0] == outs[1] and outs[0].strip()


# -- hostile or broken entries: never followed, blocked on or read whole -------------------

_M = ["--layers", "4", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "16"]


def _plant(kind: str, entry, other):
    """Put a ``kind`` of thing where the entry file ``entry`` was (``other``: another entry
    file of the store, a valid one)."""
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "symlink-dev-zero":
        entry.symlink_to("/dev/zero")
    elif kind == "symlink-entry":                   # to a regular, valid entry: refused too
        entry.symlink_to(other)
    elif kind == "directory":
        entry.mkdir()
    elif kind == "sparse-huge":                     # 1 TiB of holes, the store's magic first
        with open(entry, "wb") as f:
            f.write(store.MAGIC)
            f.truncate(1 << 40)
    elif kind == "header-overstates":               # claims a payload far beyond the file
        with open(entry, "wb") as f:
            f.write(store.MAGIC + (1 << 60).to_bytes(8, "little") + bytes(32) + bytes(80))
    else:
        raise AssertionError(kind)


_KINDS = ["fifo", "symlink-dev-zero", "symlink-entry", "directory", "sparse-huge", "header-overstates"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX file kinds")
@pytest.mark.parametrize("kind", _KINDS)
def test_an_entry_that_is_not_a_plain_entry_reads_as_absent(kind, cache_dir):
    """store.load on a FIFO (no writer: a blocking open would wait forever), a symlink to
    /dev/zero (endless), a symlink to a valid entry, a directory, a 1 TiB sparse file and a
    header claiming 2^60 numbers: None at once, reading no more than a header (run in a
    subprocess with a timeout, so a regression fails instead of hanging the suite)."""
    a, b = store.key("test", "a"), store.key("test", "b")
    assert store.save(a, np.arange(5.0)) and store.save(b, np.arange(3.0))
    _plant(kind, store.path(a), store.path(b))
    # (the peak resident set as /proc's VmHWM, which starts afresh with the new program: getrusage's
    # ru_maxrss survives exec, so the child of a large test worker reported the worker's 2.3 GB)
    code = ("import sys, time\nfrom sigprop.model import store\nt = time.perf_counter()\n"
            f"got = store.load({a!r})\n"
            "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
            "print(got is None, time.perf_counter() - t, hwm)\n")
    env = {**os.environ, "SIGPROP_CACHE_DIR": str(cache_dir)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    absent, seconds, rss_kb = r.stdout.split()
    assert absent == "True" and float(seconds) < 1.0 and int(rss_kb) < 500_000, r.stdout
    # and saving the key again replaces what is there with a regular entry (but a directory)
    assert store.save(a, np.arange(5.0)) == (kind != "directory")
    if kind != "directory":
        assert np.array_equal(store.load(a), np.arange(5.0))
    assert np.array_equal(store.load(b), np.arange(3.0))   # a symlink's target untouched


def test_an_entry_of_the_wrong_size_for_its_header_reads_as_absent(cache_dir):
    """The header's count must give the file's size exactly: one byte more, one fewer, or an
    entry over MAX_VALUES (a sparse file, written past the limit) read as absent; an entry at
    the limit is written and read."""
    k = store.key("test", "size")
    assert store.save(k, np.arange(4.0))
    p = store.path(k)
    good = p.read_bytes()
    for data in (good + b"\0", good[:-1]):
        p.write_bytes(data)
        assert store.load(k) is None
    p.write_bytes(good)
    assert np.array_equal(store.load(k), np.arange(4.0))
    assert not store.save(k, np.zeros(store.MAX_VALUES + 1))   # neither written ...
    big = store.MAX_VALUES + 1
    with open(p, "r+b") as f:                                  # ... nor read
        f.write(store.MAGIC + big.to_bytes(8, "little"))
        f.truncate(len(store.MAGIC) + 40 + 8 * big)
    assert store.load(k) is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX file kinds")
@pytest.mark.parametrize("kind", _KINDS)
def test_every_entry_broken_the_same_way_gives_the_same_answer(kind, tmp_path, monkeypatch):
    """`predict` with every stored entry replaced by a ``kind`` of bad entry: the answer,
    stderr and exit code byte-identical to the run that built the store, within a timeout
    (a FIFO once hung it forever, a symlink to /dev/zero or a huge file were read whole);
    and after it, every entry but a directory is a regular, valid file again."""
    cache = tmp_path / "store"
    first = _cli(["predict", *_M], cache)
    assert first[0] == 0
    entries = sorted(cache.glob("*.tbl"))
    assert entries
    spare = tmp_path / "valid-entry"
    spare.write_bytes(entries[0].read_bytes())
    for e in entries:
        _plant(kind, e, spare)
    env = {**os.environ, "SIGPROP_CACHE_DIR": str(cache), "SIGPROP_PROGRESS": "0"}
    r = subprocess.run([sys.executable, "-m", "sigprop", "predict", *_M], capture_output=True, env=env, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == first
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(cache))
    for e in entries:
        if kind == "directory":
            assert e.is_dir()
        else:
            assert e.is_file() and not e.is_symlink() and store.load(e.stem) is not None
