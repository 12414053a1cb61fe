"""Rule infrastructure: parameters with domains, and the Rule base class.

A rule is one component's moment map.  It defines, side by side,

* ``forward(m, x, p) -> Forward``: moments of the component output from those of its input;
* ``backward(m, x, g, p) -> Backward``: moments of dLoss/d(input) from those of
  dLoss/d(output), given the forward input state ``x``;

against a math namespace ``m`` (:mod:`sigprop.backend`).  Written once, a rule evaluates
numerically (:meth:`Rule.evaluate`, floats or broadcast NumPy arrays, with domain checks)
or symbolically (:meth:`Rule.symbolic`, sympy expressions in the symbols of
:mod:`sigprop.symbols`).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from sigprop import memo, symbols
from sigprop.backend import numeric
from sigprop.errors import DomainError
from sigprop.state import Backward, Forward


class Param(NamedTuple):
    """A rule parameter.  ``lo``/``hi`` bound it (``open_*`` excludes the bound)."""

    name: str
    doc: str
    default: Any = None
    lo: float = -math.inf
    hi: float = math.inf
    open_lo: bool = False
    open_hi: bool = False
    integer: bool = False
    #: types taken as they are (an opaque, hashable value that checks itself, such as the
    #: attention rule's sigprop.rope.RopeFreqs)
    accepts: tuple = ()

    def check(self, value) -> None:
        if self.accepts and isinstance(value, self.accepts):
            return
        if isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, bool):
            # scalar fast path (the whole-model predictor calls rules on scalars)
            f = float(value)
            if not math.isfinite(f):
                raise DomainError(f"{self.name} must be finite, got {value!r}")
            if ((f <= self.lo) if self.open_lo else (f < self.lo)) or ((f >= self.hi) if self.open_hi else (f > self.hi)):
                self._range_error(value)
            if self.integer and f != round(f):
                raise DomainError(f"{self.name} must be an integer, got {_show(value)}")
            return
        v = np.asarray(value, dtype=float)
        if not np.all(np.isfinite(v)):
            raise DomainError(f"{self.name} must be finite, got {value!r}")
        bad_lo = (v <= self.lo) if self.open_lo else (v < self.lo)
        bad_hi = (v >= self.hi) if self.open_hi else (v > self.hi)
        if np.any(bad_lo) or np.any(bad_hi):
            self._range_error(value)
        if self.integer and np.any(v != np.round(v)):
            raise DomainError(f"{self.name} must be an integer, got {_show(value)}")

    def _range_error(self, value):
        lb = "(" if self.open_lo else "["
        rb = ")" if self.open_hi else "]"
        raise DomainError(f"{self.name} must lie in {lb}{self.lo:g}, {self.hi:g}{rb}, got {_show(value)}")

    def describe(self) -> str:
        lb = "(" if self.open_lo else "["
        rb = ")" if self.open_hi else "]"
        kind = "integer " if self.integer else ""
        return f"{kind}{lb}{self.lo:g}, {self.hi:g}{rb}"


def _show(value) -> str:
    v = np.asarray(value)
    if v.ndim == 0:
        return f"{float(v):g}"
    return f"array with values in [{v.min():g}, {v.max():g}]"


def positive_int(name: str, doc: str, default=None) -> Param:
    return Param(name, doc, default, lo=1, integer=True)


def std(name: str, doc: str, default=None) -> Param:
    return Param(name, doc, default, lo=0.0)


def probability(name: str, doc: str, default=0.0) -> Param:
    return Param(name, doc, default, lo=0.0, hi=1.0, open_hi=True)


STATE_PARAMS = {
    "x_mean": Param("x_mean", "input mean"),
    # a zero variance (a branch whose weights are all 0) is a state like any other: the rules
    # give its image, and its correlation is reported as 0 (_corr_where_defined)
    "x_var": Param("x_var", "input variance", lo=0.0),
    "x_corr": Param("x_corr", "input token correlation", lo=-1.0, hi=1.0),
    "g_var": Param("g_var", "variance of the gradient at the output", lo=0.0),
    "g_corr": Param("g_corr", "token correlation of the gradient at the output", lo=-1.0, hi=1.0),
}


class Rule:
    """Base class; subclasses set the class attributes and implement forward/backward."""

    _fast_defaults: dict | None = None    # see fast(): every parameter's default, per rule
    #: see fast(): the parameter namespaces by the identity of their dicts, per rule (a map of
    #: the rule's own: a lookup through sigprop.memo's kinds cost ~5% of a bidirectional
    #: 768-layer prediction, 3,000 calls)
    _fast_memo: memo.Bounded | None = None

    name: str = ""
    title: str = ""
    params: tuple[Param, ...] = ()
    #: assumptions and approximations, each with its range of validity
    assumptions: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    #: the forward input mean must be 0 (checked numerically)
    zero_mean_input: bool = False

    def __repr__(self) -> str:
        return f"<rule {self.name}>"

    # -- to be implemented by each rule ---------------------------------------------------
    def forward(self, m, x: Forward, p) -> Forward:  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, m, x: Forward, g: Backward, p) -> Backward:  # pragma: no cover
        raise NotImplementedError

    # -- numeric --------------------------------------------------------------------------
    def param_values(self, values: dict) -> SimpleNamespace:
        """Validated parameters (defaults filled in).  Scalar parameter sets are memoised:
        the whole-model predictor applies the same few parameter sets thousands of times."""
        try:
            key = tuple(sorted(values.items()))
            hash(key)
        except TypeError:           # arrays: not memoised
            return self._param_values(values)
        memo = self.__dict__.setdefault("_param_memo", {})
        p = memo.get(key)
        if p is None:
            if len(memo) > 1024:
                memo.clear()
            p = memo[key] = self._param_values(values)
        return p

    def _param_values(self, values: dict) -> SimpleNamespace:
        known = {q.name for q in self.params}
        unknown = set(values) - known
        if unknown:
            raise DomainError(f"{self.name}: unknown parameter(s) {', '.join(sorted(unknown))}")
        out = {}
        for q in self.params:
            v = values.get(q.name, q.default)
            if v is None:
                raise DomainError(f"{self.name}: parameter {q.name} is required")
            try:
                q.check(v)
            except DomainError as e:
                raise DomainError(f"{self.name}: {e}") from None
            out[q.name] = v if np.ndim(v) == 0 else np.asarray(v, dtype=float)
        self.check_params(out)
        return SimpleNamespace(**out)

    def check_params(self, values: dict) -> None:
        """Cross-parameter domain checks (override where needed)."""

    def check_state(self, x: Forward, g: Backward | None) -> None:
        STATE_PARAMS["x_mean"].check(x.mean)
        STATE_PARAMS["x_var"].check(x.var)
        STATE_PARAMS["x_corr"].check(x.corr)
        if g is not None:
            STATE_PARAMS["g_var"].check(g.var)
            STATE_PARAMS["g_corr"].check(g.corr)
        if self.zero_mean_input:
            mean = np.asarray(x.mean, dtype=float)
            if np.any(np.abs(mean) > 1e-12 * np.sqrt(np.asarray(x.var, dtype=float))):
                raise DomainError(f"{self.name}: the rule assumes a zero-mean input, got mean {_show(x.mean)}")

    def evaluate(self, x: Forward, g: Backward | None = None, **params):
        """Numeric forward (and backward, if ``g`` is given) with domain checks.

        Returns ``(Forward, Backward | None)``; arrays broadcast across all inputs.
        """
        vals = (x.mean, x.var, x.corr) if g is None else (x.mean, x.var, x.corr, g.var, g.corr)
        if all(type(v) in _SCALARS for v in vals):
            # scalar fast path (the whole-model predictor): same checks and formulas
            x = Forward(np.float64(x.mean), np.float64(x.var), np.float64(x.corr))
            if g is not None:
                g = Backward(np.float64(g.var), np.float64(g.corr))
        else:
            x = Forward(*(np.asarray(v, dtype=float) if np.ndim(v) else np.float64(v) for v in
                          (x.mean, x.var, x.corr)))
            if g is not None:
                g = Backward(*(np.asarray(v, dtype=float) if np.ndim(v) else np.float64(v) for v in (g.var, g.corr)))
        self.check_state(x, g)
        p = self.param_values(params)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            y = self.forward(numeric, x, p)
            gb = None if g is None else self.backward(numeric, x, g, p)
        y = Forward(y.mean, y.var, _corr_where_defined(y.corr, y.var))
        if gb is not None:
            gb = Backward(gb.var, _corr_where_defined(gb.corr, gb.var))
        return y, gb

    def _namespace(self, params: dict) -> SimpleNamespace:
        """Every parameter's default, overridden by ``params``, as a namespace."""
        defaults = self._fast_defaults
        if defaults is None:
            defaults = self._fast_defaults = {q.name: q.default for q in self.params}
        p = SimpleNamespace(**defaults)
        p.__dict__.update(params)
        return p

    def fast(self, x: Forward, g: Backward | None, params: dict, need_forward: bool = True):
        """:meth:`evaluate` without the domain checks, on plain Python floats: for an internal
        caller (the whole-model predictor) whose states come out of rules and whose
        parameters were validated with the model.  Same formulas (``forward``/``backward``
        with the numeric namespace); where float arithmetic raises (a division by zero, an
        overflow) it defers to :meth:`evaluate`, whose NumPy scalars give inf/0 instead.
        ``need_forward=False`` (with ``g``) skips the forward output (returned as None).

        The parameter namespace is memoised on the identity of ``params``: a caller must not
        change a dict after passing it here (the predictor makes a new dict instead)."""
        fm = self._fast_memo
        if fm is None:
            fm = self._fast_memo = memo.Bounded(4096)
        hit = fm.data.get(id(params))
        if hit is not None and hit[0] is params:
            p = hit[1]
        else:                                   # (the entry keeps params: its id stays unique)
            p = fm.put(id(params), (params, self._namespace(params)))[1]
        try:
            y = self.forward(numeric, x, p) if need_forward or g is None else None
            gb = None if g is None else self.backward(numeric, x, g, p)
        except (ZeroDivisionError, OverflowError, ValueError):
            # (an input state that is not finite came out of an earlier rule whose moments
            # left the float64 range: a numerical failure, not a bad input of this rule)
            if not all(map(math.isfinite, (*x, *(g or ())))):
                raise OverflowError(f"the {self.name} rule's input moments are not finite "
                                    f"(x = {tuple(x)}, g = {None if g is None else tuple(g)})") from None
            y, gb = self.evaluate(x, g, **params)
        # plain floats out (a rule may compute in NumPy scalars)
        if y is not None:
            var, corr = float(y.var), float(y.corr)
            y = Forward(float(y.mean), var, 0.0 if var == 0 else (1.0 if corr > 1.0 else -1.0 if corr < -1.0 else corr))
        if gb is not None:
            var, corr = float(gb.var), float(gb.corr)
            gb = Backward(var, 0.0 if var == 0 else (1.0 if corr > 1.0 else -1.0 if corr < -1.0 else corr))
        return y, gb

    # -- symbolic -------------------------------------------------------------------------
    def symbolic_inputs(self):
        x = Forward(symbols.symbol("x_mean"), symbols.symbol("x_var"), symbols.symbol("x_corr"))
        if self.zero_mean_input:
            x = Forward(0, x.var, x.corr)
        g = Backward(symbols.symbol("g_var"), symbols.symbol("g_corr"))
        p = SimpleNamespace(**{q.name: symbols.symbol(q.name) for q in self.params})
        return x, g, p

    def symbolic(self) -> dict:
        """sympy expressions: keys x_mean, x_var, x_corr, g_var, g_corr (outputs)."""
        import sigprop.backend.symbolic as sm

        x, g, p = self.symbolic_inputs()
        y = self.forward(sm, x, p)
        gb = self.backward(sm, x, g, p)
        return {"x_mean": y.mean, "x_var": y.var, "x_corr": y.corr,
                "g_var": gb.var, "g_corr": gb.corr}


