"""The growth laws' batched least-squares fits (growth._fits_on_bases, used by the saturating
law's search over relaxation lengths) against the one-line-at-a-time form they replace
(growth._fit: ``np.linalg.lstsq`` per basis), and the search itself against that form."""

import math

import numpy as np
import pytest

from sigprop.model import growth


def _bases(depth, lengths):
    x = depth - depth[0]
    return np.stack([math.exp(-1.0 / length) ** x for length in lengths])


@pytest.mark.parametrize("relative", [False, True])
def test_batched_fits_equal_lstsq_per_basis(relative):
    depth = np.arange(1.0, 97.0)
    y = 1.0 + 2.0 * (1.0 - np.exp(-depth / 7.0)) + 0.01 * np.sin(depth)
    lengths = np.geomspace(0.25, 12.0, 20)
    B = _bases(depth, lengths)
    fit, c1 = growth._fits_on_bases(B, y, 1.0 / np.abs(y) if relative else None)
    for j, b in enumerate(B):
        f, s = growth._fit(b, y, relative=relative)
        np.testing.assert_allclose(fit[j], f, rtol=1e-12, atol=0)
        assert abs(c1[j] - s) <= 1e-11 * abs(s)


def _saturating_one_at_a_time(depth, lv, y):
    """The search over relaxation lengths with one lstsq fit per length and scale (the form
    growth._saturating had before its fits were batched)."""
    span = float(depth[-1] - depth[0])
    top = growth.SATURATION_MAX_LENGTH * span
    if top <= 0.25:
        return None
    x = depth - depth[0]
    best = None
    lengths = np.geomspace(0.25, top, 48)
    for _ in range(2):
        for length in lengths:
            basis = math.exp(-1.0 / length) ** x
            fit, c1 = growth._fit(basis, lv)
            r2 = growth._r2_log(lv, None, fit)
            fy, c1y = growth._fit(basis, y, relative=True)
            r2y = growth._r2_log(lv, fy)
            if r2y > r2:
                r2, c1 = r2y, c1y
            if best is None or r2 > best[0]:
                best = (float(r2), c1, float(length))
        i = np.searchsorted(lengths, best[2])
        lengths = np.geomspace(lengths[max(i - 1, 0)], lengths[min(i + 1, len(lengths) - 1)], 17)
    return best


@pytest.mark.parametrize("n,length", [(48, 3.0), (96, 0.6), (768, 40.0)])
def test_saturating_search_equals_the_fits_one_at_a_time(n, length):
    depth = np.arange(1.0, n + 1)
    lv = np.log(2.0 - np.exp(-depth / length)) + 1e-3 * np.cos(depth)
    lv = lv - lv.max()
    y = np.exp(lv)
    got = growth._saturating(depth, lv, y)
    want = _saturating_one_at_a_time(depth, lv, y)
    assert got[2] == want[2]                                 # the same relaxation length
    assert abs((1 - got[0]) - (1 - want[0])) <= 1e-9 * (1 - want[0])
    assert abs(got[1] - want[1]) <= 1e-10 * abs(want[1])
