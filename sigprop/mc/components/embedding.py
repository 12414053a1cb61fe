"""Embedding (word + position + segment tables): Monte Carlo component and a sweep.

Token ids are drawn iid from Zipf(s, V), segment ids iid from fixed segment frequencies,
positions are 0..L-1.  The forward input ``X`` is a dummy of shape (B, L, 1): only its
batch size, length and dtype are used.

Backward is the hand-written scatter-add of the output gradient into the word table, done
per sequence (matching the rule's definition): sequence b's row gradients, one per distinct
token, fill the first slots of row b of a (B, L, d) array (the rest is 0), so the
estimators see one sequence's table gradient per token occurrence.
:meth:`EmbeddingMC.table_gradient` folds them into the full (V, d) table gradient.

Word-table rows are drawn lazily, only for the ids that occur in the batch (the same law as
drawing the whole V x d table and indexing it); passing explicit tables in ``W`` (keys
"word", "pos", "seg") uses those instead, which the finite-difference test relies on.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from sigprop.mc.backend import backend_of, np_dtype
from sigprop.mc.component import WIDTH, Component
from sigprop.rules.base import Param
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.rules.embedding import zipf_frequencies
from sigprop.state import Backward, Forward

#: segment (token-type) frequencies of the sweep: two types, as in BERT
SEGMENT_FREQS = (0.6, 0.4)


@lru_cache(maxsize=32)
def _zipf_cdf(s: float, V: int) -> np.ndarray:
    c = np.cumsum(zipf_frequencies(s, V))
    c[-1] = 1.0
    return c


def _draw(rng, cdf: np.ndarray, shape) -> np.ndarray:
    """iid ids with cumulative distribution ``cdf`` (inverse-CDF sampling)."""
    ids = np.searchsorted(cdf, rng.random(shape), side="right")
    return np.minimum(ids, len(cdf) - 1)


def _grouping(tok: np.ndarray, V: int):
    """Group the positions of each sequence by token: the permutation that sorts them by
    (sequence, token), the start of every group, and for every group its sequence, its slot
    (rank among the sequence's distinct tokens) and its token."""
    B, L = tok.shape
    key = (np.arange(B, dtype=np.int64)[:, None] * V + tok).ravel()
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    ukey = sk[starts]
    seq = ukey // V
    slot = np.arange(len(ukey)) - np.searchsorted(seq, seq, side="left")
    return order, starts, seq, slot, ukey % V


class EmbeddingMC(Component):
    name = "embedding"
    rule = "embedding"
    array_api = True
    weights = False
    #: L is the rule's; the simulation draws token ids from Zipf(zipf_s, V), segment ids from
    #: SEGMENT_FREQS
    sim_params = (WIDTH, Param("V", "vocabulary size of the simulation", 30000, lo=1, integer=True),
                  Param("zipf_s", "Zipf exponent of the simulated token frequencies", 1.0, lo=0.0))

    def dims(self, params):
        return params["L"], 1, params["d"]

    def memory(self, params, batch):
        """The token distribution's cumulative frequencies (V doubles) and a few (B, L, d)
        arrays (rows drawn lazily: at most B L of the V)."""
        return 2.0 * params["V"] + 6.0 * batch * params["L"] * params["d"]

    derives = ("word_collision",)

    def derived(self, rule_params, sim):
        """The rule's collision probabilities from the simulated distributions."""
        cw = _power_sums(float(sim["zipf_s"]), int(sim["V"]))[0]
        q = np.asarray(SEGMENT_FREQS) / sum(SEGMENT_FREQS)
        return {"word_collision": cw, "segment_collision": float(q @ q)}

    def forward(self, X, W, params, rng):
        """Token and segment ids and their grouping are drawn and computed on the host (NumPy);
        the tables and the output live on X's backend."""
        bk = backend_of(X)
        xp = bk.xp
        B, L = X.shape[:2]
        d, V = params["d"], params["V"]
        dt = np_dtype(X.dtype)
        tok = _draw(rng, _zipf_cdf(float(params["zipf_s"]), int(V)), (B, L))
        uniq, inv = np.unique(tok, return_inverse=True)
        inv = inv.ravel()
        if "word" in W:
            rows = xp.take(W["word"], bk.asarray(uniq), axis=0)
        else:
            rows = rng.standard_normal((len(uniq), d), dtype=dt)
            rows *= float(params["word_std"])
        Y = xp.reshape(xp.take(rows, bk.asarray(inv), axis=0), (B, L, d))
        pos_std = params.get("pos_std", 0.0)
        if "pos" in W:
            Y += W["pos"][:L, ...]
        elif pos_std:
            Y += rng.standard_normal((L, d), dtype=dt) * float(pos_std)
        seg_std = params.get("seg_std", 0.0)
        if "seg" in W or seg_std:
            q = np.cumsum(params.get("segment_freqs", SEGMENT_FREQS), dtype=float)
            q /= q[-1]
            seg = _draw(rng, q, (B, L))
            if "seg" in W:
                S = W["seg"]
            else:
                S = rng.standard_normal((len(q), d), dtype=dt) * float(seg_std)
            Y += xp.reshape(xp.take(S, bk.asarray(seg.ravel()), axis=0), (B, L, d))
        return Y, _grouping(tok, int(V))

    def backward(self, GY, cache):
        """Scatter-add dLoss/dY per sequence: the row of token i in sequence b is the sum of
        GY[b, t] over the positions t holding i; laid out in (B, L, d) slots.  Done on the host
        (the standard has no scatter-add) and moved back to GY's backend."""
        bk = backend_of(GY)
        G = bk.to_numpy(GY)
        order, starts, seq, slot, _ = cache
        B, L, d = G.shape
        sums = np.add.reduceat(G.reshape(-1, d)[order], starts, axis=0)
        T = np.zeros_like(G)
        T[seq, slot] = sums
        return bk.asarray(T)

    @staticmethod
    def table_gradient(T, cache, V: int) -> np.ndarray:
        """The (V, d) word-table gradient of the whole batch from :meth:`backward`'s slots
        (a host NumPy array)."""
        T = backend_of(T).to_numpy(T)
        _, _, seq, slot, token = cache
        out = np.zeros((V, T.shape[-1]), dtype=np.float64)
        rows = T[seq, slot].astype(np.float64)
        order = np.argsort(token, kind="stable")
        st = token[order]
        starts = np.flatnonzero(np.r_[True, st[1:] != st[:-1]])
        out[st[starts]] = np.add.reduceat(rows[order], starts, axis=0)
        return out

    def flops(self, params, batch):
        return 6.0 * batch * params["L"] * params["d"]


COMPONENT = EmbeddingMC()


# --- sweep --------------------------------------------------------------------------------
#: target relative standard error of the measured moments (no published figures to beat; the
#: rule is exact, so the sweep's errors are sampling noise of about this size)
TARGET_SE = 0.02
TOKENS_PER_RUN = 512
MAX_RUN_ELEMENTS = 4_000_000


@lru_cache(maxsize=32)
def _power_sums(s: float, V: int) -> tuple[float, float, float]:
    """sum f^2, sum f^3, sum f^4 of Zipf(s, V)."""
    f = zipf_frequencies(s, V)
    return float(f @ f), float(np.sum(f**3)), float(np.sum(f**4))


def _count_noise(c2: float, c3: float, L: int) -> float:
    """Relative variance of the number of same-id ordered pairs among L iid draws (a
    U-statistic): 2/(L^2 c2) + 4 (c3 - c2^2)/(L c2^2), to leading orders."""
    return 2.0 / (L * L * c2) + 4.0 * (c3 - c2 * c2) / (L * c2 * c2)


def _case(pt: dict) -> Case:
    s, V, d, L, rg = pt["zipf_s"], pt["V"], pt["d"], pt["L"], pt["g_corr"]
    cw, c3, c4 = _power_sums(float(s), int(V))
    q = np.asarray(SEGMENT_FREQS) / sum(SEGMENT_FREQS)
    cs, cs3, cs4 = float(q @ q), float(np.sum(q**3)), float(np.sum(q**4))
    w2, p2, s2 = pt["word_std"] ** 2, pt["pos_std"] ** 2, pt["seg_std"] ** 2
    var = w2 + p2 + s2
    B0 = max(1, TOKENS_PER_RUN // L)
    # Noise model (relative variances; checked against the pooled standard errors).  Per run
    # the tables are fixed, and the few frequent rows carry the estimates: table noise
    # ~ (2/d) x (sum of squared row weights).  Per sequence, the count of same-token pairs
    # fluctuates (heavy for Zipf): it drives the covariance and the coherent part
    # rg (L-1) c / (1 + rg (L-1) c) of the table-gradient energy, whose other sources
    # (the sequence's shared gradient component, the chi-square of the frequent rows) are
    # also per sequence.
    coh = rg * (L - 1) * cw / (1 + rg * (L - 1) * cw)
    per_run = max(
        2.0 / d * (w2**2 * (cw + 1.0 / (B0 * L)) + p2**2 / L + s2**2 * cs) / var**2,
        2.0 / d * (w2**2 * (c4 + cw**2) + s2**2 * (cs4 + cs**2)) / var**2,
    )
    per_seq = max(
        (w2**2 * cw**2 * _count_noise(cw, c3, L) + s2**2 * cs**2 * _count_noise(cs, cs3, L)) / var**2,
        coh**2 * (_count_noise(cw, c3, L) + 2.0 / d) + 2.0 / d * (cw + 1.0 / L),
    )
    runs = int(min(1000, max(8, math.ceil(per_run / TARGET_SE**2))))
    B = max(B0, math.ceil(per_seq / (runs * TARGET_SE**2)))
    cap = max(1, MAX_RUN_ELEMENTS // (L * d))
    if B > cap:
        runs = math.ceil(runs * B / cap)
        B = cap
    rule = {"word_std": pt["word_std"], "pos_std": pt["pos_std"], "seg_std": pt["seg_std"],
            "word_collision": cw, "segment_collision": cs, "L": L}
    sim = {"word_std": pt["word_std"], "pos_std": pt["pos_std"], "seg_std": pt["seg_std"],
           "zipf_s": s, "V": V, "d": d, "L": L, "segment_freqs": SEGMENT_FREQS}
    return Case(rule, sim, Forward(0.0, 1.0, 0.0), Backward(pt.get("g_std", 1.0) ** 2, rg),
                runs, B)


SWEEP = SweepSpec(
    component=COMPONENT,
    grid={
        "zipf_s": (0.8, 1.0, 1.2), "V": (1000, 30000),
        "word_std": (0.02, 1.0), "pos_std": (0.0, 0.5), "seg_std": (0.0, 0.3),
        "d": (64, 256), "L": (128, 512), "g_corr": (0.0, 1 / 3, 2 / 3),
    },
    make_case=_case,
    published={"x_mean": None, "x_var": None, "x_corr": None, "g_var": None, "g_corr": None},
    note="Own grid (no published one). Backward = word-table gradient of one sequence per "
         "token occurrence (see sigprop.rules.embedding).",
)
