"""The summary's verdict: classes from magnitudes and growth laws together, on models whose
behaviour is known (the literature's, and the total factors read off the trace itself), and on
synthetic series whose law is known by construction."""

import math

import numpy as np
import pytest

from sigprop.model import resolve
from sigprop.model.growth import Growth, classify
from sigprop.model.predict import predict
from sigprop.model.trace import CLASSES, summary, trace, verdict

# (arch, layers, options, class, forward law, gradient law); the expectations come from the
# papers (Pre-LN: variance linear, gradient hyperbolic; Post-LN: gradient geometric in depth;
# DeepScaleLM and DeepNorm: variance conserved; LayerNorm Scaling: harmonic), not from a run
KNOWN = [
    ("preln", 24, {}, "drifting", "linear", "hyperbolic"),
    ("preln", 768, {}, "drifting", "linear", "hyperbolic"),
    ("preln", 24, {"branch_scale": 1000.0}, "unstable", "linear", "hyperbolic"),
    ("postln", 24, {}, "unstable", "constant", "exponential"),
    ("postln", 96, {}, "unstable", "constant", "exponential"),
    ("postln", 1, {"init_std": 0.08}, "unstable", "constant", "undetermined"),
    ("dslm", 24, {}, "bounded", "constant", None),
    ("dslm", 192, {}, "bounded", "constant", None),
    ("dslm", 768, {}, "bounded", "constant", None),
    ("deepnorm", 24, {}, "stable", "constant", "constant"),
    ("deepnorm", 768, {}, "stable", "constant", "constant"),
    ("lns", 24, {}, "bounded", "harmonic", None),
    ("lns", 768, {}, "bounded", "harmonic", None),
    ("mixln", 768, {}, "unstable", None, None),
    # a skip scale below 1: the stream variance relaxes to a fixed point (bounded law) while
    # the gradient, shrunk by a^2 per sublayer beside a branch gain that no longer grows,
    # falls geometrically
    ("preln", 96, {"skip_scale": 0.95}, "unstable", "bounded", "exponential"),
]


@pytest.mark.parametrize("arch,n,opts,cls,flaw,glaw", KNOWN,
                         ids=[f"{a}-{n}-{'-'.join(f'{k}{v}' for k, v in o.items())}" for a, n, o, *_ in KNOWN])
def test_verdict_on_models_of_known_behaviour(arch, n, opts, cls, flaw, glaw):
    m = resolve(arch, n_layers=n, **opts)
    s = summary(predict(m))
    assert s["verdict_class"] == cls, s["verdict"]
    assert s["verdict"].startswith(cls + ": ")
    if flaw:
        assert s["forward_law"] == flaw
    if glaw:
        assert s["grad_law"] == glaw
    # the sentence names the numbers: both total factors as printed in the summary
    g = s["grad_ratio_input_output"]
    assert f"x{g:.3g}" in s["verdict"], s["verdict"]


def test_verdict_bands_follow_the_trace_numbers():
    """The class agrees with the documented bands applied to the trace's own totals: DSLM's
    gradient ratio is within x10 at every depth (depth-independent: 0.38..0.39), Post-LN's
    beyond x10 at 24 layers, and the verdict never calls DSLM's gradient geometric."""
    ratios = []
    for n in (24, 192, 768):
        s = summary(predict(resolve("dslm", n_layers=n)))
        ratios.append(s["grad_ratio_input_output"])
        assert "vanishes" not in s["verdict"] and "geometric" not in s["verdict"]
        assert "beyond x2 but within x10" in s["verdict"]
    assert max(ratios) / min(ratios) < 1.05 and all(1 / 10 < r < 1 / 2 for r in ratios)
    s = summary(predict(resolve("postln", n_layers=24)))
    assert s["grad_ratio_input_output"] < 0.1 and "beyond x10" in s["verdict"]


def test_one_layer_changing_the_gradient_tenfold_is_not_conserved():
    s = summary(predict(resolve("postln", n_layers=1, init_std=0.08)))
    assert s["grad_ratio_input_output"] > 5
    assert "conserved" not in s["verdict"] and "per layer, beyond x2" in s["verdict"]
    assert "logit variance" in s["verdict"]          # the flag of a lower class stays


def _g(law, log_ratio, **kw):
    return Growth(law, kw.pop("r2", 1.0), kw.pop("slope", 0.0), math.exp(log_ratio), log_ratio=log_ratio, **kw)


