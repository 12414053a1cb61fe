"""Whole-model prediction: compose the component rules sublayer by sublayer.

Semantics are those of the model object (docs/formats.md, "The model object"):

    pre:  x' = a x + b * Dropout_hidden(F(n * LN(x)))
    post: x' = LN(a x + b * Dropout_hidden(F(x)))

Forward: the stream state after every sublayer.  Backward: dLoss/d(stream) from the top
(the model's ``grad`` state) down to the input, using the forward states; the skip and the
branch paths are independent at initialisation (zero-mean branch weights), so their
variances and covariances add.

Log space.  The stream variance can grow without bound (Pre-LN with a skip scale > 1) and the
gradient variance grows or vanishes geometrically in Post-LN stacks, so both are carried as
natural logarithms (``log_var``, ``log_gvar``) with a normalised state beside them.  Every
rule is still called on ordinary numbers: on the bounded branch states directly, and on the
stream through scale-invariant operations (LayerNorm; the residual combination evaluated in
units of the larger of its two inputs).  Nothing overflows, nothing becomes NaN.
"""

from __future__ import annotations

import math
from collections import namedtuple
from typing import NamedTuple

import numpy as np

from sigprop import memo, progress, registry
from sigprop.backend import numeric
from sigprop.model import blocks, logit_law, positions, profile, store, sublayers
from sigprop.errors import DomainError, float_range_failure
from sigprop.model.growth import sci_exp
from sigprop.model.spec import MAX_LAYERS, pointwise_norm, require
from sigprop.model import tables
from sigprop.rules.residual import exp_or_inf as _exp
from sigprop.model.tables import TableCache, _Prescaled
from sigprop.rules import attention, get, layernorm, residual, windows
from sigprop.rules.attention import ROW_LOGIT_VAR_MAX, row_moments
from sigprop.rules.attention import logit_var as attention_logit_var
# the mean row logit variance the attention rule bounds (ROW_LOGIT_VAR_MAX), under the name
# the predictor and its tests use
from sigprop.rules.attention import mean_row_logit_var as row_logit_var
from sigprop.rules.layernorm import combine_token_stats
# e^l1 / (e^l1 + e^l2) and log(e^l1 + e^l2) without overflow
from sigprop.rules.residual import log_add as _log_sum
from sigprop.rules.residual import log_share as _share
from sigprop.model.states import GradState, StreamState, UnitGains
from sigprop.state import Backward, Forward

#: a pre attention branch shared (but for its norm scale) by at least this many layers gets a
#: table over correlation and variance (Predictor._var_ranges); building one costs ~550
#: evaluations of the branch (the timing behind the threshold: docs/benchmarks.md, "Constants
#: chosen by measurement")
VAR_TABLE_AFTER = 128

# the stream is handed to a rule directly while exp(log_var) stays in this range; outside it,
# only scale-invariant uses remain (LayerNorm, whose eps is then negligible) and a stand-in
# state of the same shape is used (see _stand_in)
_LOG_VAR_LIMIT = 600.0


#: the longest causal sequence with rotary positions at which a soft-capped attention is
#: predicted: its capped statistics are integrals per row length (Gemma 2 2B, 26 layers: 2
#: layers at 64 tokens took 10 s, all 26 at 256 tokens more than 5 minutes)
SOFTCAP_ROPE_MAX_LEN = 64

#: the modern-block features (spec.Model.features) the predictor implements
SUPPORTED = frozenset({"norm rmsnorm", "activation silu", "placement peri", "placement output", "block parallel",
                       "ffn_kind glu", "final_norm", "n_kv_heads", "rope", "qk_norm", "sublayers", "attn_softcap",
                       "cross_attention", "window", "local_rope", "ffn_kind moe"})


# (the records are collections.namedtuple subclasses rather than typing.NamedTuple classes:
# typing's class creation turns every field annotation into a ForwardRef; these three classes
# took 0.83 ms to create that way, 0.32 ms this way; a named tuple rather than a __slots__ class
# with a __setattr__ that raises: building one that way cost ~3 us against ~0.3 us)
class Op(namedtuple("Op", ("rule", "params", "x", "table", "row", "repeated", "var_range"),
                    defaults=(None, None, None, False, None))):
    """One rule application in a branch chain, as the forward pass met it (immutable: the
    backward pass evaluates the rule's backward with parameters of its own where the gradient
    state adds some, see :meth:`Predictor._unit_backward`):

    * ``rule``, ``params``: the rule's name and parameters;
    * ``x``: its input state;
    * ``table``, ``row``: an interpolation table of this op alone, if used, and its row at x;
    * ``repeated``: its parameters are shared by at least BUILD_AFTER layers;
    * ``var_range``: causal, the input variances of the layers sharing them."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Op({self.rule!r}, {self.params!r})"


#: the branch fields of a record (BranchRecord's after ``log_b2``; SublayerRecord's last ones
#: but ``gains``)
_BRANCH_FIELDS = ("branch_ops", "chain_table", "chain_x", "out_ops", "out_prof", "out_ratio", "euler_var",
                  "att_rows", "key_w", "slot", "scale_only")
#: their defaults (a record's without those)
_NO_BRANCH = (None, None, None, None, None, 1.0, None, None, None, None, False)


class BranchRecord(namedtuple("BranchRecord", ("layer", "kind", "b", "log_b2") + _BRANCH_FIELDS,
                              defaults=_NO_BRANCH)):
    """What the forward pass recorded about one branch of a residual unit, for the backward
    pass (immutable): the branch fields, which a unit with one branch keeps itself
    (:class:`SublayerRecord`) and a parallel block keeps per branch in its ``parts``.

    * ``layer`` (1-based), ``kind`` ("attention" | "ffn"), ``b`` (its branch scale),
      ``log_b2`` (log b^2; -inf for a zero scale);
    * ``branch_ops``: the branch chain's ops (:class:`Op`), when evaluated rule by rule;
    * ``chain_table``, ``chain_x``: the interpolation table of the whole branch chain, if
      used, and its row (every tabulated quantity) at the branch input;
    * ``out_ops``: the norm on the branch output, if any; ``out_prof``: causal, the branch
      output's profile entering it; ``out_ratio``: its ratio-moment factor on the branch's
      gradient (Predictor._out_norm_stats);
    * ``euler_var``: post ReLU FFN only (else None), the per-element variance of the branch's
      departure from Euler's identity, D = F(x) - J_F x (absolute units; 0 without biases:
      sigprop.rules.activation.relu_ffn_euler_var);
    * ``att_rows``: post attention only (else None), the rule's row statistics (A2, m1) of
      its softmax rows (causal: per row length), for sigprop.rules.attention.euler_terms;
    * ``key_w``: causal attention, the per-key weights (profile.key_weights) of its input's
      position structure;
    * ``slot``: the branch's position in the layer's list of sublayers (``model.slots()``);
      ``scale_only``: the branch is its norm scale alone (blocks.Branch.scale_only)."""

    __slots__ = ()


class SublayerRecord(namedtuple("SublayerRecord",
                                ("layer", "kind", "post", "in_norm", "a", "b", "log_a2", "log_b2", "s_in", "s_sum",
                                 "s_out", "pre_ops", "branch_out", "btok", "ln_prof", "parts")
                                + _BRANCH_FIELDS + ("gains",), defaults=_NO_BRANCH + (None,))):
    """One residual unit (a sublayer, or a parallel block) as the forward pass met it
    (immutable):

    * ``layer``; ``kind``, the trace point's name ("attention" | "ffn" | "block"); ``post``: a
      norm after the residual sum; ``in_norm``: a norm before the branch(es);
    * ``a``, ``b``: the skip and branch scales, ``log_a2``, ``log_b2`` their log squares (-inf
      for a zero scale);
    * ``s_in``, ``s_sum``, ``s_out``: the stream states entering the unit, (post) of the
      residual sum before the norm, and after the unit, all
      :class:`~sigprop.model.states.StreamState` without their position deviation;
    * ``pre_ops``: the unit's norm (before the branch, or post: after the sum);
    * ``branch_out``: the branch output (absolute units, before b); ``btok``: its per-token
      statistics; ``ln_prof``: causal post, the norm's per-position gain profile
      (profile.layernorm_input);
    * ``parts``: a parallel block's branches (:class:`BranchRecord`), whose own branch fields
      then describe their sum (b = 1); else None, and the unit keeps its branch's fields
      (:class:`BranchRecord`'s, in its order) itself;
    * ``gains`` (:class:`~sigprop.model.states.UnitGains`): None on the forward pass's record;
      the records :func:`run` returns are those records with the backward pass's gains
      (:func:`with_gains`).

    The remaining attributes (``x_log_var``, ``out``, ``branch_gain``, ``g_prof``, ...) are
    read-only views of the states and gains."""

    __slots__ = ()

    # read-only views of the states and gains
    x_log_var = property(lambda self: self.s_in.log_var, doc="log variance of the stream entering the unit")
    x = property(lambda self: self.s_in.x, doc="the stream entering the unit, normalised")
    x_prof = property(lambda self: self.s_in.prof, doc="causal: its variance profile over positions")
    out_log_var = property(lambda self: self.s_out.log_var, doc="log variance of the stream after the unit")
    out = property(lambda self: self.s_out.x, doc="the stream after the unit, normalised")
    logit_var = property(lambda self: self.s_out.logit_var, doc="the unit's attention logit variance, or None")
    z_log_var = property(lambda self: (self.s_sum or self.s_out).log_var, doc="log variance of the residual sum")
    z = property(lambda self: (self.s_sum or self.s_out).x, doc="the residual sum, normalised")
    z_prof = property(lambda self: (self.s_sum or self.s_out).prof, doc="causal: the sum's variance profile")
    log_branch_gain = property(lambda self: self.gains.log_branch_gain if self.gains else -math.inf,
                               doc="log of the branch path's backward gain (b^2 and an input norm included)")
    branch_gain = property(lambda self: _exp(self.gains.log_branch_gain) if self.gains else None,
                           doc="the branch path's backward gain")
    z_gain = property(lambda self: self.gains.z_gain if self.gains else 1.0,
                      doc="post: the norm's backward factor on the sum")
    att_along = property(lambda self: self.gains.att_along if self.gains else None,
                         doc="post attention: the share along the stream's direction below it")
    g_prof = property(lambda self: self.gains.g_prof if self.gains else None,
                      doc="causal: variance profile of the gradient entering the unit")

    def __repr__(self) -> str:
        return f"SublayerRecord(layer={self.layer}, kind={self.kind!r}, post={self.post})"


_tuple_new = tuple.__new__
assert UnitGains._fields == ("log_branch_gain", "z_gain", "att_along", "g_prof", "norm_params")


def with_gains(records: list, gains: list) -> list:
    """The records of the forward pass with the backward pass's ``gains`` (one
    :class:`~sigprop.model.states.UnitGains` per record, :meth:`Predictor.backward`): new
    records; the forward pass's are left as they are."""
    return [_tuple_new(SublayerRecord, r[:-1] + (gn,)) for r, gn in zip(records, gains)]


