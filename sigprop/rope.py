"""Rotary positions given by their frequencies (the model specification's ``{"inv_freq": ...}``).

A rotary position embedding rotates every query and key vector of a head at position t as
x -> x cos(t theta) + rotate_half(x) sin(t theta), theta_i for i < d_head/2 repeated for both
halves (the Hugging Face convention, docs/formats.md).  A model gives it either as a base B
(theta_i = B^(-2i/d_head): a plain float everywhere in sigprop, unchanged) or as the
frequency vector itself, :class:`RopeFreqs`: any inverse-frequency vector (the rescaled
rotations of transformers' rope types), with an attention factor s (yarn, longrope) that
multiplies the cos and sin of every rotated plane (theta_i != 0): a rotated plane's query and
key are each scaled by s, its logit contribution by s^2.  Partial rotary (GPT-NeoX's
``rotary_pct``, Phi's ``partial_rotary_factor``) is trailing frequencies 0: those planes pass
through unrotated and unscaled (transformers' ``q_pass``).

The object is immutable and hashable (a rule parameter and a memo key), and a scalar to
NumPy (``np.ndim`` 0), so that it rides through the rules' parameter namespaces beside the
broadcast arrays of a grid.  Pure NumPy (no sympy, no torch).
"""

from __future__ import annotations

import math

import numpy as np

from sigprop.errors import DomainError


class RopeFreqs:
    """A rotary embedding given by its inverse frequencies theta_0 .. theta_{d_head/2 - 1}
    (rad per position, each finite and >= 0) and its attention factor (> 0, default 1)."""

    __slots__ = ("inv_freq", "attention_factor", "_hash")

    def __init__(self, inv_freq, attention_factor: float = 1.0):
        try:
            f = tuple(float(v) for v in inv_freq)
        except (TypeError, ValueError):
            raise DomainError(f"rope.inv_freq must be a list of numbers, got {inv_freq!r}") from None
        if not f:
            raise DomainError("rope.inv_freq must not be empty")
        if not all(math.isfinite(v) and v >= 0 for v in f):
            bad = next(v for v in f if not (math.isfinite(v) and v >= 0))
            raise DomainError(f"rope.inv_freq entries must be finite numbers >= 0, got {bad!r}")
        s = attention_factor
        if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)) or not (
                math.isfinite(float(s)) and float(s) > 0):
            raise DomainError(f"rope.attention_factor must be a finite number > 0, got {s!r}")
        object.__setattr__(self, "inv_freq", f)
        object.__setattr__(self, "attention_factor", float(s))
        object.__setattr__(self, "_hash", hash(("RopeFreqs", f, float(s))))

    def __setattr__(self, name, value):
        raise AttributeError("RopeFreqs is immutable")

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return (isinstance(other, RopeFreqs) and self.inv_freq == other.inv_freq
                and self.attention_factor == other.attention_factor)

    def __ne__(self, other):
        return not self == other

    def __bool__(self):                 # rotary positions are on
        return True

    def __repr__(self):
        # exact (every frequency at full precision): the on-disk store keys tables by the repr of
        # the parameters (sigprop.model.store.key), so two vectors must never share one
        return f"RopeFreqs({list(self.inv_freq)!r}, {self.attention_factor!r})"

    def __reduce__(self):
        return (RopeFreqs, (self.inv_freq, self.attention_factor))

    @property
    def n_planes(self) -> int:
        return len(self.inv_freq)

    @property
    def n_rotated(self) -> int:
        """The planes that rotate (theta_i != 0)."""
        return sum(1 for v in self.inv_freq if v != 0)

    def theta(self) -> np.ndarray:
        """The frequencies as a float64 array (a fresh copy)."""
        return np.array(self.inv_freq, dtype=float)

    def plane_scale(self) -> np.ndarray:
        """Each plane's factor on its query and key: the attention factor where it rotates, 1
        where it passes through."""
        t = self.theta()
        return np.where(t != 0, self.attention_factor, 1.0)

    def logit_scale2(self) -> float:
        """The factor s_eff^2 on both the query and the key variance that gives the logit the
        variance it has: the mean over the planes of their factor^4, square-rooted
        (s^2 exactly where every plane rotates or s = 1)."""
        s = self.attention_factor
        if s == 1:
            return 1.0
        k = self.n_planes
        r = self.n_rotated
        if r == k:
            return s * s
        return math.sqrt((r * s**4 + (k - r)) / k)

    def check_head(self, d_head) -> None:
        """The vector must have d_head/2 entries (d_head even)."""
        dh = np.asarray(d_head, dtype=float)
        if np.any(dh != 2 * self.n_planes):
            raise DomainError(f"rope.inv_freq has {self.n_planes} entries; a head of d_head "
                              f"{_show(d_head)} needs d_head/2")

    def to_json(self) -> dict:
        out = {"inv_freq": list(self.inv_freq)}
        if self.attention_factor != 1:
            out["attention_factor"] = self.attention_factor
        return out

    def describe(self) -> str:
        t = [v for v in self.inv_freq if v != 0]
        out = f"{self.n_planes} frequencies"
        if t:
            out += f" {max(t):.4g} .. {min(t):.4g} rad/position"
        if self.n_rotated < self.n_planes:
            out += f", {self.n_rotated} of {self.n_planes} planes rotated"
        if self.attention_factor != 1:
            out += f", attention factor {self.attention_factor:.6g}"
        return out


def _show(v):
    a = np.asarray(v)
    return f"{float(a):g}" if a.ndim == 0 else f"values in [{a.min():g}, {a.max():g}]"


def is_freqs(rope) -> bool:
    return isinstance(rope, RopeFreqs)


def base_theta(base, d_head) -> np.ndarray:
    """theta_i = base^(-2i/d_head), i < d_head/2 (scalars)."""
    return float(base) ** (-2.0 * np.arange(int(d_head) // 2) / int(d_head))


def thetas(rope, d_head) -> np.ndarray:
    """The d_head/2 frequencies of ``rope`` (a base or a :class:`RopeFreqs`)."""
    if isinstance(rope, RopeFreqs):
        rope.check_head(d_head)
        return rope.theta()
    return base_theta(rope, d_head)


def plane_scales(rope, d_head) -> np.ndarray:
    """Each plane's factor on its query and key (1 for a base)."""
    if isinstance(rope, RopeFreqs):
        return rope.plane_scale()
    return np.ones(int(d_head) // 2)


def rope_from_json(r, where: str):
    """A model object's ``rope`` entry: {"base": B} -> the float B; {"inv_freq": [...],
    "attention_factor": s} -> a :class:`RopeFreqs`."""
    if not isinstance(r, dict):
        return None                   # (the caller's message for the base form)
    if "base" in r and "inv_freq" in r:
        raise DomainError(f"{where}.rope has both base and inv_freq; give one")
    if "inv_freq" in r:
        extra = set(r) - {"inv_freq", "attention_factor"}
        if extra:
            raise DomainError(f"{where}.rope has unknown key(s) {', '.join(sorted(extra))}")
        f = r["inv_freq"]
        if not isinstance(f, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in f):
            raise DomainError(f"{where}.rope.inv_freq must be a list of numbers, got {f!r}")
        try:
            return RopeFreqs(f, r.get("attention_factor", 1.0))
        except DomainError as e:
            raise DomainError(f"{where}.{e}") from None
    return None                       # the base form: the caller parses it
