"""Position profiles of a causal model (used by the predictor only when the mask is causal).

With a causal mask the query at position i sees keys 0..i, so the statistics of a stream are
position-dependent: the attention output of row i has the variance of a row of n = i + 1
keys (row 0 copies its own value), and, backward, key j collects the gradient of the rows
i >= j, each sharing its attention gradient among its n_i = i + 1 keys, so the first
positions collect by far the most.  The mean-field state (one variance for all positions)
misses the correlation between the two: the rows that carry the most gradient (the first
ones) are the ones with the largest attention weights ~ 1/n.  So beside every mean the
predictor carries a *profile*: the variance at each position over the mean over positions
(an array of length L, mean 1), forward for the stream and backward for the gradient.

The per-row quantities come from the attention rule (``Attention.rows``: the same statistics
and combinations as its forward/backward, at one row length); this module only distributes
them over positions:

* forward: the attention branch output has profile var(n_i) / mean; a sum a x + b y mixes
  the profiles with the variance weights; a LayerNorm output is flat (every token has unit
  variance);
* backward, the gradient is carried as a covariance matrix over positions C (L x L, mean
  diagonal 1): the gradients of the first positions are strongly correlated with each other
  (measured: ~0.27 among positions 0..7 where the average correlation is 0.02), because
  every later row attends to all of them, and at the next attention layer down those
  correlations add up in the rows' value-path sums.  Through attention (U the uniform causal
  attention matrix, U_ij = 1/n_i for j <= i; per-length terms from the rule):
  key j's variance ``sum_{i >= j} C_ii spread(n_i) / n_i`` (value and key paths, one row's
  keys exchangeable) + ``C_jj local(n_j)`` (query path) + the pair-of-rows part, the rule's
  ``cross`` per unit correlation distributed as diag(U^T C' U) (C' = C off the diagonal);
  covariance of keys j != j': ``sum_{i >= max(j, j')} C_ii same_c(n_i) / (n_i (n_i - 1))``
  (value and key paths within one row) + the rule's ``cross_c`` distributed as U^T C' U +
  ``qry_c`` C'_jj'.  Each kernel is normalised so that the flat covariance (diagonal 1,
  off-diagonal rg) gives back the rule's value; the branch's gradient variance is the rule's
  (flat) value times mean diag(out(C)) / mean diag(out(flat)), its covariance the rule's
  times the same ratio of the off-diagonal means;
* a LayerNorm's backward divides the gradient at position i by that position's standard
  deviation: C_ik / sqrt(f_i f_k) (f the profile of the LayerNorm's input);
* position-wise maps (FFN, dropout, scales, LayerNorm) scale the diagonal by their
  variance gain and the off-diagonal by their covariance gain (the rules' own gains).
"""

from __future__ import annotations

import numpy as np

from sigprop.backend import numeric
from sigprop.rules import get
from sigprop.state import Backward, Forward


def flat(L: int) -> np.ndarray:
    return np.ones(int(L))


def _rows(op, g: Backward | None) -> dict:
    rule = get("attention")
    x = op.x
    p = rule.param_values(op.params)
    n = np.arange(1.0, int(op.params["L"]) + 1)
    x = Forward(np.float64(x.mean), np.float64(x.var), np.float64(x.corr))
    g = Backward(np.float64(1.0), np.float64(0.0 if g is None else g.corr))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return rule.rows(numeric, x, g, p, n)


def attention_forward(op) -> np.ndarray:
    """Profile of the attention output (op: the attention Op with its recorded input)."""
    v = np.asarray(_rows(op, None)["var"], dtype=float)
    return v / v.mean()


def mix(v1: float, f1: np.ndarray, v2: float, f2: np.ndarray) -> np.ndarray:
    """Profile of the sum of two independent signals of variances v1, v2 (profiles f1, f2)."""
    tot = v1 + v2
    if not tot > 0:
        return f1
    return (v1 * f1 + v2 * f2) / tot


def _uniform(L: int) -> np.ndarray:
    """U_ij = 1/n_i for keys j <= i: the attention matrix of uniform causal rows."""
    n = np.arange(1.0, L + 1)
    return np.tril(np.ones((L, L))) / n[:, None]


def _offdiag(C: np.ndarray) -> np.ndarray:
    return C - np.diag(np.diag(C))


def _attention_cov(r: dict, C: np.ndarray, U: np.ndarray) -> np.ndarray:
    n = np.arange(1.0, len(C) + 1)
    d = np.diag(C)
    spread, local, same_c = (np.asarray(r[k], float) for k in ("spread", "local", "same_c"))
    diag = np.cumsum((d * spread / n)[::-1])[::-1] + d * local
    a = np.where(n > 1, d * same_c * n / np.maximum(n - 1, 1), 0.0)
    same = (U.T * a) @ U
    Co = _offdiag(C)
    K = U.T @ Co @ U
    Kf = U.T @ _offdiag(np.ones_like(C)) @ U
    L = len(C)
    kd = float(r["cross"]) / (np.trace(Kf) / L)
    ko = float(r["cross_c"]) / ((Kf.sum() - np.trace(Kf)) / (L * (L - 1)))
    out = _offdiag(same + ko * K) + float(r["qry_c"]) * Co
    return out + np.diag(diag + kd * np.diag(K))


def _mean_off(C: np.ndarray) -> float:
    L = len(C)
    return float((C.sum() - np.trace(C)) / (L * (L - 1)))


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 and np.isfinite(a / b) else 1.0


def attention_backward(op, g: Backward, C: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(variance and covariance factors over the flat-profile rule values, normalised
    covariance at the attention input) for an upstream gradient covariance over positions C (mean diagonal 1; g: the
    gradient state reaching the attention op, whose correlation defines the flat reference)."""
    r = _rows(op, g)
    L = len(C)
    U = _uniform(L)
    rg = float(g.corr)
    flat_c = (1 - rg) * np.eye(L) + rg * np.ones((L, L))
    o, o1 = _attention_cov(r, C, U), _attention_cov(r, flat_c, U)
    t, t1 = np.trace(o) / L, np.trace(o1) / L
    if not (t > 0 and t1 > 0):
        return 1.0, 1.0, C
    return float(t / t1), _ratio(_mean_off(o), _mean_off(o1)), o / t


def positionwise(C: np.ndarray, var_gain: float, cov_gain: float) -> np.ndarray:
    """A position-wise map (same weights at every position): the diagonal scales by the
    variance gain, the off-diagonal by the covariance gain (returned relative to the former)."""
    if not var_gain > 0:
        return C
    return np.diag(np.diag(C)) + (cov_gain / var_gain) * _offdiag(C)


def layernorm_backward(C: np.ndarray, f: np.ndarray, var_gain: float = 1.0,
                       cov_gain: float = 1.0) -> tuple[float, float, np.ndarray]:
    """(variance and covariance factors over a flat profile, normalised covariance) of the gradient through a LayerNorm whose input
    has variance profile f: position i is divided by its standard deviation."""
    s = 1 / np.sqrt(f)
    ref = positionwise(C, var_gain, cov_gain)
    u = positionwise(C * s[:, None] * s[None, :], var_gain, cov_gain)
    k = float(np.trace(u) / len(u))
    return k, _ratio(_mean_off(u), _mean_off(ref)), u / k


def mix_cov(v1: float, C1: np.ndarray, v2: float, C2: np.ndarray) -> np.ndarray:
    tot = v1 + v2
    if not tot > 0:
        return C1
    return (v1 * C1 + v2 * C2) / tot
