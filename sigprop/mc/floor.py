"""Accuracy-floor matrix (issue: whole-model prediction, item 6): `sigprop check` semantics
for every arch with its default init and with ``torch-default`` and ``normal``, at d_model 256,
4 heads, d_ff 1024, seq 128, depths 12/48/96, dropout 0 and 0.1, bidirectional and causal.

Each configuration's result is stored as JSON under docs/validation/floor/ (resumable: done
configurations are skipped), and ``--report`` assembles the markdown table.

    python -m sigprop.mc.floor [--depths 12,48,96] [--trials 8] [--batch 8] [--seed 0]
    python -m sigprop.mc.floor --report      # the markdown section (docs/validation.md has it)
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import time
from pathlib import Path

import numpy as np

from sigprop.mc.model import logit_stats, simulate
from sigprop.model.checking import compare
from sigprop.model.predict import predict
from sigprop.model.presets import resolve

OUT = Path(__file__).resolve().parents[2] / "docs" / "validation" / "floor"
ARCHS = ["preln", "postln", "dslm", "dslm-post", "deepnorm", "lns", "mixln"]
DEFAULT_INIT = {"preln": "normal", "postln": "normal", "dslm": "dslm", "dslm-post": "dslm",
                "deepnorm": "deepnorm", "lns": "normal", "mixln": "normal"}
DIMS = dict(d_model=256, n_heads=4, d_ff=1024, seq_len=128)


def configs(depths, default_only=False, dropouts=(0.0, 0.1), causals=(False, True)):
    for arch in ARCHS:
        inits = []
        for init in (DEFAULT_INIT[arch], "torch-default", "normal"):
            if init not in inits:
                inits.append(init)
        if default_only:
            inits = inits[:1]
        for init in inits:
            for n in depths:
                for p in dropouts:
                    for causal in causals:
                        yield arch, init, n, p, causal


def name(arch, init, n, p, causal):
    return f"{arch}_{init}_{n}_p{p:g}_{'causal' if causal else 'bidir'}"


def run_one(arch, init, n, p, causal, trials, batch, seed, raw: Path | None = None, simulate_only=False):
    """Judge one configuration.  ``raw``: a directory of stored measurements (pickles of
    :class:`sigprop.mc.model.ModelMeasurement`, keyed by configuration, trials, batch and
    seed): a stored one is reused instead of simulating again, a new one is stored, so a
    change of the rules can be re-judged against the same samples."""
    model = resolve(arch, init, n_layers=n, dropout=p, causal=causal, **DIMS)
    meas = None
    if raw is not None:
        f = raw / f"{name(arch, init, n, p, causal)}_t{trials}_b{batch}_s{seed}.pkl"
        if f.exists():
            meas = pickle.loads(f.read_bytes())
        else:
            meas = simulate(model, batch=batch, trials=trials, seed=seed)
            raw.mkdir(parents=True, exist_ok=True)
            f.write_bytes(pickle.dumps(meas))
        if simulate_only:
            return None
    if meas is None:
        meas = simulate(model, batch=batch, trials=trials, seed=seed)
    if getattr(meas, "logit_draws", None) is not None:
        meas.logit_var = logit_stats(meas.logit_draws)     # the current estimator
    pts = predict(model)
    res = compare(pts, meas)
    mv = np.array([f.var for f in meas.forward])
    mg = np.array([b.var for b in meas.backward])
    return {
        "arch": arch, "init": init, "n_layers": n, "dropout": p, "causal": causal,
        "trials": trials, "batch": batch, "seed": seed, "pass": res.passed,
        "n_failures": len(res.failures), "failures": res.failures[:5],
        "errors": res.errors, "r2": res.r2,
        "fwd_change": float(mv.max() / mv.min()), "grad_change": float(mg.max() / mg.min()),
        "simulate_s": meas.simulate_s, "gflop": meas.gflop,
    }


def report(store: Path = OUT) -> str:
    rows = [json.loads(f.read_text()) for f in sorted(store.glob("*.json"))]
    if not rows:
        return ""
    order = {a: i for i, a in enumerate(ARCHS)}
    rows.sort(key=lambda r: (order[r["arch"]], r["init"], r["n_layers"], r["dropout"], r["causal"]))
    out = ["| arch | init | N | p | causal | pass | fwd var err max | grad var err max | corr err max | "
           "R² fwd (change) | R² grad (change) | trials x batch | seed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def r2(v, change):
        if change <= 2:
            return f"n/a ({change:.2f}x)"
        return f"{v:.4f} ({change:.3g}x)" if v is not None else "-"

    for r in rows:
        e = r["errors"]
        corr = max(e["forward_corr_abserr"]["max"], e["grad_corr_abserr"]["max"])
        out.append(
            f"| {r['arch']} | {r['init']} | {r['n_layers']} | {r['dropout']:g} | {'yes' if r['causal'] else 'no'} | "
            f"{'pass' if r['pass'] else 'FAIL (%d)' % r['n_failures']} | {e['forward_var_relerr']['max']:.3f} | "
            f"{e['grad_var_relerr']['max']:.3f} | {corr:.3f} | {r2(r['r2']['forward_var'], r['fwd_change'])} | "
            f"{r2(r['r2']['grad_var'], r['grad_change'])} | {r['trials']}x{r['batch']} | {r['seed']} |")
    n_pass = sum(r["pass"] for r in rows)
    bidir = [r for r in rows if not r["causal"]]
    out.append("")
    out.append(f"{n_pass} of {len(rows)} configurations pass ({sum(r['pass'] for r in bidir)} of "
               f"{len(bidir)} bidirectional, {n_pass - sum(r['pass'] for r in bidir)} of "
               f"{len(rows) - len(bidir)} causal).")
    out.append("")
    out.append(NOTES)
    return "\n".join(out)


#: what was run and what the failures are (written from the stored results; keep in step)
NOTES = """What was run (2 shared cores, 2026-11-22): the whole grid. Every architecture x init
(default, `torch-default`, `normal`; 17 pairs, the default being one of the others for five
architectures) x dropout {0, 0.1} x {bidirectional, causal} x depth {12, 48, 96}: 204
configurations, 8 weight draws x batch 4, seed 0. The measurements are stored
(`--raw DIR --simulate-only`, ~5 s, ~15 s and ~25 s of simulation per configuration at 12, 48
and 96 layers on one core) and judged against the current rules with `--raw DIR --redo`, so a
change of the rules is re-judged against the same samples.

