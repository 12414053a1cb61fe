"""The largest per-key logit offset (sigprop.model.profile.KeyWeights.offset) of every causal
configuration the accuracy floor validates, the basis of `predict.KEY_OFFSET_NOTE` (above it a
prediction carries an approximation note).

    python benchmarks/key_offsets.py [--depth 96] [--layout-depth 48] [--dropout 0]

The classic floor's causal rows and the modern blocks' at ``--depth`` layers, the block layouts'
at ``--layout-depth``, the floor's sizes, one dropout: per configuration the largest offset over
its attention layers (`predict.key_offsets` of the forward records, `predict.run`) and the
seconds it took.  Deterministic: no sampling."""

from __future__ import annotations

import argparse
import time

from sigprop.mc import floor
from sigprop.model.predict import key_offsets, run
from sigprop.model.presets import resolve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=96)
    ap.add_argument("--layout-depth", type=int, default=48)
    ap.add_argument("--dropout", type=float, default=0.0)
    a = ap.parse_args()
    ps = (a.dropout,)
    confs = [c + ((),) for c in floor.configs([a.depth], dropouts=ps, causals=(True,))]
    confs += [c for c in floor.modern_configs([a.depth], dropouts=ps) if c[4]]
    confs += list(floor.layout_configs([a.layout_depth], dropouts=ps, causals=(True,)))
    for arch, init, n, p, causal, opts in confs:
        t = time.perf_counter()
        records, _ = run(resolve(arch, init, n_layers=n, dropout=p, causal=causal, **floor.DIMS, **dict(opts)))
        offs = [off for _, off in key_offsets(records)]
        print(f"{floor.name(arch, init, n, p, causal, opts):50s} largest offset {max(offs, default=0.0):9.3g}"
              f"  ({time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
