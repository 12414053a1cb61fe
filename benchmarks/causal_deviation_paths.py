"""One causal attention layer of a deep model, at the stream state the predictor carries into it:
what the stream's position deviation S does to the attention's input gradient, path by path
(query, key, value), and to the mean attention weights of the first keys, sampled against the
causal position model.

    python benchmarks/causal_deviation_paths.py [--arch preln] [--init normal] [--placement output]
        [--layers 48] [--d-model 256] [--heads 4] [--d-ff 1024] [--seq-len 128]
        [--dropout 0] [--at 13 30 43] [--trials 40] [--batch 8] [--seed 0]

The predictor's forward pass (every position, no node grid) gives, entering each layer of
``--at``, the stream's variance, mean token correlation r, variance profile over positions and
deviation S of the pair correlations from r.  One attention layer with that layer's parameters is
sampled (float64, NumPy Generator seeded with ``--seed``; new weights, inputs and dropout masks per
draw) twice: inputs Gaussian with covariance over positions v (r + S) (diagonal: the profile), and
exchangeable ones (S = 0, the same r).  The upstream gradient is iid N(0, 1) (a flat covariance
over positions), so the layer's own response to S is what is measured.  Printed per layer:

- per path, the mean input gradient variance over positions with S and without, their ratio,
  and the same from the position model (sigprop.model.profile._attention_cov with the per-key
  weights of profile.key_weights, and their query factor where the sampled logit law gives
  them, against none; per path through the rule's per-row terms by path, as
  benchmarks/causal_layer_cov.py);
- the per-key weights n_i E[P_ij] (w1) and E[P_ij^2] over the exchangeable E[P^2] (w2) of keys
  0, 1, 2, 5 averaged over rows 32..63 and 64..127, sampled (before attention dropout; the w2
  reference from the exchangeable draws) against profile.key_weights;
- two candidate models of that layer, evaluated by sampling Gaussian logits (``--law-draws``
  per row, every 8th row from 32; the mean row logit variance vbar of the rule, no row-to-row
  spread): the row's logits with their full covariance vbar/(1 - r) (r + (1 - r) I + S) over the
  row's keys (``law``), and the same with S replaced by its additive fit m_j + m_k - mu plus a
  rank-2 factor fit of the rest (``rank2``, :func:`factor_fit`: independent keys given two
  shared factors); and the query path's S factor that the full law gives (every row, a tenth
  of the draws)
  (:func:`query_factor`: per row E[sum_jk P_j P_k ((J C J^T)_jk + q (J J^T)_jk) C_jk], J = I -
  1 P^T, C the row's keys' covariance less the shared r, q = p / (1 - p) the attention
  dropout's, against the same for iid logits), printed beside the sampled query path ratio;
- with ``--quadrature ROW ...``, those rows' rank-2 factor law evaluated deterministically
  (:func:`factor_law_moments`), beside the sampled laws."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

from sigprop.backend import numeric
from sigprop.mc.components.attention import AttentionMC
from sigprop.mc.model import _attention_params
from sigprop.model import logit_law, positions
from sigprop.model import predict as PR
from sigprop.model import profile as PF
from sigprop.model.presets import resolve
from sigprop.rules import get
from sigprop.rules.attention import mean_row_logit_var
from sigprop.state import Backward, Forward

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the shared benchmark helpers
from _model_args import add_model_args  # noqa: E402

PATHS = ("q", "k", "v")
LAW_ROWS = range(32, 128, 8)
KEYS = (0, 1, 2, 5)
ROWS = ((32, 64), (64, 128))


def _layer_cov():
    """benchmarks/causal_layer_cov.py as a module (its per-path rule terms)."""
    spec = importlib.util.spec_from_file_location("causal_layer_cov", Path(__file__).with_name("causal_layer_cov.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def states(model, layers) -> dict:
    """Entering the attention of each layer in ``layers``: (variance, r, profile, S) over every
    position (the predictor's exact position model: positions.EXACT_MAX raised to the length)."""
    got = {}
    orig = PR.Predictor._unit

    def unit(self, layer, u, s, kept):
        if u.label == "attention" and layer in layers:
            got[layer] = (float(np.exp(s.log_var)), float(s.x.corr), s.prof.copy(), s.dev.copy())
        return orig(self, layer, u, s, kept)

    keep = positions.EXACT_MAX
    positions.EXACT_MAX = max(keep, model.seq_len)
    PR.Predictor._unit = unit
    try:
        PR.Predictor(model, False, None).forward()
    finally:
        PR.Predictor._unit = orig
        positions.EXACT_MAX = keep
    return got


def sample(params: dict, cov: np.ndarray, trials: int, batch: int, rng) -> dict:
    """Per draw, each path's and the whole input gradient's mean variance, and E[P_ij] and
    E[P_ij^2] (before dropout; ``P1``, ``P2``: arrays (draws, L, L))."""
    comp = AttentionMC()
    L, d = params["L"], params["d"]
    w, V = np.linalg.eigh(cov)
    root = V * np.sqrt(np.clip(w, 0.0, None))
    out = {k: [] for k in PATHS + ("all",)}
    p1, p2 = [], []
    for _ in range(trials):
        W = comp.sample_weights(rng, params, np.float64)
        X = np.einsum("ij,bjf->bif", root, rng.standard_normal((batch, L, d)))
        _, cache = comp.forward(X, W, params, rng)
        P = cache["P"] if isinstance(cache, dict) else cache[4]
        p1.append(P.mean((0, 1)))
        p2.append((P * P).mean((0, 1)))
        paths = comp.backward_paths(rng.standard_normal((batch, L, d)), cache)
        for k in PATHS:
            out[k].append(float(np.mean(paths[k] ** 2)))
        out["all"].append(float(np.mean(sum(paths.values()) ** 2)))
    out = {k: np.array(v) for k, v in out.items()}
    out["P1"], out["P2"] = np.array(p1), np.array(p2)
    return out


def input_cov(v: float, r: float, prof: np.ndarray, S: np.ndarray) -> np.ndarray:
    K = r + S
    np.fill_diagonal(K, 1.0)
    return K * np.sqrt(np.outer(prof, prof)) * v


_softmax = logit_law._softmax


def factor_fit(S: np.ndarray, r: float, n: int, nf: int = 2, iters: int = 50):
    """The logit law of a causal row of n keys as independent keys plus ``nf`` shared factors,
    in units of vbar / (1 - r): (the keys' independent variances D, the loadings F (n, nf)),
    with (1 - r) I + S = diag(D) + F F^T + A over the row's keys (n >= 3), A additive
    (a_j + a_k: shifts the softmax ignores).  Alternating least squares off the diagonal: A
    fitted to S - F F^T, F from the top eigenvectors of S - A (its diagonal filled with the
    fit's own);
    D = (1 - r) - A_jj - |F_j|^2, floored at 1e-4 (1 - r)."""
    Sr = S[:n, :n]
    off = ~np.eye(n, dtype=bool)
    F = np.zeros((n, nf))
    for _ in range(iters):
        X = np.where(off, Sr - F @ F.T, 0.0)
        # the additive part a_j + a_k fitting X off the diagonal by least squares:
        # (n - 2) a_j + sum(a) = X's row sum j
        tot = X.sum() / (2 * n - 2)
        add = (X.sum(axis=1) - tot) / (n - 2)
        A = add[:, None] + add[None, :]
        R = np.where(off, Sr - A, F @ F.T)
        w, V = np.linalg.eigh(R)
        top = np.argsort(w)[::-1][:nf]
        F = V[:, top] * np.sqrt(np.clip(w[top], 0.0, None))
    D = np.maximum((1.0 - r) - np.diag(A) - (F ** 2).sum(axis=1), 1e-4 * (1.0 - r))
    return D, F


def factor_law_moments(s: np.ndarray, loadings: np.ndarray, nodes: int = 6, du: float = 0.1):
    """(E[P_j], E[P_j^2]) per key of one softmax row whose logits are z_j = e_j + loadings_j . xi,
    e_j ~ N(0, s_j) independent, xi ~ N(0, I) (the factor law of :func:`factor_fit`, in logit
    units), deterministically: Gauss-Hermite over xi (``nodes`` per factor) of the independent
    keys' identity E[P_j^a] = int chi_a,j(u) prod_{k != j} phi_k(u) du (Gamma(a) = 1 for a = 1,
    2; sigprop.rules.softmax_moments), where a key of mean m takes its smoothed factors at
    u + m.  The factors at each key's variance are formed by FFT on the tables' w grid (step
    0.05, softmax_moments.smoothed_factor_logs) and shifted by linear interpolation; u by the
    trapezoid rule at step ``du`` over the row's window widened by the largest shift.  A
    prototype: ~6-10 s a row of 72-104 keys at 36 nodes."""
    import math

    from sigprop.rules import softmax_moments as SM

    s = np.asarray(s, dtype=float)
    loadings = np.atleast_2d(np.asarray(loadings, dtype=float))
    n, nf = loadings.shape
    w = SM.factor_w_grid()
    rows = np.stack([SM.smoothed_factor_logs(float(sj)) for sj in s], axis=1)     # (3, n, w)
    x, wt = np.polynomial.hermite.hermgauss(nodes)
    x, wt = x * math.sqrt(2.0), wt / math.sqrt(math.pi)
    xi = np.stack([g.ravel() for g in np.meshgrid(*([x] * nf), indexing="ij")], axis=1)
    W = np.prod(np.stack([g.ravel() for g in np.meshgrid(*([wt] * nf), indexing="ij")], axis=1), axis=1)
    smax, mumax = float(s.max()), float(np.abs(loadings).sum(axis=1).max() * x.max())
    u = np.arange(-math.log(n) - smax / 2 - 3 * math.sqrt(smax) - 40 - mumax,
                  8.5 * math.sqrt(smax) + 8 + mumax, du)
    E1, E2 = np.zeros(n), np.zeros(n)
    keys = np.arange(n)[:, None]
    for q in range(len(W)):
        pos = (u[None, :] + (loadings @ xi[q])[:, None] - w[0]) / (w[1] - w[0])
        i0 = np.clip(np.floor(pos).astype(int), 0, len(w) - 2)
        f = pos - i0
        lphi, lc1, lc2 = (rows[a][keys, i0] * (1 - f) + rows[a][keys, i0 + 1] * f for a in range(3))
        lam = lphi.sum(axis=0)
        E1 += W[q] * np.exp(lc1 - lphi + lam).sum(axis=1) * du
        E2 += W[q] * np.exp(lc2 - lphi + lam).sum(axis=1) * du
    return E1, E2


def query_factor(z: np.ndarray, C: np.ndarray, q: float) -> float:
    """The query path's generic term of one row over the sampled logits z (draws, n)
    (sigprop.model.logit_law.query_term of their softmax; C the keys' covariance, q the
    attention dropout's p / (1 - p))."""
    return logit_law.query_term(_softmax(z), C, q)


def law_models(S: np.ndarray, r: float, vbar: float, q: float, draws: int, rng) -> dict:
    """Per row of LAW_ROWS, the weights n_i E[P_ij] and E[P_ij^2] of the sampled Gaussian logit
    laws (full covariance, rank-2 factors; E[P^2] against iid logits); and the query factor's
    ratio, full law over iid logits, summed over every row."""
    sc = vbar / (1.0 - r)
    out = {"law": [], "rank2": []}

    def full_law(n, k):
        C = (1.0 - r) * np.eye(n) + S[:n, :n]
        w, V = np.linalg.eigh((C + r) * sc)
        return C, rng.standard_normal((k, n)) @ (V * np.sqrt(np.clip(w, 0.0, None))).T

    # the query factor over every row of more than one key (the sampled layer's mean over
    # positions), with a tenth of the draws
    qs = q0 = 0.0
    for n in range(2, len(S) + 1):
        C, z = full_law(n, max(1000, draws // 10))
        qs += query_factor(z, C, q)
        q0 += query_factor(rng.standard_normal(z.shape) * np.sqrt(vbar), (1.0 - r) * np.eye(n), q)
    out["query"] = qs / q0
    for i in LAW_ROWS:
        n = i + 1
        C, z = full_law(n, draws)
        D, F = factor_fit(S, r, n)
        z2 = rng.standard_normal((draws, n)) * np.sqrt(D * sc) + rng.standard_normal((draws, F.shape[1])) @ F.T * np.sqrt(sc)
        z0 = rng.standard_normal((draws, n)) * np.sqrt(vbar)
        P, P2, P0 = _softmax(z), _softmax(z2), _softmax(z0)
        h2 = float(np.mean(P0 * P0))
        out["law"].append(logit_law.sample_weights(P, h2))
        out["rank2"].append(logit_law.sample_weights(P2, h2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap, dropout=0.0)
    ap.add_argument("--at", type=int, nargs="+", default=[13, 30, 43], help="layers (1-based)")
    ap.add_argument("--law-draws", type=int, default=20000, help="sampled logit rows per row, for the laws")
    ap.add_argument("--quadrature", type=int, nargs="*", default=[], metavar="ROW",
                    help="rows whose rank-2 factor law is also evaluated by quadrature (factor_law_moments)")
    ap.set_defaults(trials=40, batch=8)
    a = ap.parse_args()
    kw = dict(n_layers=a.layers, dropout=a.dropout, causal=True, d_model=a.d_model, n_heads=a.heads,
              d_ff=a.d_ff, seq_len=a.seq_len)
    if a.placement != "preset":
        kw["placement"] = a.placement
    model = resolve(a.arch, a.init, **kw)
    clc = _layer_cov()
    rule = get("attention")
    L = a.seq_len
    n = np.arange(1.0, L + 1)
    print(f"{a.arch} {a.init} placement {a.placement}, {a.layers} layers, dropout {a.dropout:g}, seq {L}; "
          f"seed {a.seed}, {a.trials} draws x batch {a.batch} per layer and input")
    for layer, (v, r, prof, S) in sorted(states(model, set(a.at)).items()):
        params = _attention_params(model, layer - 1)
        rng = np.random.default_rng([a.seed, layer])
        with_s = sample(params, input_cov(v, r, prof, S), a.trials, a.batch, rng)
        flat = sample(params, input_cov(v, r, np.ones(L), 0.0 * S), a.trials, a.batch, rng)
        x = Forward(np.float64(0.0), np.float64(v), np.float64(r))
        g = Backward(np.float64(1.0), np.float64(0.0))
        kw = PF.key_weights(params, x, S)      # (with the query factor where the law applies)
        w1, w2 = kw
        rows = clc.path_rows(params, x, PF._rows_direct(params, x))
        scale = float(rule.backward(numeric, x, g, rule.param_values(params)).var)
        f_all = PF.attention_backward(params, x, g, np.eye(L), None, None, None, kw)[0]
        print(f"\nlayer {layer}: stream variance {v:.4g}, r {r:.4f}, "
              f"mean S of position 0 with the others {S[0, 1:].mean():+.3f}, of positions 64.. among "
              f"themselves {S[64:, 64:][~np.eye(L - 64, dtype=bool)].mean():+.3f}")
        for k in PATHS + ("all",):
            ms, mf = with_s[k], flat[k]
            if k == "all":
                ps, pf = scale * f_all, scale
            else:
                ps, pf = (float(np.mean(np.diag(PF._attention_cov(rows[k], np.eye(L), kwk, None, None, None))))
                          for kwk in (kw, None))
            se = np.hypot(ms.std(ddof=1) / ms.mean(), mf.std(ddof=1) / mf.mean()) / np.sqrt(len(ms))
            print(f"  {k:3s}  sampled S {ms.mean():.4g} / S=0 {mf.mean():.4g} = {ms.mean() / mf.mean():.3f} "
                  f"+- {se * ms.mean() / mf.mean():.3f}   predicted {ps:.4g} / {pf:.4g} = {ps / pf:.3f}")
        vbar = mean_row_logit_var(params, x)
        laws = law_models(S, r, vbar, a.dropout / (1.0 - a.dropout), a.law_draws, rng)
        qpm = "1 (additive fit)" if kw.query is None else f"{float(np.mean(kw.query)):.3f} (mean of its per-row factors)"
        print(f"  query path's S factor of the full logit law {laws['query']:.3f} (sampled layer "
              f"{with_s['q'].mean() / flat['q'].mean():.3f}, position model {qpm})")
        h2 = np.array([flat["P2"].mean(0)[i, :i + 1].mean() for i in range(L)])
        for lo, hi in ROWS:
            sl = slice(lo, hi)
            parts = []
            for j in KEYS:
                # per draw, the rows' mean weight of key j (standard errors over the draws)
                d1 = (with_s["P1"][:, sl, j] * n[sl]).mean(1)
                d2 = (with_s["P2"][:, sl, j] / h2[sl]).mean(1)
                parts.append(f"key {j}: w1 {d1.mean():.2f}+-{d1.std(ddof=1) / np.sqrt(len(d1)):.2f}/{w1[sl, j].mean():.2f} "
                             f"w2 {d2.mean():.1f}+-{d2.std(ddof=1) / np.sqrt(len(d2)):.1f}/{w2[sl, j].mean():.1f}")
            print(f"  rows {lo}..{hi - 1} (sampled/predicted)\n    " + "\n    ".join(parts))
        for lo, hi in ROWS:
            idx = [k for k, i in enumerate(LAW_ROWS) if lo <= i < hi]
            parts = []
            for j in KEYS:
                f = [f"{nm} w1 {np.mean([laws[nm][k][0][j] for k in idx]):.2f} w2 {np.mean([laws[nm][k][1][j] for k in idx]):.1f}"
                     for nm in ("law", "rank2")]
                parts.append(f"key {j}: " + ", ".join(f))
            print(f"  rows {lo}..{hi - 1}, Gaussian logit laws (every 8th row)\n    " + "\n    ".join(parts))
        sc = vbar / (1.0 - r)
        for i in a.quadrature:
            n = i + 1
            D, Fm = factor_fit(S, r, n)
            e1, e2 = factor_law_moments(D * sc, Fm * np.sqrt(sc))
            h2 = factor_law_moments(np.full(n, vbar), np.zeros((n, 1)), nodes=1)[1].mean()
            print(f"  row {i}, rank-2 law by quadrature: " + "  ".join(
                f"key {j}: w1 {e1[j] * n:.2f} w2 {e2[j] / h2:.1f}" for j in KEYS if j < n))


if __name__ == "__main__":
    main()
