"""The states a whole-model prediction threads through its residual units.

Forward, every residual unit maps the :class:`StreamState` entering it to the one after it;
backward, it maps the :class:`GradState` w.r.t. the stream after it to the one w.r.t. the
stream entering it (``sigprop.model.predict``).  Both are immutable named tuples: a unit
never changes a state it was given, and a trace point (``predict.StreamPoint``) is a stream
state with the gradient state at the same place.

Variances are carried as natural logarithms beside a normalised state (see
``sigprop.model.predict``): the stream and its gradient may grow or vanish beyond float64.

Which code writes which field:

* ``log_var``, ``x``: the rules, through the predictor's log-space combination
  (``rules.residual`` for the residual sum, the norm rule after it);
* ``tok``: ``rules.layernorm.combine_token_stats`` for a sum, ``model.blocks.NORM_TOKENS``
  after a norm (the norm rules read it as their parameters ``centred``, ``kappa``);
* ``prof``, ``dev`` (causal models only): ``model.profile`` (the attention rule's per-row
  terms distributed over positions);
* ``logit_var``: ``rules.attention.logit_var`` at the unit's attention input;
* ``log_gvar``, ``gcorr``: the rules' ``backward`` (norms, branch chains; the residual rule for
  the sum of the skip and branch gradients); ``gen``: the predictor's share split
  (``predict._generic_below``, with ``rules.residual``'s Post-LN shares), passed to a Post-LN
  unit's norm rule as its backward parameter ``g_generic`` / ``g_generic_rms``; ``w``
  (causal): ``model.profile``; ``slope``: ``rules.layernorm.token_slope_below`` down a
  pre-norm unit (the final norm's backward sets its start), passed to an FFN's input norm as
  ``g_slope`` / ``g_slope_rms``.  (Those parameters are a new dict per unit: the ops the
  forward pass recorded are never changed.)
"""

from __future__ import annotations

from typing import NamedTuple

from sigprop.state import Forward


class StreamState(NamedTuple):
    """The residual stream at one place (entering a unit, after it, or a Post-LN unit's sum
    before its norm)."""

    log_var: float                # natural log of the stream's variance (-inf: no signal)
    x: Forward                    # the stream normalised to variance 1 (mean in stream stds, corr)
    tok: tuple                    # per-token statistics (centred, kappa): Gaussian (0, 1), a norm's output (1, 0)
    prof: object = None           # causal: variance profile over positions (mean 1); else None
    dev: object = None            # causal: deviation of the normalised covariance over pairs of
                                  # positions from its mean (zero diagonal); None where not carried
    logit_var: float | None = None    # the attention logit variance of the unit that made it


class GradState(NamedTuple):
    """The gradient w.r.t. the stream at one place."""

    log_gvar: float               # natural log of the gradient's variance
    gcorr: float                  # its token correlation
    gen: tuple = (1.0, 1.0)       # its shares along the all-ones vector and along the stream's
                                  # direction, relative to an isotropic gradient
    w: object = None              # causal: its covariance over positions (mean diagonal 1)
    slope: float = 0.0            # slope of its relative per-token mean square on the stream's
                                  # relative per-token variance here (0: independent of it)


class UnitGains(NamedTuple):
    """What the backward pass found for one residual unit, per unit gradient variance at its
    residual split (the backward pass returns it beside the unit's record, which it only
    reads)."""

    log_branch_gain: float        # log of the branch path's gain (b^2 and an input norm included)
    z_gain: float = 1.0           # Post-LN: the norm's backward factor on the sum
    att_along: float | None = None    # Post-LN attention: the share along the stream's direction below it
    g_prof: object = None         # causal: variance profile over positions of the gradient entering the unit
    norm_params: dict | None = None   # the parameters the unit's norm's backward was evaluated with, where
                                  # the gradient state adds some to its op's (Post-LN: g_generic; a pre-norm
                                  # FFN's input norm: g_slope); None where it used its op's own
