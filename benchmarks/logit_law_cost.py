"""What the sampled logit law (sigprop.model.logit_law) costs a prediction: the `output`
placement's causal 48-layer model (floor sizes, 128 positions; the law takes the attentions
above its offsets, in part from LAW_LO) predicted in one warm process with the law and with it
switched off (LAW_LO and LAW_OFFSET raised to infinity: the additive fit everywhere),
interleaved, medians, and the ratio; plus the law's own time per call on one such layer.

    python benchmarks/logit_law_cost.py [--dropout 0.1] [--repeats 3]

The tables are built by an untimed first prediction of each kind."""

from __future__ import annotations

import argparse
import statistics
import time

from sigprop.mc import floor
from sigprop.model import logit_law
from sigprop.model.predict import predict
from sigprop.model.presets import resolve


def _timed(model, law: bool) -> float:
    """One prediction's seconds, with the law (its thresholds as they are) or without it
    (LAW_LO and LAW_OFFSET raised to infinity: the additive fit everywhere)."""
    saved = logit_law.LAW_LO, logit_law.LAW_OFFSET
    if not law:
        logit_law.LAW_LO = logit_law.LAW_OFFSET = float("inf")
    try:
        t = time.perf_counter()
        predict(model)
        return time.perf_counter() - t
    finally:
        logit_law.LAW_LO, logit_law.LAW_OFFSET = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    model = resolve("preln", "normal", n_layers=48, dropout=a.dropout, causal=True, **floor.DIMS, placement="output")
    for law in (False, True):                          # untimed: tables and memos
        _timed(model, law)
    calls = []
    orig = logit_law.law_weights

    def counted(*args, **kw):
        t = time.perf_counter()
        out = orig(*args, **kw)
        calls.append(time.perf_counter() - t)
        return out

    logit_law.law_weights = counted
    try:
        fit, with_law = [], []
        for _ in range(a.repeats):
            fit.append(_timed(model, False))
            with_law.append(_timed(model, True))
    finally:
        logit_law.law_weights = orig
    f, w = statistics.median(fit), statistics.median(with_law)
    per = len(calls) // a.repeats
    print(f"`output` placement, causal, 48 layers, dropout {a.dropout:g}, floor sizes; "
          f"{logit_law.DRAWS} draws a row, LAW_MAX {logit_law.LAW_MAX}; medians of {a.repeats}")
    print(f"additive fit everywhere  {f:7.2f} s")
    print(f"with the sampled law     {w:7.2f} s   ratio {w / f:.1f}x   ({per} layers take the law, "
          f"median {statistics.median(calls):.2f} s a call)")


if __name__ == "__main__":
    main()