class StreamPoint(NamedTuple):
    """One point of the trace: the stream after a sublayer (or the input), in log variance."""

    layer: int
    sublayer: str
    log_var: float
    mean: float                   # actual mean (may be +-inf only if it truly overflows)
    corr: float
    log_gvar: float = 0.0
    gcorr: float = 0.0
    logit_var: float | None = None

    @property
    def var(self) -> float:
        return _exp(self.log_var)

    @property
    def gvar(self) -> float:
        return _exp(self.log_gvar)


def _kept(s: StreamState) -> StreamState:
    """A stream state without its position deviation (an L x L matrix), as records keep it."""
    return s if s.dev is None else s._replace(dev=None)


def _kept_grad(g: GradState) -> GradState:
    """A gradient state without its covariance over positions (L x L), as ``backward``
    returns it."""
    return g if g.w is None else g._replace(w=None)


def _clip_corr(c: float) -> float:
    return min(1.0, max(-1.0, float(c)))


def _real(log_var: float, x: Forward) -> Forward:
    """The actual state of a normalised stream state, clipped into the representable range
    (a stand-in with the same mean-to-std ratio and correlation outside it)."""
    lv = min(max(log_var, -_LOG_VAR_LIMIT), _LOG_VAR_LIMIT)
    s = math.exp(lv / 2)
    return Forward(x.mean * s, math.exp(lv), x.corr)


def _normalise(y: Forward) -> tuple[float, Forward]:
    v = float(y.var)
    if v <= 0:
        return -math.inf, Forward(0.0, 1.0, float(y.corr))
    return math.log(v), Forward(float(y.mean) / math.sqrt(v), 1.0, float(y.corr))


_RESIDUAL = get("residual")


_EPS0 = memo.Kind("predict.without_eps", 4096, "a norm's parameters with eps 0, per parameter dict (identity)")


def _without_eps(params: dict) -> dict:
    """A norm's parameters with eps 0 (one dict per parameter dict: Rule.fast memoises on
    the identity)."""
    return _EPS0.for_object(params, lambda: {**params, "eps": 0.0})


def _fwd(op: Op) -> Forward:
    """The op's rule forward at its recorded input."""
    return get(op.rule).fast(op.x, None, op.params)[0]


def _bwd(op: Op, g: Backward, params: dict | None = None) -> Backward:
    """The op's rule backward at its recorded input for gradient ``g``: with the op's
    parameters, or ``params`` (the op's with the gradient state's additions, for a norm: see
    Predictor._unit_backward; an op without a table)."""
    if op.table is not None:
        return op.table.backward_of(op.row, g)
    return get(op.rule).fast(op.x, g, op.params if params is None else params, need_forward=False)[1]


class _ResidualParams(NamedTuple):
    a: float
    b: float
    y_mean: float
    y_var: float
    y_corr: float


def _weights(l1: float, l2: float) -> tuple[float, float, float]:
    """(ref, v1, v2) for two terms given as log variances: the larger, and both variances in
    its units (the larger is 1 exactly; 0 for a term of log variance -inf)."""
    if l1 >= l2:
        if l1 == -math.inf:
            return -math.inf, 0.0, 0.0
        return l1, 1.0, (0.0 if l2 == -math.inf else math.exp(l2 - l1))
    return l2, (0.0 if l1 == -math.inf else math.exp(l1 - l2)), 1.0


_NO_SIGNAL = Forward(0.0, 1.0, 0.0)


def _combine(ref: float, v1: float, x1: Forward, w1: float, v2: float, x2: Forward, w2: float):
    """w1 * s1 + w2 * s2 for independent signals s1, s2 given as normalised states, the
    variances of the terms w1 s1 and w2 s2 as (ref, v1, v2) from :func:`_weights` (log var
    w1 s1 = log var s1 + log w1^2), via the residual rule evaluated in units of the larger
    term; returns (log var, normalised)."""
    if ref == -math.inf:
        return -math.inf, _NO_SIGNAL
    # each term's variance w^2 var in units of the larger one (the weights folded in, so that
    # a huge weight on a small signal cannot underflow), the weights' signs as a and b
    m1, m2 = x1.mean, x2.mean
    if m1:
        m1 *= math.sqrt(v1)
    if m2:
        m2 *= math.sqrt(v2)
    x = Forward(m1, v1 if v1 > 0 else 1.0, x1.corr)
    p = _ResidualParams(math.copysign(1.0, w1) if v1 > 0 else 0.0, math.copysign(1.0, w2) if v2 > 0 else 0.0,
                        m2, v2, x2.corr)
    try:
        # the rule's own formulas on plain floats (one of the two terms is 1 in these units,
        # so the variance is positive); Rule.fast's generic path where arithmetic fails
        y = _RESIDUAL.forward(numeric, x, p)
    except (ZeroDivisionError, OverflowError, ValueError):
        y, _ = _RESIDUAL.fast(x, None, p._asdict())
    var = float(y.var)
    if var <= 0:
        return -math.inf, Forward(0.0, 1.0, float(y.corr))
    corr = float(y.corr)
    return ref + math.log(var), Forward(float(y.mean) / math.sqrt(var), 1.0,
                                       1.0 if corr > 1.0 else -1.0 if corr < -1.0 else corr)


def _mix_tokens(tok: tuple[float, float], ref: float, v1: float, v2: float,
                btok: tuple[float, float] = (0.0, 1.0)):
    """Per-token statistics of a x + b y from the stream's (``tok``) and the branch output's
    (``btok``: Gaussian-like, or a norm's output), the variances of a x and b y as
    (ref, v1, v2) from :func:`_weights`."""
    if ref == -math.inf:
        return tok
    return combine_token_stats(v1, tok[0], tok[1], v2, btok[0], btok[1])


def _generic_below(rec: SublayerRecord, gen: tuple[float, float], log_bg: float | None = None,
                   along: float | None = None, norm_below: tuple = (0.0, 0.0)) -> tuple[float, float]:
    """Shares (along 1, along the stream direction) of the gradient handed to the stream
    entering ``rec``, from the gradient's shares above it (``gen``).  Variance shares of the
    two paths: skip a^2, branch branch_gain (relative, per unit gradient at the split;
    ``log_bg``: its logarithm, and ``along``: a Post-LN attention's share along the stream,
    as the backward pass found them; default: the record's ``gains``).

    * post, x' = LN(z), z = a x + b F: the skip part a J^T g is orthogonal to 1 exactly and
      to the LN output y ~ (a x + b F); so x . J^T g = -(b/a) F . J^T g, whose share is
      b^2 v_F / a^2 of the skip part (v_F the branch output variance over the stream's;
      rules.residual.post_norm_skip_share); the branch part F^T(..) is isotropic (1, 1).
      Exception: a branch positively homogeneous of degree 1 (``rec.euler_var`` 0) makes
      x' scale-invariant in x (z(s x) = s z(x), and LN(s z) = LN(z)), so by Euler's theorem
      x . g_x = z . J^T g = 0 exactly (up to O(eps / var z) from the LayerNorm's eps): no
      share along the stream's direction, whatever a and b.
      General position-wise branch: x . g_x = z . J^T g - b (F - J_F x) . J^T g = -b D . g_z
      exactly (g_z = J^T g is orthogonal to z), so the share along x is
      b^2 v_D / (v_x (a^2 + branch gain)), v_D the per-element variance of D = F - J_F x,
      assuming only that g_z is isotropic within the (d-2)-dimensional complement of 1 and z
      (corrections O(1/d)).  The split above is the special case cov(F, J_F x) = 0.  For a
      ReLU FFN (``rec.euler_var``, rules.activation.relu_ffn_euler_var) D is the bias part
      alone (rules.residual.post_norm_euler_share).
      (Measured against the Monte Carlo: docs/validation.md, "The Post-LN gradient's
      shares, measured".)  Attention is not
      position-wise: its share (per token, through the response of every output token to
      scaling one input token) is rules.attention.euler_terms' with
      rules.residual.post_norm_attention (``rec.att_along``).
    * pre, x' = a x + b F(LN x): the skip part keeps the shares from above; the branch part
      left LayerNorm(x) orthogonal to 1 and to x's direction (0, 0) (also with a norm on the
      branch output, and for a parallel block's summed branches).  A norm of the stream
      (``rec.scale_only``, x' = n N(x)): the shares below its norm, ``norm_below`` (the norm
      kind's ``shares_below``, as below the final norm).
    * output, x' = a x + b N(F(x)): the skip part keeps the shares; the branch part is taken as
      isotropic (1, 1), like post's general branch."""
    # the shares from logarithms (a and b may be far outside float range when squared)
    log_a2 = rec.log_a2
    if log_bg is None:
        log_bg, along = rec.gains.log_branch_gain, rec.gains.att_along
    if log_a2 == -math.inf and log_bg == -math.inf:
        return (1.0, 1.0)
    skip = _share(log_a2, log_bg)                      # a^2 / (a^2 + branch gain)
    if rec.post:
        branch = _share(log_bg, log_a2)
        clipped = min(max(rec.s_in.log_var, -_LOG_VAR_LIMIT), _LOG_VAR_LIMIT)
        if along is not None:                           # attention: see _attention_euler
            return (branch, along)
        if rec.euler_var is not None:                   # b^2 v_D / (v_x (a^2 + branch gain))
            return (branch, residual.post_norm_euler_share(log_a2, rec.log_b2, log_bg, clipped, rec.euler_var))
        # the skip part's share along x (b^2 v_F / (a^2 v_x)), the branch part isotropic
        leak = residual.post_norm_skip_share(log_a2, rec.log_b2, clipped, float(rec.branch_out.var))
        return (branch, skip * leak + branch)
    if rec.in_norm:
        if rec.scale_only:
            branch = _share(log_bg, log_a2)
            return (skip * gen[0] + branch * norm_below[0], skip * gen[1] + branch * norm_below[1])
        return (skip * gen[0], skip * gen[1])
    # a norm on the branch output only: the branch part taken as isotropic, as post's
    branch = _share(log_bg, log_a2)
    return (skip * gen[0] + branch, skip * gen[1] + branch)


def _eps_share(log_var: float, eps: float) -> float:
    """v/(v + eps) for a stream of log variance ``log_var`` (clipped to float range)."""
    v = math.exp(min(max(log_var, -_LOG_VAR_LIMIT), _LOG_VAR_LIMIT))
    return v / (v + eps)


def _plain_pre(rec: SublayerRecord) -> bool:
    """A pre-norm unit with one branch and no other norm (after the sum, on the branch
    output): the units through which the per-token gradient slope is carried."""
    return rec.in_norm and not rec.post and rec.parts is None and rec.out_ops is None


def _skip_share(rec: SublayerRecord, plain: bool) -> float:
    """The skip path's share a^2 v_in / v_out of a :func:`_plain_pre` unit's output variance (at
    most 1), the ``skip_share`` of rules.layernorm.token_slope_below; 0 for other units (the
    slope is not carried through them; ``plain``: whether ``rec`` is a plain pre-norm unit)."""
    if not plain:
        return 0.0
    lx = rec.log_a2 + rec.s_in.log_var - rec.s_out.log_var
    return 0.0 if math.isnan(lx) else math.exp(min(0.0, lx))


# attention parameters that do not enter the softmax weights' statistics
_A2_IGNORES = ("v_std", "o_std", "v_bias_std", "o_bias_std", "p")


