"""The component interface of the Monte Carlo checker, the driver that measures it, and the
check of one configuration against its rule (:func:`check`, `sigprop check-component`).

A :class:`Component` draws its random weights, runs forward on a batch ``X`` of shape
(B, L, d_in) and runs a *hand-written* backward from an upstream gradient of the output's
shape.  Every backward is checked against finite differences in the tests.

:func:`measure` samples inputs with the requested mean/variance/token correlation and
upstream gradients with the requested variance/correlation (independent of the inputs),
repeats over ``runs`` independent weight draws, and returns pooled moments with standard
errors: output mean/var/cov, and input-gradient var/cov.

:func:`check` takes one configuration as a user gives it (component name and KEY=VALUE
parameters, rule and simulation parameters mixed), validates it (names, ranges, integers,
and the memory the simulation would need, estimated from its shapes, against the memory
available), evaluates the rule, measures the component and judges every moment:
|predicted - measured| <= max(tolerance, z x SE), with relative tolerances for the mean (in
units of the predicted standard deviation) and the variances, absolute ones for the
correlations.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from sigprop.errors import DomainError
from sigprop.mc.backend import Backend, Rng, numpy_backend
from sigprop.mc.sampling import correlated
from sigprop.mc.stats import Moments, pool, raw_moments
from sigprop.rules.base import Param
from sigprop.state import Backward, Forward

#: simulation parameters most components take (tokens per sequence, feature width)
SEQ = Param("L", "tokens per sequence of the simulation", 16, lo=2, integer=True)
WIDTH = Param("d", "feature width of the simulation", 64, lo=1, integer=True)


class Component:
    """Subclass per component (one module each in :mod:`sigprop.mc.components`)."""

    name: str = ""
    #: name of the rule in :data:`sigprop.rules.REGISTRY` this simulates
    rule: str = ""
    #: written against the array API (runs on every backend of :mod:`sigprop.mc.backend`);
    #: False: NumPy arrays only
    array_api: bool = False
    #: simulation-only parameters accepted besides the rule's, with their defaults and ranges
    #: (a rule parameter of the same name, e.g. attention's L, takes precedence)
    sim_params: tuple[Param, ...] = (SEQ,)
    #: whether the component has a (d_in, d_out) weight matrix (memory estimate)
    weights: bool = True

    def dims(self, params: dict) -> tuple[int, int, int]:
        """(L, d_in, d_out) of one sample."""
        raise NotImplementedError

    def sample_weights(self, rng, params: dict, dtype) -> dict:
        """Weights drawn from ``rng`` (a :class:`sigprop.mc.backend.Rng` or a NumPy Generator),
        arrays of its backend; ``dtype`` a NumPy float dtype."""
        return {}

    def forward(self, X, W: dict, params: dict, rng):
        """Return (Y, cache); X an array of any backend (see :attr:`array_api`)."""
        raise NotImplementedError

    def backward(self, GY: np.ndarray, cache) -> np.ndarray:
        """dLoss/dX from dLoss/dY, using the cache of the forward call."""
        raise NotImplementedError

    def flops(self, params: dict, batch: int) -> float:
        """Floating-point work of one forward + input-gradient backward (timing reports):
        by default one (B L, d_in) x (d_in, d_out) product each way."""
        L, din, dout = self.dims(params)
        return 4.0 * batch * L * din * dout

    def memory(self, params: dict, batch: int) -> float:
        """Elements held at once by one weight draw (an estimate from the shapes, for refusing
        sizes beyond memory up front): by default a (d_in, d_out) weight, and the input, output,
        both gradients and the forward cache of a (batch, L, width) batch."""
        L, din, dout = self.dims(params)
        return (float(din) * dout if self.weights else 0.0) + 3.0 * batch * L * (din + dout)

    #: rule parameters that :meth:`derived` supplies when the user does not give them
    derives: tuple[str, ...] = ()

    def derived(self, rule_params: dict, sim: dict) -> dict:
        """Rule parameters that follow from the simulation's (e.g. the embedding's collision
        probability from its token distribution), where the user did not give them."""
        return {}


@dataclass(frozen=True)
class Measurement:
    x: Moments          # output of the component
    g: Moments          # gradient at the component input
    runs: int
    batch: int
    seconds: float
    extra: dict = field(default_factory=dict)


def _backend_for(component: Component, backend: Backend | None) -> Backend:
    """``backend`` (default NumPy), refused with DomainError where ``component`` has no
    array-API simulation."""
    bk = backend or numpy_backend()
    if not (bk.is_numpy or component.array_api):
        raise DomainError(f"component {component.name} runs on the numpy backend only")
    return bk


def measure(component: Component, params: dict, x: Forward, g: Backward, *, runs: int = 8,
            batch: int = 8, seed: int = 0, dtype=np.float32, backend: Backend | None = None,
            stream: str = "host") -> Measurement:
    """``backend``: where the arrays live (default NumPy); ``stream``: the random stream
    (:class:`sigprop.mc.backend.Rng`: 'host', the same numbers on every backend, or 'device')."""
    bk = _backend_for(component, backend)
    rng = Rng(seed, bk, stream)
    L, din, dout = component.dims(params)
    xs, gs = [], []
    t0 = time.perf_counter()
    for _ in range(runs):
        W = component.sample_weights(rng, params, dtype)
        X = correlated(rng, (batch, L, din), x.mean, x.var, x.corr, dtype)
        Y, cache = component.forward(X, W, params, rng)
        GY = correlated(rng, Y.shape, 0.0, g.var, g.corr, dtype)
        GX = component.backward(GY, cache)
        xs.append(raw_moments(Y))
        gs.append(raw_moments(GX))
    dt = time.perf_counter() - t0
    return Measurement(pool(np.array(xs)), pool(np.array(gs), centred=False), runs, batch, dt)


# ---------------------------------------------------------------------------------------
# one configuration against its rule
# ---------------------------------------------------------------------------------------

MOMENTS = ("x_mean", "x_var", "x_corr", "g_var", "g_corr")


def moments_of(x, g, se: bool = False) -> dict:
    """{moment: float} of :data:`MOMENTS` from a forward and a backward state (or measured
    :class:`~sigprop.mc.stats.Moments`); ``se``: their standard errors instead."""
    sfx = "_se" if se else ""
    return {"x_mean": float(getattr(x, "mean" + sfx)), "x_var": float(getattr(x, "var" + sfx)),
            "x_corr": float(getattr(x, "corr" + sfx)), "g_var": float(getattr(g, "var" + sfx)),
            "g_corr": float(getattr(g, "corr" + sfx))}

#: default tolerances of :func:`check`: relative for the mean (in predicted standard
#: deviations) and the forward variance (``var``), and for the gradient variance (``grad``);
#: absolute for the correlations; ``z``: also pass within z standard errors
DEFAULT_TOL = {"var": 0.05, "grad": 0.05, "corr": 0.03, "z": 4.0}


class ComponentCheck(NamedTuple):
    """The result of :func:`check` (every dict keyed by :data:`MOMENTS`)."""

    component: str
    params: dict            # the simulation's parameters (rule parameters with defaults included)
    seed: int
    dtype: str
    trials: int
    batch: int
    predicted: dict
    measured: dict
    se: dict
    errors: dict            # the published error metric (sigprop.mc.sweep.errors), fractions
    tolerance: dict
    passed_by_moment: dict
    passed: bool
    seconds: float


def _as_number(p: Param, value, where: str):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DomainError(f"{where}: {p.name} must be a number, got {value!r}")
    p.check(value)
    if p.integer:
        return int(value)
    return value


def resolve_params(component: Component, rule, params: dict, batch: int | None = None,
                   dtype=np.float32) -> tuple[dict, dict]:
    """(rule parameters, simulation parameters) for ``params`` as a user gives them (rule and
    simulation parameters mixed): unknown names, values outside a parameter's range and
    non-integers where an integer is needed raise DomainError; integral floats (``1e3``)
    become integers; defaults fill the rest (the simulation sees the rule's too).  With
    ``batch``: also refuse sizes whose simulation would not fit in memory
    (:func:`check_memory`), before anything is computed from them."""
    name = component.name
    rule_p = {p.name: p for p in rule.params}
    sim_p = {p.name: p for p in component.sim_params if p.name not in rule_p}
    extra = set(params) - set(rule_p) - set(sim_p)
    if extra:
        raise DomainError(f"{name}: unknown parameter(s) {', '.join(sorted(extra))}; rule parameters: "
                          f"{', '.join(rule_p) or '-'}; simulation: {', '.join(sim_p) or '-'}")
    rule_params = {k: _as_number(rule_p[k], v, name) for k, v in params.items() if k in rule_p}
    sim = {k: _as_number(sim_p[k], v, name) for k, v in params.items() if k in sim_p}
    sim = {**{k: p.default for k, p in sim_p.items() if p.default is not None}, **sim}
    missing = [k for k, p in rule_p.items()
               if p.default is None and k not in rule_params and k not in component.derives]
    if missing:
        raise DomainError(f"{name}: give {', '.join(missing)} (-p KEY=VALUE); rule parameters: "
                          f"{', '.join(f'{k} {p.describe()}' for k, p in rule_p.items())}")
    defaults = {k: p.default for k, p in rule_p.items() if p.default is not None}
    if batch is not None:
        check_memory(component, {**sim, **defaults, **rule_params}, batch, dtype)
    for k, v in component.derived(rule_params, sim).items():
        rule_params.setdefault(k, v)
    return rule_params, {**sim, **defaults, **rule_params}


def available_memory() -> float | None:
    """Bytes of memory available to a new allocation (Linux: MemAvailable; else the physical
    memory), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PHYS_PAGES")) * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(component: Component, sim: dict, batch: int, dtype) -> None:
    """DomainError when one weight draw of the simulation would need more memory than is
    available (estimated from the shapes, :meth:`Component.memory`)."""
    need = component.memory(sim, batch) * np.dtype(dtype).itemsize
    have = available_memory()
    if not math.isfinite(need) or (have is not None and need > have):
        shown = f"{need / 2**30:.3g} GiB" if math.isfinite(need) and need < 1e30 else "beyond any machine"
        raise DomainError(f"{component.name}: these sizes need about {shown} of memory per weight draw"
                          + (f", more than the {have / 2**30:.3g} GiB available" if have is not None else "")
                          + ": smaller dimensions or batch")


def judge(px: Forward, pg: Backward, meas: Measurement, tol: dict | None = None) -> tuple[dict, bool]:
    """Per moment: is the prediction within tolerance of the measurement?  ``tol``: see
    :data:`DEFAULT_TOL`.  Returns ({moment: bool}, all of them)."""
    from sigprop.model.checking import within

    t = {**DEFAULT_TOL, **(tol or {})}
    pred, got, se = moments_of(px, pg), moments_of(meas.x, meas.g), moments_of(meas.x, meas.g, se=True)
    out = {}
    for k in MOMENTS:
        p, m, s = pred[k], got[k], se[k]
        if k in ("x_var", "g_var"):
            tk, absolute = t["var" if k == "x_var" else "grad"], False
        elif k == "x_mean":
            tk, absolute = t["var"] * math.sqrt(abs(float(px.var))), True
        else:
            tk, absolute = t["corr"], True
        out[k] = bool(within(p, m, s, tk, t["z"], absolute))
    return out, all(out.values())


def check(name: str, params: dict, x: Forward, g: Backward, *, trials: int = 8, batch: int = 8,
          seed: int = 0, dtype=np.float32, tol: dict | None = None, backend: Backend | None = None,
          stream: str = "host") -> ComponentCheck:
    """Evaluate the rule of component ``name`` at ``params`` (rule and simulation parameters
    mixed, see :func:`resolve_params`), input ``x`` and upstream gradient ``g``; measure the
    component over ``trials`` independent weight draws of ``batch`` sequences; judge every
    moment (:func:`judge`).  Bad names, values or sizes raise DomainError before anything is
    simulated.  ``backend`` and ``stream`` as for :func:`measure`."""
    from sigprop import rules as R
    from sigprop.mc import components as C
    from sigprop.mc.sweep import errors
    from sigprop.model.checking import tolerances

    comp = C.get(name)
    _backend_for(comp, backend)
    rule = R.get(comp.rule)
    t = tolerances(tol, DEFAULT_TOL)
    rule_params, sim = resolve_params(comp, rule, params, batch, dtype)
    px, pg = rule.evaluate(x, g, **rule_params)
    meas = measure(comp, sim, x, g, runs=trials, batch=batch, seed=seed, dtype=dtype, backend=backend,
                   stream=stream)
    by_moment, ok = judge(px, pg, meas, t)
    return ComponentCheck(
        component=name, params=sim, seed=seed, dtype=np.dtype(dtype).name, trials=meas.runs, batch=meas.batch,
        predicted=moments_of(px, pg), measured=moments_of(meas.x, meas.g), se=moments_of(meas.x, meas.g, se=True),
        errors={k: float(v) for k, v in errors(px, pg, meas).items()},
        tolerance=t, passed_by_moment=by_moment, passed=ok, seconds=meas.seconds)
