"""The component interface of the Monte Carlo checker, and the driver that measures it.

A :class:`Component` draws its random weights, runs forward on a batch ``X`` of shape
(B, L, d_in) and runs a *hand-written* backward from an upstream gradient of the output's
shape.  Every backward is checked against finite differences in the tests.

:func:`measure` samples inputs with the requested mean/variance/token correlation and
upstream gradients with the requested variance/correlation (independent of the inputs),
repeats over ``runs`` independent weight draws, and returns pooled moments with standard
errors: output mean/var/cov, and input-gradient var/cov.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from sigprop.errors import DomainError
from sigprop.mc.backend import Backend, Rng, numpy_backend
from sigprop.mc.sampling import correlated
from sigprop.mc.stats import Moments, pool, raw_moments
from sigprop.state import Backward, Forward


class Component:
    """Subclass per component (one module each in :mod:`sigprop.mc.components`)."""

    name: str = ""
    #: name of the rule in :data:`sigprop.rules.REGISTRY` this simulates
    rule: str = ""
    #: simulation-only parameters accepted besides the rule's (e.g. sequence length L)
    sim_params: tuple[str, ...] = ("L",)
    #: written against the array API (runs on every backend of :mod:`sigprop.mc.backend`);
    #: False: NumPy arrays only
    array_api: bool = False

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


@dataclass(frozen=True)
class Measurement:
    x: Moments          # output of the component
    g: Moments          # gradient at the component input
    runs: int
    batch: int
    seconds: float
    extra: dict = field(default_factory=dict)


def measure(component: Component, params: dict, x: Forward, g: Backward, *, runs: int = 8,
            batch: int = 8, seed: int = 0, dtype=np.float32, backend: Backend | None = None,
            stream: str = "host") -> Measurement:
    """``backend``: where the arrays live (default NumPy); ``stream``: the random stream
    (:class:`sigprop.mc.backend.Rng`: 'host', the same numbers on every backend, or 'device')."""
    bk = backend or numpy_backend()
    if not (bk.is_numpy or component.array_api):
        raise DomainError(f"component {component.name} runs on the numpy backend only")
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
