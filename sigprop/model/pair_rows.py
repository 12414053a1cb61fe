"""The pair-of-rows weights of a causal attention at given row lengths.

Two causal rows i != i' attending to one key j send it the value-path gradient term
E[A_ij A_i'j] C'_ii' and the key-path term E[dS_ij dS_i'j] (C' the upstream gradient
covariance over positions).  Relative to uniform weights (:func:`sigprop.rules.attention.pair_length_ratios`,
exact two-row integrals at the rule's mean row logit variance v and row-pair logit correlation
rho, :func:`sigprop.rules.attention.pair_law_mean`):

* value path: R = n_i n_i' E[A_ij A_i'j]; 1 with a one-key row, to first order
  1 + rho v (1 - 1/min(n_i, n_i'));
* key path: K = max(n_i, n_i') T2x(n_i, n_i') (T2x = E tr(A_i A_i') over the shared keys,
  A = diag(P) - P P^T); 1 - 1/min(n_i, n_i') at uniform weights.

At the logit variances of deep causal stacks without a norm on the attention's input (v ~ 10-80,
rho ~ 0.9) both rise steeply with both rows' lengths (v 16, rho 0.9: R - 1 = 0.66 / 0.91 for a
two-key row with a 3- / 128-key row, 35 for two 128-key rows; K 0.06 / 0.04 for a two-key row
with a 3- / 64-key row, 4.0 for two 64-key rows), far from the first-order shape.  Attention dropout leaves both: the masks of two
different rows are independent, E[A_ij A_i'j] = E[P_ij P_i'j].

The position model (:mod:`sigprop.model.profile`) distributes the value path's softmax part of
the pair term (the rule's ``cross`` - ``cross_k`` - ``cross_u``) with W = R - 1 and the key
path's (``cross_k``) with K instead of the first-order 1 - 1/min, each normalised as before to
the rule's own pair-averaged value (:func:`pair_terms`).  Approximation: the shapes at the mean
v and rho (the rule averages its pair statistics over their laws; the relative spread of v is
~0.2 at d_head 64); the two-row integrals' Gaussian logits (the fourth-cumulant shift of the
rule's pair statistics is not applied).

Cost: R and K on a table of row lengths (every length up to ``HEAD``, then lengths ``RATIO``
apart, up to the sequence length: 15 lengths and 120 pairs at L 128; 0.02-2 s per (v, rho) on
one core, growing with v and the number of lengths), keyed on v rounded to ``V_STEP`` in log and
rho to ``RHO_STEP`` (a deep stack whose correlation drifts meets tens of keys), kept in the
on-disk table store (:mod:`sigprop.model.store`: built once, then loaded, the same float64
numbers) and memoised per process, as are the weights over the positions' (or a grid's nodes')
lengths: those in between by bilinear interpolation in (log n_i, log n_i'), within 2-3% (W) and
2-5% (K) of the direct values at v 2-60.  Where rho v is below ``LINEAR`` the position model
keeps its first-order weights 1 - 1/min and the key path's pair covariance at uniform weights
(both shapes within 2% of the integrals' at rho v 0.02; on Pre-LN causal 768 layers, rho v up to
0.1, the integrals' weights move the gradient variance by at most 1.3e-4 relative); with rotary positions that test is first made
at the shifted logit variance before the rule's fourth-cumulant Newton step (four row
integrals, ~8 ms), below ``LINEAR`` / ``SCREEN``: the step lowered the variance in every state
sampled (ratios 0.91-1.00 over 165 layer states of llama, olmo2 and rotary preln models), so
the screen never decided otherwise than the full test there."""

from __future__ import annotations

import numpy as np

from sigprop import memo
from sigprop.model import store
from sigprop.rules import attention as attention_rule

#: every row length up to HEAD is a table length
HEAD = 8
#: table lengths beyond HEAD, this ratio apart
RATIO = 1.5
#: memo steps: log v, rho
V_STEP = 0.05
RHO_STEP = 0.01
#: below this rho v, the first-order weights 1 - 1/min(n_i, n_i')
LINEAR = 0.2
#: rotary positions: below rho v = LINEAR / SCREEN at the shifted logit variance before its
#: fourth-cumulant Newton step (``attention.pair_law_mean(newton=False)``, which costs no row
#: integrals), the first-order weights without taking the step
SCREEN = 1.25


def table_lengths(L: int) -> np.ndarray:
    """The row lengths of the table for a sequence of L positions."""
    L = int(L)
    out = list(range(1, min(HEAD, L) + 1))
    x = float(HEAD)
    while out[-1] < L:
        x *= RATIO
        out.append(min(L, max(out[-1] + 1, int(round(x)))))
    return np.asarray(out, dtype=float)


@memo.memoised(memo.Kind("pair_rows.table", 512, "(R, K) per (qv, qrho, L), from the store"))
def _table(qv: float, qrho: float, L: int) -> tuple[np.ndarray, np.ndarray]:
    """(R, K) on :func:`table_lengths` (L) at (qv, qrho), through the on-disk table store
    (:mod:`sigprop.model.store`): built once, then loaded (the same float64 numbers).  Memoised
    per process; read-only."""
    T = table_lengths(L)
    k = len(T)
    skey = store.key("pairrows", float(qv), float(qrho), int(L))
    arr = store.load(skey)
    if arr is not None and arr.size == 2 * k * k:
        R, K = arr[:k * k].reshape(k, k), arr[k * k:].reshape(k, k)
    else:
        R, K = attention_rule.pair_length_ratios(qv, qrho, T)
        store.save(skey, np.concatenate([R.ravel(), K.ravel()]))
    R.setflags(write=False)
    K.setflags(write=False)
    return R, K


