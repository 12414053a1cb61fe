"""The causal position model's gradient covariance through one attention layer, against a sampled
layer: an exchangeable input stream and an upstream gradient whose covariance over positions is
concentrated on the first positions (large variance at position 0, positive correlation among
the first positions), as deep causal stacks produce.  There the pairs of short rows carry the
pair-of-rows terms, whose weights E[A_ij A_i'j] n_i n_i' are 1 for a pair with row 0 and grow with
the shorter row's length (first order: 1 + rho v (1 - 1/min(n_i, n_i')))."""

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from sigprop.mc.components.attention import AttentionMC
from sigprop.model import pair_rows
from sigprop.model import profile as PF
from sigprop.state import Forward

D, H, L, R = 32, 2, 8, 0.3


def _params(p: float) -> dict:
    s = 2.0 / np.sqrt(D)        # row logit variance ~ 16 (large logits, as deep causal stacks)
    return dict(d=D, n_heads=H, d_head=D // H, L=L, p=p, causal=1, q_std=s, k_std=s,
                v_std=1 / np.sqrt(D), o_std=1 / np.sqrt(D), q_bias_std=0.0, k_bias_std=0.0,
                v_bias_std=0.0, o_bias_std=0.0)


def _upstream() -> np.ndarray:
    i = np.arange(L)
    f = 1 + 10.0 / (i + 1.0) ** 1.5
    C = 0.5 * np.exp(-np.add.outer(i, i) / 3.0)
    np.fill_diagonal(C, 1.0)
    C *= np.sqrt(np.outer(f, f))
    return C / np.mean(np.diag(C))


def _sampled(params: dict, C: np.ndarray, trials: int, batch: int, seed: int):
    """Per trial, the input gradient's covariance over positions (features averaged)."""
    comp = AttentionMC()
    rng = np.random.default_rng(seed)
    w, V = np.linalg.eigh(C)
    Lc = V * np.sqrt(np.clip(w, 0.0, None))
    out = []
    for _ in range(trials):
        W = comp.sample_weights(rng, params, np.float64)
        X = (np.sqrt(R) * rng.standard_normal((batch, 1, D))
             + np.sqrt(1 - R) * rng.standard_normal((batch, L, D)))
        _, cache = comp.forward(X, W, params, rng)
        G = np.einsum("ij,bjf->bif", Lc, rng.standard_normal((batch, L, D)))
        gx = comp.backward(G, cache)
        out.append(np.einsum("bif,bjf->ij", gx, gx) / (batch * D))
    return np.array(out)


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_first_positions_gradient_variance(p):
    """Seed 0, 300 trials x batch 4: the predicted gradient variance at positions 0, 1, 2 within 3
    standard errors plus 1%.  With one pair-of-rows weight for every pair (the rule's average
    over the pairs of rows) position 0 came out 7% high (7.33 against 6.85 +- 0.11 at dropout 0,
    7.98 against 7.49 +- 0.12 at 0.1, about 4 standard errors)."""
    params = _params(p)
    C = _upstream()
    K = _sampled(params, C, trials=300, batch=4, seed=0)
    mean, se = K.mean(0), K.std(0, ddof=1) / np.sqrt(len(K))
    x = Forward(np.float64(0.0), np.float64(1.0), np.float64(R))
    r = PF._rows_direct(params, x)
    pred = PF._attention_cov(r, C, vw=pair_rows.pair_weights(params, x, np.arange(1.0, L + 1)))
    for j in range(3):
        tol = 3 * se[j, j] + 0.01 * mean[j, j]
        assert abs(pred[j, j] - mean[j, j]) < tol, (j, pred[j, j], mean[j, j], se[j, j])


def test_uniform_limit_and_flat_normalisation():
    """At a vanishing logit variance the weights are uniform: the value path's pair term is its
    uniform-weight part (``cross_u``); and a flat covariance (diagonal 1, off-diagonal rg) gives
    back the rule's pair-averaged value whatever the split."""
    tiny = {**_params(0.1), "q_std": 1e-3 / np.sqrt(D), "k_std": 1e-3 / np.sqrt(D)}
    r = PF._rows_direct(tiny, Forward(np.float64(0.0), np.float64(1.0), np.float64(R)))
    assert r["cross_u"] == pytest.approx(r["cross"] - r["cross_k"], rel=1e-5)
    params = _params(0.1)
    r = PF._rows_direct(params, Forward(np.float64(0.0), np.float64(1.0), np.float64(R)))
    assert abs(r["cross"] - r["cross_k"] - r["cross_u"]) > 0.1 * r["cross_u"]   # the split matters here
    for rg in (0.0, 0.3):
        C = np.full((L, L), rg)
        np.fill_diagonal(C, 1.0)
        out = PF._attention_cov(r, C)
        t1, off1 = PF._flat_stats(r, PF.exact_positions(L), rg)
        assert np.mean(np.diag(out)) == pytest.approx(t1, rel=1e-12)


