"""The causal attention rows' Gaussian logit law with the stream's position deviation in full,
evaluated by a seeded sample: per-key weights and the query path's deviation factor for the
causal attentions whose keys' logits stand far apart (used by sigprop.model.profile).

A causal row i attends to keys 0..i.  For a stream of mean token correlation r whose pair
correlations deviate from it by S (zero diagonal), the row's logits are Gaussian with
covariance (vbar / (1 - r)) (r 1 1^T + C) over its keys, C = (1 - r) I + S (vbar the rule's
mean row logit variance: the logits' token-varying part, C's, has that variance on average;
the constant part along 1 is a shift the softmax ignores, but C alone need not be positive
semidefinite, so the law is sampled with r included).  The position model's default per-key
weights (sigprop.rules.attention.key_weights) keep the keys independent after an additive fit
of S; that fit leaves out the structure the first keys share, and the query path's rule terms
take exchangeable keys.  Where the largest per-key logit offset exceeds ``LAW_LO``
(logit-variance units) and the sequence is at most ``LAW_MAX`` long, this module evaluates,
per row, from ``DRAWS`` draws of that law (in full above ``LAW_OFFSET``, weighted with the
fit's below it, :func:`law_share`):

* the key weights w1 = n_i E[P_ij] and w2 = E[P_ij^2] over the iid row's E[P^2] (the iid row:
  the same normal numbers at variance vbar, keys independent);
* the query factor: E sum_jk P_j P_k ((J C J^T)_jk + q (J J^T)_jk) C_jk over the same for the
  iid row (J = I - 1 P^T; C for the value direction and the keys alike; q = p / (1 - p) of
  the attention dropout), the generic term of the query path's gradient variance.  Additive
  parts of C (m_j + m_k, r 1 1^T among them) drop out of it (J 1 = 0).

The normal numbers: a NumPy Generator per row, seeded with (``SEED``, the caller's ``stream``
(the predictor passes the layer's index), the row length), so a prediction is reproducible, two
rows or two layers draw independent numbers (a deep model multiplies the gradient through dozens
of such layers, where one set of numbers for all of them would add up each layer's sampling
error), and a change of the model's parameters keeps the numbers (the prediction moves smoothly
with them, as a solver needs).

Assumptions, as for the default weights: the row logit variance at its mean vbar (no row-to-row
spread); the upstream gradient and the values independent of the logits; on a position grid,
S between positions interpolated linearly in log(position + 1) from its node values (the
diagonal nodes at the grid's diagonal limit), rows evaluated at the grid's nodes.  What the
sample measured is in docs/validation.md (Block layouts)."""

from __future__ import annotations

import numpy as np

#: the per-key logit offsets (sigprop.rules.attention.key_weights_and_offset) between which the
#: sampled law takes over from the additive fit: below LAW_LO the fit alone, above LAW_OFFSET
#: the law alone, between them the two weighted linearly in the offset (law_share), so that a
#: prediction moves continuously as a parameter carries a layer across (with one threshold at 3,
#: switching the one layer just below it moved the `output` placement's 48-layer input gradient
#: by 0.02% without dropout and, at 2.69, 0.14% with dropout 0.1: the order of the law's own
#: seed-to-seed spread, but a step a solver would meet).  The scan of
#: tests/model/test_predict_key_offsets.py: every validated causal configuration but the `output`
#: placement's is below 1.6; its 12-layer ones reach 2.69, its 48-layer ones ~37
LAW_LO = 2.0
LAW_OFFSET = 3.0
#: the longest sequence whose law is sampled (its cost grows as rows x L^2 x DRAWS)
LAW_MAX = 256
#: the law's draws per row, and the seed of its normal numbers
DRAWS = 16000
SEED = 0


def law_share(offset: float, L: int) -> float:
    """The sampled law's share t of a layer's per-key weights and query factor (the fit's is
    1 - t): 0 at offsets up to LAW_LO and beyond LAW_MAX positions, 1 above LAW_OFFSET, linear
    in the offset between."""
    if int(L) > LAW_MAX or not offset > LAW_LO:
        return 0.0
    if offset >= LAW_OFFSET or LAW_OFFSET <= LAW_LO:
        return 1.0
    return (offset - LAW_LO) / (LAW_OFFSET - LAW_LO)


def _interp_matrix(grid) -> np.ndarray:
    """(L, nodes): linear interpolation in log(position + 1) from the grid's nodes."""
    u = np.log(np.arange(1.0, grid.L + 1))
    return np.stack([np.interp(u, grid.u, e) for e in np.eye(grid.size)], axis=1)


def positions_deviation(S: np.ndarray, grid) -> np.ndarray:
    """The deviation S over every position from its values at the nodes of ``grid`` (None: S
    is over every position already): the nodes' diagonal at the grid's diagonal limit
    (NodeGrid.E), linear in log(position + 1) between nodes, the diagonal 0."""
    if grid is None:
        return S
    Sl = S.copy()
    np.fill_diagonal(Sl, (S * grid.E).sum(axis=1))
    B = _interp_matrix(grid)
    out = B @ Sl @ B.T
    np.fill_diagonal(out, 0.0)
    return out


