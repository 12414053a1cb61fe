"""Write tests/data/reference_traces.json: the traces of twelve reference models.

Run only to re-pin after a change that is shown (by Monte Carlo) to improve a prediction:
``python tests/data/make_reference_traces.py``.  tests/model/test_predict_reference_traces.py requires every
later tree to reproduce these numbers to 1e-12 relative (the re-design of the model layer
must not move them)."""

import json
import math
from pathlib import Path

from sigprop.model.options import build_model
from sigprop.model.predict import predict

#: name -> model options (as sigprop.model.options.build_model takes them)
MODELS = {
    "preln-24": dict(arch="preln", layers=24),
    "postln-torch-24": dict(arch="postln", init="torch-default", layers=24),
    "dslm-48": dict(arch="dslm", layers=48),
    "dslm-post-48": dict(arch="dslm-post", layers=48),
    "deepnorm-48": dict(arch="deepnorm", layers=48, d_model=512, heads=8),
    "lns-192": dict(arch="lns", layers=192, d_model=512, heads=8),
    "mixln-24-gelu": dict(arch="mixln", layers=24, activation="gelu"),
    "preln-causal-24": dict(arch="preln", layers=24, causal=True, seq_len=64, d_model=256, heads=4),
    "postln-causal-12-gelu": dict(arch="postln", layers=12, causal=True, seq_len=64, d_model=256, heads=4,
                                  activation="gelu", dropout=0.1),
    "preln-causal-long-4": dict(arch="preln", layers=4, causal=True, seq_len=1024, d_model=256, heads=4),
    "postln-torch-96-p0": dict(arch="postln", init="torch-default", layers=96, dropout=0.0, d_model=256, heads=4),
    "preln-scaled-mean": dict(arch="preln", init="scaled", layers=12, skip_scale=0.9, branch_scale=0.7,
                              input_mean=0.3, input_var=2.0, activation="gelu", ffn_dropout=0.05,
                              grad_corr=0.2),
}


def trace(opts: dict) -> list:
    pts = predict(build_model(opts))
    return [[p.layer, p.sublayer, p.log_var, p.mean, p.corr, p.log_gvar, p.gcorr, p.logit_var] for p in pts]


def main() -> None:
    out = {name: {"options": opts, "points": trace(opts)} for name, opts in MODELS.items()}
    path = Path(__file__).with_name("reference_traces.json")
    path.write_text(json.dumps(out, indent=0, allow_nan=True) + "\n")
    print(f"wrote {path} ({len(out)} models)")


if __name__ == "__main__":
    main()