def _key_path_rows(params: dict, x: Forward, n: np.ndarray) -> dict:
    """The per-row terms of the key path alone (the rule's backward terms by path)."""
    from sigprop.backend import numeric
    from sigprop.rules import attention as AT
    from sigprop.rules import get
    from sigprop.state import Backward

    p = get("attention").param_values(params)
    c = AT._Ctx(numeric, x, p, bool(params.get("rope", 0)))
    bst = AT._backward_row_stats(numeric, c, lambda fn: c.at_n(fn, n))
    bst.update(C2=0 * n, T2x=0 * n, PP=0 * n, rvT2x=0 * n)
    t = AT._backward_terms(numeric, c, p, Backward(1.0, 0.0), bst)
    avg = AT._backward_stats(numeric, c, p)
    t0 = AT._backward_terms(numeric, c, p, Backward(1.0, 0.0), avg)
    t1 = AT._backward_terms(numeric, c, p, Backward(1.0, 1.0), avg)
    Ln = len(n)
    zero = 0.0 * n
    return {"var": zero, "spread": t["key"] + zero, "local": zero, "same_c": (Ln - 1) * t["key_c"] + zero,
            "same_k": (Ln - 1) * t["key_c"] + zero, "cross": float(t1["key_x"]), "cross_k": float(t1["key_x"]),
            "cross_u": 0.0, "cross_c": float(t1["key_c"] - t0["key_c"]), "qry_c": 0.0}


def test_rotary_key_path_first_pairs():
    """Rotary positions (base 10^4, RMS QK-norm), seed 0, 200 trials x batch 4: the key path's
    covariance of neighbouring first positions (0, 1), (1, 2), (2, 3) within 3 standard errors
    plus 2% of position 1's variance.  The rotation multiplies the within-row covariance of keys
    j, j' by kappa(j - j') (near 1 for neighbours); with the row mean kbar(L) for every pair
    (0.75 here) the predicted (0, 1) entry was -0.133 against -0.171 +- 0.008."""
    Lr = 16
    params = {**_params(0.0), "L": Lr, "d": 64, "d_head": 32, "q_std": 1 / 8, "k_std": 1 / 8,
              "v_std": 1 / 8, "o_std": 1 / 8, "qk_norm": 2, "qk_eps": 1e-6, "rope": 1e4}
    i = np.arange(Lr)
    f = 1 + 10.0 / (i + 1.0) ** 1.5
    C = 0.5 * np.exp(-np.add.outer(i, i) / 3.0)
    np.fill_diagonal(C, 1.0)
    C *= np.sqrt(np.outer(f, f))
    C /= np.mean(np.diag(C))
    comp = AttentionMC()
    rng = np.random.default_rng(0)
    w, V = np.linalg.eigh(C)
    Lc = V * np.sqrt(np.clip(w, 0.0, None))
    d = params["d"]
    Ks = []
    for _ in range(200):
        W = comp.sample_weights(rng, params, np.float64)
        X = (np.sqrt(R) * rng.standard_normal((4, 1, d)) + np.sqrt(1 - R) * rng.standard_normal((4, Lr, d)))
        _, cache = comp.forward(X, W, params, rng)
        G = np.einsum("ij,bjf->bif", Lc, rng.standard_normal((4, Lr, d)))
        gk = comp.backward_paths(G, cache)["k"]
        Ks.append(np.einsum("bif,bjf->ij", gk, gk) / (4 * d))
    Ks = np.array(Ks)
    mean, se = Ks.mean(0), Ks.std(0, ddof=1) / np.sqrt(len(Ks))
    r = _key_path_rows(params, Forward(np.float64(0.0), np.float64(1.0), np.float64(R)), np.arange(1.0, Lr + 1))
    pred = PF._attention_cov(r, C, None, PF._offset_kernel(params, None, Lr))
    for j in range(3):
        tol = 3 * se[j, j + 1] + 0.02 * mean[1, 1]
        assert abs(pred[j, j + 1] - mean[j, j + 1]) < tol, (j, pred[j, j + 1], mean[j, j + 1], se[j, j + 1])


