"""The per-key weights' second-order series (rules.attention._key_weights_series) against the
exact independent-row moments, and the lazily built smoothing tables."""

import numpy as np
import pytest

from sigprop.rules import attention as A
from sigprop.rules.softmax_moments import independent_row_moments


def _exact(V, rel, counts):
    tot = counts.sum(axis=1, keepdims=True)
    e1, e2 = independent_row_moments(V * rel, counts)
    h1, h2 = independent_row_moments(np.full(tot.shape, V), tot)
    return e1 / h1, e2 / h2


@pytest.mark.parametrize("V", [0.05, 0.5, 2.0])
def test_series_matches_exact_to_third_order(V):
    rng = np.random.default_rng(0)
    L = 24
    counts = np.tril(np.ones((L, L)))
    low = counts > 0
    shape = rng.uniform(-1, 1, (L, L))
    errs = []
    for dvmax in (0.08, 0.04):
        dvmax = min(dvmax, 0.5 * V)      # offsets below the row variance itself
        rel = np.where(low, 1 + dvmax / V * shape, 1.0)
        rel[0] = 1.0
        w1, w2 = _exact(V, rel, counts)
        s1, s2 = A._key_weights_series(V * (rel - 1), counts, V)
        assert np.max(np.abs(w2 - 1)[low]) > 10 * np.max(np.abs(s2 - w2)[low])   # the effect is resolved
        errs.append(max(np.max(np.abs(s1 - w1)[low]), np.max(np.abs(s2 - w2)[low])))
    # third order down to the exact moments' own interpolation error (~1e-4 relative)
    assert errs[0] < 1e-3 and errs[1] < 2.5e-4