def _square_table(params: dict, x: Forward, grid=None) -> tables.ThetaTable:
    """attention.row_moments as a function of the input correlation at one input mean and
    variance (one q/k parameter set), a tables.ThetaTable (verified to STATS_TOL of its
    largest value; stored: its build is ~11 evaluations of the rule)."""
    mean, var, lo = float(x.mean), float(x.var), min(0.0, float(x.corr))
    tol = tables.STATS_TOL
    if grid is None:
        key = store.key("a2rows", tuple(sorted(params.items())), mean, var, lo, tol)
        n = None
    else:       # causal, long sequence: at the graded grid's representative row lengths
        key = store.key("a2rows", tuple(sorted(params.items())), mean, var, lo, tol, grid.signature())
        n = grid.n
    return tables.ThetaTable(lambda th: np.ravel(row_moments(params, Forward(mean, var, float(np.cos(th))), n)),
                             mean, var, lo, key, tol)


#: Chebyshev nodes of a position-wise branch's covariance over the range of its input's pair
#: correlations (Predictor._branch_deviation)
_PAIR_NODES = 7
#: the nodes on [-1, 1], and the matrix taking values at them to the coefficients of the
#: interpolating polynomial in the power basis (t^0 .. t^6 of the mapped variable t); the
#: Vandermonde matrix of 7 Chebyshev nodes is well conditioned (~1e2)
_PAIR_T = np.cos(np.pi * (np.arange(_PAIR_NODES) + 0.5) / _PAIR_NODES)
_PAIR_INV = np.linalg.inv(np.vander(_PAIR_T, _PAIR_NODES, increasing=True))

#: how the attention rule's DomainError for a saturated softmax begins
_SATURATED = "attention: row logit variance"


def _repeats(cols, with_norm: bool = True) -> tuple[list, list]:
    """Per layer: the number of layers whose branch parameters (every column of ``cols``; the
    norm scale only ``with_norm``) equal this layer's, and an id of that parameter set."""
    arrays = [cols.placement, cols.norm_scale] if with_norm else [cols.placement]
    arrays += [cols.std[w] for w in sorted(cols.std)] + [cols.bias_std[w] for w in sorted(cols.bias_std)]
    rows = list(zip(*(np.asarray(a, dtype=float).tolist() for a in arrays)))
    ids: dict = {}
    group = [ids.setdefault(r, len(ids)) for r in rows]
    counts = [0] * len(ids)
    for g in group:
        counts[g] += 1
    return [counts[g] for g in group], group


#: measured (sigprop check) on a 6-layer bidirectional Gemma 3 shape (d_model 128, QK-norm, peri norms,
#: five local layers of 15 keys at 64 positions, then a global one): the stream's token correlation
WINDOW_STACK_MEASURED = ("a 6-layer Gemma 3 shape with windows of 15 of 64 keys: correlation 0.696 predicted, 0.664 "
                         "simulated after the second windowed layer, 0.704 against 0.630 at the top")


def _check_windows(model) -> None:
    """Refuse (DomainError) the sliding windows the predictor does not model: a causal window
    shorter than the sequence (the causal position model assumes row i sees keys 0..i), and a
    second bidirectional windowed layer (after a windowed layer the stream's correlation depends
    on the distance between positions; the predictor carries one mean correlation, which the
    next window's rows, seeing only near keys, do not see)."""
    if model.window is None:
        return
    L, causal = model.seq_len, bool(model.causal)
    act = [(l, w) for l, w in enumerate(model.window) if windows.active(L, w, causal)]
    if not act:
        return
    if causal:
        w = min(w for _, w in act)
        raise DomainError(f"causal sliding-window attention (window {w} < seq_len {L}, {len(act)} of "
                          f"{model.n_layers} layers) is not predicted yet: the causal position model assumes row i "
                          f"attends to keys 0..i (--seq-len {w} or less makes every window global)")
    if len(act) > 1:
        (l1, w1), (l2, w2) = act[:2]
        raise DomainError(f"bidirectional sliding-window attention in {len(act)} layers (layers {l1 + 1} and {l2 + 1}: "
                          f"windows {w1} and {w2} of {L} positions) is not predicted: after a windowed layer the "
                          "stream's token correlation depends on the distance between positions, which the predictor "
                          f"carries as one mean ({WINDOW_STACK_MEASURED}); one windowed layer is predicted, and "
                          f"--seq-len {windows.sides(min(w1, w2), False)[0] + 1} or less makes every window global")


def _regroup(group: list, extra) -> tuple[list, list]:
    """:func:`_repeats`'s counts and ids with a further per-layer key ``extra``."""
    ids: dict = {}
    new = [ids.setdefault((g, e), len(ids)) for g, e in zip(group, extra)]
    counts = [0] * len(ids)
    for g in new:
        counts[g] += 1
    return [counts[g] for g in new], new


def _gains(bwd) -> tuple[float, float]:
    """(variance gain, covariance gain) of a backward map linear in the gradient's moments."""
    g0, g1 = bwd(Backward(1.0, 0.0)), bwd(Backward(1.0, 1.0))
    return float(g0.var), float(g1.var * g1.corr - g0.var * g0.corr)


def _gains_at(bwd, g: Backward) -> tuple[float, float, Backward]:
    """:func:`_gains` and the map applied to ``g``, from the same two evaluations: the map is
    linear in the gradient's moments (var, var corr), so its output at ``g`` is the
    combination of its outputs at unit variance and correlations 0 and 1 (the same numbers as
    evaluating it at ``g``, up to rounding; the correlation clipped into [-1, 1] as
    ``Rule.fast`` does)."""
    g0, g1 = bwd(Backward(1.0, 0.0)), bwd(Backward(1.0, 1.0))
    v0, c0 = float(g0.var), float(g0.var * g0.corr)
    v1, c1 = float(g1.var), float(g1.var * g1.corr)
    var = g.var * (v0 + (v1 - v0) * g.corr)
    cov = g.var * (c0 + (c1 - c0) * g.corr)
    corr = 0.0 if var == 0 else min(1.0, max(-1.0, cov / var))
    return v0, float(g1.var * g1.corr - g0.var * g0.corr), Backward(var, corr)


def _exp_rel(lv: float, ref: float) -> float:
    return 0.0 if lv == -math.inf else math.exp(lv - ref)


def _cross_logit_funcs():
    from sigprop.rules import cross_attention

    return cross_attention.mean_row_logit_var, cross_attention.logit_var


class _LogitFuncs(dict):
    """logit rule -> (mean row logit variance, logit variance) where it is not attention's"""

    def get(self, key, default=None):
        if key == "cross_attention":
            return _cross_logit_funcs()
        return default


_LOGIT_FUNCS = _LogitFuncs()


