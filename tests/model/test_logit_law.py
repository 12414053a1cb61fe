"""sigprop.model.logit_law: the sampled Gaussian logit law of causal rows, against independent
oracles (explicit matrices, the independent-key quadrature), and its place in the position
model (profile.key_weights)."""

import numpy as np
import pytest

from sigprop.model import logit_law as LL
from sigprop.model import positions, profile
from sigprop.rules.softmax_moments import independent_row_moments
from sigprop.state import Forward


def test_query_term_against_explicit_matrices():
    rng = np.random.default_rng(4)
    n, q = 5, 0.2
    A = rng.normal(size=(n, n))
    C = A @ A.T / n
    z = rng.normal(size=(7, n)) * 1.5
    P = LL._softmax(z)
    tot = 0.0
    for row in P:
        J = np.eye(n) - np.outer(np.ones(n), row)
        X = J @ C @ J.T + q * J @ J.T
        tot += np.sum(np.outer(row, row) * X * C)
    assert LL.query_term(P, C, q) == pytest.approx(tot / len(z), rel=1e-12)


def test_query_term_iid_is_the_query_term_of_a_multiple_of_the_identity():
    """The iid reference's closed form in the draws' sums of P^2 and P^3 against the general
    product form, over several c, q and row lengths."""
    rng = np.random.default_rng(8)
    for n in (2, 5, 33):
        P = LL._softmax(rng.normal(size=(40, n)) * 1.7)
        for c, q in ((1.0, 0.0), (0.35, 0.2), (2.5, 1.0)):
            assert LL.query_term_iid(P, c, q) == pytest.approx(LL.query_term(P, c * np.eye(n), q), rel=1e-12)


def test_query_term_ignores_additive_parts():
    """m_j + m_k added to C leaves the term (J 1 = 0); a generic symmetric addition does not."""
    rng = np.random.default_rng(5)
    n = 6
    A = rng.normal(size=(n, n))
    C = A @ A.T / n
    P = LL._softmax(rng.normal(size=(50, n)) * 2.0)
    m = rng.normal(size=n)
    add = m[:, None] + m[None, :]
    assert LL.query_term(P, C + add, 0.1) == pytest.approx(LL.query_term(P, C, 0.1), rel=1e-10)
    B = rng.normal(size=(n, n))
    assert abs(LL.query_term(P, C + 0.3 * (B + B.T), 0.1) / LL.query_term(P, C, 0.1) - 1) > 1e-3


def _row(C, v, r, q, G, v_common=0.0):
    """row_law on logits drawn here from the normal numbers G (an independent construction)."""
    n = len(C)
    A = np.linalg.cholesky(C * (v / (1 - r)) + v_common * np.eye(n))
    return LL.row_law(G @ A.T, G * np.sqrt(v + v_common), C, r, q)


def test_cholesky_of_a_rounded_semidefinite_matrix():
    u = np.array([1.0, 2.0, -1.0])
    C = np.outer(u, u)            # rank 1
    Lc = LL._cholesky(C)
    assert np.allclose(Lc @ Lc.T, C, atol=1e-5)


def test_exchangeable_row_gives_one():
    """No deviation: the law is the iid row drawn from the same numbers, so the query factor is 1
    and w1 averages to 1 over the keys exactly; w1 and w2 per key within the sample's noise."""
    G = np.random.default_rng(0).standard_normal((4000, 9))
    r, v = 0.3, 2.0
    w1, w2, qf = _row((1 - r) * np.eye(9), v, r, 0.1, G)
    assert qf == pytest.approx(1.0, rel=1e-12)
    assert w1.mean() == pytest.approx(1.0, rel=1e-12)
    assert np.all(np.abs(w1 - 1) < 0.1) and np.all(np.abs(w2 - 1) < 0.25)


def test_independent_keys_against_the_quadrature():
    """Independent keys of unequal variances (C diagonal): the sampled w1, w2 against the
    independent-key quadrature (softmax_moments.independent_row_moments), a separate method."""
    n, r, vbar = 8, 0.2, 1.5
    d = np.array([2.4, 1.6, 0.8, 0.8, 0.8, 0.5, 0.5, 0.5])        # (1 - r) rel
    G = np.random.default_rng(1).standard_normal((200_000, n))
    w1, w2, _ = _row(np.diag(d), vbar, r, 0.0, G)
    s = vbar * d / (1 - r)
    e1, e2 = independent_row_moments(s[None, :], np.ones((1, n)))
    h1, h2 = independent_row_moments(np.full((1, n), vbar), np.ones((1, n)))
    assert np.allclose(w1, e1[0] / h1[0], rtol=0.02)
    assert np.allclose(w2, e2[0] / h2[0], rtol=0.04)
    # and the first key's weight is well away from 1, so the check has something to find
    assert w1[0] > 1.3


