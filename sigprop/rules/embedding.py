"""Embedding: sum of a word table, a learned absolute-position table and an optional
segment (token-type) table, looked up at random token ids ([TGS] section on embeddings).

    x[b, t] = W_word[tok[b, t]] + W_pos[t] + W_seg[seg[b, t]]

Tables have iid N(0, std^2) entries, independent of each other; token ids are drawn
independently per position from the token frequencies f, segment ids from the segment
frequencies q.

Forward (expectation over tables and ids; exact):

* mean 0, variance word_std^2 + pos_std^2 + seg_std^2;
* covariance of two different positions of one sequence: word_std^2 P(same token) +
  seg_std^2 P(same segment), with P(same token) = sum_i f_i^2 (``word_collision``) and
  P(same segment) = sum_j q_j^2 (``segment_collision``); different positions read different,
  independent rows of the position table, which adds nothing.  (For real text the tokens of
  a sequence are not independent: pass the measured pair-collision probability instead.  The
  same goes for segment ids laid out in blocks, e.g. BERT's [A ... A B ... B]: then pass the
  probability that two positions share a segment, about 1/2 for two halves.)

Backward: an embedding has no differentiable input, so "backward" here is the gradient
reaching the **word table**, dLoss/dW_word, the scatter-add of the output gradient G over
token occurrences: in one sequence, row i receives G_i = sum of G[t] over the positions t
holding token i.  The state describes **one sequence** (the rows a batch of B independent
sequences receive are sums of B such terms).  A sequence of L positions touches at most L
rows, so its row gradients are laid out in L slots (one per distinct token, the rest 0), and
the state is that of this (L, d) array, measured like a hidden state:

* var = sum_i E[G_i^2] / L per entry: the table-gradient energy **per token occurrence**,
  ``g2 (1 + rg (L-1) c)``, c = word_collision (repeats of a token inside a sequence add
  coherently when rg > 0);
* corr = sum over pairs of different rows of E[G_i G_j] / (L (L-1) var):
  ``rg (1 - c) / (1 + rg (L-1) c)`` (positions holding different tokens feed different rows;
  their gradients share the upstream token correlation rg).

Equivalent per-row views: averaged over the V rows, the per-entry variance is var L / V and
the correlation between two different rows is corr (L-1)/(V-1); a row of frequency f gets
g2 L f (1 + rg (L-1) f) (:func:`row_gradient_var`).  The position table's row t receives
G[t] itself (variance g2 per sequence); the segment table is not tracked.
"""

from __future__ import annotations

import numpy as np

from sigprop import symbols
from sigprop.errors import DomainError
from sigprop.rules.base import Param, Rule, register, std
from sigprop.state import Backward, Forward

symbols.register("word_std", r"\sigma_{\mathrm{word}}", positive=True)
symbols.register("pos_std", r"\sigma_{\mathrm{pos}}", positive=True)
symbols.register("seg_std", r"\sigma_{\mathrm{seg}}", positive=True)
symbols.register("word_collision", r"c_{\mathrm{word}}", nonnegative=True)
symbols.register("segment_collision", r"c_{\mathrm{seg}}", nonnegative=True)


# --- token statistics (plain Python / NumPy helpers) -------------------------------------
def zipf_frequencies(s: float, V: int) -> np.ndarray:
    """Token frequencies f_i proportional to i^-s, i = 1..V (normalised to sum 1)."""
    s = float(s)
    if not np.isfinite(s) or s < 0:
        raise DomainError(f"Zipf exponent s must be finite and >= 0, got {s:g}")
    if int(V) != V or V < 1:
        raise DomainError(f"vocabulary size V must be a positive integer, got {V!r}")
    # log-space keeps large s from underflowing to an all-zero tail before normalising
    logw = -s * np.log(np.arange(1, int(V) + 1, dtype=float))
    w = np.exp(logw - logw.max())
    return w / w.sum()