class Predictor:
    """Builds the per-sublayer rule chains of a :class:`sigprop.model.spec.Model`."""

    def __init__(self, model, stop_at_saturation: bool = False, tables: TableCache | None = None):
        require(model, SUPPORTED | pointwise_norm(model), "predict")
        if model.attn_softcap is not None and model.causal and model.rope is not None \
                and model.seq_len > SOFTCAP_ROPE_MAX_LEN:
            raise DomainError(f"soft-capped causal attention with rotary positions is predicted up to "
                              f"{SOFTCAP_ROPE_MAX_LEN} tokens (its capped statistics are integrals per row length: "
                              f"beyond that a prediction takes minutes, yet), got seq_len {model.seq_len}; "
                              f"a shorter sequence (--seq-len {SOFTCAP_ROPE_MAX_LEN})")
        _check_windows(model)
        self.model = model
        self.stop_at_saturation = stop_at_saturation
        self.saturation: tuple[int, str] | None = None
        self._at = 0
        m = model
        self.d = m.d_model
        # the model's norm kind and activation: what the predictor asks of them (sigprop.registry)
        self.norm_kind = registry.norm(m.norm)
        if self.norm_kind.pointwise and m.causal:
            raise DomainError(f"norm {m.norm!r} is a pointwise function: sigprop predicts it in bidirectional models "
                              "only (the causal position model assumes each norm normalises per position)")
        self.activation = registry.activation(m.activation)
        self.width = m.n_heads * m.d_head
        # how many layers share each layer's branch parameters: a chain used by at least
        # BUILD_AFTER layers gets its interpolation table at its first use (the same choice
        # whether the table is built or loaded from the store, so results never depend on it)
        # (per sublayer of the layer's list, model.slots(): by its position there)
        self.repeats, self.groups = {}, {}
        for j, cols in enumerate(m.slots()):
            self.repeats[j], self.groups[j] = _repeats(cols)
            if m.window is not None and cols.kind == "attention":
                # a layer's sliding window (and with it its rotary base) is part of its parameters
                self.repeats[j], self.groups[j] = _regroup(self.groups[j], m.window)
        # what each sublayer's kind declares (sigprop.model.sublayers): the interpreter asks
        # these, not the kind
        self.kinds = [sublayers.get(cols.kind) for cols in m.slots()]
        self._att_slot = next(j for j, cols in enumerate(m.slots()) if cols is m.attention)
        self.var_ranges = self._var_ranges()
        # the interpolation tables of this prediction: a cache per run, so that which layers a
        # table serves never depends on what was predicted before in the same process (built
        # tables come back from the store, bit for bit)
        self._tables = TableCache() if tables is None else tables
        self._chains: dict = {}
        self._handles: dict = {}          # id(chain) -> its handle in the table cache (made when asked for)
        self._rest_handles: dict = {}     # id(chain) -> handle of the chain after its norm scale
        self._op_handles: dict = {}       # id(params) -> (params, handle of a causal attention op alone)
        self._norm_ops: dict = {}
        self._log_sqs: dict = {}
        # causal, long sequences: the graded grid over positions (None: every position)
        with memo.using(self._tables.memos):
            self.grid = positions.grid_for(m.seq_len) if m.causal else None
        # the size of the position arrays and matrices: L, or the grid's number of blocks
        self.npos = self.grid.size if self.grid is not None else m.seq_len
        # an encoder-decoder model's decoder (sigprop.model.encdec): per cross-attention op of the
        # backward pass, (layer, op, log variance of the gradient at its output, its correlation)
        self.cross_grads: list = []
        self._branch_lg = 0.0

    def _var_ranges(self) -> dict:
        """layer (0-based) -> (v_lo, v_hi) for the pre attention sublayers of a model whose
        branch parameters but not their norm scale n are shared by at least
        VAR_TABLE_AFTER layers (LayerNorm Scaling): their branch input, n times a LayerNorm
        output, changes its variance from layer to layer, so one table over the correlation
        and the variance (tables.VarTable) serves them all.  A LayerNorm output's variance is
        s2/(s2 + eps) <= 1 (s2 the stream's per-token variance), so the range is
        [min n^2 / 2, max n^2]: it covers streams down to a variance of about eps; a layer whose
        branch input falls outside is evaluated rule by rule (exact, slower)."""
        m, s = self.model, self.model.attention
        if m.n_layers < VAR_TABLE_AFTER or np.all(s.norm_scale == s.norm_scale[0]):
            return {}
        counts, groups = _repeats(s, with_norm=False)
        place, n2 = s.placement.tolist(), (np.asarray(s.norm_scale) ** 2).tolist()
        members: dict = {}
        for l, g in enumerate(groups):
            if blocks.norm_flags(place[l])[0] and counts[l] >= VAR_TABLE_AFTER:
                members.setdefault(g, []).append(l)
        out = {}
        for layers in members.values():
            scales = {n2[l] for l in layers}
            if len(scales) > 1 and min(scales) > 0:
                rng = (min(scales) * 0.5, max(scales))
                out.update((l, rng) for l in layers)
        return out

    # -- branch chains -------------------------------------------------------------------
    def _norm(self, tok: tuple[float, float], x: Forward | None = None) -> Op:
        """The model's norm as an op at input ``x`` for a stream with per-token statistics
        ``tok`` = (centred, kappa); one parameter dict per distinct ``tok`` (never changed: see
        Rule.fast)."""
        op = self._norm_ops.get(tok)
        if op is None:
            op = self._norm_ops[tok] = blocks.norm_params(self.model, tok)
        if self.norm_kind.pointwise and x is not None and abs(x.mean) > 1e-12 * math.sqrt(x.var):
            raise DomainError(f"the pointwise norm {self.model.norm!r} meets an input of mean {x.mean:.3g} (variance "
                              f"{x.var:.3g}): its rule takes a zero-mean input (an input mean of 0, or an odd f)")
        return _tuple_new(Op, (op[0], op[1], x, None, None, False, None))

    def _log_sq(self, w: float) -> float:
        """log w^2 (-inf for 0), memoised per value."""
        hit = self._log_sqs.get(w)
        if hit is None:
            hit = self._log_sqs[w] = 2 * math.log(abs(w)) if w else -math.inf
        return hit

    # -- passes --------------------------------------------------------------------------
    def forward(self) -> list[SublayerRecord]:
        """The forward pass: one record per sublayer.  With ``stop_at_saturation`` the pass
        ends before the first attention sublayer whose softmax is saturated beyond the
        attention rule's domain (``self.saturation`` = (layer, note)); otherwise that
        sublayer's rule refuses it (DomainError)."""
        records: list[SublayerRecord] = []
        try:
            with memo.using(self._tables.memos):
                self._forward(records)
        except DomainError as e:
            # a saturated softmax met inside the sublayer rather than at its input (e.g. by a
            # table's build at a lower correlation than the stream's): the same edge
            if not (self.stop_at_saturation and str(e).startswith(_SATURATED)):
                raise
            self.saturation = (self._at, f"attention {str(e)[len('attention: '):].split(' (')[0]} at layer {self._at}")
        return records

    def _forward(self, records: list) -> None:
        m = self.model
        lv, x = _normalise(Forward(m.input.mean, m.input.var, m.input.corr))
        # the input: Gaussian per-token statistics; causal: a flat variance profile over
        # positions and no deviation of its correlations from their mean
        s = StreamState(lv, x, blocks.GAUSSIAN_TOKENS, profile.flat(m.seq_len, self.grid) if m.causal else None,
                        np.zeros((self.npos, self.npos)) if m.causal else None)
        kept = self._end = _kept(s)
        cols = blocks.columns(m)
        for l in range(m.n_layers):
            for unit in blocks.layer_units(m, l, cols):
                self._at = l + 1
                got = self._unit(l + 1, unit, s, kept)
                if got is None:
                    return
                rec, s = got
                # the records keep the states without the position deviation (an L x L matrix)
                kept = self._end = rec.s_out
                records.append(rec)
        if m.final_norm:
            self._norm_in_range(s.log_var, m.n_layers, "final norm")

    def _norm_in_range(self, log_var: float, layer: int, where: str) -> None:
        """Refuse (DomainError) a norm whose input variance is below exp(-_LOG_VAR_LIMIT) while
        the norm has an eps: there the stream is handed to the norm rule clipped
        (:func:`_real`), as if the norm were scale-invariant, which holds for a huge variance
        (eps negligible) and fails for a tiny one (eps dominates: an input variance of 1e-300
        was predicted with an input gradient of 2.4e39 where Monte Carlo measures 2.5)."""
        if self.norm_kind.pointwise:
            # not scale-invariant: the stream must reach the rule as it is (no clipping)
            if abs(log_var) > _LOG_VAR_LIMIT:
                raise DomainError(
                    f"the residual stream's variance is {sci_exp(log_var)} at the norm of layer {layer}'s {where}, "
                    f"beyond e^+-{_LOG_VAR_LIMIT:g}, where sigprop does not evaluate the pointwise norm "
                    f"{self.model.norm!r} (not scale-invariant): smaller or larger weight scales")
            return
        if log_var < -_LOG_VAR_LIMIT and self.model.norm_eps > 0:
            raise DomainError(
                f"the residual stream's variance is {sci_exp(log_var)} at the norm of layer {layer}'s "
                f"{where}, below e^-{_LOG_VAR_LIMIT:g} (~{math.exp(-_LOG_VAR_LIMIT):.1e}), where sigprop does not "
                f"evaluate a norm with eps {self.model.norm_eps:g}: a larger input variance or weight scales")

    def _unit(self, layer: int, unit, s: StreamState, kept: StreamState):
        """One residual unit: (its record, the stream state after it) for the stream state
        ``s`` entering it (``kept``: the same without its position deviation, for the record;
        the record's state after the unit has none either); None where the softmax saturates
        (with ``stop_at_saturation``)."""
        m, G = self.model, self.grid
        lv, x, tok, prof, dev = s.log_var, s.x, s.tok, s.prof, s.dev
        one = len(unit.branches) == 1
        br0 = unit.branches[0]
        b = br0.scale if one else 1.0
        a, log_a2, log_b2 = unit.skip, self._log_sq(unit.skip), self._log_sq(b)
        h = _real(lv, x)
        dev_in = dev
        xcov = None         # causal: the stream's covariance over positions (formed once)
        pre_ops = ln_prof = None
        if unit.in_norm:
            self._norm_in_range(lv, layer, unit.label)
            ln = self._norm(tok, h)
            pre_ops = (ln,)
            h = _fwd(ln)
            if dev is not None:
                # per position: the branch input's correlations are K_ij / sqrt(K_ii K_jj)
                xcov = self._cov(x.corr, dev, prof)
                c_in, dev_in = profile.normalised_deviation(xcov, G)
                h = Forward(h.mean, h.var, _clip_corr(h.corr + c_in - x.corr))
        elif dev is not None and float(np.ptp(prof)) > 1e-12:
            # no input norm, a stream whose variance differs over positions (branch-output
            # norms near eps, profile.branch_norm_eps): the branch sees the stream's
            # correlations K_ij / sqrt(K_ii K_jj), the profile apart (_branch: prof_in)
            xcov = self._cov(x.corr, dev, prof)
            c_in, dev_in = profile.normalised_deviation(xcov, G)
            h = Forward(h.mean, h.var, _clip_corr(h.corr + c_in - x.corr))
        if one:
            got = self._branch(br0, unit, h, dev_in, tok, None if unit.in_norm else prof)
            if got is None:
                return None
            branch, y, bcov, logit_var = got
            parts = None
            btok = br0.tokens or (blocks.NORM_TOKENS if br0.out_norm else blocks.GAUSSIAN_TOKENS)
        else:
            parts, outs = [], []
            logit_var = None
            for br in unit.branches:
                got = self._branch(br, unit, h, dev_in, tok, None if unit.in_norm else prof)
                if got is None:
                    return None
                parts.append(_tuple_new(BranchRecord, (layer, br.kind, br.scale, self._log_sq(br.scale)) + got[0]))
                if got[3] is not None:
                    logit_var = got[3]
                outs.append(got[1:])
            parts = tuple(parts)
            y, bcov = self._sum_branches(parts, outs)
            branch = _NO_BRANCH
            btok = blocks.GAUSSIAN_TOKENS
        blv, bx = _normalise(y)
        # log var of a x and of b y, and both in units of the larger
        ref, v1, v2 = _weights(lv + log_a2, blv + log_b2)
        zlv, z = _combine(ref, v1, x, a, v2, bx, b)
        if zlv == -math.inf:
            raise DomainError(
                f"the residual stream vanishes in layer {layer}'s {unit.label} sublayer (skip scale {a:g}, "
                f"and the branch adds {'nothing' if blv == -math.inf else 'nothing at branch scale 0'}): "
                "sigprop follows a stream of positive variance only")
        if prof is not None:
            w1 = _exp_rel(lv + log_a2, zlv)
            w2 = _exp_rel(blv + log_b2, zlv)
            if xcov is None:
                xcov = self._cov(x.corr, dev, prof)
            zcov = profile.mix(w1, xcov, w2, bcov)
            zcov /= float(np.trace(zcov)) / m.seq_len if G is None else G.mean_diag(zcov)
            if unit.post_norm:
                ln_prof = profile.layernorm_input(w1 * prof, tok, w2 * bcov.diagonal(), btok, self.d, G)
            prof = zcov.diagonal().copy()
        tok = _mix_tokens(tok, ref, v1, v2, btok)
        if not unit.post_norm:
            if dev is not None:
                # (zcov is this unit's own matrix, not needed after its deviation)
                _, dev = profile.deviation(zcov, G, inplace=True)
            out = StreamState(zlv, z, tok, prof, dev, logit_var)
            s_sum = None
        else:
            # the norm after the residual sum
            s_sum = StreamState(zlv, z, tok, prof, None, logit_var)
            self._norm_in_range(zlv, layer, unit.label)
            ln = self._norm(tok, _real(zlv, z))
            pre_ops = (ln,)
            lv, x = _normalise(_fwd(ln))
            if prof is not None:
                # per position the norm divides by that position's std
                c_out, dev = profile.normalised_deviation(zcov, G)
                x = Forward(x.mean, x.var, _clip_corr(x.corr + c_out - profile.mean_off(zcov, G)))
                prof = profile.flat(m.seq_len, G)
            out = StreamState(lv, x, blocks.NORM_TOKENS, prof, dev, logit_var)
        # (SublayerRecord's fields in order, the gains None: tuple.__new__ directly, for speed)
        rec = _tuple_new(SublayerRecord, (layer, unit.label, unit.post_norm, unit.in_norm, a, b, log_a2, log_b2, kept,
                                          s_sum, out if out.dev is None else out._replace(dev=None), pre_ops, y, btok,
                                          ln_prof, parts) + branch + (None,))
        return rec, out

    def _branch(self, br, unit, h: Forward, dev_in, tok: tuple, prof_in=None):
        """One branch of a unit at its input ``h`` (after the unit's input norm, before the
        norm scale; ``tok``: the stream's per-token statistics): its record's branch fields
        (:class:`BranchRecord`'s after ``log_b2``, a tuple), the branch output (absolute units, before the branch scale),
        causal its normalised covariance over positions, and its attention's logit variance
        (None without attention); None where the softmax saturates (with
        ``stop_at_saturation``: ``self.saturation`` says where).  ``prof_in``: causal, without an
        input norm, the stream's variance profile over positions (a position-wise branch with an
        output norm then carries it, :meth:`_chain_log_slopes`)."""
        m, G, npos = self.model, self.grid, self.npos
        l, n, slot = br.layer, br.norm_scale, br.slot
        sub = self.kinds[slot]
        euler_var = att_rows = key_w = out_ops = out_prof = None
        out_ratio = 1.0
        # the Post-LN Euler terms (the norm's Jacobian removes the stream's direction): none
        # after a pointwise norm, whose diag(f'(z)) removes no direction
        euler = unit.post_norm and not self.norm_kind.pointwise
        if euler and sub.euler_var is not None:
            euler_var = sub.euler_var(m, m.slots()[slot], l, self.activation)
        chain = self._chain(slot, l, unit.in_norm, n)
        logit_var = None
        if sub.logit_rule is not None:
            # (the chain: the norm scale after an input norm, the logit rule, the hidden dropout)
            k_att = next(i for i, (rule, _) in enumerate(chain) if rule == sub.logit_rule)
            att_params = chain[k_att][1]
            h_att = Forward(h.mean * n, h.var * n * n, h.corr) if unit.in_norm else h
            # (the logit rule's own functions: attention's, or cross-attention's, whose keys are E's)
            lrule = _LOGIT_FUNCS.get(sub.logit_rule) or (row_logit_var, attention_logit_var)
            if self.stop_at_saturation:
                rv = lrule[0](att_params, h_att)
                if not rv <= ROW_LOGIT_VAR_MAX:
                    self.saturation = (l + 1, f"attention row logit variance {rv:.3g} beyond {ROW_LOGIT_VAR_MAX:g} "
                                              f"at layer {l + 1}")
                    return None
            logit_var = lrule[1](att_params, h_att)
        h_in = h
        jac = None
        if euler and sub.post_norm_rows:
            att_rows = self._row_moments(att_params, h, tables.worth_tabulating(chain[k_att:k_att + 1], h,
                                                                                self.repeats[slot][l]))
        h, chain_table, chain_x, ops = self._branch_forward(slot, l, chain, h, dev_in is not None and sub.mixes_tokens)
        bcov = None
        if dev_in is not None and not h.var > 0:
            # a branch that adds nothing (all-zero output weights and biases): no
            # covariance over positions either
            bcov = np.zeros((npos, npos))
        elif dev_in is not None:
            att = next((o for o in ops or () if o.rule == "attention"), None)
            bprof = (profile.attention_forward(att.params, att.x, self._rows(att), G, att.var_range) if att
                     else profile.flat(m.seq_len, G))
            if (att is None and br.out_norm and prof_in is not None and h.var > 0
                    and float(np.ptp(prof_in)) > 1e-12):
                # a position-wise branch on a stream whose variance differs over positions
                # (no input norm): output variance and backward gain at position t are the
                # chain's at the input variance v p_t, power laws in p_t with the chain's log
                # slopes at v (bprof not normalised: the mean over positions enters bv); the
                # gain profile is folded into the output norm's divisor (profile.branch_norm_eps)
                s_f, s_b = self._chain_log_slopes(chain, h_in)
                bprof = prof_in ** s_f
                jac = prof_in ** s_b
            # the branch output's covariance over positions: the rule's (mean, profile)
            # plus the deviation the input's position structure adds
            # (the attention's deviation and key weights both start from the grid's prefix sums)
            pre = G.prefix_sums(dev_in) if att is not None and hasattr(G, "prefix_sums") else None
            bcov = self._branch_deviation(chain_table, chain, att, h_in, dev_in, pre)
            if att is not None:
                key_w = profile.key_weights(att.params, att.x, dev_in, G, pre, l)
            d = bcov.diagonal() + h.var * bprof
            bcov += h.var * h.corr
            if jac is not None:
                # the pair (t, s): the chain's covariance at the pair's correlation, scaled as
                # its two variances (p_t p_s)^(slope/2)
                sq = np.sqrt(bprof)
                bcov *= sq[:, None]
                bcov *= sq[None, :]
            positions.set_diag(bcov, d)
            bv = float(np.trace(bcov)) / m.seq_len if G is None else G.mean_diag(bcov)
            h = Forward(h.mean, bv, _clip_corr(profile.mean_off(bcov, G) / bv))
            bcov /= bv
        if br.out_norm:
            # the norm on the branch output, per position.  Forward: as for a Gaussian-like
            # signal (its output has a fixed norm); backward: with the per-token statistics
            # of the branch's hidden layer (_out_norm_stats)
            kappa, out_ratio = self._out_norm_stats(chain, h_in, unit.in_norm, tok)
            p_drop = chain[-1][1]["p"] if self.norm_kind.pointwise and chain[-1][0] == "dropout" else 0.0
            if p_drop > 0 and h.var > 0 and bcov is None:
                # a pointwise norm after the hidden dropout (_pointwise_after_dropout)
                on, y = self._pointwise_after_dropout(h, p_drop)
                on0 = on
            else:
                on = on0 = self._norm(blocks.GAUSSIAN_TOKENS, h if h.var > 0 else None)
                y = _fwd(on) if h.var > 0 else h
            if kappa != 1.0:
                on = self._norm((0.0, kappa), h)
            out_ops = (on,)
            if bcov is not None and h.var > 0:
                # per position the norm divides by sqrt(Q q_t + eps) (profile.branch_norm_eps):
                # eps in units of the rule's harmonic mean square Q from the rule itself
                y0 = get(on0.rule).fast(h, None, _without_eps(on0.params))[0]
                eps_rel = max(float(y0.var) / float(y.var) - 1.0, 0.0) if y.var > 0 else 0.0
                gain, oprof, out_prof = profile.branch_norm_eps(bcov.diagonal().copy(), eps_rel, jac, G)
                K = profile.normalise(bcov)
                if eps_rel > 0.0:
                    s = np.sqrt(oprof)
                    K *= s[:, None]
                    K *= s[None, :]
                c_out, dev_b = profile.deviation(K, G)
                y = Forward(y.mean, y.var * gain, _clip_corr(y.corr + c_out - profile.mean_off(bcov, G)))
                bcov = self._cov(y.corr, dev_b, oprof if eps_rel > 0.0 else profile.flat(m.seq_len, G))
            h = y
        # the branch fields, in BranchRecord's order (_BRANCH_FIELDS)
        return ((ops, chain_table, chain_x, out_ops, out_prof, out_ratio, euler_var, att_rows, key_w, slot,
                 br.scale_only), h, bcov, logit_var)

    def _pointwise_after_dropout(self, h: Forward, p: float) -> tuple[Op, Forward]:
        """A pointwise norm f on y = m F/(1 - p), the hidden dropout's output (state ``h``; m a
        0/1 mask per entry, independent over tokens, P(m = 1) = 1 - p): entry by entry y is 0 or
        F' = F/(1 - p), a Gaussian of variance v' = h.var/(1 - p) and token correlation
        c' = h.corr/(1 - p), not the Gaussian of y's own variance.  Forward: E f(y) = (1-p) mu + p f0,
        E f(y)^2 = (1-p) E f(F')^2 + p f0^2, E f(y_t) f(y_s) = (1-p)^2 E f(F'_t) f(F'_s) +
        2 p (1-p) f0 mu + p^2 f0^2 (mu = E f(F'), f0 = f(0)); backward: the op's input is F''s
        state, so that the rule's gradient, E f'(F')^2 and E f'(F'_t) f'(F'_s), and then the
        dropout's backward (1/(1-p) on the variance, the covariance kept) give
        E[m^2 f'(F')^2]/(1-p)^2 and E[m_t m_s f'(F'_t) f'(F'_s)]/(1-p)^2.  (The op, y.)"""
        x = Forward(h.mean, h.var / (1 - p), _clip_corr(h.corr / (1 - p)))
        op = self._norm(blocks.GAUSSIAN_TOKENS, x)
        e = _fwd(op)
        f0, q = self.norm_kind.f_zero, 1 - p
        mu, second, cross = float(e.mean), float(e.var) + float(e.mean) ** 2, float(e.var * e.corr) + float(e.mean) ** 2
        mean = q * mu + p * f0
        var = q * second + p * f0 * f0 - mean * mean
        cov = q * q * cross + 2 * p * q * f0 * mu + p * p * f0 * f0 - mean * mean
        return op, Forward(mean, var, _clip_corr(cov / var) if var > 0 else 0.0)

    def _out_norm_stats(self, chain: tuple, h: Forward, in_norm: bool, tok: tuple) -> tuple[float, float]:
        """A norm on the output of branch ``chain`` at input ``h`` (``tok``: the stream's
        per-token statistics; ``in_norm``: a norm before the branch): (its kappa, the factor
        on the gradient variance at the branch input), from the statistics of the branch's
        hidden layer, the input of its output projection (the norm rule's
        ``branch_output_stats``, rules.layernorm.branch_output_terms, for the maths).  The
        hidden layer is found by walking the chain: an attention branch's is its value
        projection (rules.attention.value_token_moments); an FFN's the first activation or GLU
        unit (its rule's token_moments, carried to the branch input through the linear layer
        before it, TokenMoments.through_linear, and through the FFN's inner dropout), whose
        width is the next linear layer's input.  The hidden dropout on F and the attention
        dropout are not modelled here."""
        x, t, width, share = h, None, None, 1.0
        for rule, params in chain:
            r = get(rule)
            if rule == "attention":
                t, width = attention.value_token_moments(params, x)
                break
            if t is None and rule not in ("linear", "residual", "dropout"):
                t = r.token_moments(numeric, x, r.param_values(params))
                if rule in registry.activation_rules():
                    # moments in the pre-activation's variance: carried to the branch input
                    t = t.through_linear(share)
            elif t is None and rule == "linear":
                share *= r.token_moments(numeric, x, r.param_values(params)).beta_b
            elif t is not None and rule == "dropout":
                t = r.token_moments_after(t, r.param_values(params))
            elif t is not None and rule == "linear":
                width = params["d_in"]
                break
            x = r.fast(x, None, params)[0]
        if t is None or width is None:
            return 1.0, 1.0
        return self.norm_kind.branch_output_stats(t, width, self.d, h, tok[1], in_norm)

    def _sum_branches(self, parts: list, outs: list):
        """The sum b_1 y_1 + b_2 y_2 + ... of a parallel block's branch outputs (independent:
        zero-mean weights of their own), in absolute units; causal: its normalised covariance
        over positions."""
        lvs = []
        for part, (y, _, _) in zip(parts, outs):
            v = float(y.var)
            lvs.append(math.log(v) + part.log_b2 if v > 0 and part.log_b2 > -math.inf else -math.inf)
        lv, xs = -math.inf, _NO_SIGNAL
        cov, w_acc = None, None
        for part, (y, bcov, _), l_i in zip(parts, outs, lvs):
            _, yn = _normalise(y)
            if lv == -math.inf:
                lv, xs = l_i, yn
                sgn = math.copysign(1.0, part.b) if part.b else 0.0
                xs = Forward(xs.mean * sgn, 1.0, xs.corr)
                cov = bcov
                continue
            ref, v1, v2 = _weights(lv, l_i)
            tot = v1 + v2
            if bcov is not None and cov is not None and tot > 0:
                cov = profile.mix(v1 / tot, cov, v2 / tot, bcov)
            lv, xs = _combine(ref, v1, xs, 1.0, v2, yn, part.b)
        if cov is not None:
            G = self.grid
            cov = cov / (float(np.trace(cov)) / self.model.seq_len if G is None else G.mean_diag(cov))
        return _real(lv, xs) if lv > -math.inf else Forward(0.0, 0.0, 0.0), cov

    @staticmethod
    def _cov(corr: float, dev: np.ndarray, prof: np.ndarray) -> np.ndarray:
        """The stream's normalised covariance over positions: mean ``corr`` plus ``dev`` off
        the diagonal, the variance profile on it."""
        K = dev + corr
        positions.set_diag(K, prof)
        return K

    def _branch_deviation(self, table, chain: tuple, att: Op | None, h: Forward,
                          dev: np.ndarray, pre=None) -> np.ndarray:
        """Deviation of the branch output's covariance over positions from the mean-field one
        (absolute units, before the branch scale; ``table``: the chain's interpolation table,
        if it has one) for branch input ``h`` whose correlations
        deviate from their mean by ``dev`` (see profile, "forward"); ``pre``: the position grid's
        prefix sums of ``dev`` (attention), where the caller has them."""
        if att is not None:
            p = att.params
            g = attention.value_gain(p) * float(att.x.var)
            return profile.attention_deviation(dev, float(att.x.corr), g, 1.0 - self.model.dropout.hidden, self.grid, pre)
        # position-wise branch: the output covariance of a pair of positions is the chain's
        # covariance C(r) at that pair's input correlation r = corr + dev (wide limit), taken
        # from a polynomial through Chebyshev nodes over the pairs' range (a curved C, such as
        # a gated FFN's, moves the mean over the pairs too: a first-order term in dev did not)
        R = h.corr + dev
        np.minimum(R, 1.0, out=R)                   # (np.clip's values, without its wrapper)
        np.maximum(R, -1.0, out=R)
        lo, hi = float(R.min()), float(R.max())
        lo, hi = min(lo, h.corr), max(hi, h.corr)
        if hi - lo < 2e-3:
            e = 1e-3
            lo, hi = max(-1.0, h.corr - e), min(1.0, h.corr + e)
            slope = (self._chain_cov(table, chain, Forward(h.mean, h.var, hi))
                     - self._chain_cov(table, chain, Forward(h.mean, h.var, lo))) / (hi - lo)
            return slope * dev
        mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
        rows_at = getattr(table, "rows_at", None)
        tr = None if rows_at is None else rows_at((mid + half * _PAIR_T).tolist(), h.var, h.mean)
        if tr is not None:
            # the seven table rows in one product: var * corr = var * (cov / var) (0 where var <= 0)
            vals = np.where(tr[1] > 0, tr[1] * (tr[2] / tr[1]), 0.0 * tr[1])
        else:
            vals = [self._chain_cov(table, chain, Forward(h.mean, h.var, mid + half * t)) for t in _PAIR_T.tolist()]
        # the interpolating polynomial (degree 6 through the 7 nodes) in the power basis of
        # the mapped variable t = (r - mid) / half, within [-1, 1], evaluated in place by
        # Horner's rule (a few passes over the matrix and no temporaries)
        c = (_PAIR_INV @ np.asarray(vals)).tolist()
        R -= mid
        R *= 1.0 / half
        out = np.full_like(R, c[-1])
        for ck in c[-2::-1]:
            out *= R
            out += ck
        t0, p0 = (h.corr - mid) / half, 0.0
        for ck in c[::-1]:
            p0 = p0 * t0 + ck
        out -= p0
        positions.set_diag(out, 0.0)
        return out

    @staticmethod
    def _chain_log_slopes(chain: tuple, h: Forward, step: float = 0.05) -> tuple[float, float]:
        """(d log var_out / d log var_in, d log g_in / d log var_in) of a branch chain at input
        ``h`` (central differences at var e^(+-step), rule by rule, the input mean and
        correlation held; g_in the gradient variance at the chain input for a unit gradient of
        correlation 0 at its output): the exponents of the output variance and backward gain
        of a position whose input variance is p times the mean, first order in log p (exact for
        a homogeneous chain: a gated FFN with small pre-activations has ~2 and ~1)."""
        def at(v):
            x, xs = Forward(h.mean, v, h.corr), []
            for rule, params in chain:
                xs.append(x)
                x = get(rule).fast(x, None, params)[0]
            g = Backward(1.0, 0.0)
            for (rule, params), xi in zip(reversed(chain), reversed(xs)):
                g = get(rule).fast(xi, g, params, need_forward=False)[1]
            return math.log(float(x.var)), math.log(float(g.var))
        hi, lo = at(float(h.var) * math.exp(step)), at(float(h.var) * math.exp(-step))
        return (hi[0] - lo[0]) / (2 * step), (hi[1] - lo[1]) / (2 * step)

    @staticmethod
    def _chain_cov(table, chain: tuple, h: Forward) -> float:
        """Output covariance of a branch chain at input ``h`` (its table ``table`` where it has
        one)."""
        if table is not None:
            y = table.forward_of(table.row(h))
        else:
            y = h
            for rule, params in chain:
                y, _ = get(rule).fast(y, None, params)
        return float(y.var) * float(y.corr)

    def _rows(self, op: Op):
        """Where an attention op's per-row-length terms may be tabulated (profile.rows): this
        prediction's table cache when its parameters repeat, else its untabulated view (direct
        evaluations, memoised for the prediction)."""
        return self._tables if op.repeated or op.var_range is not None else self._tables.untabulated

    def _chain(self, slot: int, l: int, in_norm: bool, n: float):
        """The branch chain of layer ``l``'s sublayer ``slot`` (its position in the layer's list)
        as (rule, params) pairs (blocks.unit_chain), shared by the layers with the same
        parameters (its handle in the table cache is made where a table is asked for: a causal
        attention op and a chain tabulated over the variance never need it)."""
        gid = (slot, self.groups[slot][l])
        hit = self._chains.get(gid)
        if hit is None:
            chain = tuple(blocks.unit_chain(self.model, slot, l, in_norm, n))
            hit = self._chains[gid] = chain
        return hit

    def _branch_forward(self, slot: int, l: int, chain: tuple, h: Forward, split: bool = False):
        """Layer ``l``'s (0-based) branch chain of sublayer ``slot`` at input ``h``: through an
        interpolation table of the whole chain where one is available (see
        sigprop.model.tables), else rule by rule.  ``split``: op by op (a causal model's
        position profile needs the attention op's own input and gradient), the attention op
        through a table of its own where one is available.  Returns (the output, the chain's
        table and its row at ``h``, or None, None; the ops with their inputs (Op), or None
        where the table was used)."""
        uses = self.repeats[slot][l]
        eager = tables.worth_tabulating(chain, h, uses)
        var_range = self.var_ranges.get(l) if slot == self._att_slot else None
        if split or any(rule == "cross_attention" for rule, _ in chain):
            # (cross-attention: op by op, its op's gradient feeds the encoder, sigprop.model.encdec)
            table = None
        elif var_range is not None:
            # the chain after its norm scale (chain[0]), tabulated over the variance too
            rule, params = chain[0]
            rest = self._rest_handles.get(id(chain))
            if rest is None:
                rest = self._rest_handles[id(chain)] = self._tables.handle(chain[1:])
            table = self._tables.get_var(chain[1:], get(rule).fast(h, None, params)[0], *var_range, handle=rest)
            if table is not None:
                table = _Prescaled(table, chain[0])
        else:
            handle = self._handles.get(id(chain))
            if handle is None:
                handle = self._handles[id(chain)] = self._tables.handle(chain)
            table = self._tables.get(chain, h, eager=eager, handle=handle, uses=uses)
        if table is not None:
            row = table.row(h)
            return table.forward_of(row), table, row, None
        ops = []
        for rule, params in chain:
            if split and rule == "attention":
                # causal: the attention op through a table of its own; over the correlation
                # and the variance where the layers sharing it differ in their norm scale
                # (LayerNorm Scaling: the position profile's per-row terms then come from a
                # profile.RowsVarTable over the same range)
                alone = ((rule, params),)
                oh = self._op_handles.get(id(params))
                if oh is None or oh[0] is not params:
                    oh = self._op_handles[id(params)] = (params, self._tables.handle(alone))
                oh = oh[1]
                if var_range is not None:
                    t = self._tables.get_var(alone, h, *var_range, handle=oh)
                else:
                    t = self._tables.get(alone, h, eager=eager, handle=oh, uses=uses)
                if t is not None:
                    row = t.row(h)
                    ops.append(Op(rule, params, h, t, row, eager, var_range))
                    h = t.forward_of(row)
                    continue
                op = Op(rule, params, h, None, None, eager, var_range)
            else:
                op = Op(rule, params, h, None, None, eager)
            ops.append(op)
            h = _fwd(op)
        return h, None, None, tuple(ops)

    def backward(self, records: list[SublayerRecord]) -> tuple[list[GradState], list[UnitGains]]:
        """The backward pass, top down: (the gradient states, the units' gains).  Entry i of
        the first is the gradient state (:class:`~sigprop.model.states.GradState`, without
        its covariance over positions) w.r.t. the stream entering record i; of the second,
        what the backward pass found for record i (:class:`~sigprop.model.states.UnitGains`;
        :func:`with_gains` joins them to the records).  The records are only read.  Sets
        ``self.top_grad``, the gradient state after the last unit."""
        with memo.using(self._tables.memos):
            return self._backward(records)

    def _backward(self, records: list[SublayerRecord]) -> tuple[list[GradState], list[UnitGains]]:
        m = self.model
        gc = m.grad.corr
        # the model's upstream gradient: isotropic (its shares along the all-ones vector and
        # along the stream's own direction are 1, see _generic_below); causal, its covariance
        # over positions has correlation gc off the diagonal (see profile)
        g = GradState(math.log(m.grad.var) if m.grad.var > 0 else -math.inf, gc, (1.0, 1.0),
                      np.eye(self.npos) * (1 - gc) + gc if m.causal else None)
        if m.final_norm:
            g = self._final_norm_backward(self._end, g)
        self.top_grad = _kept_grad(g)
        n = len(records)
        out, gains = [None] * n, [None] * n
        for i in range(n - 1, -1, -1):
            g, gains[i] = self._unit_backward(records[i], g)
            out[i] = g if g.w is None else g._replace(w=None)
        return out, gains

    def _final_norm_backward(self, s: StreamState, g: GradState) -> GradState:
        """Through the model's final norm (at the stream state ``s`` after the last unit): the
        upstream gradient ``g`` is given at its output."""
        G, w = self.grid, g.w
        op = self._norm(s.tok, _real(s.log_var, s.x))
        gb = _bwd(op, Backward(1.0, g.gcorr))
        kw = 1.0
        if w is not None:
            kw, kc, w = profile.layernorm_backward(w, s.prof, *_gains(lambda q: _bwd(op, q)), grid=G)
            gb = Backward(gb.var, gb.corr * kc / kw)
        lg = g.log_gvar + math.log(gb.var * kw) + self._ln_log_adjust(s.log_var) if gb.var > 0 else -math.inf
        # its Jacobian leaves nothing along the stream's direction (LayerNorm: nor along 1);
        # below it a token's gradient scales as 1/(s_t + eps): slope -v/(v + eps)
        slope = -_eps_share(s.log_var, self.model.norm_eps)
        return GradState(lg, gb.corr, self.norm_kind.shares_below, w, slope)

    def _unit_backward(self, rec: SublayerRecord, g: GradState) -> tuple[GradState, UnitGains]:
        """One residual unit, top down: (the gradient state w.r.t. the stream entering
        ``rec``, the unit's gains) from the gradient state after it (``g``).  ``rec`` is only
        read: a norm whose backward reads the gradient state (the share along the directions
        its Jacobian removes, the per-token slope) is evaluated with its op's parameters plus
        those (a new dict, Rule.fast), which the gains keep as ``norm_params``."""
        G = self.grid
        lg, gc, gen, w, slope = g
        log_a2, b, s_in = rec.log_a2, rec.b, rec.s_in
        plain = _plain_pre(rec)
        z_gain = 1.0
        norm_params = None
        if rec.post:
            # through the norm after the residual sum, then split into skip and branch
            zlv = rec.s_sum.log_var
            ln = rec.pre_ops[0]
            nk = self.norm_kind
            lp = norm_params = {**ln.params, nk.generic_key: nk.generic_share(gen)} if nk.generic_key else None
            gb = _bwd(ln, Backward(1.0, gc), lp)
            kw = 1.0
            if w is not None:
                kw, kc, w = profile.layernorm_backward(w, rec.ln_prof, *_gains(lambda q: _bwd(ln, q, lp)), grid=G)
                gb = Backward(gb.var, gb.corr * kc / kw)
            z_gain = gb.var * kw * math.exp(self._ln_log_adjust(zlv))
            lg = lg + math.log(gb.var * kw) + self._ln_log_adjust(zlv)
            gc = gb.corr
        # branch path: b * Out^T Dropout^T F^T (after an input norm: (n N)^T)
        # b^2 enters as a logarithm (lg_branch_extra), the chain sees a unit gradient
        if rec.parts is None:
            self._branch_lg = lg + (rec.log_b2 if b else 0.0)
            gbr, u, ku, kc = self._branch_backward(rec, Backward(1.0 if b else 0.0, gc), w)
            lg_branch_extra = rec.log_b2 if b else 0.0
        else:
            gbr, u, lg_branch_extra = self._parts_backward(rec.parts, gc, w)
            ku = kc = 1.0
        # the slope the unit's input norm sees (rules.layernorm.token_slope_below; it does not
        # depend on the branch's share, known only below)
        skip = _skip_share(rec, plain) if slope else 0.0
        slope_norm = layernorm.token_slope_below(slope, skip, 0.0, 1.0, 0.0)[0]
        if rec.in_norm:
            # (a plain pre-norm unit's norm is its input norm, pre_ops[0])
            op = rec.pre_ops[0]
            if (slope_norm and rec.slot is not None and self.kinds[rec.slot].slope_to_norm
                    and op.rule == self.norm_kind.rule and self.norm_kind.slope_key):
                # a position-wise branch's norm (the FFN's) sees the slope (attention mixes the
                # tokens' gradients: its norm is left at 0)
                norm_params = {**op.params, self.norm_kind.slope_key: slope_norm}
            elif rec.scale_only and self.norm_kind.generic_key:
                # a norm of the stream (its branch a scale): the gradient it receives is the
                # stream's, with its shares along the directions the norm's Jacobian removes
                nk = self.norm_kind
                norm_params = {**op.params, nk.generic_key: nk.generic_share(gen)}
            if w is not None:
                vg, cg, gbr = _gains_at(lambda q: _bwd(op, q, norm_params), gbr)
                k, k2, u = profile.layernorm_backward(u, s_in.prof, vg, cg, grid=G)
                ku, kc = ku * k, kc * k2
            else:
                gbr = _bwd(op, gbr, norm_params)
            lg_branch_extra += self._ln_log_adjust(s_in.log_var)
        if w is not None:
            gbr = Backward(gbr.var * ku, gbr.corr * kc / ku)
        # a zero gradient stays zero whatever the norm's factor (b = 0, or a zero stream)
        log_bg = math.log(gbr.var) + lg_branch_extra if gbr.var > 0 else -math.inf
        along = cross = None
        if rec.att_rows is not None and b and math.isfinite(log_bg):
            along, cross = self._attention_euler(rec, gc, w, relative=True, log_gain=log_bg)
        if w is not None:
            w = profile.mix(_share(log_a2, log_bg), w, _share(log_bg, log_a2), u)
        gen = _generic_below(rec, gen, log_bg, along, self.norm_kind.shares_below)
        # below the unit: the skip part keeps slope_norm, the branch part scales as 1/(s_t + eps)
        slope_in = slope_norm
        if math.isfinite(log_bg) and plain:
            v_in = math.exp(min(max(s_in.log_var, -_LOG_VAR_LIMIT), _LOG_VAR_LIMIT))
            slope_in = layernorm.token_slope_below(slope, skip, _share(log_bg, log_a2), v_in,
                                                   self.model.norm_eps)[1]
        # skip path a, branch path g (relative to exp(lg)); independent: variances add
        ref, v1, v2 = _weights(log_a2, log_bg)
        lsum, gsum = _combine(ref, v1, Forward(0.0, 1.0, gc), rec.a, v2, Forward(0.0, 1.0, gbr.corr), 1.0)
        if rec.euler_var is not None and b and lsum > -math.inf:
            lsum += residual.post_norm_cross_log_factor(
                rec.log_b2, min(max(s_in.log_var, -_LOG_VAR_LIMIT), _LOG_VAR_LIMIT), lsum,
                float(rec.branch_out.var), rec.euler_var, self.d)
        if cross is not None and lsum > -math.inf:
            # per position, in units of the sum a^2 + gain (= exp(lsum); _attention_euler)
            c = max(float(np.mean(cross)) if G is None or w is None else G.mean(cross), -0.5)
            if w is not None:
                dg = (w.diagonal() + cross) / (1.0 + c)
                w = w.copy()
                positions.set_diag(w, np.maximum(dg, 0.0))
            lsum += math.log1p(c)
        gains = _tuple_new(UnitGains, (log_bg, z_gain, along, None if w is None else w.diagonal().copy(), norm_params))
        return GradState(lg + lsum, gsum.corr, gen, w, slope_in), gains

    def _branch_backward(self, rec, g: Backward, w):
        """Through one branch's output norm and rule chain (table or op by op), top down, for
        gradient ``g`` at its output (causal: covariance over positions ``w``): the gradient at
        the branch input, its covariance over positions and the attention's factors (ku, kc)
        on the flat-profile variance and correlation."""
        G = self.grid
        u, ku, kc = w, 1.0, 1.0
        for op in reversed(rec.out_ops or ()):
            if op.x is None or not op.x.var > 0:
                return Backward(0.0, g.corr), u, ku, kc
            if w is None:
                g = _bwd(op, g)
                continue
            # the norm divides position t by its own scale (out_prof's divisor): the variance
            # factor k is carried in ku (and kc, their ratio unchanged), the correlation the
            # divisor adds is folded into g here, additively (the flat-profile reference is the
            # rule's own; an upstream correlation of 0 has no ratio), so that the ops below,
            # the attention's profile relative to the rule at g.corr, see it once: carried as
            # a factor kc it was counted again on top of the attention's output covariance,
            # which already holds it (and was lost where the reference was ~0)
            vg, cg, g = _gains_at(lambda q: _bwd(op, q), g)
            ref = (cg / vg if vg > 0 else 1.0) * profile.mean_off(u, G)
            k, _, u = profile.layernorm_backward(u, rec.out_prof, vg, cg, grid=G)
            g = Backward(g.var, _clip_corr(g.corr + profile.mean_off(u, G) - ref))
            ku, kc = ku * k, kc * k
        if rec.chain_table is not None:
            if w is not None:
                vg, cg, g = _gains_at(lambda q: rec.chain_table.backward_of(rec.chain_x, q), g)
                u = profile.positionwise(u, vg, cg)
            else:
                g = rec.chain_table.backward_of(rec.chain_x, g)
        else:
            for op in reversed(rec.branch_ops):
                if op.rule == "cross_attention":
                    self.cross_grads.append((rec.layer, op, self._branch_lg + math.log(g.var) if g.var > 0
                                             else -math.inf, g.corr))
                if w is not None:
                    if op.rule == "attention":
                        k, k2, u = profile.attention_backward(op.params, op.x, g, u, self._rows(op), G, op.var_range,
                                                              rec.key_w)
                        ku, kc = ku * k, kc * k2
                    else:
                        vg, cg, g = _gains_at(lambda q: _bwd(op, q), g)
                        u = profile.positionwise(u, vg, cg)
                        continue
                g = _bwd(op, g)
        # the output norm's ratio-moment factor (_out_norm_stats; 1 without that norm)
        return Backward(g.var * rec.out_ratio, g.corr), u, ku, kc

    def _parts_backward(self, parts: list, gc: float, w):
        """The branches of a parallel block, each for a unit gradient of correlation ``gc``
        (causal: covariance ``w``) at the block output, summed at their shared input
        (independent weights: variances add): (the sum's state in units of exp(log gain),
        its covariance over positions, log gain including the branch scales)."""
        lt, gt, ut = -math.inf, Backward(1.0, gc), w
        for part in parts:
            g, u, ku, kc = self._branch_backward(part, Backward(1.0 if part.b else 0.0, gc), w)
            if w is not None:
                g = Backward(g.var * ku, g.corr * kc / ku)
            li = math.log(g.var) + part.log_b2 if g.var > 0 and part.b else -math.inf
            if lt == -math.inf:
                lt, gt, ut = li, Backward(1.0, g.corr), u
                continue
            ref, v1, v2 = _weights(lt, li)
            if w is not None and v1 + v2 > 0:
                ut = profile.mix(v1, ut, v2, u)
            lt, s = _combine(ref, v1, Forward(0.0, 1.0, gt.corr), 1.0, v2, Forward(0.0, 1.0, g.corr), 1.0)
            gt = Backward(1.0, s.corr)
        return gt, ut, lt

    def _row_moments(self, params: dict, x: Forward, repeated: bool):
        """The attention rule's row statistics (attention.row_moments) at input ``x``: through
        a table in the input correlation where at least BUILD_AFTER layers share the q/k
        parameters (a Post-LN stream has the same mean and variance at every layer), else
        directly."""
        key = tuple(sorted((k, v) for k, v in params.items() if k not in _A2_IGNORES))
        if repeated:
            t = self._tables.theta("a2rows", key, x, lambda: _square_table(params, x, self.grid))
            if t is not None:
                return self._a2_at(t, params, x.corr)
        return row_moments(params, x, None if self.grid is None else self.grid.n)

    @staticmethod
    def _a2_at(t, params: dict, corr: float):
        v = t.values(corr)
        return v.reshape(2, -1) if params.get("causal") else v

    def _attention_euler(self, rec: SublayerRecord, rg: float, W: np.ndarray | None,
                         relative: bool = False, log_gain: float | None = None):
        """Post-LN attention: (the share along the stream direction of the gradient handed
        below it, the skip-branch cross term per position), both per unit variance of the
        gradient below the norm (token correlation ``rg``; causal: covariance over positions
        ``W``, mean diagonal 1); ``relative``: the cross term in units of a^2 + branch gain;
        ``log_gain``: the log branch gain (default: the record's, after its backward pass).
        The maths: sigprop.rules.attention.euler_terms (the attention's part) and
        sigprop.rules.residual.post_norm_attention (the residual weights, the projection off
        the norm's input); here only the record's quantities are handed over."""
        params = self._chain(rec.slot, rec.layer - 1, False, 1.0)[0][1]
        x = _real(rec.s_in.log_var, rec.s_in.x)
        terms = attention.euler_terms(params, x, rec.att_rows, rg, W, self.grid, self.model.dropout.hidden)
        mean = self.grid.mean if W is not None and self.grid is not None else None
        return residual.post_norm_attention(terms, x, rec.log_a2, rec.log_b2,
                                            rec.log_branch_gain if log_gain is None else log_gain,
                                            float(rec.branch_out.var), self.d, mean, relative)

    @staticmethod
    def _ln_log_adjust(log_var: float) -> float:
        """LayerNorm's backward divides by the input variance: when the stream was clipped into
        the representable range (_real), correct the gradient by the clipped-away factor."""
        clipped = min(max(log_var, -_LOG_VAR_LIMIT), _LOG_VAR_LIMIT)
        return clipped - log_var