def _s(n=24, corr=0.5, logit=0.2, grad_log=0.0):
    return {"n_layers": n, "corr_top": corr, "max_logit_var": logit,
            "grad_ratio_input_output": math.exp(grad_log), "log10_grad_ratio_input_output": grad_log / math.log(10)}


@pytest.mark.parametrize("fw,bw,s,cls", [
    (_g("constant", 0.0), _g("constant", 0.0), _s(), "stable"),
    (_g("linear", math.log(1.9)), _g("constant", 0.0), _s(), "stable"),
    (_g("linear", math.log(2.1)), _g("constant", 0.0), _s(), "bounded"),
    (_g("exponential", math.log(9.0), slope=0.09), _g("constant", 0.0), _s(), "bounded"),
    (_g("exponential", math.log(11.0), slope=0.1), _g("constant", 0.0), _s(), "unstable"),
    (_g("linear", math.log(11.0)), _g("constant", 0.0), _s(), "drifting"),
    (_g("linear", math.log(999.0)), _g("constant", 0.0), _s(), "drifting"),
    (_g("linear", math.log(1001.0)), _g("constant", 0.0), _s(), "unstable"),
    (_g("bounded", math.log(50.0), length=6.0), _g("constant", 0.0), _s(), "bounded"),
    (_g("bounded", math.log(2000.0), length=6.0), _g("constant", 0.0), _s(), "unstable"),
    # the gradient: its law was fitted from the input up, the ratio reported input/output
    (_g("constant", 0.0), _g("exponential", math.log(20.0), slope=0.1), _s(grad_log=-math.log(20)), "unstable"),
    (_g("constant", 0.0), _g("undetermined", math.log(3.0)), _s(n=1, grad_log=-math.log(3)), "unstable"),
    (_g("constant", 0.0), _g("undetermined", math.log(3.0)), _s(n=2, grad_log=-math.log(3)), "bounded"),
    (_g("constant", 0.0), _g("constant", 0.0), _s(corr=0.95), "drifting"),
    (_g("constant", 0.0), _g("constant", 0.0), _s(corr=0.995), "unstable"),
    (_g("constant", 0.0), _g("constant", 0.0), _s(logit=11.0), "drifting"),
    (_g("constant", 0.0), _g("constant", 0.0), _s(logit="inf"), "drifting"),
])
def test_verdict_thresholds(fw, bw, s, cls):
    v = verdict(fw, bw, s)
    assert v.split(":")[0] == cls, v
    assert cls in CLASSES


def test_bounded_law_for_series_that_settle():
    l = np.arange(1, 97, dtype=float)
    g = classify(l, np.log(5 - 4 * 0.7 ** l))               # relaxes to a fixed point
    assert g.law == "bounded" and g.length < 96 / 4
    g = classify(l, np.log(0.35 + 0.65 * 0.6 ** l + 0.02 * (1 - 0.9 ** l)))   # overshoots, then settles
    assert g.law == "bounded"
    # laws that do not settle stay what they are, also at great depth
    l = np.arange(1, 769, dtype=float)
    assert classify(l, np.log(1 + 0.45 * np.cumsum(1 / l))).law == "harmonic"
    assert classify(l, np.log(1 + 0.5 * l)).law == "linear"
    assert classify(l, -0.004 * l).law == "exponential"
    assert classify(l, np.log(1 / (1 + 10 * l))).law == "hyperbolic"


def test_too_few_layers_name_no_law():
    assert classify(np.array([1.0, 2.0]), np.log([1.0, 3.0])).law == "undetermined"
    assert classify(np.array([1.0, 2.0]), np.log([1.0, 1.05])).law == "constant"
    s = summary(predict(resolve("preln", n_layers=1)))
    assert s["forward_var_growth"] > 1.1 and s["forward_law"] == "undetermined"


def test_summary_keys_stay():
    m = resolve("preln", n_layers=3, d_model=64, n_heads=2, seq_len=8, d_ff=128)
    s = trace(m, predict(m))["summary"]
    assert {"forward_var_final", "forward_var_growth", "log10_forward_var_growth", "forward_law",
            "grad_ratio_input_output", "log10_grad_ratio_input_output", "grad_law", "corr_top",
            "max_logit_var", "verdict"} <= set(s)
    assert s["verdict_class"] in CLASSES and s["n_layers"] == 3


def test_verdict_words_for_a_vanished_series():
    """A variance that reaches 0 (log -inf) is written x0, not an error."""
    v = verdict(_g("constant", 0.0), _g("constant", 0.0)._replace(law="exponential", log_ratio=-math.inf),
                _s(grad_log=math.inf))
    assert v.startswith("unstable: ") and "xinf" in v