_SCALARS = (float, int, np.float64, np.float32, np.int64)


class TokenMoments(NamedTuple):
    """Per-token statistics of one hidden unit h_k of a layer (a branch's hidden layer, the
    input of its output projection), for one token: with B = h_k^2 and A = |dh_k/dx|^2 the
    squared norm of the unit's gradient with respect to the layer input x,

    * k_b = E[B^2]/E[B]^2 - 1 (relative variance of B),
    * k_ab = E[A B]/(E[A] E[B]) - 1 (relative covariance of A and B),
    * beta_b, beta_a: d log E[B]/d log Q and d log E[A]/d log Q, Q the input's mean square
      (how a fluctuation of the token's input norm moves them);
    * b_over_a = E[B]/(Q E[A]): with it the share of the layer's Jacobian energy along the
      input's own direction, |J x|^2/(|x|^2 |J|^2), is beta_b^2 b_over_a/d_in (first order,
      from x.grad h = d h/d log|x|: E[h x.grad h] = E[B] beta_b).

    Over a layer of w iid units the relative variance of |h|^2 is k_b/w and the relative
    covariance of |J|^2 and |h|^2 is k_ab/w (terms of relative order 1/d_in, from the
    correlation of a unit's weight norm with its pre-activation, neglected)."""

    k_b: float
    k_ab: float
    beta_b: float
    beta_a: float
    b_over_a: float

    def through_linear(self, share: float) -> "TokenMoments":
        """The same unit's statistics with the input taken one linear layer further down
        (h = act(W u): moments given in the pre-activation's mean square, carried to u's):
        the pre-activation's mean square moves with u's by ``share``, the linear rule's
        beta_b (its weight share of the variance), so the log slopes scale by ``share`` and
        b_over_a divides by it (0 for a zero share)."""
        return self._replace(beta_b=self.beta_b * share, beta_a=self.beta_a * share,
                             b_over_a=self.b_over_a / share if share > 0 else 0.0)



def _corr_where_defined(corr, var):
    """A signal with zero variance (all-zero weights, a zero gradient) has no correlation;
    sigprop reports 0 there rather than NaN.  A correlation is clipped into [-1, 1] (rounding
    in a rule evaluated at |r| -> 1 can leave it a few ulps outside)."""
    if type(var) in _SCALARS and type(corr) in _SCALARS:
        if var == 0:
            return np.float64(0.0)
        return np.float64(1.0 if corr > 1.0 else -1.0 if corr < -1.0 else corr)   # NaN stays NaN
    corr = np.where(np.asarray(var) == 0, 0.0, np.clip(corr, -1.0, 1.0))
    return corr if corr.ndim else corr[()]


REGISTRY: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    if rule.name in REGISTRY:
        raise ValueError(f"rule {rule.name!r} registered twice")
    REGISTRY[rule.name] = rule
    return rule