def test_rotary_common_part_enters_both_laws():
    """A variance every key takes on its own (v_common) in both laws: with no deviation the
    factor stays 1, and it flattens the weights of a structured row."""
    G = np.random.default_rng(2).standard_normal((20_000, 6))
    r = 0.1
    assert _row((1 - r) * np.eye(6), 1.0, r, 0.0, G, v_common=2.0)[2] == pytest.approx(1.0, rel=1e-12)
    C = (1 - r) * np.eye(6)
    C[0, 0] = 4.0
    plain = _row(C, 1.0, r, 0.0, G)[0][0]
    shared = _row(C, 1.0, r, 0.0, G, v_common=2.0)[0][0]
    assert plain > shared > 1.0


def test_positions_deviation_keeps_the_nodes():
    """On a grid, S over every position takes the nodes' values at pairs of distinct nodes, is
    symmetric with a zero diagonal, and is linear in log(position + 1) between nodes."""
    g = positions.NodeGrid(200)
    u = g.u
    S = 0.1 * np.add.outer(u, u) + 0.02 * np.multiply.outer(u, u)
    np.fill_diagonal(S, 0.0)
    Sp = LL.positions_deviation(S, g)
    off = ~np.eye(g.size, dtype=bool)
    assert np.allclose(Sp[np.ix_(g.x, g.x)][off], S[off], rtol=1e-12, atol=1e-14)
    assert np.allclose(Sp, Sp.T) and np.all(np.diag(Sp) == 0)
    # between two nodes beyond the head, linear in u along a row far from the diagonal
    a, b = g.x[-3], g.x[-2]
    m = (a + b) // 2
    t = (np.log(m + 1.0) - np.log(a + 1.0)) / (np.log(b + 1.0) - np.log(a + 1.0))
    assert Sp[0, m] == pytest.approx((1 - t) * Sp[0, a] + t * Sp[0, b], rel=1e-12)
    assert LL.positions_deviation(S, None) is S


def _structured(L, first=1.2):
    """A deviation whose first keys share a component: S_jk = first for j, k < 3 (j != k)."""
    S = np.zeros((L, L))
    S[:3, :3] = first
    np.fill_diagonal(S, 0.0)
    return S


def test_key_weights_switch_to_the_law_and_back():
    """profile.key_weights takes the law above LAW_OFFSET and at most LAW_MAX positions (with
    the query factor), the default weights at offsets up to LAW_LO (no query factor)."""
    params = dict(d=64, n_heads=2, d_head=32, L=40, p=0.0, causal=1, q_std=0.3, k_std=0.3, v_std=0.1,
                  o_std=0.1, q_bias_std=0.0, k_bias_std=0.0, v_bias_std=0.0, o_bias_std=0.0)
    x = Forward(0.0, 4.0, 0.1)
    S = _structured(40)
    kw = profile.key_weights(params, x, S)
    assert kw.offset > LL.LAW_OFFSET
    assert kw.query is not None and kw.query.shape == (40,) and kw.query[0] == 1.0
    assert kw[0].shape == (40, 40) and np.all(kw[0][np.triu_indices(40, 1)] == 0)
    # the component the first three keys share makes them one bloc: less mean weight each,
    # and a query factor above 1 in the short rows, where the bloc is most of the row
    assert kw[0][30, 0] < 0.8 and kw.query[2] > 1.3
    # w1 is n E[P_j]: its mean over a row's keys is 1 (the weights sum to 1 in every draw)
    assert kw[0][30, :31].mean() == pytest.approx(1.0, rel=1e-12)
    # seeded by the stream (the layer): the same stream draws the same numbers, another
    # stream others
    again = profile.key_weights(params, x, S)
    assert np.array_equal(again[0], kw[0]) and np.array_equal(again.query, kw.query)
    other = profile.key_weights(params, x, S, stream=1)
    assert not np.array_equal(other.query, kw.query)
    assert other.query.mean() == pytest.approx(kw.query.mean(), rel=0.05)
    low = profile.key_weights(params, Forward(0.0, 0.05, 0.1), S)
    assert low.offset <= LL.LAW_LO and low.query is None


