"""The whole-model table of docs/validation/moe-models.md: mixture-of-experts models (ffn_kind
"moe") predicted by sigprop and measured by its whole-model Monte Carlo (`sigprop check`'s
default rule: 5% or 4 standard errors, correlations 0.03 absolute), over routers (softmax
renormalised or not, sigmoid with group-limited routing and a route scale, a gated shared
expert), placements, masks, depths, widths, expert counts and router sharpness.

    python docs/moe_models.py            print the table (about 10 minutes on 2 cores)
    python docs/moe_models.py --write    write docs/validation/moe-models.md
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "validation" / "moe-models.md"
TRIALS, BATCH = 16, 8

#: (label, moe fields beyond n_experts/top_k/d_ff_expert)
ROUTERS = {
    "softmax, renormalised (Mixtral, Qwen3-MoE)": dict(norm_topk_prob=True),
    "softmax (OLMoE, Qwen2-MoE)": dict(),
    "sigmoid, 2 of 4 groups, x2.5, shared (DeepSeek-V3)": dict(router="sigmoid", norm_topk_prob=True, n_group=4,
                                                                topk_group=2, route_scale=2.5, d_ff_shared=256),
    "softmax, gated shared expert (Qwen2-MoE)": dict(d_ff_shared=256, shared_mix=True),
}
#: (router label, layers, d_model, experts, top k, router std x sqrt(d_model), placement, causal, seed)
ROWS = [
    (0, 6, 128, 8, 2, 1.0, "pre", True, 0), (0, 6, 128, 8, 2, 3.0, "pre", True, 1),
    (0, 24, 128, 8, 2, 1.0, "pre", True, 2), (0, 6, 256, 8, 2, 1.0, "post", False, 3),
    (1, 6, 128, 64, 8, 1.0, "pre", False, 4), (1, 6, 128, 64, 8, 3.0, "pre", True, 5),
    (1, 24, 256, 8, 2, 1.0, "pre", True, 6), (1, 6, 128, 8, 2, 2.0, "post", True, 7),
    (2, 6, 128, 16, 4, 1.0, "pre", True, 8), (2, 6, 128, 16, 4, 3.0, "pre", False, 9),
    (2, 24, 128, 16, 4, 1.0, "pre", True, 10),
    (3, 6, 128, 8, 2, 1.0, "pre", True, 11), (3, 6, 256, 8, 2, 3.0, "pre", False, 12),
    (3, 24, 128, 8, 2, 1.0, "post", True, 13),
]


def model(router: int, layers: int, d: int, experts: int, k: int, sharp: float, placement: str, causal: bool) -> dict:
    """The model object: RMSNorm, SwiGLU experts of width 2 d_model, 4 heads, RoPE, 32 tokens,
    every weight std 1/sqrt(fan-in) but the router's (``sharp``/sqrt(d_model)) and the queries'
    and keys' (0.5/sqrt(d_model): small logits, the mixture is what is measured); a final norm
    with the pre placement."""
    moe = {"n_experts": experts, "top_k": k, "d_ff_expert": 2 * d, **list(ROUTERS.values())[router]}
    names = ["router", "gate", "up", "down"] + (["shared_gate", "shared_up", "shared_down"] if moe.get("d_ff_shared")
                                               else []) + (["shared_mix"] if moe.get("shared_mix") else [])
    fan_in = {"down": 2 * d, "shared_down": moe.get("d_ff_shared", 1)}

    def sub(ws, std):
        return {"placement": placement, "skip_scale": 1.0, "branch_scale": 1.0, "norm_scale": 1.0,
                "init": {w: {"std": std(w), "bias_std": 0.0} for w in ws}}
    att = sub("qkvo", lambda w: (0.5 if w in "qk" else 1.0) / math.sqrt(d))
    ffn = sub(names, lambda w: sharp / math.sqrt(d) if w == "router" else 1 / math.sqrt(fan_in.get(w, d)))
    return {"arch": "moe", "n_layers": layers, "d_model": d, "n_heads": 4, "d_head": d // 4, "d_ff": 2 * d,
            "seq_len": 32, "activation": "silu", "norm": "rmsnorm", "causal": causal,
            "dropout": {"attention": 0.0, "hidden": 0.0, "ffn_inner": 0.0},
            "input": {"mean": 0.0, "var": 1.0, "corr": 0.2}, "grad": {"var": 1.0, "corr": 0.0},
            "ffn_kind": "moe", "moe": moe, "rope": {"base": 10000.0}, "final_norm": placement == "pre",
            "layers": [{"attention": att, "ffn": ffn} for _ in range(layers)]}


def rows() -> list[str]:
    from sigprop.api import check

    out = []
    for router, layers, d, experts, k, sharp, placement, causal, seed in ROWS:
        r = check(model(router, layers, d, experts, k, sharp, placement, causal), trials=TRIALS, batch=BATCH,
                  seed=seed)
        e = r.errors

        def pct(key):
            return f"{100 * e[key]['median']:.2f} / {100 * e[key]['max']:.1f}"
        out.append(f"| {list(ROUTERS)[router]} | {experts} / {k} | {sharp:g} | {layers} | {d} | {placement} | "
                   f"{'causal' if causal else 'bidirectional'} | {seed} | {'pass' if r.passed else 'FAIL'} | "
                   f"{pct('forward_var_relerr')} | {pct('grad_var_relerr')} | {e['forward_corr_abserr']['max']:.4f} | "
                   f"{e['grad_corr_abserr']['max']:.4f} | {pct('logit_var_relerr')} |")
        print(out[-1], file=sys.stderr, flush=True)
    return out


def page(table: list[str]) -> str:
    n = sum("| pass |" in r for r in table)
    head = f"""## Mixtures of experts: whole models

`docs/moe_models.py` (ffn_kind "moe", docs/formats.md): each model predicted and measured by the
whole-model Monte Carlo, {TRIALS} trials x batch {BATCH}, `check`'s default rule (5% or 4 standard
errors; correlations 0.03). RMSNorm, SwiGLU experts of width 2 d_model, 4 heads, RoPE, 32 tokens,
every weight std 1/sqrt(fan-in) but the router's (the column "router": its std times sqrt(d_model),
so the router logits' variance) and the queries' and keys' (0.5/sqrt(d_model)); a final norm with
the pre placement. Errors: median / max in
percent (correlations: max, absolute). {n} of {len(table)} models pass.

| router | experts / top k | router | layers | d_model | placement | attention | seed | result | fwd var | grad var | fwd corr | grad corr | logit var |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""
    return head + "\n".join(table) + "\n" + NOTE


#: what was measured beyond the table (by hand, with this module's models and sigprop.api.check)
NOTE = """
The failing row is the Post-LN stack's heavy-tailed gradient, not a bias of the mixture's rule:
at 24 Post-LN layers each norm divides a draw's gradient by that draw's per-token standard
deviation, and seed 13's 16 trials put the input gradient at 0.66 of the prediction (52.3 +- 4
measured, 79.4 predicted). The same model at seed 14 with 32 trials measures 0.986 +- 0.104 of
the prediction and passes; at seed 13 the plain softmax router passes (prediction / measured
1.010), the renormalised one passes (1.093), the shared expert without its gate fails
(1.278 +- 0.085), and the dense SwiGLU stack of the same width passes at 0.802. The gated shared
expert under the pre placement at 24 layers, seed 13: 0.920 +- 0.030, pass.
"""


if __name__ == "__main__":
    text = page(rows())
    if "--write" in sys.argv[1:]:
        OUT.write_text(text)
    else:
        print(text)
