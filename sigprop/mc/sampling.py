"""Sampling hidden states with a given mean, variance and token correlation.

Convention (docs/formats.md, "Input"): a Gaussian component shared by all tokens of a sequence
carries the correlation.  For shape (B, L, d),

    x = mean + sqrt(var) * (sqrt(corr) * c + sqrt(1 - corr) * e),

c of shape (B, 1, d) and e of shape (B, L, d) iid standard normal.  This needs corr >= 0;
negative token correlations are not sampled (DomainError).

Also the two random primitives of the Monte Carlo hot path, both drawn from the generator's
raw 64-bit output (NumPy's float32 ziggurat costs ~10 ns a number; these ~3 ns and ~1.5 ns):

* :func:`standard_normal`: float32 by the Box-Muller transform, one 64-bit word per pair;
* :func:`keep_mask`: a dropout keep-mask, one 32-bit word per element compared with
  round(p 2^32) (the drop probability exact to 2^-32).

Each takes a NumPy Generator (NumPy arrays) or a :class:`sigprop.mc.backend.Rng` (arrays of
its backend: by default the same host draws moved to the device).
"""

from __future__ import annotations

import numpy as np

from sigprop.errors import DomainError

_CHUNK = 1 << 16            # pairs per Box-Muller block (keeps the temporaries in L2)
_ONE_BITS = np.uint32(0x3F800000)
_TWO_PI = np.float32(2.0 * np.pi)


def standard_normal(rng, shape, dtype=np.float32):
    """iid N(0, 1) of ``shape`` (on the Rng's backend; a NumPy array for a NumPy Generator)."""
    if isinstance(rng, np.random.Generator):
        return _host_standard_normal(rng, shape, dtype)
    return rng.normal(shape, dtype)


def _host_standard_normal(rng: np.random.Generator, shape, dtype=np.float32) -> np.ndarray:
    """iid N(0, 1) of ``shape``.  float32: Box-Muller from the raw bits (below); any other
    dtype: ``rng.standard_normal``.

    Each 64-bit word gives two uniforms with 23-bit mantissas, f1, f2 in [1, 2) (bits placed
    under the exponent of 1.0); u = 2 - f1 lies in (0, 1], so r = sqrt(-2 ln u) is finite and
    the pair (r cos 2 pi f2, r sin 2 pi f2) is two independent standard normals (the angle's
    whole turn is immaterial).  The 2^-23 grid of u truncates |z| at 5.65, a tail of
    probability 1.6e-8 that no moment here can see."""
    if np.dtype(dtype) != np.float32:
        return rng.standard_normal(shape, dtype=dtype)
    out = np.empty(shape, dtype=np.float32)
    flat = out.reshape(-1)
    n = flat.size
    bits = rng.bit_generator
    for s in range(0, n, 2 * _CHUNK):
        e = min(n, s + 2 * _CHUNK)
        m = (e - s + 1) // 2
        u = bits.random_raw(m).view(np.uint32)          # 2m words: m radii, then m angles
        u >>= 9
        u |= _ONE_BITS
        f = u.view(np.float32)
        r, th = f[:m], f[m:]
        np.subtract(np.float32(2.0), r, out=r)
        np.log(r, out=r)
        r *= np.float32(-2.0)
        np.sqrt(r, out=r)
        th *= _TWO_PI
        np.multiply(r, np.cos(th), out=flat[s:s + m])
        k = e - s - m
        np.sin(th, out=th)
        np.multiply(r[:k], th[:k], out=flat[s + m:e])
    return out


def keep_mask(rng, shape, p: float):
    """Boolean dropout keep-mask: True with probability 1 - p (on the Rng's backend)."""
    if isinstance(rng, np.random.Generator):
        return _host_keep_mask(rng, shape, p)
    return rng.keep(shape, p)


def _host_keep_mask(rng: np.random.Generator, shape, p: float) -> np.ndarray:
    """Boolean dropout keep-mask: True with probability 1 - p (p exact to 2^-32)."""
    n = int(np.prod(shape))
    words = rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n]
    return (words >= np.uint32(min(round(p * 2.0**32), 2**32 - 1))).reshape(shape)


def correlated(rng, shape, mean=0.0, var=1.0, corr=0.0, dtype=np.float32):
    """States of ``shape`` (B, L, d) with the given moments, on the Rng's backend (a NumPy
    array for a NumPy Generator); ``dtype`` a NumPy dtype or one of the backend's."""
    B, L, d = shape
    if not 0.0 <= corr <= 1.0:
        raise DomainError(f"the sampler needs a token correlation in [0, 1], got {corr:g}")
    if var < 0:
        raise DomainError(f"variance must be non-negative, got {var:g}")
    from sigprop.mc.backend import np_dtype

    dtype = np_dtype(dtype)
    # Python float scalars take the array's dtype (the standard's rule; NumPy's too)
    e = standard_normal(rng, (B, L, d), dtype)
    e *= float(np.sqrt((1.0 - corr) * var))
    if corr > 0:
        c = standard_normal(rng, (B, 1, d), dtype)
        c *= float(np.sqrt(corr * var))
        e += c
    if mean:
        e += float(mean)
    return e