def _interp_matrix(T: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Linear interpolation weights in log length: (len(n), len(T))."""
    lt, ln = np.log(T), np.log(np.clip(n, T[0], T[-1]))
    k = np.clip(np.searchsorted(lt, ln, side="right") - 1, 0, len(T) - 2)
    t = (ln - lt[k]) / (lt[k + 1] - lt[k])
    A = np.zeros((len(n), len(T)))
    A[np.arange(len(n)), k] = 1.0 - t
    A[np.arange(len(n)), k + 1] = t
    return A


@memo.memoised(memo.Kind("pair_rows.interp", 64, "interpolation weights per (L, row lengths)"))
def _interp_for(L: int, nkey: bytes) -> np.ndarray:
    """:func:`_interp_matrix` of the table of L at the row lengths packed in ``nkey`` (the same
    positions or grid nodes at every layer), memoised; read-only."""
    A = _interp_matrix(table_lengths(L), np.frombuffer(nkey, dtype=float))
    A.setflags(write=False)
    return A


def pair_weights(params: dict, x, n: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(W, K) over the row lengths ``n`` (positions, or a grid's nodes) at attention input
    ``x``: the value path's softmax weights W = R - 1 and the key path's K
    (:func:`sigprop.rules.attention.pair_length_ratios`); None where rho v < ``LINEAR`` (the
    caller keeps the first-order weights 1 - 1/min(n_a, n_b), and the key path's pair
    covariance at uniform weights).  Only their shapes matter to the caller (it normalises
    each)."""
    n = np.asarray(n, dtype=float)
    if not params.get("rope") and not params.get("qk_norm"):
        # there v is the mean row logit variance (a closed form) and |rho| <= 1 (the query's
        # shared fraction of its variance): below LINEAR, no rule evaluation is needed
        if attention_rule.mean_row_logit_var(params, x) < LINEAR:
            return None
    v, rho = attention_rule.pair_law_mean(params, x, newton=False)
    if params.get("rope"):
        if np.isfinite(v) and np.isfinite(rho) and abs(rho) * v < LINEAR / SCREEN:
            return None
        v, rho = attention_rule.pair_law_mean(params, x)
    if not (np.isfinite(v) and np.isfinite(rho)) or abs(rho) * v < LINEAR:
        return None
    qv = float(np.exp(np.round(np.log(v) / V_STEP) * V_STEP))
    qrho = float(np.round(rho / RHO_STEP) * RHO_STEP)
    return _weights(qv, qrho, int(max(n.max(), 2)), n.tobytes())


@memo.memoised(memo.Kind("pair_rows.weights", 256, "(W, K) per (qv, qrho, L, row lengths)"))
def _weights(qv: float, qrho: float, L: int, nkey: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(W, K) at the row lengths packed in ``nkey``, memoised: the same (read-only) arrays
    for every layer whose (v, rho) round to the same key."""
    R, K = _table(qv, qrho, L)
    A = _interp_for(L, nkey)
    W, K = A @ (R - 1.0) @ A.T, A @ K @ A.T
    W.setflags(write=False)
    K.setflags(write=False)
    return W, K


def pair_terms(r: dict, dK: np.ndarray, kf_diag: float, dW: np.ndarray, w_flat: float,
               dM: np.ndarray, m_flat: float) -> np.ndarray:
    """The pair-of-rows variance per key: the value path's uniform-weight part (``cross_u``) on
    diag(U^T C' U) (``dK``, flat mean ``kf_diag``), its softmax part (``cross`` - ``cross_k`` -
    ``cross_u``) on diag(U^T (C' o W) U) (``dW``, flat mean ``w_flat``), the key path's
    (``cross_k``) on diag(U^T (C' o K) U) (``dM``, flat mean ``m_flat``); each normalised to
    the rule's value for a flat covariance."""
    cu, ck = float(r["cross_u"]), float(r["cross_k"])
    soft = float(r["cross"]) - ck - cu
    out = (cu / kf_diag) * dK
    if m_flat:
        out = out + (ck / m_flat) * dM
    if w_flat:
        out = out + (soft / w_flat) * dW
    return out


def pair_cov_kernel(r: dict, Ku: np.ndarray, ku_off: float, Kk: np.ndarray, kk_off: float, L: int) -> np.ndarray:
    """The pair-of-rows covariance of keys j != j' (the rule's ``cross_c``): its key-path part,
    -``cross_k`` / (L - 1) (each row's key-path gradients sum to zero, so a pair of rows' key
    covariances over j != j' are minus their j = j' terms), on U^T (C' o K) U (``Kk``, flat
    off-diagonal mean ``kk_off``), as its variance part; the rest (value path) on U^T C' U
    (``Ku``, ``ku_off``).  Returns the scaled kernel (a new array)."""
    ck = -float(r["cross_k"]) / (L - 1) if L > 1 else 0.0
    out = ((float(r["cross_c"]) - ck) / ku_off) * Ku
    if kk_off:
        out += (ck / kk_off) * Kk
    return out