def run_top(model, tables: TableCache | None = None):
    """:func:`run`, and the gradient state (``GradState``: log variance, corr, ...) w.r.t. the
    stream after the last sublayer: the model's upstream gradient, or below its final norm."""
    records, grads, gains, _, top = _run(model, False, tables)
    return with_gains(records, gains), grads, top


def run(model, tables: TableCache | None = None) -> tuple[list[SublayerRecord], list]:
    """Forward and backward passes: the per-sublayer records and the gradient states entering
    them (:meth:`Predictor.backward`).  The records hold no reference cycles; the process
    entry (sigprop.__main__) pauses the cyclic collector for the CLI, the library leaves it
    as it is (a 20,000-layer prediction: ~1.4x the time with it running)."""
    records, grads, gains, _, _ = _run(model, False, tables)
    return with_gains(records, gains), grads


def _run(model, stop_at_saturation: bool, tables: TableCache | None = None):
    if model.n_layers > MAX_LAYERS:
        raise DomainError(f"n_layers {model.n_layers} is beyond the {MAX_LAYERS:,} layers sigprop predicts "
                          "(the trace keeps every sublayer's state, ~5 KB of memory per layer)")
    # (a branch that adds nothing evaluates 0/0 for its correlation, which the rules report as
    # 0: NumPy's warnings about it are silenced; so are its overflows, whose inf a later rule
    # meets as a numerical failure, Rule.fast, reported below in one line)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"), progress.task("sigprop: predicting"):
        pr = Predictor(model, stop_at_saturation, tables)
        try:
            records = pr.forward()
            grads, gains = pr.backward(records)
            return records, grads, gains, pr.saturation, pr.top_grad
        except (OverflowError, ZeroDivisionError, np.linalg.LinAlgError) as e:
            # the residual stream and the gradient are carried in log space; the inside of
            # one branch is not, and weight stds or scales near the float64 range take it out
            raise float_range_failure(e) from None


