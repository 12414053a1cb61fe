"""The largest per-key logit offset (sigprop.model.profile.KeyWeights.offset) of the causal
configurations the accuracy floor validates, the basis of `predict.KEY_OFFSET_NOTE` and of
the sampled logit law's threshold `logit_law.LAW_LO` (above it a causal attention takes its
per-key weights from the law, or carries an approximation note).  Deterministic: no
sampling; the `output` placement's 48-layer model (offsets ~37, minutes of the law) is left
out, as the constants' comments say."""

import pytest

from sigprop.mc import floor
from sigprop.model import logit_law
from sigprop.model.predict import KEY_OFFSET_NOTE, key_offsets, run
from sigprop.model.presets import resolve


def _configs():
    confs = [c + ((),) for c in floor.configs([96], dropouts=(0.0,), causals=(True,))]
    confs += [c for c in floor.modern_configs([96], dropouts=(0.0,)) if c[4]]
    confs += [c for c in floor.layout_configs([48], dropouts=(0.0,), causals=(True,))
              if ("placement", "output") not in c[5]]
    return confs


@pytest.mark.slow
@pytest.mark.parametrize("cfg", _configs(), ids=lambda c: floor.name(*c))
def test_validated_causal_models_stay_below_the_law(cfg):
    arch, init, n, p, causal, opts = cfg
    records, _ = run(resolve(arch, init, n_layers=n, dropout=p, causal=causal, **floor.DIMS, **dict(opts)))
    largest = max((off for _, off in key_offsets(records)), default=0.0)
    assert KEY_OFFSET_NOTE == logit_law.LAW_LO
    assert largest < 1.6 < logit_law.LAW_LO