def _sampled_ratios(v: float, rho: float, na: int, nb: int, draws: int, seed: int):
    """From sampled softmax rows (row i: n_a iid N(0, v) logits; row i': n_b, correlated rho
    with row i's on the first n_a keys): n_b sum_{j < n_a} P_ij P_i'j (the value path's ratio R)
    and n_b tr(A_i A_i') over the shared keys, A = diag(P) - P P^T (the key path's K); each as
    (mean, standard error)."""
    rng = np.random.default_rng(seed)
    z = np.sqrt(v) * rng.standard_normal((draws, nb))
    z2 = rho * z + np.sqrt(1 - rho**2) * np.sqrt(v) * rng.standard_normal((draws, nb))
    P = np.exp(z[:, :na] - z[:, :na].max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    Q = np.exp(z2 - z2.max(1, keepdims=True))
    Q /= Q.sum(1, keepdims=True)
    Q = Q[:, :na]
    pq = (P * Q).sum(1)
    r = nb * pq
    k = nb * (pq - (P * Q * Q).sum(1) - (P * P * Q).sum(1) + pq**2)
    return [(float(x.mean()), float(x.std() / np.sqrt(draws))) for x in (r, k)]


@pytest.mark.parametrize("v,rho", [(16.0, 0.3), (16.0, 0.85), (2.0, 0.9)])
def test_pair_length_ratios_against_sampling(v, rho):
    """The two-row ratios at two given row lengths (exact double integrals) against sampled
    softmax rows, seed 0, 100000 draws per pair: within 4 standard errors plus 0.3% (of R; of
    K plus 0.002 absolute).  And their limits: R = 1 and K = 0 with a one-key row."""
    from sigprop.rules.attention import pair_length_ratios

    lengths = [1, 2, 3, 5, 16]
    R, K = pair_length_ratios(v, rho, lengths)
    assert np.allclose(R[0], 1.0, atol=1e-3) and np.allclose(K[0], 0.0, atol=1e-6)
    for a, b in [(1, 2), (1, 4), (2, 3), (2, 4), (3, 4)]:
        (mr, sr), (mk, sk) = _sampled_ratios(v, rho, lengths[a], lengths[b], 100_000, 0)
        assert abs(R[a, b] - mr) < 4 * sr + 0.003 * mr, (lengths[a], lengths[b], R[a, b], mr, sr)
        assert abs(K[a, b] - mk) < 4 * sk + 0.003 * abs(mk) + 0.002, (lengths[a], lengths[b], K[a, b], mk, sk)


def test_pair_length_weights_first_order():
    """At a small logit variance both pair weights take the first-order shape the position
    model used before: R - 1 = rho v (1 - 1/min(n_i, n_i')) within 1% at rho v = 0.009, and
    K = 1 - 1/min(n_i, n_i') within 1% (its uniform-weight value)."""
    from sigprop.rules.attention import pair_length_ratios

    lengths = np.array([1.0, 2.0, 3.0, 4.0, 8.0, 64.0])
    v, rho = 0.01, 0.9
    R, K = pair_length_ratios(v, rho, lengths)
    M = 1.0 - 1.0 / np.minimum.outer(lengths, lengths)
    off = ~np.eye(len(lengths), dtype=bool)
    assert np.allclose((R - 1.0)[off], rho * v * M[off], rtol=0.01, atol=1e-7)
    assert np.allclose(K[off], M[off], rtol=0.01, atol=1e-7)


@settings(max_examples=60, deadline=None)
@example(mean=0.0, var=1.0, corr=0.3, qs=0.05, ks=0.05, qb=0.0, kb=0.0)      # screened out
@example(mean=0.0, var=1.0, corr=0.3, qs=0.5, ks=0.5, qb=0.0, kb=0.0)        # weights needed
@given(mean=st.floats(-2.0, 2.0), var=st.floats(1e-3, 4.0), corr=st.floats(-0.2, 0.999),
       qs=st.floats(0.01, 0.6), ks=st.floats(0.01, 0.6), qb=st.floats(0.0, 1.0), kb=st.floats(0.0, 1.0))
def test_pair_weights_screen_never_skips_a_state_that_needs_them(mean, var, corr, qs, ks, qb, kb):
    """pair_weights decides "no weights" without the rule where the closed-form mean row logit
    variance is below LINEAR (no rotary positions, no QK-norm): that bounds |rho| v, so the
    screen and the full test agree."""
    from sigprop.rules import attention as AT

    params = {**_params(0.0), "q_std": qs, "k_std": ks, "q_bias_std": qb, "k_bias_std": kb}
    x = Forward(mean, var, corr)
    v, rho = AT.pair_law_mean(params, x, newton=False)
    bound = AT.mean_row_logit_var(params, x)
    assert abs(rho) * v <= bound * (1 + 1e-12) + 1e-300
    full = not (np.isfinite(v) and np.isfinite(rho)) or abs(rho) * v < pair_rows.LINEAR
    assert (pair_rows.pair_weights(params, x, np.arange(1.0, L + 1)) is None) == full
