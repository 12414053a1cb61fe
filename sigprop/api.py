"""The Python API: the whole-model commands as functions (docs/api.md).

``predict``, ``check``, ``solve_init`` and ``compare`` take the options of the commands of
the same names, as keyword arguments spelt like the flags with underscores for dashes
(``--d-model`` is ``d_model``, ``--tol-var`` is ``tol_var``), with the same defaults, and
return result objects whose ``to_json()`` is the text the command prints with ``--json``.
``build_model`` / ``build_models`` resolve the model options into
:class:`sigprop.model.spec.Model` objects, and ``load_spec`` reads a resolved model (a
``--spec`` file, a dict, or a result holding one).

Every keyword is listed once, in :data:`KEYWORDS` (keyword -> the library's name for it, the
functions that take it, its default, and the checks the command line applies to it), which
also gives each function its signature.  A model option left at ``None`` is "not given": the
preset's default applies, a ``config`` file may set it, and ``spec`` excludes it, exactly as
on the command line.

Bad input raises :class:`sigprop.errors.SigpropError` (:class:`~sigprop.errors.DomainError`,
or :class:`UnknownOption` for a keyword the function does not take) with the message the
command line prints; a numerical failure the prediction cannot represent raises
FloatingPointError (the command line's exit code 3).  A negative verdict (a check outside
tolerance, an infeasible solve) is not an exception: see ``passed`` / ``feasible`` and
``exit_code`` on the result.

Nothing here computes: every function calls the library functions the command calls
(:func:`sigprop.model.presets.resolve`, :func:`sigprop.model.predict.predict`,
:func:`sigprop.mc.model.simulate`, :func:`sigprop.model.checking.compare`,
:func:`sigprop.solve.solve`, :func:`sigprop.compare.compare`, ...).  Importing this module
imports no NumPy, sympy, rich or typer; the functions import what they need when called.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
from typing import NamedTuple

from sigprop.errors import DomainError, SigpropError
from sigprop.solve import TARGETS  # (imports no sympy)


class UnknownOption(SigpropError, TypeError):
    """A keyword that the function does not take (the command line's "No such option")."""


class Keyword(NamedTuple):
    """One keyword of the API: ``name`` is what the library calls it (the option name of
    :func:`sigprop.model.presets.resolve`, a tolerance key, a :func:`sigprop.solve.solve`
    argument); ``takes`` the API functions that accept it; ``default`` the command line's
    default (None: not given); ``type``, ``lo`` and ``choices`` the checks the command line
    applies before running (model options are checked by the library instead, so they have
    none here)."""

    name: str
    takes: tuple
    default: object = None
    type: type | None = None
    lo: float | None = None
    choices: tuple | None = None


_B, _P, _C, _X, _S = "build_model", "predict", "check", "compare", "solve_init"
_MODEL = (_B, _P, _C, _X, _S)
_STEP = ("step", "lr", "batch_size", "adam_betas", "adam_eps", "weight_decay")

#: API keyword (the command-line flag without its dashes, '-' -> '_') -> :class:`Keyword`.
#: The single table of names: renaming a flag is renaming its key here.
KEYWORDS: dict[str, Keyword] = {
    # model options (sigprop.model.presets.OPTIONS; checked by presets.resolve)
    "arch": Keyword("arch", _MODEL),
    "init": Keyword("init", _MODEL),
    "layers": Keyword("n_layers", _MODEL),
    # (an encoder-decoder model: the command line's predict and check take it; the API refuses it)
    "encoder_layers": Keyword("encoder_layers", _MODEL),
    "decoder_layers": Keyword("decoder_layers", _MODEL),
    "encoder_seq_len": Keyword("encoder_seq_len", _MODEL),
    "deepnorm_variant": Keyword("deepnorm_variant", _MODEL),
    "d_model": Keyword("d_model", _MODEL),
    "heads": Keyword("n_heads", _MODEL),
    "kv_heads": Keyword("n_kv_heads", _MODEL),
    "d_head": Keyword("d_head", _MODEL),
    "d_ff": Keyword("d_ff", _MODEL),
    "seq_len": Keyword("seq_len", _MODEL),
    "dropout": Keyword("dropout", _MODEL),
    "attn_dropout": Keyword("attn_dropout", _MODEL),
    "hidden_dropout": Keyword("hidden_dropout", _MODEL),
    "ffn_dropout": Keyword("ffn_dropout", _MODEL),
    "ffn": Keyword("ffn", _MODEL),
    "activation": Keyword("activation", _MODEL),
    "norm": Keyword("norm", _MODEL),
    "norm_eps": Keyword("norm_eps", _MODEL),
    "placement": Keyword("placement", _MODEL),
    "block": Keyword("block", _MODEL),
    "rope": Keyword("rope", _MODEL),
    "rope_base": Keyword("rope_base", _MODEL),
    "qk_norm": Keyword("qk_norm", _MODEL),
    "final_norm": Keyword("final_norm", _MODEL),
    "bias": Keyword("bias", _MODEL),
    "causal": Keyword("causal", _MODEL),
    "input_mean": Keyword("input_mean", _MODEL),
    "input_var": Keyword("input_var", _MODEL),
    "input_corr": Keyword("input_corr", _MODEL),
    "grad_var": Keyword("grad_var", _MODEL),
    "grad_corr": Keyword("grad_corr", _MODEL),
    "skip_scale": Keyword("skip_scale", _MODEL),
    "branch_scale": Keyword("branch_scale", _MODEL),
    "mixln_alpha": Keyword("mixln_alpha", _MODEL),
    "init_std": Keyword("init_std", _MODEL),
    "beta_k": Keyword("beta_k", _MODEL),
    "config": Keyword("config", _MODEL),
    "spec": Keyword("spec", _MODEL),
    "hf_config": Keyword("hf_config", _MODEL),
    # predict (check's --every thins its table only: no keyword here)
    "every": Keyword("every", (_P,), None, int, 1),
    # check (tolerance keys of sigprop.model.checking.DEFAULT_TOL)
    "trials": Keyword("trials", (_C,), 8, int, 2),
    # (batch default 8, dtype default float32; with a step: the step's batch_size, float64)
    "batch": Keyword("batch", (_C,), None, int, 1),
    "seed": Keyword("seed", (_C,), 0, int, 0),
    "dtype": Keyword("dtype", (_C,), None, str, choices=("float32", "float64")),
    "tol_var": Keyword("forward_var", (_C,), 0.05, float, 0.0),
    "tol_grad": Keyword("grad_var", (_C,), 0.05, float, 0.0),
    "tol_corr": Keyword("corr", (_C,), 0.03, float, 0.0),
    "tol_logit": Keyword("logit_var", (_C,), 0.05, float, 0.0),
    "z": Keyword("z", (_C,), 4.0, float, 0.0),
    "backend": Keyword("backend", (_C,), "numpy", str, choices=("numpy", "torch", "cupy")),
    "device": Keyword("device", (_C,), "cpu", str, choices=("cpu", "cuda")),
    "rng": Keyword("rng", (_C,), "host", str, choices=("host", "device")),
    "dask": Keyword("dask", (_C,), None, str),
    "workers": Keyword("workers", (_C,), None, int),
    # the step (sigprop.model.update; check simulates it, predict and compare refuse it)
    "step": Keyword("step", (_P, _C, _X), None, str, choices=("sgd", "adam", "adamw")),
    "lr": Keyword("lr", (_P, _C, _X), None, float),
    "batch_size": Keyword("batch_size", (_P, _C, _X), None, int),
    "adam_betas": Keyword("adam_betas", (_P, _C, _X)),
    "adam_eps": Keyword("adam_eps", (_P, _C, _X), None, float),
    "weight_decay": Keyword("weight_decay", (_P, _C, _X), None, float),
    # solve_init (arguments of sigprop.solve.solve)
    "target": Keyword("target", (_S,), "unit-variance", str, choices=TARGETS),
    "value": Keyword("value", (_S,), None, float),
    "logit_var": Keyword("logit_var", (_S,), None, float),
    "max_grad_ratio": Keyword("max_ratio", (_S,), None, float),
    "max_layers": Keyword("n_max", (_S,), None, int, 1),
    "tol": Keyword("tol", (_S,), 0.01, float),
    "verify": Keyword("verify", (_S,), True, bool),
    "strict": Keyword("strict", (_S,), False, bool),
    "explain": Keyword("explain", (_S,), False, bool),
}

#: the number of layers when none is given (solve_init's max-depth target searches it instead)
DEFAULT_LAYERS = {_B: 24, _P: 24, _C: 12, _X: 24, _S: 24}


def flag(keyword: str) -> str:
    """The command-line flag of an API keyword: ``"d_model"`` -> ``"--d-model"``."""
    return "--" + keyword.replace("_", "-")


def _signature(fn_name: str) -> inspect.Signature:
    params = []
    for key, kw in KEYWORDS.items():
        if fn_name not in kw.takes or (fn_name == _S and key == "spec"):
            continue
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if key == "spec" else inspect.Parameter.KEYWORD_ONLY
        params.append(inspect.Parameter(key, kind, default=kw.default))
    params.sort(key=lambda p: p.kind)            # spec first
    return inspect.Signature(params)


def _options(fn_name: str, spec, options: dict) -> dict:
    """The keywords given to ``fn_name`` (None dropped), in :data:`KEYWORDS` order, each
    checked as the command line checks its flags; model options are left to the library."""
    if spec is not None:
        options = {"spec": spec, **options}
    known = [k for k, kw in KEYWORDS.items() if fn_name in kw.takes]
    for key in options:
        if key not in known:
            msg = f"no such option: {flag(key)}"
            close = difflib.get_close_matches(flag(key), [flag(k) for k in known])
            if close:
                msg += f" (Possible options: {', '.join(sorted(close))})"
            raise UnknownOption(msg)
    out = {}
    for key in known:
        value = options.get(key, KEYWORDS[key].default)
        if value is not None:
            out[key] = _check(key, value)
    return out


def _check(key: str, value):
    kw = KEYWORDS[key]
    if kw.type is None:
        return value
    bad = f"invalid value for '{flag(key)}': "
    if kw.type is bool:
        if not (isinstance(value, bool) or type(value).__name__ == "bool_"):
            raise DomainError(f"{bad}{value!r} is not a valid boolean")
        return bool(value)
    if kw.type is str:
        if hasattr(value, "value") and isinstance(value.value, str):        # an Enum member
            value = value.value
        if kw.name == "dtype" and not isinstance(value, str):
            value = getattr(value, "__name__", None) or getattr(value, "name", value)  # np.float32, np.dtype
        if not isinstance(value, str) or (kw.choices and value not in kw.choices):
            choices = ", ".join(repr(c) for c in kw.choices)
            raise DomainError(f"{bad}{value!r} is not one of {choices}")
        return value
    number = isinstance(value, (int, float)) or type(value).__module__ == "numpy"
    if isinstance(value, bool) or not number or type(value).__name__ == "bool_":
        raise DomainError(f"{bad}{value!r} is not a valid {'integer' if kw.type is int else 'float'}")
    if kw.type is int:
        if not isinstance(value, int) and not type(value).__name__.startswith(("int", "uint")):    # 4.0 too
            raise DomainError(f"{bad}{value!r} is not a valid integer")
        value = int(value)
    else:
        value = float(value)
    if kw.lo is not None and value < kw.lo:
        raise DomainError(f"{bad}{value} is not in the range x>={kw.type(kw.lo)}")
    return value


# ---------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------

def load_spec(spec):
    """A resolved model (:class:`sigprop.model.spec.Model`) from ``spec``: a Model; a path
    to a JSON file holding the model object or an object with key ``"model"`` (a trace, a
    check or solve-init output: what ``--spec FILE`` reads); such an object as a dict; or a
    result of this module (its ``.model``).  Malformed input raises DomainError naming the
    first bad value."""
    from sigprop.model.spec import Model

    if isinstance(spec, Model):
        return spec
    if isinstance(getattr(spec, "model", None), Model):
        return spec.model
    if isinstance(spec, (str, os.PathLike)):
        return Model.load(spec)
    if isinstance(spec, dict):
        obj = spec["model"] if "model" in spec and "layers" not in spec else spec
        return Model.from_json(obj, "model")
    raise DomainError(f"spec must be a model (Model, dict with the model object, or a JSON file's path), "
                      f"got {type(spec).__name__}")


def _model(opts: dict, default_layers: int | None):
    """One model from the model keywords in ``opts`` (those of :data:`KEYWORDS` with a model
    option's name): defaults < config < keywords, or ``spec`` alone (the commands' resolution,
    :func:`sigprop.model.options.build_model`)."""
    from sigprop.model.options import build_model as resolve

    return resolve(_model_opts(opts), default_layers)


def _model_opts(opts: dict) -> dict:
    out = {k: v for k, v in opts.items() if KEYWORDS[k].takes is _MODEL}
    if out.get("spec") is not None and len(out) == 1:    # (with other options: refused by the resolution)
        out["spec"] = load_spec(out["spec"])
    return out


def _models(opts: dict, default_layers: int | None) -> list:
    from sigprop.model.options import build_models as resolve

    opts = _model_opts(opts)
    if isinstance(opts.get("arch"), (list, tuple)):
        opts["arch"] = ",".join(map(str, opts["arch"]))
    return resolve(opts, default_layers)


def build_model(spec=None, **options):
    """Resolve model options (those of ``sigprop predict``; ``layers`` defaults to 24) into a
    :class:`sigprop.model.spec.Model`, or load a resolved one from ``spec``."""
    return _model(_options(_B, spec, options), DEFAULT_LAYERS[_B])


def build_models(spec=None, **options) -> list:
    """One model per architecture, as ``sigprop compare`` builds them: ``arch`` is a
    comma-separated string or a list of names (default: the config file's ``arch``, else
    preln, postln, dslm, deepnorm, lns, mixln), each with its own default init unless
    ``init`` is given; ``spec`` gives one model."""
    return _models(_options(_X, spec, options), DEFAULT_LAYERS[_X])


# ---------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------

class Prediction:
    """The layer-by-layer prediction of one model (``sigprop predict``).

    ``model``: the resolved :class:`sigprop.model.spec.Model`.  ``points``: every trace
    point, a list of :class:`sigprop.model.predict.StreamPoint` (the input, then one per
    sublayer: ``layer``, ``sublayer``, ``mean``, ``var``, ``corr``, ``gvar``, ``gcorr``,
    ``logit_var``, and the natural logarithms ``log_var``, ``log_gvar``).  ``summary``: the
    trace's summary dict (final forward variance, growth laws, gradient ratio, correlation
    at the top, largest logit variance, ``verdict``).  ``every``: the thinning of
    ``to_json()`` / ``to_dict()`` (the ``every`` keyword of :func:`predict`; None: every
    layer)."""

    def __init__(self, model, points: list, every: int | None = None):
        self.model = model
        self.points = points
        self.every = every
        self._summary = None

    @property
    def summary(self) -> dict:
        if self._summary is None:
            from sigprop.model.trace import summary

            self._summary = summary(self.points)
        return self._summary

    @property
    def verdict(self) -> str:
        """The summary's plain-words verdict ("stable: ...", "drifting: ...", "unstable: ...")."""
        return self.summary["verdict"]

    def to_dict(self, every: int | None = None) -> dict:
        """The trace object (schema ``sigprop.trace/1``)."""
        from sigprop.model.trace import trace

        return trace(self.model, self.points, (self.every or 1) if every is None else _check("every", every))

    def to_json(self, every: int | None = None) -> str:
        """The trace as JSON text: ``print(p.to_json())`` writes what ``sigprop predict
        --json`` writes for the same options."""
        from sigprop.model.trace import trace_text

        return trace_text(self.model, self.points, (self.every or 1) if every is None else _check("every", every))

    def __repr__(self) -> str:
        return f"<Prediction {self.model.arch}, {self.model.n_layers} layers: {self.verdict}>"


class CheckResult:
    """A whole-model Monte Carlo compared with the prediction (``sigprop check``).

    ``passed`` (every point within tolerance), ``errors`` (median / p90 / max of each
    moment's error), ``failures`` (one line per point outside tolerance), ``r2`` (R^2 of log
    predicted vs log measured variance), ``tolerance``, ``predicted`` and ``measured`` (the
    points as in the check object), ``seed``, ``trials``, ``batch``; ``measurement``: the
    :class:`sigprop.mc.model.ModelMeasurement`; ``prediction``: the :class:`Prediction` it
    was compared with; ``exit_code``: 0 if passed, else 1 (the command's)."""

    def __init__(self, model, points: list, measurement, result, seed: int, trials: int, batch: int):
        self.model = model
        self.points = points
        self.measurement = measurement
        self.result = result
        self.seed, self.trials, self.batch = seed, trials, batch

    passed = property(lambda self: self.result.passed)
    errors = property(lambda self: self.result.errors)
    failures = property(lambda self: self.result.failures)
    r2 = property(lambda self: self.result.r2)
    tolerance = property(lambda self: self.result.tolerance)
    predicted = property(lambda self: self.result.predicted)
    measured = property(lambda self: self.result.measured)
    exit_code = property(lambda self: 0 if self.result.passed else 1)

    @property
    def prediction(self) -> Prediction:
        return Prediction(self.model, self.points)

    def to_dict(self) -> dict:
        """The check object (schema ``sigprop.check/1``)."""
        from sigprop.model.checking import check_object

        return check_object(self.model, self.result, self.measurement, self.seed, self.trials, self.batch)

    def to_json(self) -> str:
        """The check object as JSON text, as ``sigprop check --json`` prints it."""
        return json.dumps(self.to_dict())

    def __repr__(self) -> str:
        return (f"<CheckResult {self.model.arch}, {self.model.n_layers} layers, seed {self.seed}: "
                f"{'pass' if self.passed else 'outside tolerance'}>")


class StepResult:
    """The Monte Carlo of one optimizer step from the initialisation (``sigprop check --step``;
    no prediction of the step exists, docs/update.md).

    ``measurement``: the :class:`sigprop.mc.step.StepMeasurement` (per point ``var``, ``rel``,
    ``fresh_var``, ``fresh_rel`` and their ``*_se``; ``modules``, ``weights``, ``logits``);
    ``step``: the step's settings; ``points`` and ``summary``: the measured points and the
    summary of the step object; ``seed``, ``trials``; ``exit_code`` 0 (nothing is judged)."""

    def __init__(self, model, measurement, step: dict):
        self.model, self.measurement, self.step = model, measurement, step
        self._obj = None

    seed = property(lambda self: self.measurement.seed)
    trials = property(lambda self: self.measurement.trials)
    exit_code = 0

    def to_dict(self) -> dict:
        """The step object (schema ``sigprop.step/1``)."""
        if self._obj is None:
            from sigprop.mc.step_check import step_object

            self._obj = step_object(self.model, self.measurement, self.step)
            if "hf" in self.model.notes:
                self._obj["hf"] = self.model.notes["hf"]
        return self._obj

    points = property(lambda self: self.to_dict()["measured"])
    summary = property(lambda self: self.to_dict()["summary"])

    def to_json(self) -> str:
        """The step object as JSON text, as ``sigprop check --step ... --json`` prints it."""
        return json.dumps(self.to_dict())

    def __repr__(self) -> str:
        s = self.summary
        return (f"<StepResult {self.model.arch}, {self.model.n_layers} layers, {self.step['optimizer']} lr "
                f"{self.step['lr']:g}, seed {self.seed}: rel at the top {s['update_rel_top']:.4g}>")


def _step(opts: dict) -> dict | None:
    """The step settings of the step keywords in ``opts`` (None: none given)."""
    from sigprop.model.update import settings

    return settings({k: opts[k] for k in _STEP if k in opts})


class SolveResult:
    """The solution of ``sigprop solve-init``.

    ``solution``: the library's result (:class:`sigprop.solve.solver.Solution`, or
    :class:`sigprop.solve.depth.DepthResult` for the max-depth target), whose attributes
    are also reachable here (``tol``, ``sublayers``, ``max_depth``, ``evaluations``, ...).
    ``model``: the solved model (None when none could be solved; pass the result or its
    model to :func:`predict` or :func:`check`); ``feasible`` and ``reason``; ``steps``: the
    derivation (a list of :class:`sigprop.solve.explain.Step`) when ``explain=True``, else
    None; ``exit_code``: 0 if feasible, else 1 (the command's)."""

    def __init__(self, solution, steps=None):
        self.solution = solution
        self.steps = steps

    model = property(lambda self: self.solution.model)
    target = property(lambda self: self.solution.target)
    feasible = property(lambda self: bool(self.solution.feasible))
    reason = property(lambda self: self.solution.reason)
    exit_code = property(lambda self: 0 if self.solution.feasible else 1)

    def __getattr__(self, name):
        if name.startswith("_") or name in ("solution", "steps"):
            raise AttributeError(name)
        return getattr(self.solution, name)

    @property
    def prediction(self) -> Prediction | None:
        """The prediction of the solved model made while verifying it (None if not verified)."""
        pts = getattr(self.solution, "points", None)
        return None if not pts or self.model is None else Prediction(self.model, pts)

    def to_dict(self) -> dict:
        """The solution object (schema ``sigprop.solve/1``, with the resolved model under
        key ``"model"``)."""
        # the object is built by the command's renderer (it imports the command line's package)
        from sigprop.cli._render_solve import solution_json

        return solution_json(self.solution, self.steps)

    def to_json(self) -> str:
        """The solution object as JSON text, as ``sigprop solve-init --json`` prints it
        (written to a file, ``predict(spec=FILE)`` and ``sigprop predict --spec FILE`` read it)."""
        return json.dumps(self.to_dict())

    def __repr__(self) -> str:
        return f"<SolveResult {self.target}, {self.solution.arch}: {'feasible' if self.feasible else 'infeasible'}>"


class Comparison:
    """One row per architecture (``sigprop compare``): ``rows`` is a list of
    :class:`sigprop.compare.Row` (``arch``, ``init``, ``model``, ``points``, ``summary``,
    ``label``); iterating or indexing the comparison gives the rows."""

    def __init__(self, rows: list):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    def to_dict(self) -> dict:
        """The comparison object (schema ``sigprop.compare/1``)."""
        from sigprop.compare import to_json

        return to_json(self.rows)

    def to_json(self) -> str:
        """The comparison as JSON text, as ``sigprop compare --json`` prints it."""
        return json.dumps(self.to_dict())

    def __repr__(self) -> str:
        return f"<Comparison {', '.join(r.arch for r in self.rows)}>"


# ---------------------------------------------------------------------------------------
# the commands
# ---------------------------------------------------------------------------------------

def predict(spec=None, **options) -> Prediction:
    """Predict forward variance, token correlation, logit variance and gradient variance,
    layer by layer (``sigprop predict``).

    Takes a model: the model options (``arch``, ``init``, ``layers`` (default 24), ``d_model``,
    ``heads``, ... as in :data:`KEYWORDS`; ``config``: a TOML file or dict of them), or
    ``spec`` (positional or keyword): a resolved model, see :func:`load_spec`.  ``every``:
    keep every K-th layer in ``to_json()`` (default None: every layer, as ``--json``).  A
    model whose softmax saturates beyond the attention rule's domain is predicted up to the layer before it (``summary["saturation_layer"]``,
    verdict "unstable"), as by the command.  Returns a :class:`Prediction`."""
    from sigprop.model.predict import predict as run

    opts = _options(_P, spec, options)
    if _step(opts) is not None:
        from sigprop.model.update import refuse_prediction

        refuse_prediction("predict")
    model = _model(opts, DEFAULT_LAYERS[_P])
    return Prediction(model, run(model, stop_at_saturation=True), opts.get("every"))


def check(spec=None, **options):
    """Simulate the whole model with NumPy and compare every point with the prediction
    (``sigprop check``).

    The model as for :func:`predict` (``layers`` defaults to 12); ``trials`` (8, at least 2),
    ``batch`` (8), ``seed`` (0), ``dtype`` ("float32" or "float64"); tolerances ``tol_var``
    and ``tol_grad`` (relative, 0.05), ``tol_corr`` (absolute, 0.03), ``tol_logit``
    (relative, 0.05) and ``z`` (4: a point also passes within z standard errors).  A check
    outside tolerance returns a result with ``passed`` False; a model whose softmax saturates
    (its prediction incomplete) is bad input, as for the command.  Returns a :class:`CheckResult`.

    With ``step`` ("sgd", "adam", "adamw") and ``lr`` (and ``batch_size`` (8), ``adam_betas``
    ((0.9, 0.999) or "0.9,0.999"), ``adam_eps`` (1e-8), ``weight_decay`` (0)): the Monte Carlo
    of one optimizer step from the initialisation, ``trials`` draws, ``dtype`` float64 by
    default, NumPy only (``batch``, the tolerances and the backend keywords are refused).
    Returns a :class:`StepResult`."""
    from sigprop.model.checking import check_model, tolerances

    opts = _options(_C, spec, options)
    step = _step(opts)
    if step is not None:
        return _check_step(opts, step)
    opts.setdefault("batch", 8)
    opts.setdefault("dtype", "float32")
    tol = tolerances({KEYWORDS[k].name: opts[k] for k in ("tol_var", "tol_grad", "tol_corr", "tol_logit", "z")})
    model = _model(opts, DEFAULT_LAYERS[_C])
    points, meas, res = check_model(model, tol, trials=opts["trials"], batch=opts["batch"], seed=opts["seed"],
                                    dtype=opts["dtype"], backend=opts["backend"], device=opts["device"],
                                    rng=opts["rng"], dask=opts.get("dask"), workers=opts.get("workers"))
    return CheckResult(model, points, meas, res, opts["seed"], opts["trials"], opts["batch"])


def _check_step(opts: dict, step: dict) -> StepResult:
    from sigprop.mc import step_check

    step_check.require_step_options(
        opts.get("batch"), {k: (opts.get(k, KEYWORDS[k].default), KEYWORDS[k].default)
                            for k in ("backend", "device", "rng", "dask", "workers")},
        {KEYWORDS[k].name: opts[k] for k in ("tol_var", "tol_grad", "tol_corr", "tol_logit", "z")})
    model = _model(opts, DEFAULT_LAYERS[_C])
    meas = step_check.run(model, step, trials=opts["trials"], seed=opts["seed"],
                          dtype=opts.get("dtype", "float64"))
    return StepResult(model, meas, step)


def solve_init(**options) -> SolveResult:
    """Derive the init and residual scaling that conserve the moments, from the rules
    (``sigprop solve-init``).

    ``target``: "unit-variance" (default), "unit-forward", "logit-var" (needs ``value``) or
    "max-depth" (needs ``max_grad_ratio``; ``max_layers`` caps the search); ``logit_var``
    (unit targets, default 1), ``tol`` (0.01), ``verify`` (True: predict the solved model and
    judge the target on it), ``strict`` (unit-variance: the gradient must also be within
    ``tol`` of 1), ``explain`` (keep the derivation steps).  The model options as for
    :func:`predict` except ``spec`` (the solve builds the model); ``layers`` defaults to 24
    except for max-depth, which searches it.  An infeasible target returns a result with
    ``feasible`` False.
    Returns a :class:`SolveResult`."""
    from sigprop.solve import solve
    from sigprop.solve import steps as get_steps

    from sigprop.model.options import solve_options

    opts = _options(_S, None, options)
    target = opts["target"]
    arch, init, merged = solve_options({k: v for k, v in opts.items() if KEYWORDS[k].takes is _MODEL}, target,
                                       DEFAULT_LAYERS[_S])
    sol = solve(target, arch=arch, init=init,
                **{KEYWORDS[k].name: opts.get(k) for k in ("logit_var", "value", "max_grad_ratio", "max_layers",
                                                            "tol", "verify", "strict")},
                **merged)
    return SolveResult(sol, get_steps(sol) if opts["explain"] else None)


def compare(spec=None, **options) -> Comparison:
    """Compare architectures under the same model options, one prediction each
    (``sigprop compare``): ``arch`` is a comma-separated string or a list (default: preln,
    postln, dslm, deepnorm, lns, mixln; a ``config`` file's ``arch`` when it names one), each
    with its own default init unless ``init`` is given; ``layers`` defaults to 24; ``spec``
    gives a single row.  Returns a :class:`Comparison`."""
    from sigprop.compare import compare as rows

    opts = _options(_X, spec, options)
    if _step(opts) is not None:
        from sigprop.model.update import refuse_prediction

        refuse_prediction("compare")
    return Comparison(rows(_models(opts, DEFAULT_LAYERS[_X])))


for _fn in (build_model, build_models, predict, check, solve_init, compare):
    _fn.__signature__ = _signature(_X if _fn is build_models else _fn.__name__)
del _fn

__all__ = ["predict", "check", "solve_init", "compare", "build_model", "build_models", "load_spec",
           "Prediction", "CheckResult", "StepResult", "SolveResult", "Comparison", "KEYWORDS", "UnknownOption"]
