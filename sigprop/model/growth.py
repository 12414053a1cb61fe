"""Name the growth law of a moment along depth.

Candidates (theory.md section 3): constant; linear in depth (Pre-LN forward variance);
harmonic, i.e. linear in the harmonic number H_l (LayerNorm Scaling); hyperbolic, i.e.
proportional to 1/l (Pre-LN gradient, counted from the input); exponential (Post-LN
gradient).  Each law is a least-squares fit of a linear model in a transformed variable; the
law with the best R^2 wins, ties going to the simpler law, and a series whose total change is
below 10% is "constant".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# order = preference on ties (simpler first)
LAWS = ("constant", "linear", "harmonic", "hyperbolic", "exponential")


@dataclass(frozen=True)
class Growth:
    law: str
    r2: float
    slope: float          # per unit of the law's variable (per layer for linear/exponential)
    ratio: float          # last / first

    def describe(self, what: str) -> str:
        if self.law == "constant":
            return f"{what} stays constant (x{self.ratio:.3g} overall)"
        if self.law == "exponential":
            return f"{what} grows exponentially (x{np.exp(self.slope):.4g} per layer, x{self.ratio:.3g} overall)" \
                if self.slope > 0 else f"{what} decays exponentially (x{np.exp(self.slope):.4g} per layer, x{self.ratio:.3g} overall)"
        return f"{what} is {self.law} in depth (x{self.ratio:.3g} overall)"


def _r2(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    A = np.vstack([np.ones_like(x), x]).T
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ coef
    ss = np.sum((y - y.mean()) ** 2)
    return (1.0 - np.sum(resid**2) / ss if ss > 0 else 1.0), float(coef[1])


def classify(depth: np.ndarray, log_values: np.ndarray) -> Growth:
    """``depth``: 1..N (layers, possibly fractional for sublayers); ``log_values``: natural log
    of the moment (log space so exploding series are fine)."""
    depth = np.asarray(depth, dtype=float)
    lv = np.asarray(log_values, dtype=float)
    ok = np.isfinite(lv)
    depth, lv = depth[ok], lv[ok]
    if len(lv) < 3:
        return Growth("constant", 1.0, 0.0, 1.0)
    ratio = float(np.exp(np.clip(lv[-1] - lv[0], -700, 700)))
    if np.max(lv) - np.min(lv) < np.log(1.1):
        return Growth("constant", 1.0, 0.0, ratio)
    # linear-scale fits on values normalised by their maximum (safe for huge values)
    y = np.exp(lv - lv.max())
    harmonic = np.cumsum(1.0 / np.maximum(depth, 1.0))
    cands = {
        "linear": _r2(depth, y),
        "harmonic": _r2(harmonic, y),
        "hyperbolic": _r2(1.0 / np.maximum(depth, 1e-9), y),
        "exponential": _r2(depth, lv),
    }
    best = max(cands, key=lambda k: (round(cands[k][0], 4), -LAWS.index(k)))
    r2, slope = cands[best]
    return Growth(best, float(r2), slope, ratio)
