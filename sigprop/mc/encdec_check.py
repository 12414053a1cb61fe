"""Encoder-decoder models against the whole-model Monte Carlo (docs/validation.md, "Encoder-decoder
models"): Post-LN and Pre-LN, N-layer encoder and M-layer decoder with N, M in {6, 12}, decoder
bidirectional and causal; init xavier, d_model 256, 4 heads, d_ff 1024, decoder 16 tokens, encoder
24, dropout 0.1; check's default tolerance (5% or 4 SE, correlations 0.03), 16 trials x batch 8,
seed 0 (``--final-norm``: the Pre-LN rows with a final norm on both stacks).  Prints one markdown row per model: pass, median / max relative errors of the forward and
gradient variances (percent), the largest absolute correlation errors, and the encoder output's
gradient predicted / measured."""

from __future__ import annotations

import itertools
import sys
import time

from sigprop.model import encdec as ED


def row(arch, n, m, causal, trials=16, batch=8, seed=0, d=256, final_norm=False):
    model = ED.from_options(dict(arch=arch, init="xavier", d_model=d, n_heads=4, d_ff=4 * d, seq_len=16,
                                 causal=causal, final_norm=final_norm), n, m, encoder_seq_len=24)
    t0 = time.perf_counter()
    pred, meas, res = ED.check(model, None, trials=trials, batch=batch, seed=seed)
    e = res.errors
    ne = len(pred.encoder)
    top_p, top_m = pred.encoder[-1].gvar, meas["encoder"].backward[ne - 1].var
    top_se = meas["encoder"].backward[ne - 1].var_se
    return (f"| {arch}{' + final norm' if final_norm else ''} | {n} | {m} | {'causal' if causal else 'bidirectional'} | {'pass' if res.passed else 'FAIL'} | "
            f"{100 * e['forward_var_relerr']['median']:.2f} / {100 * e['forward_var_relerr']['max']:.1f} | "
            f"{100 * e['grad_var_relerr']['median']:.2f} / {100 * e['grad_var_relerr']['max']:.1f} | "
            f"{e['forward_corr_abserr']['max']:.4f} | {e['grad_corr_abserr']['max']:.4f} | "
            f"{top_p:.4g} / {top_m:.4g} ± {top_se:.2g} | {time.perf_counter() - t0:.0f} |")


def main(argv=None):
    """``--final-norm``: the Pre-LN rows with a final norm on both stacks (E normalised) only."""
    argv = sys.argv[1:] if argv is None else argv
    fn = "--final-norm" in argv
    print("| arch | N | M | decoder | result | fwd var % med / max | grad var % med / max | fwd corr max | "
          "grad corr max | dL/dE var pred / meas | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for arch, (n, m), causal in itertools.product(("preln",) if fn else ("postln", "preln"),
                                                  ((6, 6), (6, 12), (12, 6), (12, 12)), (False, True)):
        print(row(arch, n, m, causal, final_norm=fn), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
