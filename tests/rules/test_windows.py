"""Sliding-window mask geometry (sigprop.rules.windows): the rows' keys, their lengths, and the
exact pair sums the attention rule's two-row statistics use, against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.rules import windows as wn


def test_masks():
    # causal: keys i-W+1..i
    m = wn.mask(6, 3, True)
    assert m[0].tolist() == [1, 0, 0, 0, 0, 0] and m[4].tolist() == [0, 0, 1, 1, 1, 0]
    # bidirectional: W keys centred, one more on the right for an even W, clipped at the ends
    m = wn.mask(7, 3, False)
    assert m[3].tolist() == [0, 0, 1, 1, 1, 0, 0] and m[0].tolist() == [1, 1, 0, 0, 0, 0, 0]
    assert wn.mask(7, 4, False)[3].tolist() == [0, 0, 1, 1, 1, 1, 0]
    assert wn.row_lengths(7, 3, False).tolist() == [2, 3, 3, 3, 3, 3, 2]
    # global: W = 0
    assert wn.mask(5, 0, False).all() and (wn.mask(5, 0, True) == np.tril(np.ones((5, 5), bool))).all()


def test_active():
    assert wn.active(64, 63, True) and not wn.active(64, 64, True) and not wn.active(64, 0, True)
    # bidirectional: global once every row sees every key (left, right >= L - 1)
    assert wn.active(64, 126, False) and not wn.active(64, 127, False)
    assert not wn.active(5, 9, False) and wn.active(6, 9, False)


def _brute(L, W, causal, l2, l1u, l1w, q):
    M = wn.mask(L, W, causal)
    tot = 0.0
    for i in range(L):
        for k in range(i + 1, L):
            s = int((M[i] & M[k]).sum())
            if s < 1:
                continue
            a, b = int((M[i] & ~M[k]).sum()), int((M[k] & ~M[i]).sum())
            ff = 1
            for j in range(q):
                ff *= s - j
            tot += ff * np.exp((s - q) * l2 + a * l1u + b * l1w)
    return tot


CASES = [(10, 3, True), (10, 4, False), (10, 5, False), (9, 20, False), (12, 11, False), (30, 8, True),
         (30, 9, False), (5, 3, False), (40, 39, True), (40, 60, False), (17, 2, False), (17, 2, True)]


@pytest.mark.parametrize("L, W, causal", CASES)
def test_pair_sums_against_brute_force(L, W, causal):
    w = wn.Window(L, W, causal)
    rng = np.random.default_rng(L * 100 + W)
    # factors of shape (C, n, m): l2 on the grid, l1u a function of u, l1w of w
    l2 = -rng.uniform(0.0, 1.0, (1, 3, 2))
    l1u = -rng.uniform(0.0, 0.6, (1, 3, 1))
    l1w = -rng.uniform(0.0, 0.6, (1, 1, 2))
    got = w.pair_weights(l2, l1u, l1w, (1, 2))
    for q, g in zip((1, 2), got):
        for iu in range(3):
            for iw in range(2):
                ref = _brute(L, W, causal, l2[0, iu, iw], l1u[0, iu, 0], l1w[0, 0, iw], q)
                assert g[0, iu, iw] == pytest.approx(ref, rel=1e-12, abs=1e-300)


def test_row_means():
    for L, W, causal in CASES + [(300, 41, False), (300, 41, True), (1000, 333, False)]:
        w = wn.Window(L, W, causal)
        n = wn.row_lengths(L, W, causal).astype(float)
        for f in (lambda x: np.sqrt(x) + 1 / x, lambda x: np.exp(-x / 10.0), lambda x: x**2):
            assert w.row_mean(f) == pytest.approx(np.mean(f(n)), rel=1e-4)
        assert w.mean_len == pytest.approx(n.mean())


def test_one_key_rows_share_nothing():
    w = wn.Window(16, 1, False)
    assert w.runs[0].size == 0
    assert all(np.all(o == 0) for o in w.pair_weights(np.zeros((1, 2, 2)), 0.0, 0.0))


def test_too_many_pairs_refused(monkeypatch):
    monkeypatch.setattr(wn, "PAIR_MAX", 100)
    with pytest.raises(DomainError, match="row pairs"):
        wn.Window(64, 8, True)
