"""Name the growth law of a moment along depth.

Candidates: constant; linear in depth, y = c0 + c1 l (Pre-LN forward
variance); harmonic, y = c0 + c1 H_l (LayerNorm Scaling); hyperbolic, y = 1/(c0 + c1 l)
(Pre-LN gradient, counted from the input); exponential, log y = c0 + c1 l (Post-LN
gradient).  Each law is a least-squares fit in the space where it is linear, weighted to
relative residuals; the fits are then compared by R^2 of log y (one common space), ties
going to the simpler law.  A series
whose total change is below 10% is "constant"; one that no law fits with R^2 >= 0.95 is
"mixed" (the best fit is named).

"bounded" is a series that settles within the depth: log y = c0 + c1 q^l, a geometric
relaxation towards a depth-independent limit (a skip scale below 1, whose stream variance
approaches a fixed point).  It is named only when its relaxation length L (q = e^(-1/L)) is
at most an eighth of the depth (so the series has settled to within e^-4 of its total change over
the last half), its R^2 is at least 0.99 and it leaves at most half the residual of the best
two-parameter law (it has one parameter more, so it must earn it); or, whatever its shape
(a relaxation that overshoots, two time scales), when the series has settled: at least 8
points and a change over the last half of the depth of at most 1% of its total spread (a
harmonic law, which grows like log N, changes by ln 2 / ln N of it: 2% at 10^6 layers).

With fewer than three points no law can be fitted: such a series is "constant" if it changes
by less than 10%, else "undetermined".
"""

from __future__ import annotations


import math
from typing import NamedTuple

import numpy as np

# order = preference on ties (simpler first)
LAWS = ("constant", "linear", "harmonic", "hyperbolic", "exponential")
#: laws that stay within a depth-independent factor however deep the model
BOUNDED_LAWS = ("constant", "bounded")
#: laws that compound a constant factor per layer (undetermined: too few layers to tell, so
#: the per-layer change is taken to compound)
COMPOUNDING_LAWS = ("exponential", "undetermined")
#: the saturating law: largest relaxation length as a fraction of the depth, least R^2, and
#: largest share of the best two-parameter law's residual it may leave
SATURATION_MAX_LENGTH = 1.0 / 8.0
SATURATION_MIN_R2 = 0.99
SATURATION_RESIDUAL_SHARE = 0.5
#: the settled test: least number of points, and largest change over the last half of the
#: depth as a share of the series' total spread (max - min of log y)
SETTLED_MIN_POINTS = 8
SETTLED_SHARE = 0.01
#: below this R^2 (log space) no single law describes the series: it is reported as "mixed"
#: (e.g. Mix-LN: constant through the Post-LN layers, then linear), naming the best fit
MIN_R2 = 0.95


class Growth(NamedTuple):
    law: str
    r2: float
    slope: float          # per unit of the law's variable (per layer for linear/exponential)
    ratio: float          # last / first
    best: str = ""        # for "mixed": the best-fitting single law
    log_ratio: float = 0.0  # natural log of last / first (exact where ratio overflows)
    length: float = 0.0   # "bounded": layers until the series stays within 5% of its total change of its final value

    @property
    def overall(self) -> str:
        """last/first as text, also beyond the range of a double."""
        return _times(self.log_ratio)

    def describe(self, what: str) -> str:
        if self.law == "constant":
            return f"{what} stays constant ({self.overall} overall)"
        if self.law == "mixed":
            return (f"{what} follows no single growth law ({self.overall} overall; best fit "
                    f"{self.best}, R^2 {self.r2:.2f})")
        if self.law == "bounded":
            return f"{what} settles by layer {self.length:.0f} ({self.overall} overall)"
        if self.law == "undetermined":
            return f"{what} changes {self.overall} (too few layers to name a growth law)"
        if self.law == "exponential":
            return f"{what} grows exponentially ({_times(self.slope, 4)} per layer, {self.overall} overall)" \
                if self.slope > 0 else f"{what} decays exponentially ({_times(self.slope, 4)} per layer, {self.overall} overall)"
        return f"{what} is {self.law} in depth ({self.overall} overall)"


def _times(log_value: float, digits: int = 3) -> str:
    """'x<value>' for exp(log_value), in scientific notation beyond a double's range."""
    return "x" + sci_exp(log_value, digits)


def sci_exp(log_value: float, digits: int = 3) -> str:
    """exp(log_value) as text, in scientific notation beyond a double's range ('inf', '0' at
    the infinities, '?' for NaN)."""
    if not math.isfinite(log_value):
        return "inf" if log_value > 0 else "0" if log_value < 0 else "?"
    if abs(log_value) < 700:
        return f"{np.exp(log_value):.{digits}g}"
    return sci_log10(log_value / np.log(10.0), digits)