class Points(list):
    """The trace points (a list of :class:`StreamPoint`) and where the prediction stopped:
    ``saturation_layer`` (1-based; None when every sublayer was predicted) and
    ``domain_note``, what left the rules' domain there (None likewise); and
    ``approximation_notes``, one line for each approximation the prediction leaned on beyond
    where it was measured to hold (:func:`approximation_notes`)."""

    saturation_layer: int | None = None
    domain_note: str | None = None
    approximation_notes: tuple = ()


#: the per-key logit offset (profile.KeyWeights.offset) above which a causal attention is
#: noted: its per-key weights and query path come from the rows' sampled logit law
#: (sigprop.model.logit_law: in part from LAW_LO, in full above LAW_OFFSET), or, beyond that
#: law's longest sequence, stay the additive fit's, noted as approximate.  Measured on the
#: validated causal models (tests/model/test_predict_key_offsets.py; docs/validation.md, Block layouts):
#: every one below 1.1 at the floor's sizes (olmo2 1.6 at its own), the `output` placement's
#: 12-layer models 2.7, its 48-layer models ~37
KEY_OFFSET_NOTE = logit_law.LAW_LO


def _key_weights(records):
    """(layer, profile.KeyWeights) of every causal attention with per-key weights among the
    forward records ``records`` (a parallel block's in its parts), in order."""
    return [(rec.layer, kw) for rec in records
            for kw in (rec.key_w,) + tuple(p.key_w for p in (rec.parts or ())) if kw is not None]


