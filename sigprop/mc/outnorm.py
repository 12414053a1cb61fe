"""Sweep of the norm on a branch output (placements ``peri`` and ``output``) against the Monte
Carlo, one block at a time: ``python -m sigprop.mc.outnorm [--trials T] [--batch B] [--seed S]``.

A norm on the branch output divides each token's branch output by that token's own rms.  The
predictor's forward and backward through it use the per-token statistics of the branch
output (sigprop.rules.base.TokenMoments: the relative variance of a token's mean square, far
above its Gaussian value for an FFN's output), which are first order in 1/d and 1/d_ff.  This
sweep measures that correction where it matters: one LLaMA-style block (RMSNorm, no rotary
positions, no final norm, bidirectional, dropout 0, N(0, 0.02^2) weights) with every norm
placed ``peri`` or ``output``, over an FFN kind (MLP with GeLU; GeGLU), d_model, d_ff / d_model
and the input variance (1 and 0.05: with ``output`` nothing normalises the branch input, so
its scale changes the branch output's statistics).  Each point is ``sigprop check``'s
comparison (``sigprop.api.check``); the Markdown written to
``docs/validation/zz-branch-output-norm.md`` is appended to docs/validation.md by
``python -m sigprop.mc.validate --assemble``."""

from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[2] / "docs" / "validation" / "zz-branch-output-norm.md"

GRID = dict(ffn=("mlp", "geglu"), d_model=(64, 128, 256), ff_ratio=(2, 4), placement=("peri", "output"),
            input_var=(1.0, 0.05))
SEQ = 16

#: what the last full run showed (kept with the table when it is rewritten)
NOTES = ("Where it is not noise: at d_model 64 with input variance 0.05 the input gradient is\n"
         "predicted low in all eight configurations (1.7-4.8%, 1.3-3.4 standard errors; largest with\n"
         "the narrow MLP, d_ff 128); at d_model 128 and 256 every point is within 1.3%. The GeGLU\n"
         "block with `output` at d_model 64 and input variance 1 has a point 1.0-1.6% off (3.5-5.5 SE).\n"
         "These are the widths where terms beyond first order in 1/d and 1/d_ff show; their cause\n"
         "is not established.")


def point(ffn: str, d_model: int, ff_ratio: int, placement: str, input_var: float, trials: int, batch: int,
          seed: int) -> dict:
    """One configuration's check: the gradient variance at every point (predicted, measured,
    standard error) and the worst forward variance error."""
    from sigprop import api

    opts = dict(arch="llama", ffn=ffn, rope=False, causal=False, placement=placement, final_norm=False,
                layers=1, d_model=d_model, heads=4, d_ff=ff_ratio * d_model, seq_len=SEQ, input_var=input_var,
                trials=trials, batch=batch, seed=seed)
    if ffn == "mlp":
        opts["activation"] = "gelu"
    r = api.check(**opts).to_dict()
    g = [(p["backward"]["var"], m["backward"]["var"], m["se"]["backward"]["var"])
         for p, m in zip(r["predicted"], r["measured"])]
    rel = [abs(b - a) / b for a, b, _ in g]
    z = [abs(b - a) / s if s > 0 else math.inf for a, b, s in g]
    k = int(np.argmax(rel))
    return dict(ffn=ffn, d_model=d_model, d_ff=ff_ratio * d_model, placement=placement, input_var=input_var,
                grad_pred=g[0][0], grad_meas=g[0][1], grad_se=g[0][2], grad_rel_max=rel[k], grad_z_at_max=z[k],
                fwd_rel_max=r["errors"]["forward_var_relerr"]["max"], passed=r["pass"])


def report(rows: list, trials: int, batch: int, seed: int, wall: float) -> str:
    rel = np.array([r["grad_rel_max"] for r in rows]) * 100
    fwd = np.array([r["fwd_rel_max"] for r in rows]) * 100
    p = lambda a: " / ".join(f"{np.percentile(a, q):.2f}" for q in (50, 90, 99))     # noqa: E731
    lines = [
        "", "## The norm on a branch output, one block", "",
        "`python -m sigprop.mc.outnorm`: one LLaMA-style block (RMSNorm, no rotary positions, no final",
        "norm, bidirectional, dropout 0, N(0, 0.02^2) weights, 4 heads, 16 tokens) with every norm placed",
        "`peri` (before and after the branch) or `output` (on the branch output only), over the FFN",
        "(MLP with GeLU; GeGLU), d_model 64 / 128 / 256, d_ff 2x and 4x d_model and the input variance",
        f"(1 and 0.05, token correlation 0.221): {len(rows)} configurations, each `sigprop check`'s",
        f"comparison with {trials} weight draws x batch {batch}, seed {seed} ({wall:.0f} s on 2 shared cores).",
        "The per-token correction of the norm's backward (the relative variance of a token's mean",
        "square, first order in 1/d and 1/d_ff) is what this measures; before it, with each token's",
        "branch output treated as Gaussian, one GeGLU block at d_model 128 gave a gradient 2-3% low.", "",
        f"Gradient variance, largest relative error over the block's points, p50 / p90 / p99: {p(rel)} %;",
        f"forward variance: {p(fwd)} %. {sum(r['passed'] for r in rows)} of {len(rows)} configurations pass",
        "`check`'s default tolerance.", "",
        "| FFN | d_model | d_ff | placement | input var | input grad predicted | measured (SE) | grad err max | z there | fwd err max | pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    tail = ["", NOTES]
    for r in rows:
        lines.append(f"| {r['ffn']} | {r['d_model']} | {r['d_ff']} | {r['placement']} | {r['input_var']:g} | "
                     f"{r['grad_pred']:.4g} | {r['grad_meas']:.4g} ({r['grad_se']:.2g}) | "
                     f"{100 * r['grad_rel_max']:.2f}% | {r['grad_z_at_max']:.1f} | {100 * r['fwd_rel_max']:.2f}% | "
                     f"{'pass' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines + tail) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    rows, t0 = [], time.perf_counter()
    keys = list(GRID)
    for vals in itertools.product(*GRID.values()):
        c = dict(zip(keys, vals))
        rows.append(point(**c, trials=a.trials, batch=a.batch, seed=a.seed))
        r = rows[-1]
        print(f"{c}: grad err max {100 * r['grad_rel_max']:.2f}% (z {r['grad_z_at_max']:.1f}), "
              f"fwd {100 * r['fwd_rel_max']:.2f}%", flush=True)
    from sigprop.output import write_text

    write_text(a.out, report(rows, a.trials, a.batch, a.seed, time.perf_counter() - t0))
    print(f"written {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
