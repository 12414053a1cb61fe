"""Frozen moment states (theory.md section 1).

``Forward``: mean ``mean``, variance ``var = E[x^2] - mean^2`` and token correlation
``corr`` (covariance of two different tokens at the same feature, over ``var``) of a hidden
state.  ``Backward``: variance and token correlation of dLoss/dx (mean 0).

Fields hold floats, NumPy arrays (one entry per configuration, broadcast together) or
sympy expressions: the state does not care which.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Forward:
    mean: Any
    var: Any
    corr: Any

    @property
    def cov(self):
        return self.corr * self.var

    @property
    def second_moment(self):
        """Uncentred E[x^2]."""
        return self.var + self.mean**2

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Backward:
    var: Any
    corr: Any

    @property
    def cov(self):
        return self.corr * self.var

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