def collision_probability(freqs) -> float:
    """sum_i f_i^2 of a frequency list: the probability that two independent draws agree.

    ``freqs`` may be probabilities or any non-negative weights (counts): they are
    normalised by their sum.  Raises DomainError for an empty list, negative or non-finite
    entries, or an all-zero list.
    """
    f = np.asarray(freqs, dtype=float)
    if f.ndim != 1 or f.size == 0:
        raise DomainError("frequencies must be a non-empty 1-D list")
    if not np.all(np.isfinite(f)):
        raise DomainError("frequencies must be finite")
    if np.any(f < 0):
        raise DomainError("frequencies must be non-negative")
    total = f.sum()
    if total <= 0:
        raise DomainError("frequencies must not all be zero")
    f = f / total
    return float(np.dot(f, f))


def row_gradient_var(f, L, g_var, g_corr):
    """Per-entry variance of the word-table gradient row of a token of frequency ``f``,
    for one sequence of length ``L`` (independent token draws): g2 L f (1 + rg (L-1) f)."""
    return g_var * L * f * (1 + g_corr * (L - 1) * f)


class Embedding(Rule):
    name = "embedding"
    title = "Embedding (word + position + segment tables)"
    params = (
        Param("word_std", "std of the word-table entries (> 0)", None, lo=0.0, open_lo=True),
        std("pos_std", "std of the learned absolute-position table entries", default=0.0),
        std("seg_std", "std of the segment-table entries", default=0.0),
        Param("word_collision", "probability that two positions of a sequence hold the same "
              "token; sum_i f_i^2 for independent draws (see collision_probability)",
              None, lo=0.0, hi=1.0),
        Param("segment_collision", "probability that two positions share a segment id; "
              "sum_j q_j^2 for independent draws (1 = a single segment type)",
              1.0, lo=0.0, hi=1.0),
        Param("L", "sequence length (tokens per sequence)", None, lo=2, integer=True),
    )
    assumptions = (
        "Table entries iid zero-mean with the given stds, tables independent; exact for any "
        "entry law with these moments.",
        "Token ids independent across positions with collision probability word_collision "
        "(sum f^2); segment ids likewise with segment_collision; positions 0..L-1 read "
        "distinct rows of the position table (learned absolute positions). Exact under these "
        "assumptions; for real text pass the measured pair-collision probabilities.",
        "The output does not depend on the (absent) input state: x is ignored.",
        "Backward is the word-table gradient of ONE sequence (scatter-add of the output "
        "gradient), per token occurrence: its distinct-token rows laid out in L slots; corr "
        "sums the covariances of different rows. The upstream gradient is independent of the "
        "token ids and tables, with mean 0 and exchangeable positions (rg >= -1/(L-1), "
        "enforced). Exact.",
    )
    references = (
        "[TGS] Kedia et al. 2024, embedding section (token correlation = sum of squared "
        "token frequencies; measured BERT/Wikipedia value 0.221)",
    )

    def evaluate(self, x, g=None, **params):
        # an exchangeable gradient over L positions needs rg >= -1/(L-1) (PSD covariance)
        if g is not None and params.get("L") is not None:
            L = np.asarray(params["L"], dtype=float)
            if np.any(np.asarray(g.corr, dtype=float) < -1.0 / np.maximum(L - 1, 1) - 1e-12):
                raise DomainError("g_corr must be at least -1/(L-1) for L exchangeable positions")
        return super().evaluate(x, g, **params)

    def forward(self, m, x, p):
        w2, p2, s2 = p.word_std**2, p.pos_std**2, p.seg_std**2
        var = w2 + p2 + s2
        cov = w2 * p.word_collision + s2 * p.segment_collision
        return Forward(0 * var, var, cov / var)

    def backward(self, m, x, g, p):
        c = p.word_collision
        coherent = 1 + g.corr * (p.L - 1) * c
        var = g.var * coherent
        corr = g.corr * (1 - c) / coherent
        return Backward(var, corr)


register(Embedding())
