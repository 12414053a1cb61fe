"""Backend primitives, sampling and estimators: the foundations everything else trusts."""

import math

import numpy as np
import pytest

from sigprop.backend import numeric as m
from sigprop.errors import DomainError
from sigprop.mc.sampling import correlated
from sigprop.mc.stats import pool, raw_moments
from sigprop.rules.base import Param


def test_erf_matches_math_erf():
    xs = np.linspace(-7, 7, 2001)
    ref = np.array([math.erf(v) for v in xs])
    assert np.max(np.abs(m.erf(xs) - ref)) < 2e-7


def test_phi_is_normal_cdf():
    # the erfc approximation has fractional error < 1.2e-7 (documented in backend.numeric)
    assert m.Phi(0.0) == pytest.approx(0.5, abs=1e-7)
    assert m.Phi(1.959963984540054) == pytest.approx(0.975, abs=2e-7)


@pytest.mark.parametrize("k,expected", [(0, 1.0), (2, 2.5), (4, 3 * 2.5**2), (6, 15 * 2.5**3)])
def test_expect_normal_gaussian_moments(k, expected):
    assert m.expect_normal(lambda x: x**k, 2.5) == pytest.approx(expected, rel=1e-12)


def test_expect_normal_broadcasts_and_nests():
    var = np.array([0.5, 1.0, 2.0])
    # E[exp(X)] = exp(var/2)
    np.testing.assert_allclose(m.expect_normal(np.exp, var), np.exp(var / 2), rtol=1e-10)
    # nested: E_X E_Y[(X+Y)^2] = var + 1, closure captures the outer node array
    nested = m.expect_normal(lambda x: m.expect_normal(lambda y: (x + y) ** 2, 1.0 + 0 * x), var)
    np.testing.assert_allclose(nested, var + 1, rtol=1e-10)


@pytest.mark.parametrize("mean,var,corr", [(0.0, 1.0, 0.0), (3.0, 0.5, 0.4), (-1.0, 2.0, 0.9)])
def test_sampler_and_estimators_recover_moments(mean, var, corr):
    rng = np.random.default_rng(1)
    raws = [raw_moments(correlated(rng, (64, 32, 64), mean, var, corr, np.float64)) for _ in range(8)]
    mo = pool(np.array(raws))
    assert mo.mean == pytest.approx(mean, abs=5 * max(mo.mean_se, 1e-3))
    assert mo.var == pytest.approx(var, abs=5 * mo.var_se + 1e-3)
    assert mo.corr == pytest.approx(corr, abs=5 * mo.corr_se + 1e-3)


def test_sampler_rejects_negative_correlation():
    with pytest.raises(DomainError):
        correlated(np.random.default_rng(0), (2, 3, 4), corr=-0.1)


def test_param_domains():
    p = Param("p", "prob", lo=0.0, hi=1.0, open_hi=True)
    p.check(0.0)
    p.check(np.array([0.1, 0.9]))
    for bad in (1.0, -0.1, np.array([0.5, 1.5]), float("nan")):
        with pytest.raises(DomainError):
            p.check(bad)
    with pytest.raises(DomainError):
        Param("n", "n", lo=1, integer=True).check(2.5)