def key_offsets(records) -> list[tuple[int, float]]:
    """(layer, per-key logit offset) of every causal attention with per-key weights among the
    forward records ``records`` (a parallel block's in its parts), in order."""
    return [(layer, kw.offset) for layer, kw in _key_weights(records)]


def approximation_notes(records) -> tuple[str, ...]:
    """The notes for the forward records ``records``: the causal attentions whose per-key
    logit offset exceeds KEY_OFFSET_NOTE (their layers, the largest offset and where), one note
    for those whose weights come from the sampled logit law and one for those beyond its
    longest sequence."""
    notes = []
    for law in (True, False):
        hits = [(layer, kw.offset) for layer, kw in _key_weights(records)
                if kw.offset > KEY_OFFSET_NOTE and (kw.query is not None) == law]
        if not hits:
            continue
        layer, top = max(hits, key=lambda h: h[1])
        first, last = hits[0][0], hits[-1][0]
        span = f"layer {first}" if first == last else f"layers {first}-{last}"
        head = (f"{span}: causal attention whose first keys' logits stand apart from the rest (per-key "
                f"logit offset up to {top:.3g}, layer {layer}; above {KEY_OFFSET_NOTE:g}): ")
        if law:
            notes.append(head + "its per-key weights and the query path's share of the stream's position "
                         f"deviation come from the rows' Gaussian logit law, sampled ({logit_law.DRAWS} draws, "
                         f"seed {logit_law.SEED}; sigprop.model.logit_law; in full above offset "
                         f"{logit_law.LAW_OFFSET:g}, weighted with the additive fit's below); " + LAW_MEASURED)
        else:
            notes.append(head + "the position model's per-key weights (an additive fit of the stream's "
                         "position deviation) overstate the first keys there and its query path leaves that "
                         f"deviation out (the sampled logit law that replaces them stops at "
                         f"{logit_law.LAW_MAX} positions); " + FIT_MEASURED)
    return tuple(notes)


