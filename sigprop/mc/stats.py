"""Moment estimators over arrays of shape (B, L, d) (theory.md section 1).

Per call we return *sums* (first moment, second moment, cross-token moment), so that
independent runs can be pooled and a standard error taken from their spread.

Cross-token moment: with S the sum over tokens, mean over (batch, feature) of
(S^2 - sum_tokens x^2) / (L (L - 1)): the average product of two different tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def raw_moments(x: np.ndarray) -> np.ndarray:
    """[E x, E x^2, E x_i x_j (i != j)] of one array, accumulated in float64."""
    B, L, d = x.shape
    # float64 accumulators without a float64 copy of x (numpy casts in buffered chunks)
    m1 = np.sum(x, dtype=np.float64) / x.size
    sq = np.sum(np.square(x), dtype=np.float64) / x.size
    s = np.sum(x, axis=1, dtype=np.float64)
    cross = (np.einsum("bd,bd->", s, s) / (B * d) - sq * L) / (L * (L - 1)) if L > 1 else np.nan
    return np.array([m1, sq, cross])


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