def _softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of z (draws, n), computed in z's own memory (z is overwritten)."""
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def query_term(P: np.ndarray, C: np.ndarray, q: float) -> float:
    """E over the rows of attention weights P (draws, n) of
    sum_jk P_j P_k ((J C J^T)_jk + q (J J^T)_jk) C_jk, J = I - 1 P^T (the module docstring)."""
    CP = P @ C
    X = P * CP
    pcp = X.sum(axis=1)
    s1 = np.einsum("nj,nj->n", P @ (C * C), P)
    s2 = np.einsum("nj,nj->n", X, CP)
    P2 = P * P
    drop = P2 @ np.diag(C) - 2 * np.einsum("nj,nj->n", X, P) + P2.sum(axis=1) * pcp
    return float(np.mean(s1 - 2 * s2 + pcp * pcp + q * drop))


def query_term_iid(P: np.ndarray, c: float, q: float) -> float:
    """:func:`query_term` for C = c I, in closed form in the draws' sums of P^2 and P^3:
    c^2 (S2 - 2 S3 + S2^2) + q c (S2 - 2 S3 + S2^2)."""
    P2 = P * P
    s2 = P2.sum(axis=1)
    s3 = np.einsum("nj,nj->n", P2, P)
    t = s2 - 2.0 * s3 + s2 * s2
    return float(np.mean(t)) * (c * c + q * c)


def _cholesky(C: np.ndarray) -> np.ndarray:
    """The lower Cholesky factor of a covariance; where rounding leaves it indefinite, that of
    its projection onto the positive semidefinite matrices plus 1e-12 times its largest
    diagonal entry (at least 1e-300) on the diagonal."""
    try:
        return np.linalg.cholesky(C)
    except np.linalg.LinAlgError:
        w, V = np.linalg.eigh(C)
        Cp = (V * np.clip(w, 0.0, None)) @ V.T
        jitter = 1e-12 * max(float(np.max(np.diag(C), initial=0.0)), 1e-300)
        return np.linalg.cholesky(Cp + jitter * np.eye(len(C)))


def sample_weights(P: np.ndarray, h2: float) -> tuple:
    """(w1, w2) per key from sampled attention rows P (draws, n): n E[P_j] and E[P_j^2] / h2,
    h2 the iid row's E[P^2] (per key, averaged over its keys)."""
    return P.mean(axis=0) * P.shape[1], (P * P).mean(axis=0) / h2


def row_law(z: np.ndarray, z0: np.ndarray, C: np.ndarray, r: float, q: float) -> tuple:
    """(w1, w2, query factor) of one row of n keys from its sampled logits z (draws, n) of the
    law and z0 of the iid row drawn from the same normal numbers, C the keys' covariance less r
    (n x n, in stream units: (1 - r) I + S) (the module docstring).  z and z0 are overwritten
    (their softmax is computed in place)."""
    P, P0 = _softmax(z), _softmax(z0)
    w1, w2 = sample_weights(P, float(np.mean(P0 * P0)))
    ref = query_term_iid(P0, 1.0 - r, q)
    return w1, w2, (query_term(P, C, q) / ref if ref > 0 else 1.0)


def law_weights(S: np.ndarray, r: float, vbar: float, q: float, grid=None, v_common: float = 0.0,
                stream: int = 0):
    """(w1, w2, query): the per-key weights (rows, keys) and the per-row query factor over the
    positions or the nodes of ``grid``, for a stream of mean correlation r and deviation S (at
    the nodes on a grid), row logit variance vbar (its token-varying part; ``v_common``: a
    logit variance every key takes on its own, rotary positions' key-shared part, in the law
    and in the iid row) and attention dropout's q = p / (1 - p); ``stream``: the caller's
    index of the layer, part of the seed (the module docstring).  Above the diagonal (keys
    after the row) 1, as the caller replaces them."""
    Sp = positions_deviation(S, grid)
    L = len(Sp)
    rows = np.arange(L) if grid is None else np.asarray(grid.x)
    one_minus_r = max(1.0 - float(r), 1e-12)
    C = Sp + one_minus_r * np.eye(L)
    # the logits' covariance over the keys, r included (the module docstring)
    A = (C + float(r)) * (vbar / one_minus_r) + v_common * np.eye(L)
    nr = len(rows)
    w1, w2, qf = np.ones((nr, nr)), np.ones((nr, nr)), np.ones(nr)
    for a, i in enumerate(rows):
        n = int(i) + 1
        if n < 2:
            continue
        G = np.random.default_rng([SEED, int(stream), n]).standard_normal((DRAWS, n))
        z = G @ _cholesky(A[:n, :n]).T
        G *= np.sqrt(vbar + v_common)           # the iid row's logits (G not needed after)
        r1, r2, qf[a] = row_law(z, G, C[:n, :n], r, q)
        keys = rows[: a + 1]
        w1[a, : a + 1], w2[a, : a + 1] = r1[keys], r2[keys]
    return w1, w2, qf