def test_law_share_ramps_linearly_between_the_thresholds():
    lo, hi = LL.LAW_LO, LL.LAW_OFFSET
    assert lo < hi
    assert LL.law_share(lo, 100) == 0.0 and LL.law_share(lo - 1.0, 100) == 0.0
    assert LL.law_share(hi, 100) == 1.0 and LL.law_share(hi + 5.0, 100) == 1.0
    assert LL.law_share(0.25 * lo + 0.75 * hi, 100) == pytest.approx(0.75, rel=1e-12)
    assert LL.law_share(hi + 5.0, LL.LAW_MAX + 1) == 0.0
    assert LL.law_share(float("nan"), 100) == 0.0           # (a NaN offset: the fit)
    assert LL.law_share(float("inf"), 100) == 1.0


def test_law_share_with_the_thresholds_together_is_a_step(monkeypatch):
    monkeypatch.setattr(LL, "LAW_LO", 2.5)
    monkeypatch.setattr(LL, "LAW_OFFSET", 2.5)
    assert LL.law_share(2.5, 100) == 0.0 and LL.law_share(2.5 + 1e-12, 100) == 1.0
    monkeypatch.setattr(LL, "LAW_LO", float("inf"))
    monkeypatch.setattr(LL, "LAW_OFFSET", float("inf"))
    assert LL.law_share(1e300, 100) == 0.0                # both infinite: the fit everywhere


def test_key_weights_blend_is_continuous_across_the_ramp(monkeypatch):
    """Between LAW_LO and LAW_OFFSET the weights and the query factor are the fit's and the
    law's, weighted by law_share: the law's alone just above the ramp, the fit's alone just
    below it (no query factor), and the share's mixture inside; no step at either end."""
    params = dict(d=64, n_heads=2, d_head=32, L=40, p=0.1, causal=1, q_std=0.3, k_std=0.3, v_std=0.1,
                  o_std=0.1, q_bias_std=0.0, k_bias_std=0.0, v_bias_std=0.0, o_bias_std=0.0)
    x = Forward(0.0, 4.0, 0.1)
    S = _structured(40)
    off = profile.key_weights(params, x, S).offset
    # the same input, thresholds placed around its offset
    monkeypatch.setattr(LL, "LAW_LO", off - 2.0)
    monkeypatch.setattr(LL, "LAW_OFFSET", off - 1.0)
    law = profile.key_weights(params, x, S)
    monkeypatch.setattr(LL, "LAW_LO", off + 1.0)
    monkeypatch.setattr(LL, "LAW_OFFSET", off + 2.0)
    fit = profile.key_weights(params, x, S)
    assert fit.query is None and law.query is not None
    low = np.tril_indices(40)
    assert np.abs(law[0] - fit[0])[low].max() > 0.1          # the two differ here
    for share in (1e-9, 0.3, 1.0 - 1e-9):
        monkeypatch.setattr(LL, "LAW_LO", off - share * 1.0)
        monkeypatch.setattr(LL, "LAW_OFFSET", off + (1.0 - share) * 1.0)
        mid = profile.key_weights(params, x, S)
        assert LL.law_share(off, 40) == pytest.approx(share, rel=1e-6)
        for k in (0, 1):
            want = (1.0 - share) * fit[k] + share * law[k]
            assert np.allclose(mid[k][low], want[low], rtol=1e-9, atol=1e-12)
        assert np.allclose(mid.query, (1.0 - share) + share * law.query, rtol=1e-9)


def test_key_weights_law_limited_in_length(monkeypatch):
    params = dict(d=64, n_heads=2, d_head=32, L=40, p=0.0, causal=1, q_std=0.3, k_std=0.3, v_std=0.1,
                  o_std=0.1, q_bias_std=0.0, k_bias_std=0.0, v_bias_std=0.0, o_bias_std=0.0)
    monkeypatch.setattr(LL, "LAW_MAX", 39)
    kw = profile.key_weights(params, Forward(0.0, 4.0, 0.1), _structured(40))
    assert kw.offset > LL.LAW_OFFSET and kw.query is None


def test_notes_say_which_weights_a_layer_took():
    """Above the threshold, a layer whose weights came from the law gets the law's note; one
    beyond the law's length (no query factor) the additive fit's; both kinds, two notes."""
    from types import SimpleNamespace

    from sigprop.model import predict as PR

    def rec(layer, off, law):
        kw = profile.KeyWeights(np.ones(1), np.ones(1), off, np.ones(1) if law else None)
        return SimpleNamespace(layer=layer, key_w=kw, parts=None)

    hi = 2 * PR.KEY_OFFSET_NOTE
    (law,) = PR.approximation_notes([rec(3, hi, True), rec(4, hi, True)])
    assert law.startswith("layers 3-4:") and "sampled" in law and f"seed {LL.SEED}" in law
    (fit,) = PR.approximation_notes([rec(3, hi, False)])
    assert fit.startswith("layer 3:") and "additive fit" in fit and str(LL.LAW_MAX) in fit
    both = PR.approximation_notes([rec(1, hi, True), rec(2, hi, False), rec(5, 0.5, False)])
    assert [n.split(":")[0] for n in both] == ["layer 1", "layer 2"]