The failures, by cause (203 of 204 pass):
- Attention logit variance: none left. The first complete run had 8 failures, each a single
  logit point measured 9-38% low at 48 and 96 layers. Two causes, both in the measurement:
  (1) the estimator subtracted the square of the grand mean of the 8 draws, but each draw's mean
  logit (the token-shared part of q.k, a different constant in every draw) belongs to the
  variance, whose expected mean is exactly 0, so it was biased low by about r^2/8 (12% at a
  stream correlation of 0.99; block averages of measured/predicted were 0.91-0.94 in deep Mix-LN
  `torch-default`); (2) the per-draw value is heavy-tailed (per head the shared part is a
  chi-square with one degree of freedom times ~r^2 of the variance) and its spread grows with
  depth (relative SD 0.05-0.10 in the first 12 layers, ~0.33 beyond layer 25), so an SE from a
  layer's own 8 draws, or pooled over all layers, or scaled by a set of draws that happens to
  fall low, is too small. The estimator is now the mean second moment and the SE pools the
  relative spread over +-6 neighbouring attention layers, scaled by their mean level
  (`sigprop.mc.model.logit_stats`); the whole grid was simulated again for it. The median
  logit-variance error of a configuration is 1.0% (0.4% to 8.7%).
- Post-LN `torch-default`, 96 layers, dropout 0.1, causal: the forward token correlation
  around layer 79 is 0.03 high (0.830 against 0.799 +- 0.007; 9 points just beyond the 0.03
  tolerance and 4 SE). Its gradient R^2 is 0.82 (0.93 at dropout 0): in deep causal Post-LN
  stacks the gradient first falls and then grows again towards the input, and the causal
  position model (see docs/design.md) predicts it 3-9% low in the middle layers (48 layers,
  dropout 0.1; every point within its SE, which is 8-15% there).
- R^2 criterion: measured-variance change above 2x in 62 forward and 71 gradient series; R^2
  below the floor in 1 forward and 5 gradient series: Pre-LN `normal` 48 layers dropout 0
  forward 0.9978 (a 2.19x change; the measured input correlation realised 0.0043 above its
  nominal value, 1.3 SE, and the measured forward variance follows it, 1% above the
  prediction), Post-LN DSLM 12 layers
  gradient 0.985 (a ~4% over-prediction opening in the top two layers), and Post-LN
  `torch-default` gradient: 48 layers causal 0.976, 96 layers causal 0.82 and 0.93, 96
  layers bidirectional dropout 0 0.980 (a 101x change).
- Causal models: before the position model (one number per moment for all positions) 7 of the
  34 causal 12-layer configurations failed, with the input gradient up to 18% low; now all 34
  pass, and at 48 and 96 layers all but the Post-LN `torch-default` one above."""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="12,48,96")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma list of archs")
    ap.add_argument("--inits", default="", help="comma list of inits (default: every init of the grid)")
    ap.add_argument("--out", default=None, help="directory for the per-configuration JSONs (default: docs/validation/floor)")
    ap.add_argument("--default-init-only", action="store_true")
    ap.add_argument("--dropouts", default="0,0.1")
    ap.add_argument("--causal", default="0,1", help="comma list of 0/1")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--raw", default=None, help="directory of stored measurements (reused; new ones stored)")
    ap.add_argument("--simulate-only", action="store_true", help="with --raw: only store measurements")
    ap.add_argument("--redo", action="store_true", help="judge configurations that already have a result")
    a = ap.parse_args()
    out = Path(a.out) if a.out else OUT
    if a.report:
        print(report(out))
        return
    out.mkdir(parents=True, exist_ok=True)
    depths = [int(x) for x in a.depths.split(",")]
    only = set(a.only.split(",")) if a.only else None
    inits = set(a.inits.split(",")) if a.inits else None
    causals = tuple(bool(int(x)) for x in a.causal.split(","))
    for cfg in configs(depths, a.default_init_only, tuple(float(x) for x in a.dropouts.split(",")), causals):
        if (only and cfg[0] not in only) or (inits and cfg[1] not in inits):
            continue
        f = out / (name(*cfg) + ".json")
        if f.exists() and not (a.redo or a.simulate_only):
            continue
        t = time.perf_counter()
        res = run_one(*cfg, a.trials, a.batch, a.seed, Path(a.raw) if a.raw else None, a.simulate_only)
        if res is None:
            print(f"{name(*cfg)}: stored {time.perf_counter() - t:.0f}s", flush=True)
            continue
        f.write_text(json.dumps(res, indent=1))
        print(f"{name(*cfg)}: {'pass' if res['pass'] else 'FAIL'} R2 {res['r2']} "
              f"{time.perf_counter() - t:.0f}s", flush=True)
        for x in res["failures"][:2]:
            print("   ", x, flush=True)


if __name__ == "__main__":
    main()
