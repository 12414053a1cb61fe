"""Accuracy-floor matrix: `sigprop check` semantics
for every arch with its default init and with ``torch-default`` and ``normal``, at d_model 256,
4 heads, d_ff 1024, seq 128, depths 12/48/96, dropout 0 and 0.1, bidirectional and causal.

Each configuration's result is stored as JSON under docs/validation/floor/ (resumable: done
configurations are skipped), and ``--report`` assembles the markdown table.

    python -m sigprop.mc.floor [--depths 12,48,96] [--trials 8] [--batch 8] [--seed 0]
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


def _matrix_report(store: Path, notes: str = "") -> str:
    """A matrix's table from its stored results, the pass count and ``notes``."""
    rows = [json.loads(f.read_text()) for f in sorted(store.glob("*.json"))]
    if not rows:
        return ""
    out = _table(rows)
    out += ["", f"{sum(r['pass'] for r in rows)} of {len(rows)} configurations pass."]
    if notes:
        out += ["", notes]
    return "\n".join(out)


def modern_report(store: Path = OUT_MODERN) -> str:
    """The modern blocks' table (docs/validation.md)."""
    return _matrix_report(store, MODERN_NOTES)


def layouts_report(store: Path = OUT_LAYOUTS) -> str:
    """The block layouts' table (docs/validation.md)."""
    return _matrix_report(store, LAYOUT_NOTES)