def sci_log10(l10: float, digits: int = 3) -> str:
    """10**l10 in scientific notation, also beyond a double's range ('1e+2400', not
    '10e+2399' when the mantissa rounds up to 10); 10**-inf is '0', 10**inf 'inf'."""
    if not math.isfinite(l10):
        return "0" if l10 < 0 else "inf"
    k = math.floor(l10)
    mant = f"{10 ** (l10 - k):.{digits}g}"
    if float(mant) >= 10:
        k += 1
        mant = f"{10 ** (l10 - k):.{digits}g}"
    return f"{mant}e{int(k):+d}"


def _fit(x: np.ndarray, y: np.ndarray, relative: bool = False) -> tuple[np.ndarray, float]:
    """Least-squares line through (x, y): fitted values and slope.  ``relative``: minimise
    relative residuals (y - fit)/y, the residuals that matter in the log-space comparison (an
    ordinary fit of a series spanning decades misses its small values)."""
    A = np.vstack([np.ones_like(x), x]).T
    if relative:
        w = 1.0 / np.abs(y)
        coef, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    else:
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return A @ coef, float(coef[1])


def _r2_log(lv: np.ndarray, fitted_y: np.ndarray | None, fitted_log: np.ndarray | None = None) -> float:
    """R^2 in log space of a fit given on the (max-normalised) linear scale, or directly as
    fitted logarithms (``fitted_log``: no underflow for series spanning > 700 e-folds)."""
    if fitted_log is None:
        if np.any(~np.isfinite(fitted_y)) or np.any(fitted_y <= 0):
            return -np.inf
        fitted_log = np.log(fitted_y)
    resid = lv - fitted_log
    ss = np.sum((lv - lv.mean()) ** 2)
    return 1.0 - np.sum(resid**2) / ss if ss > 0 else 1.0


def classify(depth: np.ndarray, log_values: np.ndarray) -> Growth:
    """``depth``: 1..N (layers, possibly fractional for sublayers); ``log_values``: natural log
    of the moment (log space so exploding series are fine)."""
    depth = np.asarray(depth, dtype=float)
    lv = np.asarray(log_values, dtype=float)
    ok = np.isfinite(lv)
    depth, lv = depth[ok], lv[ok]
    if len(lv) == 0:
        return Growth("constant", 1.0, 0.0, 1.0)
    log_ratio = float(lv[-1] - lv[0])
    ratio = float(np.exp(np.clip(log_ratio, -700, 700)))
    if np.max(lv) - np.min(lv) < np.log(1.1):
        return Growth("constant", 1.0, 0.0, ratio, log_ratio=log_ratio)
    if len(lv) < 3:
        return Growth("undetermined", 0.0, log_ratio / max(len(lv) - 1, 1), ratio, log_ratio=log_ratio)
    # fits on values normalised by their maximum (safe for huge values)
    lv = lv - lv.max()
    # (values more than 600 e-folds below the maximum are floored for the fits on the linear
    # scale, whose relative weights would overflow; such series are exponential anyway)
    y = np.exp(np.maximum(lv, -600.0))
    harmonic = np.cumsum(1.0 / np.maximum(depth, 1.0))
    cands = {}
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        fy, slope = _fit(depth, y, relative=True)
        cands["linear"] = (_r2_log(lv, fy), slope)
        fy, slope = _fit(harmonic, y, relative=True)
        cands["harmonic"] = (_r2_log(lv, fy), slope)
        inv = 1.0 / y
        if np.all(np.isfinite(inv)):
            fi, slope = _fit(depth, inv, relative=True)
            cands["hyperbolic"] = (_r2_log(lv, 1.0 / fi), slope)
        fl, slope = _fit(depth, lv)
        cands["exponential"] = (_r2_log(lv, None, fl), slope)
    # predictions are deterministic, so R^2 differences far below 1e-3 are meaningful
    best = max(cands, key=lambda k: (round(cands[k][0], 9), -LAWS.index(k)))
    r2, slope = cands[best]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        sat = _saturating(depth, lv, y)
    fits = sat is not None and sat[0] >= SATURATION_MIN_R2 and (1 - sat[0]) <= SATURATION_RESIDUAL_SHARE * (1 - r2)
    if fits or _settled(lv):
        return Growth("bounded", float(sat[0]) if fits else float(r2), sat[1] if fits else 0.0, ratio,
                      log_ratio=log_ratio, length=_settling_depth(depth, lv))
    if r2 < MIN_R2:
        return Growth("mixed", float(r2), slope, ratio, best, log_ratio)
    return Growth(best, float(r2), slope, ratio, log_ratio=log_ratio)


