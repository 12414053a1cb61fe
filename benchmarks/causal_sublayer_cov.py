"""Where a causal model with branch-output norms (placements ``output`` and ``peri``) gets its
gradient covariance over the first positions: the Monte Carlo's actual gradient against the
prediction's covariance over positions after every step of every sublayer, top to bottom.

    python benchmarks/causal_sublayer_cov.py [--arch olmo2] [--placement preset] [--layers 48]
        [--dropout 0.1] [--trials 4] [--batch 4] [--seed 0] [--upto 12] [--out FILE]

Monte Carlo (float64, the sampled sublayers of sigprop.mc.model, trial t from the t-th child of
SeedSequence(seed), the same weight draws and masks as ``sigprop.mc.model.run_trial`` at that
dtype; top gradient iid N(0, grad var) through the final norm as there): each branch-output-norm
sublayer's backward is re-traced step by step: ``out`` (the gradient G reaching the sublayer),
``norm`` (through the output norm), ``drop`` (through the hidden dropout), ``branch`` (through the
branch: the gradient at the branch input) and ``in`` (branch plus skip).  At each step, over
batch and width: K = the covariance over positions; reported, in units of its mean diagonal,
K at positions 0..3 (variance profile p0..p3 and correlations c01, c02, c12, c03) and the mean
off-diagonal; and the step's gain (mean diagonal over that of ``out``).

Prediction: the predictor's normalised covariance over positions (position grid; positions 0..3
are nodes of it) after the same steps (profile.layernorm_backward of the output norm,
profile.positionwise / profile.attention_backward of each branch op, ``branch``: what the
branch's backward returns, the unit's mix), and the branch gain exp(log_bg) of each unit (rec.gains: the branch's gradient variance per unit
gradient at the sublayer output)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from sigprop.mc import model as mcm
from sigprop.model.presets import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the shared benchmark helpers
from _model_args import add_model_args, sampled_trials  # noqa: E402

POS = 4


def _stats(G) -> dict:
    B, L, d = G.shape
    K = np.einsum("bif,bjf->ij", G[:, :POS], G[:, :POS]) / (B * d)
    md = float(np.mean(G * G))
    tot = float(np.sum(G.sum(axis=1) ** 2)) / (B * d)
    off = (tot - L * md) / (L * (L - 1))
    return {"md": md, "K": K / md, "off": off / md}


def _summary(K: np.ndarray, off: float) -> dict:
    dg = np.sqrt(np.diag(K))
    C = K / np.outer(dg, dg)
    out = {f"p{i}": float(K[i, i]) for i in range(POS)}
    for i, j in ((0, 1), (0, 2), (1, 2), (0, 3)):
        out[f"c{i}{j}"] = float(C[i, j])
    out["off"] = float(off)
    return out


def _recording_branch(tr, kind, l, X, a, b, n, norm_in, log):
    """sigprop.mc.model._Trial._normed_branch with its backward's steps recorded (the same
    random calls in the same order)."""
    bk, rng, ln_p = tr.bk, tr.rng, tr.norm_p
    p = tr.m.dropout.hidden
    c = 1.0 / (1.0 - p) if p > 0 else 1.0
    if norm_in:
        Hn, c_in = tr.norm.forward(X, {}, ln_p, rng)
        Y, bwd, logits = tr.branch_forward(kind, l, Hn, n, c)
        Hn = None
    else:
        Y, bwd, logits = tr.branch_forward(kind, l, X, 1.0, c)
    keep = mcm.keep_mask(rng, Y.shape, p) if p > 0 else None
    if keep is not None:
        Y = bk.mul_(Y, keep)
    Z, c_out = tr.norm.forward(Y, {}, ln_p, rng)
    Y = None
    out = Z * b if b != 1.0 else Z + 0.0
    out += X if a == 1.0 else a * X
    Z = None

    def back(G):
        rec = {"out": _stats(G)}
        Gz = tr.norm.backward(G * b if b != 1.0 else G, c_out)
        rec["norm"] = _stats(Gz)
        if keep is not None:
            Gz = Gz * keep
        rec["drop"] = _stats(Gz)
        Gx = bwd(Gz)
        if norm_in:
            Gx = tr.norm.backward(Gx, c_in)
        rec["branch"] = _stats(Gx)
        Gx += G if a == 1.0 else a * G
        rec["in"] = _stats(Gx)
        log[(l + 1, kind)] = rec
        return Gx
    return out, back, logits


def measure(m, trials: int, batch: int, seed: int, upto: int) -> dict:
    kinds = mcm._kinds(m)
    res: dict = {}
    for t, rng, tr, X in sampled_trials(m, seed, trials, batch):
        log: dict = {}
        backs = []
        for l in range(m.n_layers):
            for kind in kinds:
                cols = getattr(m, kind)
                place = int(cols.placement[l])
                if place in (mcm._PERI, mcm._OUTPUT) and l < upto:
                    a, b, n = float(cols.skip_scale[l]), float(cols.branch_scale[l]), float(cols.norm_scale[l])
                    X, back, _ = _recording_branch(tr, kind, l, X, a, b, n, place == mcm._PERI, log)
                else:
                    X, back, _ = tr.step(kind, l, X)
                backs.append(back)
        X, top = tr.final(X)
        from sigprop.mc.sampling import correlated
        G = correlated(rng, X.shape, 0.0, m.grad.var, m.grad.corr, np.float64)
        X = None
        if top is not None:
            G = top(G)
        for j in range(len(backs) - 1, -1, -1):
            G = backs[j](G)
            backs[j] = None
        for key, rec in log.items():
            for step, s in rec.items():
                r = _summary(s["K"], s["off"])
                r["gain"] = s["md"] / rec["out"]["md"]
                for k, v in r.items():
                    res.setdefault((key, step, k), []).append(v)
        print(f"trial {t} done", file=sys.stderr, flush=True)
    return res


def predicted(m, upto: int) -> dict:
    from sigprop.model import predict as P
    from sigprop.model import profile
    from sigprop.state import Backward

    pr = P.Predictor(m)
    recs = pr.forward()
    grid = pr.grid
    xs = list(np.asarray(grid.x)) if grid is not None else list(range(m.seq_len))
    idx = [xs.index(i) for i in range(POS)]
    mean_diag = (lambda w: grid.mean_diag(w)) if grid is not None else (lambda w: float(np.mean(np.diag(w))))
    mean_off = lambda w: profile.mean_off(w, grid)   # noqa: E731
    got: dict = {}
    cur: list = []

    def summ(w):
        md = mean_diag(w)
        return _summary(w[np.ix_(idx, idx)] / md, mean_off(w) / md)

    orig_ln, orig_att, orig_pw = profile.layernorm_backward, profile.attention_backward, profile.positionwise

    def ln(C, f, *a, **k):
        out = orig_ln(C, f, *a, **k)
        if cur:
            cur[-1].append(("norm", {**summ(out[2]), "k": float(out[0])}))
        return out

    def att(*a, **k):
        out = orig_att(*a, **k)
        if cur:
            cur[-1].append(("attention", {**summ(out[2]), "k": float(out[0])}))
        return out

    def pw(C, vg, cg):
        out = orig_pw(C, vg, cg)
        if cur:
            cur[-1].append((f"positionwise({cg / vg if vg else 1:.3f})", summ(out)))
        return out

    profile.layernorm_backward, profile.attention_backward, profile.positionwise = ln, att, pw
    orig_unit = pr._unit_backward

    def unit(rec, g):
        w = g[3]
        if rec.layer > upto or w is None:
            return orig_unit(rec, g)
        cur.append([("out", summ(w))])
        out = orig_unit(rec, g)
        steps = cur.pop()
        steps.append(("in", summ(out[3])))
        norm_rule = [float(P._bwd(op, Backward(1.0, float(g[1]))).var) for op in rec.out_ops or ()]
        got[(rec.layer, rec.kind)] = {"steps": steps, "branch_gain": float(np.exp(rec.gains.log_branch_gain)),
                                      "norm_rule_gain": norm_rule, "out_ratio": rec.out_ratio,
                                      "grad_gain": float(np.exp(out[0] - g[0]))}
        return out

    pr._unit_backward = unit
    orig_branch = pr._branch_backward

    def branch(rec, g, w):
        out = orig_branch(rec, g, w)
        if cur and out[1] is not None:
            cur[-1].append(("branch", summ(out[1])))
        return out

    pr._branch_backward = branch
    try:
        pr.backward(recs)
    finally:
        profile.layernorm_backward, profile.attention_backward, profile.positionwise = orig_ln, orig_att, orig_pw
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap, dropout=0.1)
    ap.set_defaults(arch="olmo2", placement="preset")
    ap.add_argument("--upto", type=int, default=12, help="record layers 1..upto")
    ap.add_argument("--no-mc", action="store_true")
    ap.add_argument("--out", default=None, help="also write the rows as JSON lines here")
    a = ap.parse_args()
    kw = {} if a.placement in ("", "preset") else {"placement": a.placement}
    m = resolve(a.arch, a.init, n_layers=a.layers, d_model=a.d_model, n_heads=a.heads, d_ff=a.d_ff,
                seq_len=a.seq_len, dropout=a.dropout, causal=True, **kw)
    pred = predicted(m, a.upto)
    res = {} if a.no_mc else measure(m, a.trials, a.batch, a.seed, a.upto)
    rows = [dict(arch=a.arch, init=a.init, placement=a.placement, layers=a.layers, d_model=a.d_model,
                 heads=a.heads, d_ff=a.d_ff, seq_len=a.seq_len, dropout=a.dropout, trials=a.trials,
                 batch=a.batch, seed=a.seed)]
    for (l, kind), p in sorted(pred.items(), key=lambda kv: (-kv[0][0], kv[0][1] != "ffn")):
        row = {"layer": l, "kind": kind, "pred_branch_gain": round(p["branch_gain"], 4),
               "pred_norm_rule_gain": p["norm_rule_gain"], "pred_out_ratio": p["out_ratio"],
               "pred_grad_gain": round(p["grad_gain"], 4), "pred": [[s, {k: round(v, 4) for k, v in q.items()}]
                                                                    for s, q in p["steps"]]}
        mc = {}
        for (key, step, k), v in res.items():
            if key == (l, kind):
                v = np.array(v)
                mc.setdefault(step, {})[k] = [round(float(v.mean()), 4),
                                              round(float(v.std(ddof=1) / np.sqrt(len(v))), 4) if len(v) > 1 else None]
        row["mc"] = mc
        rows.append(row)
    for r in rows:
        print(json.dumps(r))
    if a.out:
        Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