#: what was run of the modern matrix (written from the stored results; keep in step)
MODERN_NOTES = """Run 2026-11-25 on 2 shared cores, seed 0: each preset's own init at 12, 48 and 96 layers
and torch-default at 12 and 48 layers, 8 weight draws x batch 4; then (later the same day) the
96-layer rows the matrix lacked: DSLM's own init, and torch-default for `llama`, `gpt2`,
`bert`, `peri`, `lns` and `dslm`, 8 draws x batch 8 (the script's default; the table's last column
says each row's draws), and torch-default `olmo2` at 8 x 4. After the QK-norm backward's
inverse chi-square factor (2026-11-25) the ten earlier `olmo2` rows (12 and 48 layers, and 96
layers own init) were re-simulated on the same seed-0 draws (8 x 4) and re-judged: every 12-
and 48-layer row passes, and so do the two new torch-default 96-layer rows. `olmo2` own init 96 layers, dropout 0.1, now fails at one point, the
gradient entering layer 1's attention predicted 10.54 against 8.41 +- 0.44 (25% high, 4.9 SE,
where the gradient has grown ~10^4-fold from the top); the rules of the day before give 10.46
on the same draws and fail too (re-judged with that tree), so the row's earlier pass came from
an older revision of the rules and it was not re-judged since. The other failures are
`gpt2` `scaled` at 96 and 48 layers, dropout 0, on seed 0's sample alone (both pass on six
samples pooled, the table's rows; below), and `olmo2` own init at 96 layers, dropout 0 (the
gradient 11% low at layer 16's FFN, 0.0393
against 0.0443 +- 0.0012), which passes since the per-key attention weights, when `olmo2` own
init at 48 layers, dropout 0.1, fails instead (the last paragraphs). Before the
branch-output norm's per-token correction (below), `olmo2` torch-default, 48 layers, dropout
0.1, causal, failed: the gradient
9-10% low around layers 6-7 (0.139 against 0.151 +- 0.003), where it has grown ~10^5-fold
from the top, which is the `olmo2` failure below again:
- `gpt2`, dropout 0, causal: a small systematic error of the gradient, most of it now carried,
  plus an unfavourable sample. The gradient's per-token covariance with the stream's per-token
  variance: below the final norm a token's gradient scales as 1/s_t of the top stream, every
  pre-norm branch's gradient as 1/s_t of its input, and a token's per-token variance persists
  up the stack (each branch adds a part independent of it), so the gradient reaching a pre-norm
  is larger on the tokens whose variance is small, and E[|g_t|^2 / s_t] exceeds E|g_t|^2
  E[1/s_t] by -lambda 2/(d-1), lambda the regression slope of the one on the other (the norm
  rules' g_slope / g_slope_rms; sigprop.rules.layernorm.token_slope_below carries it down a
  pre-norm unit: lambda x skip share at the norm, minus the branch gradient's share below the
  unit). The predictor carries it (GradState.slope) from the final norm down the plain pre-norm
  units into the FFN norms; the attention's norms take 0 (its value path mixes the tokens'
  gradients). It raises the 48-layer input gradient's prediction by 1.3% (1312.5 to 1329.6).
  Seed 0's 48-layer sample (8 x 4) has the input gradient 1440.5 +- 32, 8.3% above it: its
  draws lie 0-20% above (six of eight above 7%), and the 96-layer sample, whose first 48 layers
  draw the same normal numbers at another output scale, repeats it; re-judged on those stored
  draws the 48-layer row goes from 36 failing points to 11 (largest gradient error 8.9% to
  7.7%, R^2 of the gradient 0.9891 to 0.9906), the 96-layer row's largest gradient error from
  8.5% to 7.4% (R^2 0.9906 to 0.9921; its one failing point, the forward variance at layer 47,
  0.00449 against 0.00428 +- 0.00003, is unchanged). Six independent samples of the 48-layer
  model (seeds 0-5, 8 x 4 each): seeds 1, 2, 3 and 5 pass, 0 and 4 fail (11 and 5 points;
  without the slope 36 and 8), and pooled (48 draws, the table's row) the model passes:
  gradient error at most 3.1% (4.3% without the slope), R^2 0.9990 (0.9984). The 96-layer
  model on the same six seeds (8 x 4 each; the table's row is the six pooled, 48 draws): seeds
  1-5 pass alone (forward variance error at most 1.1-2.9%), and pooled it passes, forward
  variance error at most 1.1%, gradient 1.9%, R^2 0.9999 forward and 0.9996 gradient. Seed 0's
  failing point is its sample's: at layer 47's attention the prediction is 5.0% above seed 0's
  mean and -1.5% to +2.7% off seeds 1-5's (per-draw SD 3.4%, so 1.2% for 8 draws), seed 0
  being the sample whose draws also put the 48-layer model's top 4.5% under the prediction
  (the first 48 layers draw the same normal numbers); pooled, the prediction is 1.0% +- 0.5%
  high there and 0.4% +- 0.55% high at the top (the 48-layer model: 1.05% +- 0.57% at its top,
  on the same seeds, so not an independent sample). What is left is the forward variance.
  Pooled, the gradient is predicted low by 3.1% +- 1.0% at the input and
  1.2% +- 0.55% below the final norm, and the forward variance high by 1.05% +- 0.57% at the
  top (the correlation 0.009 +- 0.007): the gradient below a norm scales as 1/var, so the top's
  variance error is the final norm's gradient error, and the errors of the stream's variance
  entering each unit (+0.1-0.4% in the first 18 layers, +0.4-1.2% above), weighted by the
  branch's share of each unit's gradient growth, account for another 0.8%: 2.0 of the 3.1
  points, the remaining 1.1 within one SE. The variance error appears with the longer causal
  sequence: the model at d_model 64 with the gains held (init_std 0.04, embedding variance
  5e-4, d_ff 256, 48 layers, float64, seeds 0-3 x 16 x 4) has the top variance 1.7% +- 0.6%
  high with 4 heads and 128 tokens (input gradient 3.2% +- 1.6% low, 8.3% without the slope)
  and 1.0% +- 1.0% low with 2 heads and 32 tokens (input gradient 1.4% +- 2.8% low, 6.6%
  without): the causal forward model of the stream (the attention's averaging over positions),
  not the norms' backward. (Measured before the slope was carried: the bias needs the small
  embedding, the same model on an input variance of 1 being 0.3% +- 0.2% low, shrinks with
  dropout 0.1 and grows roughly as 1/d.) Two smaller O(1/d) terms were located in direct
  simulations and are not carried: (1) a branch output's per-token variance spread. A value
  path W_o V of a normalised input has kappa 2.0 (2/(d-1) units; measured 2.00 at d 64, 2.02 at
  256: a product of two Gaussian matrices), a GeLU FFN 1.3-1.6 (1.34 at d 64, 1.55 at 256, N(0,
  0.02)); the predictor mixes a plain branch's output into the stream's per-token statistics as
  Gaussian (kappa 1). It matters where one branch output makes up the stream: a pre-LN stack at
  d_model 32 (6 layers, 8 tokens, bidirectional, init_std 0.1, input variance 1e-3, final norm,
  512 x 4 draws) has the gradient 15.4% +- 1.6% low below layer 1's FFN and 10.7% +- 2.1% low
  at the input, 7.3% and 2.3% with kappa 2 and 1.4 for the attention and FFN outputs; in `gpt2`
  at d_model 256 the embedding and many branches make up the stream (kappa near 1) and it moves
  the input gradient by 0.07%. (2) The attention's input norm: the gradient reaching token s's
  value mixes later tokens' gradients, whose per-token variances correlate with token s's by
  r^2 (r the token correlation), so its slope is about lambda (w + (1 - w) r^2), w the own
  token's share (uniform causal weights: sum 1/(s+1)^2 / H_L); +0.17% on the 48-layer input
  gradient (+0.4% with w = 1), not resolved by the d_model 64 samples (SE 1.6-2.8%).
- `bert` torch-default, 12 layers, dropout 0, bidirectional: passes `check`, but seed 0's
  sample (8 x 4) had the gradient's R^2 at 0.9869, under the 0.99 floor (the gradient changes
  2.8x over depth; largest error 5.3%). Five more independent samples (seeds 1-5, 8 x 4 each)
  give 0.9996, 0.9983, 0.9994, 0.9975 and 0.9990, and the six pooled (48 draws, the table's
  row) 0.9993 with the largest gradient error 1.3%: seed 0's value was its sample's.
- `olmo2`, dropout 0, causal: the gradient, which grows 10^6-fold from the top to the tiny
  embedding stream, is up to 15% off at some points (R^2 0.9976 at 48 layers, 0.9959 at 96).
Before the position-wise pair covariance was taken at each pair's own correlation (2026-11-25),
`olmo2` at 12 layers failed on the token correlation (error 0.058); it passes now.
Re-run after the branch-output norm's per-token correction (the backward of a norm on a
branch output divides by each token's rms, whose spread over tokens the hidden units' tails
set; 2026-11-25), those four configurations only, the rest not re-run: `olmo2` own init, 48
layers, dropout 0, causal, and `olmo2` torch-default, 48 layers, dropout 0.1, causal, now pass
(R^2 of the gradient 0.9985 and 0.9997); `olmo2` own init at 96 layers still fails (the
gradient 12% low at layers 14-15, 0.0424 against 0.0480 +- 0.0014; R^2 0.9974), and `gpt2` at
48 layers (no branch-output norm) is unchanged, as expected.
What is left in `olmo2` (measured 2026-11-25; `benchmarks/causal_key_weights.py --arch olmo2
--placement preset --layers 96`, 4 draws x batch 4, seed 0): the mechanism of the `output`
placement's causal failures (Block layouts, above), weaker per layer. QK-norm keeps the logits
near unit variance, but the branches make up the stream from the first layer on (the
embedding's is tiny) and the first positions mix with few others, so position 0 stays far
less correlated with the rest (0.28-0.31 against a mean over pairs of 0.79-0.81 at layers
13-85), and the rows 64..127 attend to key 0 1.16-1.45 times its uniform weight at every
depth (1.35 +- 0.17 at layer 13, 1.45 +- 0.11 at layer 37, 1.43 +- 0.13 at layer 85; keys
1-3 0.9-1.5), where the
attention rule and the causal position model take every key's weight as uniform; over 96
layers, on a gradient that grows 10^6-fold towards the input, that is the likely cause of the
gradient predicted 12% low at layers 14-16. A smaller reproduction (d 128, 2 heads, d_ff 512,
seq 64, 96 layers, float64, 8 draws x batch 4, seed 0) does not fail but shows the same
shape: the gradient within 1% from the top down to layer 28 and 3-7% low at layers 8-16
(1.3-1.5 standard errors), where position 0's share of it is under-predicted (6.8 against 7.6
after layer 16, 12.3 against 13.7 after layer 8).
Per-key attention weights (docs/design.md, "Per-key weights"; 2026-11-25): the four `olmo2` own-init
rows at 48 and 96 layers were re-judged on their stored draws (8 x 4, seed 0). 96 layers, dropout
0: from FAIL (8 points; gradient error max 0.170, R^2 0.9974) to pass (0.138, 0.9980). 48 layers,
dropout 0: pass to pass (0.111 -> 0.145; R^2 0.9986 -> 0.9989). 48 layers, dropout 0.1: from pass
(0.180) to FAIL at one point, layer 1's attention gradient 7.63 against 6.09 +- 0.31 (0.254);
96 layers, dropout 0.1: FAIL at the same point, 10.54 -> 11.22 against 8.41 +- 0.44 (0.254 ->
0.335). What moved (48 layers, dropout 0.1): predicted over measured 0.97 at layers 3-18 before,
0.98-1.01 after (1.04 at layer 2's attention), and the two sublayers of layer 1,
which over-predicted the gradient's growth before (the FFN step by 6%, the attention step by
11%, with the tree before the change: 7.19 against 6.09 at layer 1's attention), are no longer
offset by the deficit above them. That layer-1 excess, on a stream that is still the tiny
embedding under the branch-output norms, is not from the key weights (layer 1's input has no
position structure: its weights are 1).
After the predictor began carrying the gradient's per-token slope (2026-11-25; it changes the
gradient of pre-norm models with a final norm or pre-norm branches: `gpt2`, `llama`, `lns` and
`dslm` here, not `bert`, `peri` or `olmo2`), these rows were re-judged: every `gpt2` row (12
and 48 layers and `scaled` 96 layers dropout 0.1 re-simulated on the same seed-0 draws, the
other 96-layer rows on the stored draws; `scaled` 48 layers dropout 0 on the six stored seeds
pooled), and the 96-layer torch-default rows of `llama`, `lns` and `dslm` and DSLM's own
96-layer rows on their stored draws. Every one passes as before; the largest moves are `gpt2`
`scaled` dropout 0.1 at 48 and 96 layers (largest gradient error 0.018 to 0.033 and 0.018 to
0.031, R^2 0.9999 to 0.9997 and 0.9995 to 0.9990, within what 8 draws resolve) and DSLM's own
init at 96 layers (dropout 0: 0.027 to 0.013, R^2 0.9832 to 0.9960; dropout 0.1: 0.016 to
0.021, R^2 0.9949 to 0.9866; the gradient changes 1.8-1.9x over depth there, under the 2x at
which the R^2 floor applies). With dropout 0.1 the slope holds in the reduced model above
(d_model 64, gains held, 2 heads, 32 tokens, 64 draws): the input gradient 3.3% +- 1.7% low
with it, 9.0% without. The other `llama`, `lns` and `dslm` rows (12 and 48 layers, and `llama`
and `lns` own init at 96; 28 rows), judged before both the per-key weights and the slope, were
then re-simulated on the same seed-0 draws (8 x 4; the samples repeat: every measured change
over depth agrees to the digit) and re-judged: all 28 pass, as before. The largest gradient
errors are in `llama`, where the gradient grows 10^2-10^4-fold over depth and the points pass on
their standard error (largest gradient error, torch-default: 12 layers dropout 0.1 0.127 to
0.142, 48 layers dropout 0 0.155 to 0.162, dropout 0.1 0.125 to 0.108); DSLM's own init moves
most otherwise (dropout 0.1: 12 layers 0.040 to 0.052, 48 layers 0.024 to 0.038; the gradient
changes 1.7-1.8x over depth there, under the 2x at which the R^2 floor applies). Where a
variance changes over 2x (14 forward and 14 gradient series) R^2 is at least 0.9994 forward and
0.9989 gradient.
The `olmo2` own-init rows' layer-1 excess at dropout 0.1 (measured 2026-11-25;
`benchmarks/causal_grad_correlation.py --arch olmo2 --placement preset`, NumPy, float64, seed 0,
4 draws x batch 4) is the causal position model's gradient covariance over the first positions
again, here too positive: at the outputs of layers 1, 2, 3, 7's attention the predictor's
correlation between positions 0 and 1 is 0.27, 0.28, 0.29, 0.31 against 0.17 +- 0.03, 0.22 +-
0.01, 0.23 +- 0.03, 0.22 +- 0.01 measured, position 0's variance over the mean 48 / 34 / 26 / 13
against 32 +- 3 / 27 +- 3 / 22 +- 2 / 11.0 +- 0.6, and the branch gradient for that covariance
over the same without its off-diagonal 1.41 / 1.54 / 1.56 / 1.57 against 1.33 +- 0.03 / 1.44 +-
0.05 / 1.38 +- 0.02 / 1.44 +- 0.03 (the actual gradient against the same with every position's
sign drawn at random): each attention step in the first layers 6-13% high. At dropout 0 the same
over-prediction is there (corr(0, 1) 0.57 against 0.37 +- 0.04 at layer 1; the branch ratio 1.93 /
2.05 / 2.05 / 1.98 against 1.82 +- 0.09 / 1.86 +- 0.05 / 1.91 +- 0.07 / 1.79 +- 0.08), and that
row passes; with dropout 0.1 the point at layer 1 crosses the tolerance. One layer alone (input
variance 4e-4, upstream gradient iid: no position structure; `sigprop check --arch olmo2
--layers 1`, 64 x 4) has the input gradient within 1% at dropout 0 and 0.1 (its gradient between
the two sublayers 5% above the prediction at both). Not modelled yet; the rows
are unchanged (48 layers re-judged on the stored draws: 7.63 against 6.09 +- 0.31, one point).
Re-judged after two position-model changes (2026-11-25; design.md, "Causal models: positions":
the value path's pair term split by pair weight, and with rotary positions the key path's
within-row covariance and the query path's at kappa(j - j') / kbar(L) instead of kbar(L),
kappa(1) / kbar(128) = 1.74 at d_head 64): layer 1's gradient 7.40 against 6.09 +- 0.31 at 48
layers and 10.79 against 8.41 +- 0.44 at 96 (was 11.22), one failing point each as before;
every other `olmo2` row (10) passes on its stored draws. The probe moves little: corr(0, 1)
0.27 / 0.29 / 0.30 / 0.31 at layers 1 / 2 / 3 / 7 (0.59 at layer 1, dropout 0), position 0's
variance over the mean 46 / 32 / 25 / 12.5. The QK-normed logits are small here, so neither the
softmax's pair part nor the key path carries much. One sampled `olmo2`-like attention layer
(RMS QK-norm, RoPE, d 64, 2 heads, 16 tokens, exchangeable input, upstream covariance on the
first positions, 100 x 8) agrees at positions 0-3 within 2.5%, the (0, 1) covariance 5% high
(1.73 against 1.64 +- 0.03; value path 1.87 against 1.81 +- 0.03), so the excess builds up
across the stack outside one attention layer's backward; not located.
Located (2026-11-28; `benchmarks/causal_sublayer_cov.py`, 48 layers, dropout 0.1, NumPy float64,
seed 0, 4 draws x batch 4: the gradient's covariance over positions 0-3 and each step's gain
after every step of layers 8 down to 1, sampled against predicted): the excess is layer 1's
FFN step, its branch gradient gain predicted 3.49 against 2.95 +- 0.05 (layer 1's attention
step 1648 against 1727 +- 70, within). The FFN's input is not flat over positions: the
embedding stream has variance 4e-4, so layer 1's attention output is ~1e-6, comparable to the
output norm's eps (1e-6), and the norm divides position t by sqrt(v_t + eps), so row 0 (one
value, ~4 times the rows' mean) keeps more than the long rows: the stream after layer 1's
attention has position 0 at 1.507 +- 0.028 times its mean (8 x 4), where the position model
had every norm output flat. The SwiGLU FFN (pre-activations ~0.1, nearly quadratic) then has
2.35 +- 0.12 times its mean output at position 0, and its output norm divides position 0's
gradient by that. Modelled (docs/design.md, "Branch-output norms near eps"): the norm's eps per
position, and a position-wise branch's output variance and backward gain from its input's
profile; predicted then 1.510 for the stream, 2.93 for the FFN step. Re-judged on the stored
draws (8 x 4, seed 0): 48 layers dropout 0.1 passes (layer 1's attention gradient 6.14
against 6.09 +- 0.31, predicted over measured 0.97-1.04 at every point but the input, 1.11
+- 0.07; gradient error max 0.216 to 0.113, R^2 0.99975 to 0.99987), 96 layers dropout 0.1
passes (layer 1's attention 8.58 against 8.41 +- 0.44; 0.283 to 0.145, R^2 0.99972 to
0.99984); and the guard rows pass: 12 layers dropout 0
(gradient error max 0.109 to 0.131) and 0.1 (0.096 to 0.114), 48 layers dropout 0 (0.113 to
0.102), 96 layers dropout 0 (0.151 to 0.162, R^2 0.99785 to 0.99767), Pre-LN `output` causal dropout 0 at 12 (0.029 to 0.029) and 48
layers (0.085 to 0.086, R^2 0.99843 both), torch-default 12 layers dropout 0 (0.084 to 0.087)
and 0.1 (0.027 to 0.030), 48 layers dropout 0 (0.089 to 0.090) and 0.1 (0.040 to 0.042). The 96-layer
dropout-0 row is the one near its edge:
its gradient is 12-16% low at layers 1-8 (layer 1's attention predicted over measured 0.867,
layer 2's 0.838, within 3 standard errors; 0.85-0.87 at layers 2-8 before, where layer 1's FFN
excess lifted layer 1's attention to 1.09). What is left at layers 1-8 (48 layers, dropout
0.1): each attention step's branch gain 0-13% high (layer 2 0.502 against 0.443 +- 0.028,
layer 1 1868 against 1727 +- 70), with position 0's share after it 5-14% high and the
(0, 1) gradient correlation 0.45-0.50 against 0.39-0.48, where the gradient entering the
attention at positions 0-3 agrees; and each FFN step passes too much of the (0, 1) covariance
(0.14-0.19 after it against 0.04-0.12): a position-wise branch passes the covariance of a pair
as its input correlation, and position 0 is the least correlated (a sampled SwiGLU passes 0.371
at correlation 0.3 of what it passes at 0.8, the rules 0.372). Taking each pair's gain at its
own correlation brings that to 0.10-0.13 and 48 layers dropout 0.1 to a gradient error max of
0.038, but lowers layer 1's attention gradient of the 96-layer dropout-0 row from 7.22 to 6.44
against 8.33 +- 0.39 (4 failing points), so it is not carried.
Re-judged 2026-11-28 (the twelve DSLM and DSLM-Post own-init causal rows, re-simulated with the
present seeding, NumPy, 8 x 4, seed 0: the same samples, the forward errors identical) after the
causal position model took the pair-of-rows weights at the two rows' lengths from the attention
rule's two-row integrals (`sigprop.model.pair_rows`) wherever rho v >= 0.2 (the DSLM init's
logit variance is 1). Of 30 causal configurations predicted before and after (these twelve,
Post-LN torch-default 48 and 96, DeepNorm 48, and the modern LLaMA, LNS and DSLM on LLaMA blocks,
GPT-2 and OLMo 2 rows at 48 layers) only these twelve moved (gradient variance by at most 0.47%,
correlations by 1e-4); the others are unchanged bit for bit, and the remaining causal rows were
not compared. Their gradient error max moved by -0.5 to +0.4
points (dropout 0.1 rows better, dropout 0 rows worse, e.g. DSLM 48 dropout 0 0.029 -> 0.033,
DSLM-Post 48 dropout 0.1 0.033 -> 0.028); the verdicts are unchanged: DSLM-Post 48 layers dropout
0 fails on this sample as before (27 points instead of 25: layer 1's gradient 0.5486 against
0.602 +- 0.011, 0.5511 before), and passes on the same model at 8 x 8 (gradient error max 0.018,
R^2 0.9988).
Re-judged 2026-11-28 (the twelve `olmo2` rows, QK-norm's; re-simulated with the present seeding,
NumPy, 8 x 4, seed 0; 10 of the 12 samples identical to the stored ones, the torch-default
96-layer rows' not, judged before and after
on the same draws) after the attention rule's QK-norm changes (the logits' fourth cumulant by
its Edgeworth term, with Wk's anisotropy; the norm's Jacobian removing the gradient's own
direction by the statistic T2e2; docs/validation.md, the attention qknorm grid): all twelve
pass as before, 0 failing points; gradient error max own init 12 layers 0.131 -> 0.130
(dropout 0) and 0.114 -> 0.112 (0.1), 48 layers 0.102 -> 0.101 and 0.113 -> 0.112, 96 layers
0.162 -> 0.161 and 0.145 -> 0.145; torch-default 12 layers 0.087 -> 0.085 and 0.030 -> 0.029,
48 layers 0.090 -> 0.090 and 0.042 -> 0.041, 96 layers 0.153 -> 0.152 and 0.094 -> 0.094;
R^2 of the gradient within 2e-5 of before. Every model without QK-norm predicts bit for bit as
before."""


