"""`make validate`: run every component's sweep and write docs/validation.md.

    python -m sigprop.mc.validate --out docs/validation.md [--n 500] [--seed 0] [--only NAME ...]

Each sweep's result is stored as docs/validation/NAME-GRID.json; the markdown is assembled from
every stored result, so ``--only`` reruns some components and keeps the others.

For each component: the default (published) grid, then each named variant grid; the
published forms (where sigprop registers them, e.g. ``softmax-approx``) are scored on the same
measurements, so the comparison is like for like.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from sigprop import __version__
from sigprop.mc.components import SWEEPS
from sigprop.mc.sweep import run_sweep
from sigprop.output import write_text
from sigprop.rules import REGISTRY

# published forms scored beside sigprop's rule on the same samples
PUBLISHED_FORMS = {"softmax": ("softmax-approx", "softmax-full"), "attention": ("attention-published",),
                   "layernorm": ("layernorm-published",)}
def _published_forms(name: str, spec, grid_name: str) -> tuple:
    """The published forms scored beside the rule, unless the grid's variant says they do not
    model it (``"published_forms": False``, e.g. attention with rotary positions)."""
    if grid_name != "published" and not spec.variants.get(grid_name, {}).get("published_forms", True):
        return ()
    return tuple(REGISTRY[a] for a in PUBLISHED_FORMS.get(name, ()) if a in REGISTRY)


LABEL = {"x_mean": "x mean", "x_var": "x var", "x_corr": "x cov", "g_var": "g var", "g_corr": "g cov"}


def _fmt(p):
    return " / ".join(f"{p[k]:.2f}" for k in ("p50", "p90", "p99")) if p else "-"


#: components whose sweeps store their per-point measurements and standard errors
#: (docs/validation/rows/NAME-GRID.json), scored in standard errors too
ROWS_STORED = ("attention", "cross_attention", "cross_attention_kv", "moe_reglu", "moe_geglu", "moe_swiglu")
_VARS = ("x_var", "g_var")


def noise_scores(rows: list, predicted: list) -> dict:
    """Monte Carlo noise against rule bias, per variance moment: the percentiles of
    |predicted - measured| / SE over the points (``z``; when the rule is exact it is noise, Student's
    t with k - 1 degrees of freedom for SEs from k weight draws: 0.71 / 1.89 / 3.50 at p50 / p90 /
    p99 for 8 draws, 0.67 / 1.64 / 2.58 for many), the percentiles of the relative SE, and the p99 of the
    error in percent that the noise alone would give (``noise_p99``: the 99th percentile of the
    pooled |N(0, SE_i / measured_i)|, 20000 draws per point, seed 0).  ``rows`` carry
    ``measured`` and ``se``; ``predicted`` the rule's moments per row."""
    out = {}
    rng = np.random.default_rng(0)
    for mom in _VARS:
        meas = np.array([r["measured"][mom] for r in rows])
        se = np.array([r["se"][mom] for r in rows])
        pred = np.array([p[mom] for p in predicted])
        z = np.abs(pred - meas) / se
        rel = se / np.abs(meas)
        draws = np.abs(rng.standard_normal((20000, rel.size)) * rel).ravel() * 100
        out[mom] = {"z": {f"p{q}": float(np.percentile(z, q)) for q in (50, 90, 99)},
                    "rel_se": {f"p{q}": float(np.percentile(rel * 100, q)) for q in (50, 90, 99)},
                    "noise_p99": float(np.percentile(draws, 99))}
    return out


def _store_rows(store: Path, name: str, grid_name: str, res, seed: int, wall: float) -> None:
    """The sweep's per-point measurements and standard errors, for ``--rescore``."""
    rows_dir = store / "rows"
    rows_dir.mkdir(exist_ok=True)
    write_text(rows_dir / f"{name}-{grid_name}.json", json.dumps({
        "rows": [{"point": {k: (v.item() if hasattr(v, "item") else v) for k, v in r["point"].items()},
                  "measured": r["measured"], "se": r["se"]} for r in res.rows],
        "seed": seed, "wall": wall, "mc": res.seconds}))