def test_attention_cov_takes_the_query_factor():
    """The query factor multiplies the row's query term (``local``) on the diagonal and the
    query path's covariance of rows i, i' by sqrt(qf_i qf_i'); nothing else moves."""
    L = 12
    params = dict(d=64, n_heads=2, d_head=32, L=L, p=0.1, causal=1, q_std=0.2, k_std=0.2, v_std=0.1,
                  o_std=0.1, q_bias_std=0.0, k_bias_std=0.0, v_bias_std=0.0, o_bias_std=0.0)
    x = Forward(0.0, 1.0, 0.2)
    r = profile.rows(params, x)
    rng = np.random.default_rng(7)
    A = rng.normal(size=(L, L))
    C = A @ A.T / L + np.eye(L)
    ones = np.tril(np.ones((L, L)))
    qf = 1.0 + rng.uniform(0.0, 2.0, L)
    base = profile._attention_cov(r, C, profile.KeyWeights(ones, ones, 5.0))
    got = profile._attention_cov(r, C, profile.KeyWeights(ones, ones, 5.0, qf))
    d = np.diag(C)
    assert np.allclose(np.diag(got) - np.diag(base), d * np.asarray(r["local"]) * (qf - 1), rtol=1e-10, atol=1e-14)
    off = ~np.eye(L, dtype=bool)
    want = float(r["qry_c"]) * C * (np.sqrt(np.outer(qf, qf)) - 1)
    assert np.allclose((got - base)[off], want[off], rtol=1e-10, atol=1e-14)
    assert np.abs(want[off]).max() > 1e-6 * np.abs(base).max()


def test_grid_law_against_every_position():
    """On a node grid (the path the predictor takes from 65 to LAW_MAX positions) the law at
    the nodes against the same law over every position: S smooth in log position, the query
    factor and the first keys' w1 within the sampling noise."""
    L = 100
    g = positions.NodeGrid(L)
    u = np.log(np.arange(1.0, L + 1))
    S = -0.25 * np.exp(-np.add.outer(u, u) / 2.0) + 0.03 * np.exp(-np.abs(np.subtract.outer(u, u)))
    np.fill_diagonal(S, 0.0)
    r, vbar, q = 0.7, 8.0, 0.1
    exact = LL.law_weights(S, r, vbar, q, None)
    nodes = LL.law_weights(S[np.ix_(g.x, g.x)], r, vbar, q, g)
    x = g.x
    assert np.allclose(nodes[2], exact[2][x], rtol=0.03)
    assert np.max(np.abs(nodes[2] - 1)) > 0.1            # the factor is not trivially 1 here
    late = x >= 50
    for k in range(3):
        assert np.allclose(nodes[0][late, k], exact[0][x[late], k], rtol=0.12)


def test_prediction_is_continuous_where_a_layer_enters_the_ramp(monkeypatch):
    """The whole prediction, with the ramp's start placed just below and just above the largest
    per-key offset of a 12-layer `output` model (the law's share 1e-9 against the fit alone: a
    query factor of ~1 against none), moves by less than 1e-6; with the old single switch there
    (the law in full just above) it moves by more."""
    from sigprop.mc import floor
    from sigprop.model.predict import key_offsets, predict, run
    from sigprop.model.presets import resolve

    m = resolve("preln", "normal", n_layers=12, dropout=0.0, causal=True, **floor.DIMS, placement="output")
    monkeypatch.setattr(LL, "LAW_LO", float("inf"))
    monkeypatch.setattr(LL, "LAW_OFFSET", float("inf"))
    top = max(off for _, off in key_offsets(run(m)[0]))

    def grads(lo, hi):
        monkeypatch.setattr(LL, "LAW_LO", lo)
        monkeypatch.setattr(LL, "LAW_OFFSET", hi)
        return np.array([p.log_gvar for p in predict(m)])

    fit = grads(top + 1e-9, top + 1.0)
    ramp = grads(top - 1e-9, top - 1e-9 + 1.0)
    step = grads(top - 1e-9, top - 1e-9)
    assert np.max(np.abs(ramp - fit)) < 1e-6
    assert np.max(np.abs(step - fit)) > 1e-5
