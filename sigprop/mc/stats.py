"""Moment estimators over arrays of shape (B, L, d).

Per call we return *sums* (first moment, second moment, cross-token moment), so that
independent runs can be pooled and a standard error taken from their spread.

Cross-token moment: with S the sum over tokens, mean over (batch, feature) of
(S^2 - sum_tokens x^2) / (L (L - 1)): the average product of two different tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _sums(x, bk):
    """(B, d) token sums in float64 and the float64 total of the squares, from partial sums
    in x's precision (per (sequence, feature) over L tokens, per token over d features)."""
    xp = bk.xp
    B, L, d = x.shape
    rows = xp.reshape(x, (B * L, d))
    s = xp.astype(xp.sum(x, axis=1), xp.float64)
    return s, float(xp.sum(bk.rowdot(rows, rows), dtype=xp.float64))


def raw_moments(x) -> np.ndarray:
    """[E x, E x^2, E x_i x_j (i != j)] of one array (of any backend), accumulated in float64;
    a host NumPy array.

    No float64 copy of x: partial sums in x's precision over L or d terms (relative error
    ~1e-7 in float32), float64 over those.  Where the mean is not small against the root mean
    square (mean^2 > 1e-3 E x^2), the variance and covariance would come out of a cancellation
    that magnifies that error, so the sums are taken again about c = the mean:
    E x^2 = E y^2 + 2 c E y + c^2 with y = x - c, and likewise for the cross-token moment."""
    from sigprop.mc.backend import backend_of

    bk = backend_of(x)
    xp = bk.xp
    B, L, d = x.shape
    n = B * L * d
    s, ssq = _sums(x, bk)
    m1, sq = float(xp.sum(s)) / n, ssq / n
    c = 0.0
    if m1 * m1 > 1e-3 * sq:
        c = xp.asarray(m1, dtype=x.dtype, device=bk.device)   # the mean rounded to x's dtype
        s, ssq = _sums(x - c, bk)
        c = float(c)
    my, sqy = float(xp.sum(s)) / n, ssq / n                  # moments of y = x - c
    cross_y = (_dot_all(s, bk) / (B * d) - sqy * L) / (L * (L - 1)) if L > 1 else np.nan
    shift = 2.0 * c * my + c * c
    return np.array([c + my, sqy + shift, cross_y + shift])


def _dot_all(s, bk) -> float:
    """sum of s * s over all entries (float64)."""
    if bk.is_numpy:
        return float(np.einsum("bd,bd->", s, s))
    return float(bk.xp.sum(s * s))


@dataclass(frozen=True)
class Moments:
    """Pooled moments with standard errors (from the spread across independent runs)."""

    mean: float
    var: float
    cov: float
    mean_se: float
    var_se: float
    cov_se: float

    @property
    def corr(self) -> float:
        return self.cov / self.var if self.var > 0 else float("nan")

    @property
    def corr_se(self) -> float:
        return self.cov_se / self.var if self.var > 0 else float("nan")


def pool(raw: np.ndarray, centred: bool = True) -> Moments:
    """Pool per-run raw moments (runs, 3).  ``centred=False`` takes the mean as known 0
    (gradients), which removes the noise of estimating it."""
    raw = np.asarray(raw, dtype=np.float64)
    n = raw.shape[0]
    mean = raw.mean(axis=0)
    se = raw.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.full(3, np.nan)
    if centred:
        mu = mean[0]
        # per-run centred values to get a standard error of var and cov (delta method)
        per_var = raw[:, 1] - raw[:, 0] ** 2
        per_cov = raw[:, 2] - raw[:, 0] ** 2
        var = mean[1] - mu**2
        cov = mean[2] - mu**2
        var_se = per_var.std(ddof=1) / np.sqrt(n) if n > 1 else np.nan
        cov_se = per_cov.std(ddof=1) / np.sqrt(n) if n > 1 else np.nan
        return Moments(mu, var, cov, se[0], var_se, cov_se)
    return Moments(0.0, mean[1], mean[2], 0.0, se[1], se[2])