def section(name: str, grid_name: str, res, spec, note: str) -> str:
    alts = list(res.also)
    head = ["moment", "sigprop p50 / p90 / p99", "published figure"] + [f"`{a}` on the same samples" for a in alts]
    lines = [f"### {name}: {grid_name} grid", "",
             f"{res.n_configs} configurations, seed {res.seed}, float32, simulation {res.seconds:.0f} s."
             + (f" {note}" if note else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mom in spec.moments:
        pub = res.published.get(mom) if grid_name == "published" else None
        row = [LABEL[mom], _fmt(res.percentiles[mom]), _fmt(pub)] + [_fmt(res.also[a][mom]) for a in alts]
        lines.append("| " + " | ".join(row) + " |")
    noise = getattr(res, "noise", None)
    if noise:
        lines += ["", "Noise against bias (variances): the error in standard errors of the measurement, "
                  "the relative standard error, and the p99 error (percent) the noise alone would give.", "",
                  "| moment | error / SE p50 / p90 / p99 | SE % p50 / p90 / p99 | noise-only p99 % |",
                  "|---|---|---|---|"]
        for mom in _VARS:
            nz = noise[mom]
            lines.append(f"| {LABEL[mom]} | {_fmt(nz['z'])} | {_fmt(nz['rel_se'])} | {nz['noise_p99']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="docs/validation.md")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--grid", nargs="*", default=None, help="run only these grids of the components")
    ap.add_argument("--rescore", nargs=3, metavar=("ROWS.json", "COMPONENT", "GRID"), default=None,
                    help="score stored measurements (rows with 'point' and 'measured') with the current rules")
    ap.add_argument("--assemble", action="store_true",
                    help="only re-assemble the markdown from the stored results")
    args = ap.parse_args(argv)
    store = Path(args.out).with_suffix("")
    store.mkdir(parents=True, exist_ok=True)
    if args.assemble:
        write_markdown(args.out, store)
        return 0
    if args.rescore:
        rescore(store, *args.rescore)
        write_markdown(args.out, store)
        return 0
    for name, spec in SWEEPS.items():
        if args.only and name not in args.only:
            continue
        grids = [("published", None, spec.note)] + [(k, v["grid"], v.get("note", "")) for k, v in spec.variants.items()]
        for grid_name, grid, note in grids:
            if args.grid and grid_name not in args.grid:
                continue
            t0 = time.perf_counter()
            also = _published_forms(name, spec, grid_name)
            res = run_sweep(spec, REGISTRY[spec.component.rule], n=args.n, seed=args.seed, grid=grid, also=also)
            wall = time.perf_counter() - t0
            noise = None
            if name in ROWS_STORED:
                _store_rows(store, name, grid_name, res, args.seed, wall)
                noise = noise_scores(res.rows, [r["predicted"] for r in res.rows])
            write_text(store / f"{name}-{grid_name}.json", json.dumps({"noise": noise,
                "component": name, "grid": grid_name, "note": note, "n_configs": res.n_configs, "seed": res.seed,
                "n": args.n, "wall_s": wall, "simulate_s": res.seconds, "percentiles": res.percentiles,
                "published": res.published, "also": res.also, "version": __version__,
                "date": datetime.date.today().isoformat()}, indent=1))
            print(f"{name} [{grid_name}]: {res.n_configs} configs in {wall:.0f} s", file=sys.stderr)
    write_markdown(args.out, store)
    return 0


def rescore(store: Path, rows_file: str, name: str, grid_name: str) -> None:
    """Measurements do not depend on the rule: re-score stored rows (each with the grid
    ``point`` and the ``measured`` moments of a run_sweep) with the current rule and the
    published forms, without re-running the simulation."""
    from sigprop.mc.sweep import _percentiles, errors
    from sigprop.mc.stats import Moments

    data = json.loads(Path(rows_file).read_text())
    spec = SWEEPS[name]
    rules = [REGISTRY[spec.component.rule], *_published_forms(name, spec, grid_name)]
    scored = {r.name: [] for r in rules}
    predicted = []
    for row in data["rows"]:
        case = spec.make_case(row["point"])
        m = row["measured"]
        meas = SimpleNamespace(
            x=Moments(m["x_mean"], m["x_var"], m["x_corr"] * m["x_var"], 0, 0, 0),
            g=Moments(0.0, m["g_var"], m["g_corr"] * m["g_var"], 0, 0, 0))
        for rule in rules:
            px, pg = rule.evaluate(case.x, case.g, **case.rule_params)
            scored[rule.name].append({"e": errors(px, pg, meas)})
            if rule is rules[0]:
                predicted.append({"x_var": float(px.var), "g_var": float(pg.var)})
    noise = noise_scores(data["rows"], predicted) if all("se" in r for r in data["rows"]) else None
    pct = {k: _percentiles(v, spec.moments, "e") for k, v in scored.items()}
    note = spec.note if grid_name == "published" else spec.variants[grid_name].get("note", "")
    pub = {k: (dict(zip(("p50", "p90", "p99"), v)) if v else None) for k, v in spec.published.items()}
    write_text(store / f"{name}-{grid_name}.json", json.dumps({
        "noise": noise, "component": name, "grid": grid_name, "n_configs": len(data["rows"]), "seed": data.get("seed", 0),
        "n": len(data["rows"]), "wall_s": data.get("wall") or float("nan"), "simulate_s": data.get("mc") or float("nan"),
        "note": (note + " " if note else "") + f"Measurements from a stored run_sweep ({Path(rows_file).name}), "
                "re-scored with the current rules (`validate --rescore`).",
        "percentiles": pct[rules[0].name], "published": pub, "also": {k: v for k, v in pct.items() if k != rules[0].name},
        "version": __version__, "date": datetime.date.today().isoformat()}, indent=1))


#: the measured accuracy in brief (hand-written: update it when the stored results change)
SUMMARY = """## In short

- **Components.** Every rule against Monte Carlo over its published grid (and the variant grids:
  causal, multi-head, grouped-query, QK-norm, rotary, soft-capped, sliding-window attention; the extended
  softmax grid), errors at the 50th / 90th / 99th percentile beside the published ones:
  "Results" below.
- **Whole models** (the accuracy floor; d_model 256, 4 heads, d_ff 1024, 128 tokens; 8 weight
  draws x batch 4): 203 of the 204 configurations pass `check` (every architecture with its
  default, `torch-default` and `normal` init, dropout 0 and 0.1, bidirectional and causal, 12, 48
  and 96 layers). The failure, DSLM-Post's own init at 48 layers, causal, dropout 0, is seed 0's
  sample: seeds 1-5 at the same size and an independent 48-draw sample pass. Where the variance
  changes more than 2x over depth, R^2 of log predicted against log measured variance meets 0.998
  (forward) and 0.99 (gradient) in 123 of 133 series at 8 draws; all but one of the misses meet
  it on independent 32-draw samples (judged before the position model's last change).
- **Block layouts** (`peri`, `output`, `parallel`; 24 configurations) and **modern blocks** (the
  `llama`, `gpt2`, `bert`, `olmo2` and `peri` presets, LNS and DSLM on LLaMA blocks; 96
  configurations): all pass, and R^2 meets its floor in every series that changes over 2x.
- **Causal models with a norm after the branch** (`peri`, `output`) on a stream of variance 1
  and 0.01: the input gradient's token correlation within 0.026 of the measured 0.25-0.49
  (`tests/model/test_predict_out_norm_causal.py`: 16 points, d 128, 32 tokens, 1 and 4 layers, LayerNorm and
  RMSNorm, 8 x 8 draws, all pass). The stored causal `peri`/`output` layout rows predate this.
- **Causal models at long context**: the position node grid within 3e-6 of the exact position
  model on the trace and 7e-5 on the gradient's position profile.
- Pre-LN DeepScaleLM's depth-independent gradient factor (input/output 0.39 at 192 and at 768
  layers): the Monte Carlo at width 256 measures 0.39 against 0.40 predicted at 12 layers.

"""


def write_markdown(out: str, store: Path) -> None:
    order = list(SWEEPS)
    results = [json.loads(f.read_text()) for f in sorted(store.glob("*.json"))]
    results.sort(key=lambda r: (order.index(r["component"]) if r["component"] in order else 99, r["grid"] != "published", r["grid"]))
    parts, timing = [], []
    for r in results:
        res = SimpleNamespace(n_configs=r["n_configs"], seed=r["seed"], seconds=r["simulate_s"],
                              percentiles=r["percentiles"], published=r["published"], also=r["also"],
                              noise=r.get("noise"))
        parts.append(section(r["component"], r["grid"], res, SWEEPS[r["component"]], r["note"]))
        timing.append((r["component"], r["grid"], r["n_configs"], r["wall_s"]))
    ns = sorted({r["n"] for r in results}) or [500]
    seeds = sorted({r["seed"] for r in results}) or [0]
    header = f"""# Validation: every rule and whole model against Monte Carlo

Assembled by `python -m sigprop.mc.validate --assemble` (a second) from the stored results; do
not edit by hand (a test compares this page with the assembled one). The results are made by:

| what | command | stored in |
|---|---|---|
| the component sweeps ("Results") | `make validate` (`python -m sigprop.mc.validate`; tens of minutes) | `docs/validation/*.json` |
| the whole-model accuracy floor | `make validate-models` (`python -m sigprop.mc.floor`; hours on 2 cores) | `docs/validation/floor/`, `floor_more/` |
| the block layouts | `python -m sigprop.mc.floor --layouts` | `docs/validation/layouts/` |
| the modern blocks | `python -m sigprop.mc.floor --modern` | `docs/validation/modern/` |
| the other sections | the script each names | `docs/validation/*.md`, appended as they are |

Each sweep measures a seeded random subset of {', '.join(map(str, ns))} points of the component's
grid (the whole grid when it is smaller), seed {', '.join(map(str, seeds))}. Errors are in percent, at the 50th / 90th / 99th
percentile over configurations, in the published error metric of [TGS]:
`|measured - predicted| / |measured|` for variances; for covariances ("cov" columns, scored on
correlation x variance) the smaller of that and `|measured - predicted| / predicted variance`.
**One deliberate difference:** for means the published metric divides by the predicted
*variance*, which is not scale-invariant; sigprop divides by the predicted *standard deviation*.
"Published figure" is the [TGS] table; where sigprop also registers the published formulas, they
are scored on the very same samples in the last columns.

""" + SUMMARY + """## Wall time of each sweep

| component | grid | configurations | wall s |
|---|---|---|---|
""" + "\n".join(f"| {a} | {b} | {c} | {d:.0f} |" for a, b, c, d in timing) + "\n\n## Results\n\n"
    write_text(out, header + "\n".join(parts) + models_section() + extra_sections(store))


def extra_sections(store: Path) -> str:
    """Sections measured by other scripts, stored as Markdown beside the sweeps' results
    (``<store>/*.md``, in name order), appended as they are."""
    return "".join("\n" + f.read_text().rstrip("\n") + "\n" for f in sorted(store.glob("*.md")))


def models_section() -> str:
    """The whole-model accuracy floor (`python -m sigprop.mc.floor`), from its stored results."""
    from sigprop.mc import floor

    table = floor.report()
    if not table:
        return ""
    return """

## Whole models: `sigprop check` (accuracy floor)

`python -m sigprop.mc.floor` runs `sigprop check`'s comparison (same prediction, same Monte Carlo,
same pass rule: every point within 5% relative for variances or 0.03 absolute for correlations,
or within z = 4 standard errors over the weight draws) for every architecture with its default
init and with `torch-default` and `normal`, at d_model 256, 4 heads of 64, d_ff 1024, 128 tokens,
ReLU, dropout 0 and 0.1 (all three), bidirectional and causal; results are stored per
configuration in `docs/validation/floor/` and this table is assembled from them. "err max":
largest error over all points (relative for variances, absolute for correlations). R²: of log
predicted vs log measured variance over all points, shown where the measured variance changes
by more than 2x over depth (the change in brackets). "trials x batch": weight draws x sequences
per draw; seed 0 throughout. What was run, and the failures by cause, are said below the
table. The floor asks for R² >= 0.998 (forward) and >= 0.99 (gradient) where the change
exceeds 2x.

""" + table + "\n" + layouts_section() + modern_section()


def layouts_section() -> str:
    """The block layouts' matrix (`python -m sigprop.mc.floor --layouts`), from its stored results."""
    from sigprop.mc import floor

    table = floor.layouts_report()
    if not table:
        return ""
    return """
### Block layouts: peri, output and parallel blocks

`python -m sigprop.mc.floor --layouts`: the same comparison and pass rule for Pre-LN's `normal`
init (N(0, 0.02^2) weights, no biases) with every sublayer placed `peri` (the model's norm before
and after the branch) or `output` (on the branch output only), and with `parallel` blocks (one
norm, attention and FFN branches summed), LayerNorm, at the dimensions above, depths 12 and 48,
dropout 0 and 0.1, bidirectional and causal; results in `docs/validation/layouts/`.

""" + table + "\n"


def modern_section() -> str:
    """The modern blocks' matrix (`python -m sigprop.mc.floor --modern`), from its stored results."""
    from sigprop.mc import floor

    table = floor.modern_report()
    if not table:
        return ""
    return """
### Modern blocks: the model presets, and LNS and DSLM on LLaMA blocks

`python -m sigprop.mc.floor --modern`: the same comparison and pass rule for the model presets
(`llama` with grouped-query attention, n_heads / n_kv_heads = 4; `gpt2`, `bert`, `olmo2`,
`peri`) and for LayerNorm Scaling and DSLM on LLaMA blocks (pre-RMSNorm, SwiGLU, RoPE, final
norm, no biases), each with its preset's init, at the dimensions above (d_model 256, 4 heads,
d_ff 1024, 128 tokens; the presets' own sizes replaced), dropout 0 and 0.1, causal (and
bidirectional for the encoders `bert` and `peri`); results in `docs/validation/modern/`.

""" + table + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