def _saturating(depth: np.ndarray, lv: np.ndarray, y: np.ndarray) -> tuple[float, float, float] | None:
    """Best geometric relaxation, log y = c0 + c1 q^(l - l_1) or y = c0 + c1 q^(l - l_1)
    (``y``: the max-normalised series, fitted to relative residuals), with relaxation length L
    (q = e^(-1/L)) between 1/4 layer and SATURATION_MAX_LENGTH of the depth: (R^2 in log space,
    c1, length), or None when the depth allows no such length.  q is searched on a
    logarithmic grid of lengths (c0, c1 by least squares at each: :func:`_fits_on_bases`, all
    lengths of a grid at once), refined once around the best."""
    span = float(depth[-1] - depth[0])
    top = SATURATION_MAX_LENGTH * span
    if top <= 0.25:
        return None
    x = depth - depth[0]
    best = None
    lengths = np.geomspace(0.25, top, 48)
    w = 1.0 / np.abs(y)
    for _ in range(2):
        bases = np.exp(-1.0 / lengths)[:, None] ** x[None, :]
        fit, c1 = _fits_on_bases(bases, lv)                       # in log space
        fy, c1y = _fits_on_bases(bases, y, w)                     # and on the linear scale
        r2 = _r2_log_rows(lv, None, fit)
        r2y = _r2_log_rows(lv, fy)
        for j, length in enumerate(lengths.tolist()):
            r, c = (r2y[j], c1y[j]) if r2y[j] > r2[j] else (r2[j], c1[j])
            if best is None or r > best[0]:
                best = (float(r), float(c), float(length))
        i = np.searchsorted(lengths, best[2])
        lo, hi = lengths[max(i - 1, 0)], lengths[min(i + 1, len(lengths) - 1)]
        lengths = np.geomspace(lo, hi, 17)
    return best


def _fits_on_bases(B: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares lines y ~ c0 + c1 b through (b, y) for every row b of ``B`` at once:
    (fitted values, one row per row of B; the slopes c1).  ``w``: minimise the weighted
    residuals w (y - fit) (as :func:`_fit` with ``relative``, w = 1/|y|).  The normal equations
    of two parameters in centred form (weighted means of b and y taken out first), which is
    what :func:`_fit`'s ``lstsq`` solves, to rounding, for the bases here (b = q^x, not
    constant over x)."""
    if w is None:
        bm = B.mean(axis=1)
        ym = float(y.mean())
        Bc = B - bm[:, None]
        c1 = (Bc @ (y - ym)) / np.einsum("ij,ij->i", Bc, Bc)
    else:
        W = w * w
        sw = float(W.sum())
        bm = (B @ W) / sw
        ym = float(W @ y) / sw
        Bc = B - bm[:, None]
        c1 = ((Bc * W) @ (y - ym)) / ((Bc * Bc) @ W)
    c0 = ym - c1 * bm
    return c0[:, None] + c1[:, None] * B, c1


def _r2_log_rows(lv: np.ndarray, fitted_y: np.ndarray | None, fitted_log: np.ndarray | None = None) -> np.ndarray:
    """:func:`_r2_log` for every row of the fits ``fitted_y`` (or ``fitted_log``) at once."""
    if fitted_log is None:
        bad = np.any(~np.isfinite(fitted_y) | (fitted_y <= 0), axis=1)
        fitted_log = np.log(np.where(bad[:, None], 1.0, fitted_y))
    else:
        bad = np.zeros(len(fitted_log), dtype=bool)
    resid = lv[None, :] - fitted_log
    ss = np.sum((lv - lv.mean()) ** 2)
    r2 = 1.0 - np.sum(resid**2, axis=1) / ss if ss > 0 else np.ones(len(fitted_log))
    return np.where(bad, -np.inf, r2)


def _settled(lv: np.ndarray) -> bool:
    """Whether the series changed by at most SETTLED_SHARE of its spread over the last half."""
    if len(lv) < SETTLED_MIN_POINTS:
        return False
    spread = float(np.max(lv) - np.min(lv))
    tail = lv[len(lv) // 2:]
    return float(np.max(tail) - np.min(tail)) <= SETTLED_SHARE * spread


def _settling_depth(depth: np.ndarray, lv: np.ndarray) -> float:
    """The depth from which the series stays within 5% of its spread of its final value."""
    spread = float(np.max(lv) - np.min(lv))
    off = np.abs(lv - lv[-1]) > 0.05 * spread
    idx = np.flatnonzero(off)
    return float(depth[idx[-1] + 1]) if idx.size else float(depth[0])
