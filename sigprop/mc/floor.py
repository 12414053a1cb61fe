"""Accuracy-floor matrix: `sigprop check` semantics
for every arch with its default init and with ``torch-default`` and ``normal``, at d_model 256,
4 heads, d_ff 1024, seq 128, depths 12/48/96, dropout 0 and 0.1, bidirectional and causal.

Each configuration's result is stored as JSON in ``--out DIR`` (resumable: done
configurations are skipped); ``--docs`` stores it in this checkout's docs/validation/floor/
(``layouts/``, ``modern/`` for those matrices), whose tables docs/validation.md shows.  Nothing
is written without one of the two.  ``--report`` assembles the markdown table from the stored
results (``--out DIR``, else the checkout's docs store) and the run notes beside them
(``NOTES.md`` in the same directory, written by hand from the results).

    python -m sigprop.mc.floor (--out DIR | --docs) [--depths 12,48,96] [--trials 8] [--batch 8] [--seed 0]
                               [--backend numpy|torch|cupy] [--device cpu|cuda] [--rng host|device]
                               [--dask ADDRESS|local] [--workers N]
    python -m sigprop.mc.floor --report      # the markdown section (docs/validation.md has it)

With ``--dask`` the trials of every configuration run on a Dask cluster's workers
(``local``: a LocalCluster of ``--workers`` processes here) and each configuration is judged
here as its last trial arrives; each trial depends on its seed alone, so the results are those
of the serial run.  With ``--raw`` whole configurations are the tasks instead, and the workers
read and write that directory: on a cluster of several machines it must be a shared file
system.

The measurements in ``--raw DIR`` are data, never code: NumPy ``.npz`` files of plain arrays
(:func:`save_measurement`), read with ``allow_pickle=False`` and checked field by field
(:func:`load_measurement`: a regular file, opened without waiting on a FIFO, of at most
``RAW_MAX_BYTES`` packed and unpacked), written to a temporary file and renamed into place.  Pickles
(``*.pkl``, the format before 2026-12-02) are not read: unpickling runs whatever the file
says, and DIR may be shared.  A configuration whose measurement is only a pickle is refused
before anything runs; ``--convert-pickles`` converts the pickles in DIR that you wrote
yourself, through an unpickler that admits only the measurement's own classes and NumPy's
arrays (anything else in the file is refused, not run), and leaves the ``.pkl`` in place.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from sigprop.mc.model import ModelMeasurement, logit_stats
from sigprop.mc.model import simulate as _simulate
from sigprop.mc.stats import Moments
from sigprop.model.checking import compare
from sigprop.model.predict import predict
from sigprop.model.presets import resolve

OUT = Path(__file__).resolve().parents[2] / "docs" / "validation" / "floor"
ARCHS = ["preln", "postln", "dslm", "dslm-post", "deepnorm", "lns", "mixln"]
DEFAULT_INIT = {"preln": "normal", "postln": "normal", "dslm": "dslm", "dslm-post": "dslm",
                "deepnorm": "deepnorm", "lns": "normal", "mixln": "normal"}
DIMS = dict(d_model=256, n_heads=4, d_ff=1024, seq_len=128)


def configs(depths, default_only=False, dropouts=(0.0, 0.1), causals=(False, True)):
    for arch in ARCHS:
        inits = []
        for init in (DEFAULT_INIT[arch], "torch-default", "normal"):
            if init not in inits:
                inits.append(init)
        if default_only:
            inits = inits[:1]
        for init in inits:
            for n in depths:
                for p in dropouts:
                    for causal in causals:
                        yield arch, init, n, p, causal


#: the block layouts' matrix (``--layouts``): Pre-LN's default init with every sublayer peri or
#: output, and parallel blocks, LayerNorm; results in docs/validation/layouts/
LAYOUTS = (("placement", "peri"), ("placement", "output"), ("block", "parallel"))
OUT_LAYOUTS = OUT.parent / "layouts"


def layout_configs(depths, dropouts=(0.0, 0.1), causals=(False, True)):
    for opt in LAYOUTS:
        for n in depths:
            for p in dropouts:
                for causal in causals:
                    yield "preln", "normal", n, p, causal, (opt,)


#: the modern blocks' matrix (``--modern``): the model presets, and LayerNorm Scaling and DSLM on
#: LLaMA blocks (pre-RMSNorm, SwiGLU, RoPE, final norm, no biases); the LLaMA rows with
#: grouped-query attention (n_heads / n_kv_heads = 4); each with its preset's init and with
#: torch-default; causal, and bidirectional for the encoders (bert, peri); results in
#: docs/validation/modern/
LLAMA_BLOCKS = (("norm", "rmsnorm"), ("ffn", "swiglu"), ("rope", True), ("final_norm", True), ("bias", False))
MODERN = (("llama", "normal", (("kv_heads", 1),), (True,)),
          ("gpt2", "scaled", (), (True,)),
          ("bert", "normal", (), (False,)),
          ("olmo2", "normal", (), (True,)),
          ("peri", "normal", (), (False, True)),
          ("lns", "normal", LLAMA_BLOCKS, (True,)),
          ("dslm", "dslm", LLAMA_BLOCKS, (True,)))
OUT_MODERN = OUT.parent / "modern"


def modern_configs(depths, dropouts=(0.0, 0.1), inits=None):
    for arch, init, options, causals in MODERN:
        for ini in (init, "torch-default"):
            if inits and ini not in inits:
                continue
            for n in depths:
                for p in dropouts:
                    for causal in causals:
                        yield arch, ini, n, p, causal, options


def name(arch, init, n, p, causal, options=()):
    tag = "".join(f"_{v}" if isinstance(v, str) else f"_{k}{v}" if not isinstance(v, bool)
                  else (f"_{k}" if v else f"_no-{k}") for k, v in options)
    if tuple(options) == LLAMA_BLOCKS:
        tag = "_llama-blocks"
    return f"{arch}{tag}_{init}_{n}_p{p:g}_{'causal' if causal else 'bidir'}"


class RawError(ValueError):
    """A stored measurement (``--raw``) that is not read: not this format, or a pickle."""


#: a stored measurement's file suffix (``--raw``) and the pickles' of before, which are refused
RAW_SUFFIX, PICKLE_SUFFIX = ".npz", ".pkl"
#: a stored measurement's format version (the ``format`` field of its .npz)
RAW_FORMAT = "sigprop.floor.raw/1"
_MOMENT_FIELDS = ("mean", "var", "cov", "mean_se", "var_se", "cov_se")
#: the most a stored measurement's file, and its arrays unpacked, may take (the floor's largest,
#: 32 draws of a 96-layer model, is under 1 MB)
RAW_MAX_BYTES = 1 << 30


def raw_path(raw: Path, arch, init, n, p, causal, trials, batch, seed, options=()) -> Path:
    """The measurement file of a configuration in ``raw`` (keyed by configuration, trials,
    batch and seed)."""
    return raw / f"{name(arch, init, n, p, causal, options)}_t{trials}_b{batch}_s{seed}{RAW_SUFFIX}"


def save_measurement(path: Path, meas: ModelMeasurement) -> None:
    """``meas`` as a NumPy .npz of plain arrays (no object arrays: :func:`load_measurement`
    reads it with allow_pickle=False), written to a temporary file in its directory and
    renamed into place, so a reader (another worker) never sees half a file."""
    import tempfile

    def moments(ms):
        return np.array([[getattr(m, f) for f in _MOMENT_FIELDS] for m in ms], dtype=np.float64).reshape(-1, 6)

    lv = meas.logit_var
    workers = -1 if meas.workers is None else meas.workers
    arrays = {
        "format": np.array(RAW_FORMAT),
        "forward": moments(meas.forward),
        "backward": moments(meas.backward),
        "logit_var": np.array([(np.nan, np.nan) if x is None else x for x in lv], dtype=np.float64).reshape(-1, 2),
        "logit_present": np.array([x is not None for x in lv], dtype=bool),
        "ints": np.array([meas.trials, meas.batch, meas.seed, workers], dtype=np.int64),
        "floats": np.array([meas.simulate_s, meas.gflop], dtype=np.float64),
        "strings": np.array([meas.dtype, meas.backend, meas.device, meas.rng], dtype=str),
    }
    if meas.logit_draws is not None:
        arrays["logit_draws"] = np.asarray(meas.logit_draws, dtype=np.float64)
    if meas.points is not None:
        arrays["point_layers"] = np.array([int(a) for a, _ in meas.points], dtype=np.int64)
        arrays["point_sublayers"] = np.array([str(b) for _, b in meas.points], dtype=str)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_measurement(path: Path) -> ModelMeasurement:
    """The measurement :func:`save_measurement` wrote to ``path``.  Read as data only
    (``allow_pickle=False``: an object array in the file is refused, never unpickled), every
    field checked for its dtype and shape; RawError otherwise."""
    import stat
    import zipfile

    def bad(why):
        return RawError(f"{path}: not a stored measurement ({why})")

    try:        # never blocked on a FIFO; a regular file whose arrays hold at most RAW_MAX_BYTES
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise bad(f"cannot open: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > RAW_MAX_BYTES:
        os.close(fd)
        raise bad(f"not a regular file of at most {RAW_MAX_BYTES >> 20} MiB")
    with os.fdopen(fd, "rb") as fh:
        try:
            z = np.load(fh, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise bad("not an .npz archive")
            with z:
                if sum(i.file_size for i in z.zip.infolist()) > RAW_MAX_BYTES:
                    raise bad(f"its arrays would take over {RAW_MAX_BYTES >> 20} MiB")
                got = {k: z[k] for k in z.files}
        except RawError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:   # not an .npz; a pickle
            raise bad(f"{type(e).__name__}: {e}") from None
    if got.get("format") is None or got["format"].shape != () or str(got["format"]) != RAW_FORMAT:
        raise bad(f"no format {RAW_FORMAT!r}")
    want = {"forward": ("f", 2, 6), "backward": ("f", 2, 6), "logit_var": ("f", 2, 2), "logit_present": ("b", 1, None),
            "ints": ("i", 1, None), "floats": ("f", 1, None), "strings": ("U", 1, None)}
    for k, (kind, ndim, last) in want.items():
        a = got.get(k)
        if a is None or a.dtype.kind != kind or a.ndim != ndim or (last is not None and a.shape[-1] != last):
            raise bad(f"field {k!r} missing or of another type")
    if got["ints"].shape != (4,) or got["floats"].shape != (2,) or got["strings"].shape != (4,) \
            or got["logit_present"].shape != got["logit_var"].shape[:1]:
        raise bad("fields of the wrong length")
    draws = got.get("logit_draws")
    if draws is not None and (draws.dtype.kind != "f" or draws.ndim != 3 or draws.shape[2] != 2):
        raise bad("field 'logit_draws' of another type or shape")
    points = None
    if "point_layers" in got or "point_sublayers" in got:
        la, sub = got.get("point_layers"), got.get("point_sublayers")
        if la is None or sub is None or la.dtype.kind != "i" or sub.dtype.kind != "U" or la.ndim != 1 \
                or la.shape != sub.shape:
            raise bad("fields 'point_layers' and 'point_sublayers' do not match")
        points = [(int(a), str(b)) for a, b in zip(la, sub)]
    trials, batch, seed, workers = (int(x) for x in got["ints"])
    dtype, backend, device, rng = (str(x) for x in got["strings"])
    return ModelMeasurement(
        forward=[Moments(*map(float, r)) for r in got["forward"]],
        backward=[Moments(*map(float, r)) for r in got["backward"]],
        logit_var=[(float(a), float(b)) if ok else None for (a, b), ok in zip(got["logit_var"], got["logit_present"])],
        trials=trials, batch=batch, seed=seed, dtype=dtype,
        simulate_s=float(got["floats"][0]), gflop=float(got["floats"][1]),
        logit_draws=draws, backend=backend, device=device, rng=rng,
        workers=None if workers < 0 else workers, points=points)


def _refuse_pickle(f: Path) -> RawError:
    return RawError(f"{f.with_suffix(PICKLE_SUFFIX)}: a pickled measurement, which is not read (unpickling runs "
                    f"whatever code the file holds, and the directory may be shared); if you wrote it, convert "
                    f"it with --raw {f.parent} --convert-pickles, else remove it")


def pending_pickles(raw: Path, cfgs, trials, batch, seed) -> list[Path]:
    """The configurations of ``cfgs`` whose measurement in ``raw`` is only a pickle."""
    out = []
    for c in cfgs:
        f = raw_path(raw, *c[:5], trials, batch, seed, *c[5:])
        if not f.exists() and f.with_suffix(PICKLE_SUFFIX).exists():
            out.append(f.with_suffix(PICKLE_SUFFIX))
    return out


#: what a pickled measurement may name (--convert-pickles): its own classes and what NumPy
#: arrays and scalars pickle through (and protocol 2's bytes, through a latin-1 encoder of its
#: own); anything else (os.system, builtins.eval, ...) is refused
_PICKLE_GLOBALS = frozenset({
    ("sigprop.mc.model", "ModelMeasurement"), ("sigprop.mc.stats", "Moments"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("copyreg", "_reconstructor"), ("builtins", "object"),
})


def convert_pickles(raw: Path, out=print) -> int:
    """Convert every ``*.pkl`` measurement in ``raw`` that has no ``.npz`` yet (the pickle is
    left in place).  Only for pickles you wrote: the unpickler admits just
    ``_PICKLE_GLOBALS`` (RawError on anything else, before it is called), which keeps a
    planted pickle from running code, but still reads the file's structure.  Returns the
    number converted."""
    import io
    import pickle

    def latin1(text, encoding):     # how protocol 2 pickles bytes: _codecs.encode(text, "latin1")
        if encoding != "latin1" or not isinstance(text, str):
            raise RawError(f"encodes with {encoding!r}, which a measurement does not")
        return text.encode("latin1")

    class Restricted(pickle.Unpickler):
        def find_class(self, module, cls):
            if (module, cls) == ("_codecs", "encode"):
                return latin1
            if (module, cls) not in _PICKLE_GLOBALS:
                raise RawError(f"refers to {module}.{cls}, which a measurement does not hold")
            return super().find_class(module, cls)

    n = 0
    for f in sorted(raw.glob(f"*{PICKLE_SUFFIX}")):
        dest = f.with_suffix(RAW_SUFFIX)
        if dest.exists():
            continue
        try:
            meas = Restricted(io.BytesIO(f.read_bytes())).load()
        except RawError as e:
            raise RawError(f"{f}: not converted: {e}") from None
        except Exception as e:          # noqa: BLE001 - a broken pickle is the file's fault
            raise RawError(f"{f}: not converted: {type(e).__name__}: {e}") from None
        if not isinstance(meas, ModelMeasurement):
            raise RawError(f"{f}: not converted: holds a {type(meas).__name__}, not a measurement")
        save_measurement(dest, meas)
        out(f"{f.name} -> {dest.name}")
        n += 1
    return n


def run_one(arch, init, n, p, causal, trials, batch, seed, raw: Path | None = None, simulate_only=False,
            backend: str = "numpy", device: str = "cpu", stream: str = "host", options=()):
    """Judge one configuration.  ``raw``: a directory of stored measurements
    (:func:`save_measurement`'s .npz files of :class:`sigprop.mc.model.ModelMeasurement`,
    keyed by configuration, trials, batch and seed: :func:`raw_path`): a stored one is
    reused instead of simulating again, a new one is stored, so a change of the rules can be
    re-judged against the same samples (a configuration stored only as a pickle: RawError).
    ``backend``, ``device``, ``stream``: where the simulation runs (:mod:`sigprop.mc.backend`).
    Depends on its arguments alone (what lets a Dask worker run it).  ``options``: further
    resolve() options as (name, value) pairs (the layouts' placement or block)."""
    from sigprop.mc.backend import get_backend

    bk = get_backend(backend, device)

    def simulate(model, **kw):
        return _simulate(model, backend=bk, stream=stream, **kw)

    model = resolve(arch, init, n_layers=n, dropout=p, causal=causal, **DIMS, **dict(options))
    meas = None
    if raw is not None:
        f = raw_path(raw, arch, init, n, p, causal, trials, batch, seed, options)
        if f.exists():
            meas = load_measurement(f)
        elif f.with_suffix(PICKLE_SUFFIX).exists():
            raise _refuse_pickle(f)
        else:
            meas = simulate(model, batch=batch, trials=trials, seed=seed)
            save_measurement(f, meas)
        if simulate_only:
            return None
    if meas is None:
        meas = simulate(model, batch=batch, trials=trials, seed=seed)
    return judge(model, meas, arch, init, n, p, causal, trials, batch, seed, options)


def judge(model, meas, arch, init, n, p, causal, trials, batch, seed, options=()) -> dict:
    """One configuration's result: the prediction of ``model`` against the measurement."""
    if getattr(meas, "logit_draws", None) is not None:
        meas.logit_var = logit_stats(meas.logit_draws)     # the current estimator
    pts = predict(model)
    res = compare(pts, meas)
    mv = np.array([f.var for f in meas.forward])
    mg = np.array([b.var for b in meas.backward])
    return {
        "arch": arch, "init": init, "n_layers": n, "dropout": p, "causal": causal,
        **({"options": dict(options)} if options else {}),
        "trials": trials, "batch": batch, "seed": seed, "pass": res.passed,
        "n_failures": len(res.failures), "failures": res.failures[:5],
        "errors": res.errors, "r2": res.r2,
        "fwd_change": float(mv.max() / mv.min()), "grad_change": float(mg.max() / mg.min()),
        "simulate_s": meas.simulate_s, "gflop": meas.gflop,
    }


def run_many(configs: list, trials: int, batch: int, seed: int, dist, on_result=None, progress=None,
             backend: str = "numpy", device: str = "cpu", stream: str = "host") -> list:
    """:func:`run_one` for every configuration ``(arch, init, n, p, causal[, options])``, with
    the trials of all of them as the tasks of the distributor ``dist`` (a configuration's
    trials spread over every worker, so unequal configurations do not leave workers idle) and
    each configuration judged here as soon as its last trial is in: the same results as
    :func:`run_one` (each trial depends on its seed alone; the pooling is the same).
    ``on_result(i, result)`` as configuration i is judged."""
    from sigprop.mc.backend import get_backend
    from sigprop.mc.model import _trial_task, check_supported, pooled, trial_tasks

    bk = get_backend(backend, device)
    models = [resolve(c[0], c[1], n_layers=c[2], dropout=c[3], causal=c[4], **DIMS, **dict(c[5] if len(c) > 5 else ()))
              for c in configs]
    for m in models:
        check_supported(m, bk)
    tasks, owner = [], []
    for i, m in enumerate(models):
        for t in trial_tasks(m, batch, seed, trials, backend=bk, stream=stream):
            tasks.append(t)
            owner.append(i)
    got = [[None] * trials for _ in configs]
    left = [trials] * len(configs)
    results: list = [None] * len(configs)
    t0 = time.perf_counter()

    def arrived(k, out):
        i = owner[k]
        got[i][k - i * trials] = out                   # configuration i's trials are tasks i*trials ..
        left[i] -= 1
        if left[i] == 0:
            c = configs[i]
            meas = pooled(models[i], got[i], batch=batch, seed=seed, backend=bk, stream=stream,
                          seconds=time.perf_counter() - t0, workers=dist.n_workers)
            results[i] = judge(models[i], meas, *c[:5], trials, batch, seed, c[5] if len(c) > 5 else ())
            if on_result is not None:
                on_result(i, results[i])

    dist.map(_trial_task, tasks, on_result=arrived, progress=progress, what="floor-trials")
    return results


#: what was run of a matrix and what its failures are: Markdown beside its stored results
#: (``<store>/NOTES.md``), written by hand from them (keep in step), appended to its table
NOTES_FILE = "NOTES.md"


def notes(store: Path) -> str:
    """The run notes stored beside a matrix's results (``<store>/NOTES.md``; "" without)."""
    f = store / NOTES_FILE
    return f.read_text(encoding="utf-8").rstrip("\n") if f.is_file() else ""


def _matrix_report(store: Path) -> str:
    """A matrix's table from its stored results, the pass count and its notes."""
    rows = [json.loads(f.read_text()) for f in sorted(store.glob("*.json"))]
    if not rows:
        return ""
    out = _table(rows)
    out += ["", f"{sum(r['pass'] for r in rows)} of {len(rows)} configurations pass."]
    text = notes(store)
    if text:
        out += ["", text]
    return "\n".join(out)


def modern_report(store: Path = OUT_MODERN) -> str:
    """The modern blocks' table (docs/validation.md)."""
    return _matrix_report(store)


def layouts_report(store: Path = OUT_LAYOUTS) -> str:
    """The block layouts' table (docs/validation.md)."""
    return _matrix_report(store)


#: independent, larger samples of the configurations that miss at 8 draws (see the floor's notes)
OUT_MORE = OUT.parent / "floor_more"


def report(store: Path = OUT, more: Path = OUT_MORE) -> str:
    rows = [json.loads(f.read_text()) for f in sorted(store.glob("*.json"))]
    if not rows:
        return ""
    out = _table(rows)
    n_pass = sum(r["pass"] for r in rows)
    bidir = [r for r in rows if not r["causal"]]
    out.append("")
    out.append(f"{n_pass} of {len(rows)} configurations pass ({sum(r['pass'] for r in bidir)} of "
               f"{len(bidir)} bidirectional, {n_pass - sum(r['pass'] for r in bidir)} of "
               f"{len(rows) - len(bidir)} causal).")
    extra = [json.loads(f.read_text()) for f in sorted(more.glob("*.json"))] if more.is_dir() else []
    if extra:
        out.append("")
        out.append("The configurations that fail or miss an R² floor above, measured again on independent, "
                   "larger samples (other seed, more weight draws; same pass rule, so the standard errors "
                   "are smaller):")
        out.append("")
        out += _table(extra)
    text = notes(store)
    if text:
        out += ["", text]
    return "\n".join(out)


def _options(r) -> str:
    opts = r.get("options", {})
    if tuple(opts.items()) == LLAMA_BLOCKS:
        return "LLaMA blocks"
    return ", ".join(f"{k} {v}" if not isinstance(v, bool) else (k if v else f"no {k}") for k, v in opts.items())


def _table(rows: list) -> list:
    order = {a: i for i, a in enumerate(ARCHS)}
    rows.sort(key=lambda r: (order.get(r["arch"], len(order)), _options(r), r["init"], r["n_layers"], r["dropout"],
                             r["causal"]))
    out = ["| arch | init | N | p | causal | pass | fwd var err max | grad var err max | corr err max | "
           "R² fwd (change) | R² grad (change) | trials x batch | seed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def r2(v, change):
        if change <= 2:
            return f"n/a ({change:.2f}x)"
        return f"{v:.4f} ({change:.3g}x)" if v is not None else "-"

    for r in rows:
        e = r["errors"]
        corr = max(e["forward_corr_abserr"]["max"], e["grad_corr_abserr"]["max"])
        arch = r["arch"] + (f" ({_options(r)})" if r.get("options") else "")
        out.append(
            f"| {arch} | {r['init']} | {r['n_layers']} | {r['dropout']:g} | {'yes' if r['causal'] else 'no'} | "
            f"{'pass' if r['pass'] else 'FAIL (%d)' % r['n_failures']} | {e['forward_var_relerr']['max']:.3f} | "
            f"{e['grad_var_relerr']['max']:.3f} | {corr:.3f} | {r2(r['r2']['forward_var'], r['fwd_change'])} | "
            f"{r2(r['r2']['grad_var'], r['grad_change'])} | {r['trials']}x{r['batch']} | {r['seed']} |")
    return out




def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="12,48,96")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma list of archs")
    ap.add_argument("--inits", default="", help="comma list of inits (default: every init of the grid)")
    ap.add_argument("--out", default=None, help="directory for the per-configuration JSONs")
    ap.add_argument("--docs", action="store_true",
                    help="store them in this checkout's docs/validation/floor (layouts, modern) instead")
    ap.add_argument("--default-init-only", action="store_true")
    ap.add_argument("--dropouts", default="0,0.1")
    ap.add_argument("--causal", default="0,1", help="comma list of 0/1")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--layouts", action="store_true",
                    help="the block layouts' matrix (peri, output, parallel; default depths 12,48) instead of the archs'")
    ap.add_argument("--modern", action="store_true",
                    help="the modern blocks' matrix (model presets, LNS and DSLM on LLaMA blocks) instead of the archs'")
    ap.add_argument("--raw", default=None, help="directory of stored measurements (reused; new ones stored)")
    ap.add_argument("--simulate-only", action="store_true", help="with --raw: only store measurements")
    ap.add_argument("--convert-pickles", action="store_true",
                    help="with --raw: convert the *.pkl measurements there (ones you wrote: they are unpickled, "
                         "admitting only a measurement's own classes) to .npz, then stop")
    ap.add_argument("--redo", action="store_true", help="judge configurations that already have a result")
    ap.add_argument("--backend", default="numpy", choices=["numpy", "torch", "cupy"], help="array library")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rng", default="host", choices=["host", "device"], help="random stream (sigprop.mc.backend.Rng)")
    ap.add_argument("--dask", default=None, help="run the configurations on a Dask cluster: scheduler address or 'local'")
    ap.add_argument("--workers", type=int, default=None, help="with --dask local (implied alone): worker processes")
    a = ap.parse_args()
    if a.out and a.docs:
        raise SystemExit("floor: --out and --docs name two stores; give one")
    out = Path(a.out) if a.out else (OUT_LAYOUTS if a.layouts else OUT_MODERN if a.modern else OUT)
    if a.convert_pickles:
        if not a.raw:
            raise SystemExit("floor: --convert-pickles needs --raw DIR")
        try:
            print(f"converted {convert_pickles(Path(a.raw))}")
        except (RawError, OSError) as e:
            raise SystemExit(f"floor: {e}")
        return
    if a.report:
        print(layouts_report(out) if a.layouts else modern_report(out) if a.modern else report(out))
        return
    if not (a.out or a.docs or a.simulate_only):
        raise SystemExit("floor: say where the results go: --out DIR, or --docs for this checkout's docs/validation/")
    if not a.simulate_only:
        out.mkdir(parents=True, exist_ok=True)
    depths = [int(x) for x in a.depths.split(",")]
    only = set(a.only.split(",")) if a.only else None
    inits = set(a.inits.split(",")) if a.inits else None
    causals = tuple(bool(int(x)) for x in a.causal.split(","))
    todo = []
    dropouts = tuple(float(x) for x in a.dropouts.split(","))
    if a.layouts and a.depths == "12,48,96":
        depths = [12, 48]
    grid = (layout_configs(depths, dropouts, causals) if a.layouts
            else modern_configs(depths, dropouts, inits) if a.modern
            else configs(depths, a.default_init_only, dropouts, causals))
    for cfg in grid:
        if (only and cfg[0] not in only) or (inits and cfg[1] not in inits):
            continue
        f = out / (name(*cfg) + ".json")
        if f.exists() and not (a.redo or a.simulate_only):
            continue
        todo.append(cfg)
    from sigprop.errors import DomainError
    from sigprop.mc.backend import get_backend

    try:
        get_backend(a.backend, a.device)
    except DomainError as e:
        raise SystemExit(f"floor: {e}")
    raw = Path(a.raw) if a.raw else None
    if raw is not None:             # before anything runs, not when a worker reaches it
        pickles = pending_pickles(raw, todo, a.trials, a.batch, a.seed)
        if pickles:
            more = f" (and {len(pickles) - 1} more configurations)" if len(pickles) > 1 else ""
            raise SystemExit(f"floor: {_refuse_pickle(pickles[0].with_suffix(RAW_SUFFIX))}{more}")
    extra = (a.backend, a.device, a.rng)
    t_start = time.perf_counter()

    def record(cfg, res, seconds):
        if res is None:
            print(f"{name(*cfg)}: stored {seconds:.0f}s", flush=True)
            return
        (out / (name(*cfg) + ".json")).write_text(json.dumps(res, indent=1))
        print(f"{name(*cfg)}: {'pass' if res['pass'] else 'FAIL'} R2 {res['r2']} {seconds:.0f}s", flush=True)
        for x in res["failures"][:2]:
            print("   ", x, flush=True)

    if a.dask is None and a.workers is None:
        for cfg in todo:
            t = time.perf_counter()
            try:
                res = run_one(*cfg[:5], a.trials, a.batch, a.seed, raw, a.simulate_only, *extra, *cfg[5:])
            except RawError as e:       # a stored measurement that is not one: one line, no traceback
                raise SystemExit(f"floor: {e}")
            record(cfg, res, time.perf_counter() - t)
        return
    from sigprop.mc.distributed import connect, stderr_progress
    from sigprop.mc.floor import run_one as task     # by module name, also under `python -m`

    try:
        dist = connect(a.dask or "local", a.workers)
    except DomainError as e:
        raise SystemExit(f"floor: {e}")
    with dist:
        if raw is None:     # every configuration's trials are the cluster's tasks (balanced)
            run_many(todo, a.trials, a.batch, a.seed, dist, progress=stderr_progress("trials"),
                     on_result=lambda i, res: record(todo[i], res, time.perf_counter() - t_start),
                     backend=a.backend, device=a.device, stream=a.rng)
            return
        dist.map(task, [(*cfg[:5], a.trials, a.batch, a.seed, raw, a.simulate_only, *extra, *cfg[5:]) for cfg in todo],
                 progress=stderr_progress("configurations"),
                 on_result=lambda i, res: record(todo[i], res, time.perf_counter() - t_start), what="floor")


if __name__ == "__main__":
    main()