#: what the layouts' failures are (written from the stored results; keep in step)
LAYOUT_NOTES = """Run 2026-11-25 on 2 shared cores, 8 weight draws x batch 4, seed 0. The one
failure is the `output` placement's causal 48-layer model with dropout 0.1: the gradient below the
first layers is predicted 22% low (121.2 against 155.6 +- 4.6 at the input; gradient error max
0.221, R^2 0.9850). Per-key attention weights (the causal position model's kernels weight each key
by its own softmax weight, from per-key logit variances set by the stream's pair-correlation
deviation; docs/design.md, "Per-key weights") were added on 2026-11-25 and the causal 48-layer
`output` and `peri` rows re-judged on their stored draws (8 x 4, seed 0): dropout 0 from FAIL (64
points; input gradient 37.1 against 47.8 +- 2.4, gradient error max 0.240, R^2 0.9739) to pass
(51.9, error max 0.087, R^2 0.9986); dropout 0.1 from FAIL (69; 103.3, error max 0.336, R^2 0.9774)
to FAIL (67; 121.2, 0.221, 0.9850): the prediction falls behind the measurement steadily from the
top (measured over predicted 1.02 at layer 42's FFN, 1.12 at layer 24's, 1.20 at layer 12's, 1.26
at layer 1's) although the predicted key weights agree with the measured ones where the draws
resolve them (key 0 of rows 64..127 at layer 13: 2.70 predicted, 2.67 +- 0.16 measured, 2 draws x
batch 4; `benchmarks/causal_key_weights.py --dropout 0.1`), so a second, dropout-related part is
not modelled; `peri` unchanged (gradient error max 0.030). The 12-layer `output` causal rows, whose
draws were not stored, were re-simulated here (NumPy, seed 0, 8 x 4) and re-judged: both pass as
before, gradient error max 0.048 -> 0.026 (dropout 0) and 0.056 -> 0.018 (dropout 0.1), R^2 of the
gradient 0.9991 -> 0.9999 both. The same models bidirectional pass (gradient error at most 1.5%).
Before the per-key weights the failures were both causal 48-layer `output` rows; earlier still,
those two rows and `peri` causal 48 were re-judged on the same stored draws after the branch-output
norm's per-token correction (2026-11-25): the input gradient moved from 36.5 to 37.1 and from 101.6
to 103.3 (gradient error max 0.248 -> 0.240 and 0.347 -> 0.336), `peri` causal from a gradient
error of 0.041 to 0.030.

Why (measured; `benchmarks/causal_key_weights.py`, 4 draws x batch 4, seed 0). With the norm on
the branch output only, nothing normalises the attention's input: the logit variance grows with
the stream (0.01 at layer 1, 6.6 at layer 13, 76 at layer 43 here). In a causal stack the first
positions mix with few others, so they stay less correlated with the rest (position 0 with the
others 0.58 / 0.64 / 0.74 at layers 7 / 13 / 43 against the mean over pairs 0.82 / 0.87 /
0.92), and the logit of such a key has an extra variance of its own in every row (the part of
the stream shared by the other keys cancels in the softmax, its own deficit does not): in the
last row, key 0's logit varies about the row mean with variance 4.2 against the other keys'
median 0.70 at layer 13, 32 against 5.1 at layer 43. So the rows attend to the first keys far
more than to the others: the mean weight n_i E[P_ij] of rows 64..127 is 2.8 +- 0.5 (key 0),
1.7-1.9 (keys 1-3) at layer 13, 9.1 +- 1.1 at layer 31 (key 0), and 3-9 for keys 0-3 from layer
19 on; exchangeable keys give 1. The attention rule's softmax statistics take the keys of a row
as exchangeable (iid logits given the row), and the causal position model distributes the
per-row terms with uniform weights (the stream's pair-correlation deviation S enters the value
path only, docs/design.md), so E[P_ij] = 1/n_i for every key: the coupling of S to the logits
(first order in the logit scale times S: in a long row key j's logit varies about the row mean
with variance v (1 - 2 mean_k S_jk / (1 - r)), v the row logit variance, which with the
measured correlations gives 3.0 and 27 for key 0 at layers 13 and 43 against the 4.2 and 32
above) is left out. The first keys then collect more value-path gradient (~ E[P_ij^2] summed
over rows) than predicted, layer after layer. Per position (the same model, float64, 8 draws x
batch 4, seed 0; sigprop.mc.model's sublayers, the gradient's variance at a position over its
mean over positions): position 0 has 1.06 against a measured 1.28 at layer 48's input (below
the top layer, logit variance 95), 1.29 against 2.84 at layer 44's input, 5.9 against 18.0 at
layer 13's input and 51.8 against 67.6 at the model's input, while the late positions are
over-predicted (0.39 against 0.25 at position 31, input); the mean gradient departs steadily
from the top (measured over predicted 1.01 at layer 45's input, 1.05 at layer 31's, 1.10 at
layer 21's, 1.36 at the model's input: 50.4 +- 3.3 against 37.1). Peri (logit variance 0.01 at
every layer) and bidirectional models (exchangeable keys) do not see it. A QK-norm, or the
init's logit scale, keeps such a model where the position model holds. The per-key weights
above model it (for the dropout-0 row, fully).
What the dropout-0.1 row misses (measured 2026-11-25; NumPy, float64, seed 0, 4 draws x batch 4
unless said). It is the attention steps: on the stored draws the FFN sublayers' gradient steps
(g_in/g_out - 1) are predicted to within a few per cent (measured over predicted 0.93-1.06), the
attention sublayers' 10-25% short at layers 4-35 (1.11 at layer 4, 1.12 at 13, 1.19 at 25, 1.08
at 43; 0.90-1.06 in the dropout-0 row). Not the attention rule, nor the branch-output norm: on
the model's own stream, for an upstream gradient of iid entries, the attention-branch gradient
(hidden dropout, norm and attention) measured directly is 0.0135, 0.0240, 0.0461, 0.0622 at
layers 7, 13, 25, 43 and the predictor's branch backward gives 0.0129, 0.0228, 0.0465, 0.0611
(`benchmarks/dropout_output_norm.py` takes it apart: attention dropout raises the attention's
input gradient 1.22-1.32x on the same stream, key path 1.31-1.42x, query 1.26-1.31x, value
1.09-1.13x; the norm's projection off each token's output removes 3.4-5.4% of it, 4-7% of the key
and query paths against the isotropic 2/d = 0.8%, and its per-token rms, kappa 4.5-5.5 with
dropout against 1.5-3 without, gives 0.4-7.5% back: net 0.97-1.03). What differs is the gradient's
covariance over the first positions, which the causal position model carries into each
attention's backward (`benchmarks/causal_grad_correlation.py`, the actual gradient at each
attention's output against the predictor's covariance over positions there). With dropout 0.1 the
predictor puts too little of the gradient on position 0 (its variance over the mean 11.6 / 7.8 /
5.7 at layers 7 / 13 / 25 against 17.4 +- 1.1 / 13.1 +- 0.8 / 7.7 +- 0.6 measured) and makes the
first positions' gradients too strongly anticorrelated (corr(0, 1) -0.21 and -0.22 at layers 13
and 25 against -0.15 +- 0.02 and -0.19 +- 0.01; corr(1, 2) -0.11 against -0.06 +- 0.02 at 25);
the anticorrelation is the key path's (each row's key gradients sum to zero, so the first keys,
which the short rows share, pull against each other), and dropout, which raises the key path
most, deepens it. Its effect on the branch, the branch gradient for the covariance over positions
against the same with the off-diagonal removed: predicted 0.84, 0.81, 0.96 at layers 13, 25, 43,
measured (the actual gradient against the same with every position's sign drawn at random)
0.90 +- 0.04, 0.94 +- 0.03, 0.99 +- 0.05. In the dropout-0 row they agree to within 0.06 (at most 2.7 standard errors; position 0's variance
25.6 / 18.2 / 10.7 predicted against 23.1 +- 1.5 / 16.2 +- 1.2 / 9.3 +- 0.6 at layers 7 / 13 / 25;
the branch ratio 1.24 / 1.16 / 1.03 / 0.98 against 1.24 +- 0.08 / 1.10 +- 0.02 / 1.15 +- 0.08 /
1.01 +- 0.02 at layers 7 / 13 / 25 / 43). So the missing part is in the position model's backward
of a causal attention with attention dropout, at the first positions (the rows of length 1, 2, 3,
whose dropout terms differ most from a row average); it is not modelled yet, and the row still
fails as above (re-judged on its stored draws with the unchanged rules: input gradient 121.2
against 155.6 +- 4.6, 67 points, R^2 0.9850).
Part of it is located and modelled since (2026-11-25): the value path's pair-of-rows term.
Two rows attending to one key carry E[A_ij A_i'j] n_i n_i', which is 1 for a pair with row 0
and rises with the shorter row's length (one sampled layer at row logit variance ~16: 1.16-1.25
with a two-key row, 1.49-1.52 with a four-key row, 1.78 on average); the position model had put
the rule's average on every pair, so on the pairs of short rows that carry the upstream
covariance. Split to first order (design.md, "Causal models: positions"), the probe gives
position 0's variance over the mean 17.8 / 12.7 / 7.9 at layers 7 / 13 / 25 (17.4 +- 1.1 /
13.1 +- 0.8 / 7.7 +- 0.6 measured), corr(0, 1) -0.16 / -0.18 at 13 / 25 (-0.15 +- 0.02 /
-0.19 +- 0.01), the branch ratio 0.89 / 0.87 at 13 / 25 (0.90 +- 0.04 / 0.94 +- 0.03); in the
dropout-0 row position 0 25.9 / 18.7 / 11.1 and the branch ratio 1.21 / 1.13 / 1.03 / 0.99 (that
row still passes). On the stored draws this row still fails, closer: input gradient 134.4
against 155.6 +- 4.6, 65 points, R^2 0.9924. The attention steps at layers 14-38 are still
3-12% short (layer 26: 0.041 against 0.047), those of layers 1-13 and the FFN steps within a
few per cent. What is left, measured on the same sampled layer: beyond first order the pair
weight rises more steeply with the shorter row's length than 1 - 1/min(n_i, n_i') ((R - 1) /
(1 - 1/min) 0.3-0.5 at min 2 and 3, 0.65-0.7 at 4, 0.8 at 5), so at these logit variances the
split still leaves too much of the pair term on short rows; the two-row statistics at two
given row lengths (the rule's C2 per pair of lengths) are not computed.
Modelled since (2026-11-28): the pair-of-rows weights at the two rows' lengths
(`sigprop.model.pair_rows`; design.md, "Causal models: positions"). The rule's two-row integrals at
two given lengths, at the layer's mean row logit variance v and row-pair logit correlation rho,
give the value path's R = n_i n_i' E[A_ij A_i'j] and the key path's K = n_max T2x of the pair
(checked against sampled softmax rows, tests/test_position_pair_rows.py); the key path's pair
covariance of keys j != j' (-cross_k / (L - 1), each row's key gradients summing to zero) follows K
too. Attention dropout does not enter them (different rows' masks are independent). A deep stream's
rows are strongly correlated (rho ~0.9, its token correlation), so at v ~16 the weights rise
steeply with both lengths (R - 1: 0.66 for a two-key row with a three-key row, 35 for two 128-key
rows; K: 0.06 and 4.0), far from the first-order 1 - 1/min. One sampled layer
(`benchmarks/causal_layer_cov.py --d 64 --heads 2 --seq-len 16 --corr 0.85 --qk 3.2`, logit
variance ~16, 200 draws x batch 4, seed 0), dropout 0.1, first-order split -> length weights:
position 0's gradient 15.03 -> 14.37 against 13.77 +- 0.36, position 1 8.19 -> 7.54 against 7.48 +-
0.32, entry (0, 1) -1.20 -> -0.78 against -0.79 +- 0.17; dropout 0: position 0 12.44 -> 11.78
against 11.98 +- 0.26, position 1 5.97 -> 5.32 against 5.19 +- 0.17 (at input correlation 0.3, rho
0.3, both within 0.03 of before). This row, re-simulated (NumPy, seed 0, 8 x 4) and judged on the
same draws with the rules before and after: input gradient 134.4 -> 153.7 against 155.6 +- 4.6,
failing points 65 -> 11, gradient error max 0.136 -> 0.054, R^2 0.9924 -> 0.9989. Measured over
predicted gradient 1.01 at the input, 1.04 at layer 4, 1.05 at layers 10-20 (1.14-1.16 before),
1.03 at 30, 1.01 at 44; the attention step at layer 26 0.0444 against 0.0467 (0.0410 before); those
at layers 16-37 still 1-8% short, at layers 2-5 2-13% long. The 11 failing points are layers 11-16
(gradient 5.1-5.4% low, 4.1-5.3 standard errors). On the same draws the other causal rows of the
`output` placement pass as before: 48 layers dropout 0 gradient error max 0.085 -> 0.079 (R^2
0.9984 -> 0.9987), 12 layers dropout 0 / 0.1 0.029 -> 0.030 / 0.022 -> 0.023; `peri` causal 48
dropout 0.1 is unchanged (its logit variance, 0.01, stays below rho v 0.02, where the first-order
weights are kept). `olmo2` (modern floor, 48 layers, causal, stored draws 8 x 4, seed 0): own init
dropout 0 passes (gradient error max 0.113 -> 0.108, input gradient 12893 -> 12762 against 11986 +-
454), dropout 0.1 fails at one point as before, for another reason (layer 1's attention 7.40 ->
7.33 against 6.09 +- 0.31; input 12213 -> 12052 against 11136 +- 727); torch-default dropout 0.1
passes (0.040 -> 0.041; input 10004 -> 9881 against 9623 +- 526), dropout 0 passes (0.089 -> 0.091;
input 10429 -> 10322 against 9840 +- 428). What is still missing shows in the whole-model probe
(`benchmarks/causal_grad_correlation.py`, 4 draws x batch 4, seed 0): position 0's gradient
variance over the mean at layers 7 / 13 / 25 / 43 is now 21.0 / 15.3 / 9.4 / 3.0 against 17.4 +-
1.1 / 13.1 +- 0.8 / 7.7 +- 0.6 / 2.9 +- 0.3 (17.8 / 12.7 / 7.9 with the first-order split), corr(0,
1) -0.074 / -0.140 / -0.163 / -0.087 against -0.085 +- 0.015 / -0.150 +- 0.023 / -0.186 +- 0.014 /
-0.123 +- 0.018, the branch ratio 0.97 / 0.93 / 0.95 / 0.99 against 0.94 +- 0.02 / 0.90 +- 0.04 /
0.94 +- 0.03 / 0.99 +- 0.05: the mean gradient is right to a few per cent but the first position
gets 15-22% too much. The per-key weights' re-weighting of the pair sums (`profile._weighted`)
still takes the first-order pair shape; given the length weights instead, position 0 comes to 20.4
/ 14.9 / 9.1 and corr(0, 1) to -0.083 / -0.152 / -0.175, but the row's gradient is worse (32
failing points, input 151.0), so it is not used. Cost: one table of 120 two-row integrals per layer
(0.1-1.4 s each at v 2-60), so predicting this row took 104 s against 58 s before on the same
loaded 2-core machine; rows below rho v 0.02 compute none.
Re-judged 2026-11-28 (the causal rows, on draws re-simulated with the present seeding: NumPy,
8 x 4, seed 0) with two later changes: a branch-output norm near its eps per position
(`profile.branch_norm_eps`; `olmo2`, Modern blocks) and the first-order pair weights kept below
rho v 0.2 instead of 0.02 (`pair_rows.LINEAR`; there the two-row integrals move a prediction by
at most ~1e-4: Pre-LN causal 768 layers, rho v up to 0.1, gradient variance 1.3e-4, so the
`peri` and `parallel` rows take no integrals and the `output` rows, at rho v ~1-14, take them as
before). `output` 48 layers dropout 0.1 still fails at the same 11 points (gradient error max
0.054, R^2 0.9989); every other causal layout row passes: `output` 48 dropout 0 gradient error
max 0.080, 12 layers 0.029 / 0.023 (dropout 0 / 0.1); `peri` 48 0.031 / 0.046, 12 0.018 / 0.011;
`parallel` at most 0.008. (The `peri` rows' earlier results came from samples drawn before the
trials' seeding changed; these are the present seed 0's.)
Diagnosed 2026-11-29 (modelled the same day: the last paragraph). The two 48-layer `output` causal rows err in opposite
directions, layer by layer. With dropout 0.1 the attention steps (log of the gradient's growth
through one attention sublayer) at layers 16-47 are measured up to 13% of the step above the
prediction (28 of 32 above; layer 26: 0.0457 against 0.0434), with dropout 0 those at layers
28-48 up to 21% below (20 of 21 below; layer 38: 0.0126 against 0.0158); the FFN steps are
within a few per cent in both. One attention
layer at the stream state the predictor carries into it (variance, r, profile and deviation S over
every position), sampled with that S and with S = 0 at the same r, iid upstream gradient
(`benchmarks/causal_deviation_paths.py`, 40 draws x batch 8, seed 0), separates two parts:
(1) the query path takes no S in the position model (design.md, "Per-key weights"), and S
multiplies it by 2.86 / 2.97 / 2.46 +- 0.08 at layers 13 / 30 / 43 with dropout 0 and by 1.46 /
1.23 / 1.17 +- 0.02 with dropout 0.1 (the row's key that stands apart, position 0, carries a
larger share of the query gradient Sum_j dS_ij u_j); (2) the per-key weights overshoot at high
logit variance: at layer 30 (dropout 0) key 1 of rows 64..127 has w1 4.49 +- 0.30 and w2 16.5 +-
1.8 sampled against 5.81 and 28.9 predicted, key 2 2.64 and 7.2 against 4.46 and 19.5 (key 0
30.0 +- 3.1 against 46.3 for w2), so S raises the key and value paths 1.58x and 1.47x in the
prediction against 1.33 +- 0.05 and 1.18 +- 0.03 sampled. The cause of (2): the additive fit
S_jk ~ mu_i + b_j + b_k leaves a large positive residual among the first keys (row 100, layer 30:
0.30 between keys 0 and 1, 0.24 between 0 and 2 and between 1 and 2, against 1 - r = 0.094), so
their logits share a component that the independent-logit fit turns into independent variance
(relative variances 5.2 and 3.9 for keys 0 and 1). With dropout 0 the query path is small
(~5% of the layer's input gradient without S) and (2) wins: the whole layer is predicted 1.51x
against 1.36 +- 0.04 sampled at layer 30, 1.43x against 1.20 +- 0.03 at 43, as the over-predicted
steps above. With dropout 0.1 the attention dropout's shared-value terms make the query path
15-21% of the layer's gradient and the weights' overshoot is small (key 1 of rows 64..127 at layer
30: w2 4.6 +- 0.5 against 6.0), so (1) wins: 1.07x against 1.09 +- 0.015 at layer 30, 1.12x
against 1.19 +- 0.02 at layer 13, the under-predicted steps above. Modelling (1) alone with the
present weights (the row's query term times Sum_j w2_ij rel_ij / n_i) would overshoot it at
layers 30 and 43 (1.34 / 1.23 against 1.23 / 1.17 with dropout 0.1, 3.9 / 3.8 against 3.0 / 2.5
with dropout 0). What would model both, checked by sampling Gaussian logits (the same script,
20,000 logit rows per row, at the rule's mean row logit variance): (2') the row's logits with
their full covariance vbar/(1 - r) (r + (1 - r) I + S) over the row's keys give the sampled
weights: at layer 30 (dropout 0, rows 64..127) w1 6.90 / 3.95 / 2.86 / 1.64 and w2 34.3 / 13.9
/ 8.0 / 3.0 for keys 0 / 1 / 2 / 5 against 6.38 +- 0.45 / 4.49 +- 0.30 / 2.64 +- 0.20 / 1.81 +-
0.14 and 30.0 +- 3.1 / 16.5 +- 1.8 / 7.2 +- 1.2 / 3.7 +- 0.6 sampled (the additive fit: 8.09 /
5.81 / 4.46 / 2.45 and 46.3 / 28.9 / 19.5 / 7.4), with dropout 0.1 likewise (key 0 of those rows:
law 2.55 / 10.5, sampled 2.39 +- 0.14 / 9.0 +- 1.1, additive fit 2.69 / 12.0); the additive fit
plus two shared factors fitted to the rest (independent keys given the factors) gives the full
law's weights within ~5% (key 1: 4.02 / 14.5), one factor only part of the way (key 1 at layer
30: w2 18 against 14 and the additive fit's 27); at layer 13 (dropout 0) key 0 stays above the
sampled weight (law 2.69 against 2.29 +- 0.13), the one place where it does not hold. (1') The
query path's generic term of row i, E[Sum_jk P_j P_k ((J C J^T)_jk + q (J J^T)_jk) C_jk] (J = I -
1 P^T, C the row's keys' covariance over positions less the shared r, q = p / (1 - p)), under the
full law over the same under iid logits, summed over the rows, gives the sampled query path's S
factor: 3.20 / 2.99 / 2.54 at layers 13 / 30 / 43 with dropout 0 (sampled 2.86 +- 0.07 / 2.97 +-
0.08 / 2.46 +- 0.08) and 1.47 / 1.24 / 1.17 with dropout 0.1 (1.46 +- 0.02 / 1.23 +- 0.01 / 1.17
+- 0.01). A predictor that takes both needs the key weights' independent-key moments
(softmax_moments.independent_row_moments) averaged over two Gaussian factors with per-key mean
shifts (a key's mean m shifts its u argument in the softmax identity; only the first keys load
on the factors), and the query term's pair moments of P under that law. The first is prototyped
in the script (`factor_law_moments`: Gauss-Hermite over the two factors, 6 nodes each, of the
independent keys' identity with each key's factors taken at u + its mean): at layer 30 (dropout 0)
rows 71 and 103 against 40,000 sampled rows of the same law, keys 0, 1, 2, 5, 50: w1 within
3.3%, w2 within 6% (key 0 w1 5.79 / 7.50 against 5.68 / 7.50, w2 24.6 / 39.5 against 24.1 / 39.2;
the sampled w2 of a minor key is itself a few per cent uncertain, not measured here), at 6-10 s
a row unoptimised (an FFT per key and factor table, 36 nodes). Its tests: without factors, the
package's independent_row_moments within 1e-3; with two factors, 200,000 sampled rows within 4
standard errors plus 0.2%. Neither part is in the predictor.
The per-key logit offset v max|rel - 1| (the largest over a model's attention layers;
`benchmarks/key_offsets.py`, dropout 0, 2026-11-29) of the validated causal configurations: the
classic floor at 96 layers at most 0.34 (DSLM's own init), the modern blocks at 96 layers at most
1.09 (olmo2; LLaMA blocks with torch-default 0.56), the layouts at 48 layers 0.005 (peri), 0.0006
(parallel) and 35.7 (output); olmo2 at its own sizes (32 layers, seq 4096) 1.59 and the `output`
placement at 12 layers 2.69 (dropout 0.1). A prediction whose offset exceeds 2 carries an
approximation note (`predict.KEY_OFFSET_NOTE`).
Modelled 2026-11-29 (`sigprop.model.logit_law`; docs/design.md, "The sampled logit law"): above
offset 3, at most 256 positions, the per-key weights and the query path's factor come from
the rows' logits with their full covariance, sampled (16,000 draws per row, a Generator per row
seeded by the seed, the layer's index and the row length). The two 48-layer `output`
causal rows, re-judged on their stored draws (8 x 4, seed 0): dropout 0.1 from FAIL (11 points;
gradient error median 0.034, max 0.054, R^2 0.9989) to pass (median 0.0027, max 0.038, R^2
0.99991; input gradient 161.3 against 155.6 +- 4.6, 153.7 before), dropout 0 still passes
(median 0.022 -> 0.026, max 0.080 -> 0.058, R^2 0.9986 -> 0.9987; input 45.6 against 47.8 +-
2.4, 51.6 before). The gradient's error by depth, dropout 0.1: -1.2% / -5.1% / -3.8% / -1.2% at
the input and after layers 10 / 26 / 42 before, +3.7% / +0.7% / -0.1% / -0.3% now; dropout 0:
+8.0% / +3.2% / +1.9% / +1.3% before, -4.6% / -3.3% / -2.2% / 0.0% now. Seeds 0 and 1 of the law
differ by at most 0.12% over the points (dropout 0.1) and 0.07% (dropout 0); at 4,000 draws
seeds 0, 1 and 2 put the dropout-0 input gradient 3.1%, 0.03% and 0.12% off the 16,000-draw
value (one rare-row outlier: the reason for 16,000). Two things the
first version got wrong, found on these rows: the law sampled with C = (1 - r) I + S alone as
the covariance, which is indefinite there (smallest eigenvalue -3.2 at layer 30, dropout 0.1; with r
1 1^T added +0.27), so its projection onto the semidefinite matrices changed the law (input
gradient +8%); and one set of normal numbers for every row and layer, whose sampling errors add
up over the layers (+10.5% at the input with the indefinite covariance, against +8.1% with a
stream per row). The other causal layouts (and every other validated causal configuration) stay
below the offset, so their predictions are unchanged (the 8 reference commands of the change:
identical JSON but the `output` one). One attention layer at a time
(`benchmarks/causal_deviation_paths.py`, as above: 40 draws x batch 8, seed 0), the S factor of
the layer's input gradient, sampled / law (then at 4,000 draws) / additive fit: dropout 0.1, layers 13 / 30 / 43,
1.191 +- 0.018 / 1.172 / 1.120, 1.093 +- 0.015 / 1.092 / 1.065, 1.042 +- 0.014 / 1.058 / 1.033,
its query path 1.455 +- 0.023 / 1.472, 1.233 +- 0.011 / 1.239, 1.166 +- 0.013 / 1.166 (1 in the
fit); dropout 0, layers 30 / 43, 1.359 +- 0.035 / 1.334 / 1.509 and 1.198 +- 0.029 / 1.228 /
1.425, the query path 2.966 +- 0.081 / 3.009 and 2.460 +- 0.075 / 2.547, the key path 1.328 +-
0.050 / 1.253 / 1.580 and 1.122 +- 0.038 / 1.160 / 1.470. That switch at offset 3 was a step
(layer 13 with dropout 0 just below it: its query path's S factor 2.86 +- 0.07 sampled, 1 in the
fit; switching that layer alone moved the input gradient by 0.02%, and layer 12 at 2.69 with
dropout 0.1 by 0.14%). Since 2026-11-29 (later) the law comes in gradually: from offset 2
(`logit_law.LAW_LO`) its weights and query factor are mixed with the fit's linearly in the
offset, in full from 3, so a prediction is continuous in the model's parameters. Only the
`output` rows have offsets between 2 and 3 (olmo2's 1.59 is the next), and all four were judged
again on their stored draws (8 x 4, seed 0): 12 layers, dropout 0 / 0.1, pass, gradient error
median 0.0042 / 0.0048 (0.0043 / 0.0040 with the step), max 0.030 / 0.022 (0.029 / 0.023);
48 layers, pass, median 0.026 / 0.0027 (unchanged), max 0.058 / 0.039 (0.058 / 0.038), R^2
0.99875 / 0.99990 (0.9987 / 0.99991)."""