#: what the notes of approximation_notes say was measured (docs/validation.md, Block layouts)
LAW_MEASURED = ("on the `output` placement's 48-layer causal models at 128 positions (offsets to ~37) "
                "the gradient was measured within 3.9% (dropout 0.1) and 5.8% (dropout 0) of Monte Carlo "
                "(docs/validation.md, Block layouts)")
FIT_MEASURED = ("with the additive fit the `output` placement's 48-layer causal models at 128 positions "
                "(offsets to ~37) had the gradient within 5.4% (dropout 0.1) and 8% (dropout 0) of Monte "
                "Carlo (docs/validation.md, Block layouts)")


def predict(model, stop_at_saturation: bool = False, tables: TableCache | None = None) -> Points:
    """The trace points: the input point, then one per sublayer.

    An attention sublayer whose softmax is saturated beyond the attention rule's domain (mean
    row logit variance above ``sigprop.rules.attention.ROW_LOGIT_VAR_MAX``) is refused
    (DomainError), unless ``stop_at_saturation``: then the trace ends with the last sublayer
    before it (the input point alone when it is layer 1's), and ``saturation_layer`` and
    ``domain_note`` say where and why.  The backward pass of such a trace starts from the
    model's upstream gradient (``model.grad``) at the output of the last predicted
    sublayer, as for the model cut off there."""
    records, grads, _, sat, top = _run(model, stop_at_saturation, tables)
    pts = Points(_points(model, records, grads, top))
    if sat is not None:
        pts.saturation_layer, pts.domain_note = sat
    pts.approximation_notes = approximation_notes(records) + _pointwise_norm_notes(model)
    return pts


def _pointwise_norm_notes(model) -> tuple[str, ...]:
    """The note for a pointwise norm (sigprop.extend) of the stream (before a branch, after the
    sum, a norm sublayer, the final norm) in a model with hidden dropout: its rule takes the
    stream's entries as Gaussian, which the dropout's masks on the branch outputs added to it
    make a mixture of Gaussians (measured with DyT, docs/extending.md; a norm right after the
    dropout, on a branch output, takes the mixture: Predictor._pointwise_after_dropout)."""
    if not registry.norm(model.norm).pointwise or not model.dropout.hidden > 0:
        return ()
    if not (model.final_norm or any(s.kind == "norm" or any(blocks.norm_flags(int(c))[0] or blocks.norm_flags(int(c))[2]
                                                            for c in s.placement) for s in model.slots())):
        return ()
    return (f"the pointwise norm {model.norm} of the residual stream takes the stream's entries as Gaussian, "
            "which the hidden dropout on the branch outputs makes a mixture of Gaussians: measured with DyT "
            "(Pre-LN, 12 layers, init xavier, d_model 128) against Monte Carlo, the forward variance up to 5.1% "
            "high at hidden dropout 0.1 and 2.2% at 0 (docs/extending.md)",)


def _points(model, records, grads, top=None) -> list[StreamPoint]:
    """The trace points from the records' stream states and the gradient states ``grads``
    (entry i: entering record i); ``top``: the gradient state after the last record (below
    the final norm where the model has one; None: the model's upstream gradient)."""
    m = model
    if top is None:
        top = (math.log(m.grad.var) if m.grad.var > 0 else -math.inf), m.grad.corr
    lv0, x0 = _normalise(Forward(m.input.mean, m.input.var, m.input.corr))
    # the input point: its mean is the model's own (not recomputed from the normalised state)
    pts = [_point(0, "input", StreamState(lv0, x0, blocks.GAUSSIAN_TOKENS), grads[0] if grads else top,
                  m.input.mean)]
    n = len(records)
    for i, rec in enumerate(records):
        # gradient w.r.t. the stream *after* this sublayer = gradient entering the next one
        pts.append(_point(rec.layer, rec.kind, rec.s_out, grads[i + 1] if i + 1 < n else top))
    return pts


def _point(layer: int, name: str, s: StreamState, g, mean: float | None = None) -> StreamPoint:
    """The trace point of stream state ``s`` with gradient state ``g`` (log variance, corr,
    ...) at the same place; ``mean``: the stream's actual mean where it is known exactly."""
    if mean is None:
        mm, lv = s.x.mean, s.log_var   # the mean in stream stds: a zero mean stays 0 (never 0 x inf)
        mean = mm * math.exp(lv / 2) if lv < 1400 \
            else math.copysign(_exp(math.log(abs(mm)) + lv / 2), mm) if mm else 0.0
    return StreamPoint(layer, name, s.log_var, mean, s.x.corr, g[0], g[1], s.logit_var)