#: independent, larger samples of the configurations that miss at 8 draws (see NOTES)
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
    out.append("")
    out.append(NOTES)
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


#: what was run and what the failures are (written from the stored results; keep in step)
NOTES = """What was run (2 shared cores, 2026-11-22): the whole grid. Every architecture x init
(default, `torch-default`, `normal`; 17 pairs, the default being one of the others for five
architectures) x dropout {0, 0.1} x {bidirectional, causal} x depth {12, 48, 96}: 204
configurations, 8 weight draws x batch 4, seed 0. The measurements are stored
(`--raw DIR --simulate-only`, ~5 s, ~15 s and ~25 s of simulation per configuration at 12, 48
and 96 layers on one core) and judged against the current rules with `--raw DIR --redo`, so a
change of the rules is re-judged against the same samples. The configurations that fail or
miss an R^2 floor were simulated again on independent samples of 32 draws x batch 4, seed 1
(`--raw DIR2 --trials 32 --seed 1 --inits ... --out docs/validation/floor_more`; 1-7 minutes
each on a loaded core), the second table above.

Results at 8 draws (204 of 204 pass; judged with the rules of 2026-11-22's last revision, which added the
Post-LN attention share along the stream and cross term, the causal key-path pair weights and
the Post-LN LayerNorm's per-position token statistics; the 162 Post-LN, Mix-LN, DeepNorm,
DSLM-Post and causal configurations re-judged, the 42 bidirectional Pre-LN, DSLM and LNS ones
unchanged bit for bit):
- Mix-LN `torch-default`, 96 layers, dropout 0.1, causal, the one failure under the previous revision of the rules (the
  gradient near layer 6 predicted 6.98 against 5.92 +- 0.24), passes (gradient R^2 0.9880 ->
  0.9904). Both its samples showed the prediction 6-7% high at the input below the Post-LN
  layers (2.0-2.6 SE at every point of the 32-draw sample); MC/pred at the input 0.856 ->
  0.865 (8 draws), 0.943 -> 0.953 (32 draws).
- Post-LN `torch-default`, 96 layers, dropout 0.1, causal, which failed under an earlier revision (forward
  token correlation 0.03 high near layer 79), passes since the causal position model carries
  the stream's correlation over pairs of positions (docs/design.md).
- R^2: measured-variance change above 2x in 62 forward and 71 gradient series; R^2 below the
  floor in 1 forward and 4 gradient series at 8 draws: Pre-LN `normal` 48 dropout 0 forward
  0.9978; Post-LN `torch-default` causal 96 dropout 0 gradient 0.915 and 48 dropout 0.1 0.977;
  Post-LN `torch-default` 96 dropout 0 bidirectional 0.981; DSLM-Post 12 dropout 0.1 0.985. On
  the independent 32-draw samples (second table): 1.0000, 0.9822, 0.9923, 0.9982 and 0.9994, so
  one series stays below its floor: deep causal Post-LN `torch-default` at 96 layers.
- Why neither 8 nor 32 draws can test the gradient R^2 of deep causal Post-LN stacks: one
  draw's input gradient varies by a factor of several (relative SD 0.41-0.56 per draw in
  Post-LN `torch-default` 96 causal), and every draw moves all the points below its top
  together. From 120 pooled draws of that configuration, random subsets scored against the
  mean of the other draws (a near-perfect predictor) fall below R^2 0.99 85% of the time for
  8-draw subsets (median 0.968) and 52% for 32-draw subsets (median 0.9896); the prediction
  (the rules before that revision's fixes) does the same (86%, median 0.965; 56%, median 0.9876).
  Pooled over all 120 draws, MC/pred at
  the input is 1.067 +- 0.055 and the prediction's R^2 against the pooled mean 0.9906.
- What remains in causal Post-LN gradients: the gradient's concentration at the first
  positions is over-predicted in the first layers (DSLM-Post 12 layers, 96 draws: MC/pred at
  the input 0.969 before the key-path fix, log error -31 -> -15 e-3 after it, SE 9);
  the value path's attention weights beyond uniform at logit variance ~1 are the next
  candidate (a first-order correction overshot). The attention output's own per-token
  dispersion (kappa_F ~ 2 rather than the Gaussian 1) would add ~0.16e-3 per Post-LN attention
  layer; not implemented (it changes every architecture's token statistics).
- Attention logit variance: no failures. The estimator is the mean second moment (the earlier
  grand-mean subtraction biased it low by ~r^2/8), with an SE pooled over +-6 neighbouring
  attention layers (the per-draw value is heavy-tailed); the median logit-variance error of a
  configuration is 1.0% (0.4% to 8.7%).
- Causal models: before the position model (one number per moment for all positions) 7 of the
  34 causal 12-layer configurations failed, with the input gradient up to 18% low; now all 102
  causal configurations but the Mix-LN one above pass.
- The per-key attention weights and the gradient's per-token slope (both 2026-11-25,
  docs/design.md) came after these runs, whose raw samples were not kept. The per-key weights'
  effect on the 102 causal rows' predictions, with the weights against without them (same trees
  otherwise): the forward variance and the correlations unchanged, the log gradient variance
  moved by at most 0.0075 (Post-LN torch-default, 96 layers, dropout 0.1; 0.0068 at 48 layers;
  DSLM-Post's own init 0.004-0.005; every other row below 0.0052, most below 1e-3), against the
  5% tolerance.
- Causal rows re-run with the rules of 2026-11-25 (per-key weights and per-token slope): the 68
  causal 12- and 48-layer rows, re-simulated (NumPy, seed 0, 8 x 4) with the raw measurements
  stored this time, and judged: 67 of 68 pass. These are new
  samples, not the earlier ones: the whole-model trials have drawn from their own children of
  `SeedSequence(seed)` since 2026-11-24, so seed 0 now gives other numbers (the measured
  variance changes over depth differ by up to 12%). The failure: DSLM-Post's own init, 48
  layers, dropout 0 (6 points, the gradient at layers 4-5 predicted 0.547 against 0.587 +-
  0.010, 6.9% low at 4.0 SE; gradient error max 0.091 -> 0.070, R^2 0.9705 -> 0.9001 where the
  gradient changes 1.7x, under the 2x of the floor); it passed on the earlier sample, and its
  independent 32-draw sample (seed 1, the second table) passes, gradient error at most 0.028,
  R^2 0.9975. Not the causal position model's first-position covariance: after the value
  path's pair term was split by pair weight (2026-11-25, design.md; on one sampled layer at this
  row's state, row logit variance ~0.7 and token correlation 0.3, position 0's value-path
  gradient 8.00 against 7.93 +- 0.10, 8.21 before), the row re-judged on its stored draws fails
  on 25 points (layer 1 0.551 against 0.602 +- 0.011; gradient error max 0.085, R^2 0.8803).
  Summed over the 48 layers, the log gradient steps through the FFN sublayers (with their
  LayerNorm) are +0.037 measured against -0.004 predicted (+0.001 to +0.004 per layer at layers
  25-47, ~+0.0001 predicted) and through the attention sublayers -0.541 against -0.592 (-0.575
  before the split). Largest errors over the 68 rows:
  forward variance 0.037 -> 0.047 (DSLM's own init, 48 layers, dropout 0), gradient variance
  0.121 -> 0.090 (Post-LN `torch-default`, 48 layers, dropout 0.1), correlation 0.015 -> 0.025
  (DSLM-Post's own init, 48 layers, dropout 0). R^2 where the measured variance changes over 2x:
  gradient in 15 series, one under the 0.99 floor, Post-LN `torch-default` 48 layers dropout 0.1
  (0.9839, was 0.9771; 0.9923 on its 32-draw sample); forward in 19 series, three under the
  0.998 floor on the new samples, all where the forward variance changes only 2.1-2.4x: Mix-LN
  `torch-default` 12 layers dropout 0 (0.9978, was 0.9996), Pre-LN `normal` 48 layers dropout 0
  (0.9973, was 0.9982) and 0.1 (0.9975, was 0.9999), the configurations whose bidirectional twin
  gives 0.9978 at 8 draws and 1.0000 at 32 draws (above). The 34 causal 96-layer rows, re-simulated
  the same way (raw measurements stored) and judged: 34 of 34 pass. Largest errors over them:
  forward variance 0.037 -> 0.034 (Mix-LN `torch-default`), gradient variance 0.240 ->
  0.197 (Post-LN `torch-default`, dropout 0), correlation 0.017 -> 0.026 (Post-LN `normal`,
  dropout 0). R^2 where the measured variance changes over 2x: every forward series meets its
  floor (Pre-LN `normal` dropout 0 0.9997 -> 0.9981); gradient: Post-LN `torch-default` dropout 0
  stays under it (0.9152 -> 0.9518; the series that neither 8 nor 32 draws can test, above) and
  dropout 0.1 falls under it (0.9912 -> 0.9855, a change of 4.1x); Mix-LN `torch-default`
  dropout 0.1 0.9904 -> 0.9991. Over the whole floor: 203 of 204 configurations pass, R^2 meets
  its floor in 124 of 133 series.
- The four new R^2 misses, measured again on independent samples (32 draws x batch 8, seed 1,
  the second table): each meets its floor, Mix-LN `torch-default` 12 layers causal dropout 0
  forward 0.99995, Pre-LN `normal` 48 layers causal forward 0.9997 (dropout 0) and 0.9999
  (dropout 0.1), Post-LN `torch-default` 96 layers causal dropout 0.1 gradient 0.9962; each
  configuration passes. Of the nine series under the floor at 8 draws, eight meet it on their
  32-draw samples; the one left is deep causal Post-LN `torch-default` at 96 layers, dropout 0
  (0.9822), the series that neither sample size can test.
- All 102 causal rows re-judged on their stored draws (8 x 4, seed 0) after the position
  model's pair-of-rows split and rotary offset kernel (docs/design.md): 101 of 102 pass, the same
  failure (DSLM-Post's own init, 48 layers, dropout 0, now 25 points: layer 1's gradient 0.551
  against 0.602 +- 0.011; its deficit is in the FFN steps, not this kernel). The largest
  gradient error moves by more than 0.005 in 15 rows, better in 7 (mostly dropout 0.1: DSLM-Post
  12 layers 0.053 -> 0.040, DSLM 48 layers 0.045 -> 0.031, Mix-LN `torch-default` 96 layers
  0.079 -> 0.051) and worse in 8 (mostly dropout 0: DSLM-Post 96 layers 0.036 -> 0.049, Mix-LN
  `torch-default` 48 layers 0.016 -> 0.030, Post-LN `torch-default` 96 layers dropout 0.1 0.150
  -> 0.176). R^2 of the gradient where it changes over 2x: Post-LN `torch-default` 48 layers
  dropout 0 falls under the floor (0.9909 -> 0.9873), 96 layers dropout 0.1 0.9855 -> 0.9801 and
  dropout 0 0.9518 -> 0.9505. Over the whole floor: 203 of 204 configurations pass, R^2 meets its
  floor in 123 of 133 series; the 32-draw samples of the second table were judged before this
  change and not again."""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="12,48,96")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma list of archs")
    ap.add_argument("--inits", default="", help="comma list of inits (default: every init of the grid)")
    ap.add_argument("--out", default=None, help="directory for the per-configuration JSONs (default: docs/validation/floor)")
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
