"""sympy implementation of the rule namespace."""

from __future__ import annotations

import itertools

import sympy as sp

NAME = "symbolic"
SYMBOLIC = True

pi = sp.pi
exp = sp.exp
log = sp.log
sqrt = sp.sqrt
acos = sp.acos
asin = sp.asin
atan = sp.atan
tanh = sp.tanh
erf = sp.erf
erfc = sp.erfc
Abs = sp.Abs
oo = sp.oo
Rational = sp.Rational


def log1p(x):
    return sp.log(1 + x)


def expm1(x):
    return sp.exp(x) - 1


def maximum(a, b):
    return sp.Max(a, b)


def Phi(x):  # noqa: N802
    return (1 + sp.erf(x / sp.sqrt(2))) / 2


_counter = itertools.count()
#: integration variable -> (kind, number of nodes) of the primitive that made it, so that
#: :func:`evaluate` can evaluate the integral with the numeric backend's quadrature
_PRIMITIVES: dict = {}


def _dummy(name):
    return sp.Symbol(f"{name}_{{{next(_counter)}}}", real=True)


def expect_normal(f, var, mean=0, n: int = 64):  # noqa: ARG001  (n is numeric-only)
    """E[f(X)], X ~ N(mean, var), as an unevaluated sympy Integral."""
    x = _dummy("x")
    fx = f(x)
    _PRIMITIVES[x] = ("normal", n)
    return sp.Integral(fx * normal_pdf(x, mean, var), (x, -sp.oo, sp.oo))


def normal_pdf(x, mean, var):
    """The N(mean, var) density at x, a named quantity (its definition printed once)."""
    return named("normal_pdf", lambda x, mu, s2: sp.exp(-((x - mu) ** 2) / (2 * s2)) / sp.sqrt(2 * sp.pi * s2),
                 shown=(("x", x, {"real": True}), ("mu", mean, {"real": True}), ("sigma^2", var, {"positive": True})),
                 tex=r"\varphi", text="normal_pdf")


def gamma_pdf(x, mean, relvar):
    """The Gamma density of mean ``mean`` and relative variance ``relvar`` (shape 1/relvar)
    at x, a named quantity (its definition printed once)."""
    def pdf(x, mu, delta):
        k = 1 / delta
        theta = mu * delta
        return x ** (k - 1) * sp.exp(-x / theta) / (sp.gamma(k) * theta**k)

    return named("gamma_pdf", pdf, shown=(("s", x, {"positive": True}), ("m", mean, {"positive": True}),
                                          ("delta", relvar, {"positive": True})),
                 tex=r"g_{\Gamma}", text="gamma_pdf")


def integrate_smoothed(outer, inner, var, args=(), window=None):  # noqa: ARG001 (numeric-only)
    """Integral over the real line of ``outer(u, S, *args)`` with
    ``S[i] = E[e**b_i f_i(u + e)]``, e ~ N(0, var), as unevaluated sympy Integrals (a tuple
    of them where ``outer`` returns a tuple; see the numeric twin; ``sympy.lambdify(expr, modules='mpmath')`` evaluates it to any precision)."""
    u = _dummy("u")
    S = []
    for f, b in inner:
        e = _dummy("e")
        density = sp.exp(-(e**2) / (2 * var)) / sp.sqrt(2 * sp.pi * var)
        S.append(sp.Integral(e**b * f(u + e) * density, (e, -sp.oo, sp.oo)))
    out = outer(u, S, *args)
    if isinstance(out, tuple):
        return tuple(sp.Integral(o, (u, -sp.oo, sp.oo)) for o in out)
    return sp.Integral(out, (u, -sp.oo, sp.oo))


# --- primitives of the attention rule (sigprop.rules.attention) ------------------------
def expect_gamma(f, mean, relvar, n: int = 6):  # noqa: ARG001  (n is numeric-only)
    """E[f(X)], X ~ Gamma(shape 1/relvar, mean ``mean``), as an unevaluated sympy Integral."""
    x = _dummy("s")
    fx = f(x)
    _PRIMITIVES[x] = ("gamma", n)
    return sp.Integral(fx * gamma_pdf(x, mean, relvar), (x, 0, sp.oo))


def sum_over_lengths(f, L):
    """sum_{n=1}^{L} f(n) as an unevaluated sympy Sum."""
    n = sp.Symbol(f"n_{{{next(_counter)}}}", integer=True, positive=True)
    fn = f(n)
    _PRIMITIVES[n] = ("lengths",)
    return sp.Sum(fn, (n, 1, L))


def pair_length_sum(log_phi2, log_phi1, L, k):
    """sum_{n=1}^{L-1} (n)_k exp((n-k) log_phi2) sum_{m=1}^{L-n} exp(m log_phi1), with the
    inner geometric sum in closed form (see the numeric twin)."""
    if not isinstance(k, int):
        return tuple(pair_length_sum(log_phi2, log_phi1, L, kk) for kk in k)
    n = sp.Symbol(f"n_{{{next(_counter)}}}", integer=True, positive=True)
    x = sp.exp(log_phi1)
    geo = x * (1 - x ** (L - n)) / (1 - x)
    return sp.Sum(sp.ff(n, k) * sp.exp((n - k) * log_phi2) * geo, (n, 1, L - 1))


def choose(flag, if0, if1):
    """``if0()`` where flag == 0, ``if1()`` where flag == 1 (a sympy Piecewise)."""
    a, b = if0(), if1()
    if isinstance(a, tuple):
        return tuple(sp.Piecewise((x, sp.Eq(flag, 0)), (y, True)) for x, y in zip(a, b))
    return sp.Piecewise((a, sp.Eq(flag, 0)), (b, True))


def integrate_smoothed2(outer, inner, var, rho, args=(), window=None):  # noqa: ARG001
    """Double integral over (u, w) of ``outer(u, w, S, *args)`` with
    ``S[i] = E[f_i(u + e) g_i(w + e')]``, (e, e') bivariate normal (variances ``var``,
    correlation ``rho``): unevaluated sympy Integrals (see the numeric twin)."""
    u, w = _dummy("u"), _dummy("w")
    S = []
    for f, g in inner:
        e, e2 = _dummy("e"), _dummy("e")
        if f is not None and g is not None:
            dens = sp.exp(-(e**2 - 2 * rho * e * e2 + e2**2) / (2 * var * (1 - rho**2))) / (
                2 * sp.pi * var * sp.sqrt(1 - rho**2))
            S.append(sp.Integral(f(u + e) * g(w + e2) * dens, (e, -sp.oo, sp.oo), (e2, -sp.oo, sp.oo)))
        elif f is not None or g is not None:
            h, x = (f, u) if f is not None else (g, w)
            dens = sp.exp(-(e**2) / (2 * var)) / sp.sqrt(2 * sp.pi * var)
            S.append(sp.Integral(h(x + e) * dens, (e, -sp.oo, sp.oo)))
        else:
            S.append(sp.Integer(1))
    out = outer(u, w, S, *args)
    if isinstance(out, tuple):
        return tuple(sp.Integral(o, (u, -sp.oo, sp.oo), (w, -sp.oo, sp.oo)) for o in out)
    return sp.Integral(out, (u, -sp.oo, sp.oo), (w, -sp.oo, sp.oo))


def expect_normal_strip(f, var, mean=0, strip=None, max_nodes=None):  # noqa: ARG001 (numeric-only)
    """E[f(X)], X ~ N(mean, var), as an unevaluated sympy Integral (the numeric twin picks
    a quadrature suited to f with poles near the real axis; the integral is the same)."""
    return expect_normal(f, var, mean)


# --- named quantities ------------------------------------------------------------------
class Defined(sp.Function):
    """A quantity that a formula names and that is defined once (a "where" entry): an
    applied function whose arguments are the quantity's inputs, whose body is a
    :class:`sympy.Lambda` of formal arguments built by the very function the numeric backend
    evaluates.  The first ``_shown`` arguments are printed (``kbar(n)``); the others (the
    parameters the definition reads, such as the rotary base) are carried so that
    substitution, ``free_symbols`` and differentiation see them, but are not printed.
    ``doit()`` and ``evalf()`` expand the definition; sympy never evaluates it on its own,
    so integrals and sums over it keep their size (a Piecewise inside a definition is not
    folded into every integral that uses the quantity)."""

    _body: sp.Lambda = None
    _numeric = None           # the numeric twin (see ``named``)
    _entry = None             # which entry of the twin's tuple or dict result this is
    _shown: int = 0
    _tex: str = ""
    _text: str = ""

    @classmethod
    def eval(cls, *args):
        return None

    @property
    def shown_args(self):
        return self.args[:self._shown]

    @property
    def hidden_args(self):
        return self.args[self._shown:]

    def definition(self):
        """The body with this instance's arguments substituted."""
        return self._body.expr.xreplace(dict(zip(self._body.variables, self.args)))

    def doit(self, **hints):
        args = [a.doit(**hints) if isinstance(a, sp.Basic) else a for a in self.args]
        body = self._body.expr.xreplace(dict(zip(self._body.variables, args)))
        return body.doit(**hints) if hints.get("deep", True) else body

    def _eval_evalf(self, prec):
        from mpmath.libmp.libmpf import prec_to_dps

        return self.definition().evalf(prec_to_dps(prec))

    def fdiff(self, argindex=1):
        var = self._body.variables[argindex - 1]
        return self._body.expr.diff(var).xreplace(dict(zip(self._body.variables, self.args)))

    def _code(self, printer):
        # code printers (lambdify's numpy, mpmath, math and plain Python) print the definition
        return printer._print(self.definition())

    _lambdacode = _pythoncode = _numpycode = _scipycode = _mpmathcode = _code

    def _latex(self, printer, exp=None):
        tex = self._tex
        if self._shown:
            tex += r"\left(%s\right)" % ", ".join(printer._print(a) for a in self.shown_args)
        return tex if exp is None else r"%s^{%s}" % (tex if not self._shown else r"\left(%s\right)" % tex, exp)

    def _sympystr(self, printer):
        if not self._shown:
            return self._text
        return "%s(%s)" % (self._text, ", ".join(printer._print(a) for a in self.shown_args))

    def _pretty(self, printer):
        from sympy.printing.pretty.stringpict import prettyForm

        name = prettyForm(self._text)       # the name as given (no sub/superscript parsing)
        if not self._shown:
            return name
        args = printer._print_seq(self.shown_args, delimiter=", ")
        return prettyForm(*name.right(prettyForm(*args.parens())))


#: key -> the Defined subclass (one definition per key, built on first use)
_DEFINED: dict = {}


def named(key, fn, shown=(), hidden=(), tex=None, text=None, numeric=None):
    """The quantity ``fn(*shown values, *hidden values)`` as a named applied function.
    ``key`` names its definition, built once from ``fn`` applied to formal arguments (the
    same ``key`` must always mean the same ``fn``).  ``shown`` and ``hidden``: sequences of
    (formal name, value, sympy assumptions) of the printed and the carried arguments.  A
    tuple or dict result gives one named quantity per entry, returned in the same shape.
    ``tex`` / ``text``: the printed name (default ``key``); for a tuple or dict result, a
    sequence or mapping of them, or a callable of the entry's index or name.  ``numeric``:
    the same definition evaluated with the numeric backend (a function of the argument
    values, returning what ``fn`` returns), which :func:`evaluate` calls in its place."""
    values = tuple(sp.sympify(v) for _, v, _ in (*shown, *hidden))
    cls = _DEFINED.get(key)
    if cls is None:
        formals = tuple(sp.Dummy(nm, **(asm or {})) for nm, _, asm in (*shown, *hidden))
        cls = _DEFINED[key] = _make(key, fn(*formals), formals, len(shown), tex, text, numeric)
    if isinstance(cls, dict):
        return {k: c(*values) for k, c in cls.items()}
    if isinstance(cls, tuple):
        return tuple(c(*values) for c in cls)
    return cls(*values)


def _pick(spec, k):
    if callable(spec):
        return spec(k)
    if isinstance(spec, (tuple, list, dict)):
        return spec[k]
    return spec


def _make(key, body, formals, n_shown, tex, text, numeric):
    def one(name, b, t, x, entry=None):
        return type(_class_name(name), (Defined,), {
            "_body": sp.Lambda(formals, sp.sympify(b)), "_shown": n_shown,
            "_tex": t if t is not None else name, "_text": x if x is not None else name,
            "_numeric": staticmethod(numeric) if numeric is not None else None, "_entry": entry})

    if isinstance(body, dict):
        return {k: one(f"{key}.{k}", b, _pick(tex, k), _pick(text, k), k) for k, b in body.items()}
    if isinstance(body, tuple):
        return tuple(one(f"{key}.{i}", b, _pick(tex, i), _pick(text, i), i) for i, b in enumerate(body))
    return one(key, body, tex, text)


def _class_name(key: str) -> str:
    return "Def_" + "".join(ch if ch.isalnum() else "_" for ch in key)


def expand_defined(expr):
    """``expr`` with every named quantity replaced by its definition, recursively (the
    formulas written out in full: large)."""
    memo: dict = {}

    def walk(e):
        if not isinstance(e, sp.Basic) or not e.args:
            return e
        if e in memo:
            return memo[e]
        args = [walk(a) for a in e.args]
        out = e.func(*args) if any(a is not b for a, b in zip(args, e.args)) else e
        if isinstance(out, Defined):
            out = walk(out.definition())
        memo[e] = out
        return out

    return walk(expr)


def display_symbols(cls):
    """Plain symbols standing for the shown formal arguments of a named quantity's class
    (the Dummies' names, with their assumptions)."""
    return tuple(sp.Symbol(v.name, **v.assumptions0) for v in cls._body.variables[:cls._shown])


def where(exprs):
    """The named quantities that ``exprs`` use, directly or through other definitions:
    ``[(lhs, rhs)]`` in define-before-use order, ``lhs`` the quantity applied to display
    symbols for its shown arguments, ``rhs`` its definition in those symbols (the carried
    arguments as the first instance found has them)."""
    order, seen, memo = [], set(), set()

    def walk(e):
        if not isinstance(e, sp.Basic) or not e.args or e in memo:
            return
        memo.add(e)
        for a in e.args:
            walk(a)
        if isinstance(e, Defined) and type(e) not in seen:
            seen.add(type(e))
            cls = type(e)
            shown = display_symbols(cls)
            lhs = cls(*shown, *e.hidden_args)
            rhs = cls._body.expr.xreplace(dict(zip(cls._body.variables, (*shown, *e.hidden_args))))
            walk(rhs)
            order.append((lhs, rhs))

    for e in exprs:
        walk(e)
    return order


# --- numeric evaluation of a symbolic expression -------------------------------------------
def evaluate(expr, values: dict):
    """``expr`` evaluated at ``values`` ({symbol: number}) with the numeric backend: the
    integrals and sums the primitives of this module made by the numeric primitive of the same
    name (the same quadrature nodes), each named quantity by its numeric twin (the same
    definition, numeric backend; its body where it has none), every other node by its NumPy
    counterpart.  So a rule's symbolic expression, evaluated here, must reproduce the rule's
    numeric evaluation to rounding: a check of everything between the named quantities and
    the quadratures (the composition written against the namespace, its branches, the
    naming).  The guards the numeric backend applies and this one omits (floors against 0/0,
    clips) are not reproduced: choose points where they are inactive."""
    import numpy as np

    from sigprop.backend import numeric as nm

    values = {k: np.float64(v) for k, v in values.items()}
    deps_memo: dict = {}
    twin_memo: dict = {}

    def deps(e):
        """The integration variables of this module's primitives free in ``e``."""
        hit = deps_memo.get(e)
        if hit is None:
            if e.is_Symbol:
                hit = frozenset((e,)) if e in _PRIMITIVES or e not in values else frozenset()
            elif isinstance(e, Defined):
                hit = frozenset().union(*(deps(a) for a in e.args))
            else:
                hit = frozenset().union(*(deps(a) for a in e.args)) if e.args else frozenset()
                if isinstance(e, (sp.Integral, sp.Sum)):
                    hit = hit - frozenset(e.variables)
            deps_memo[e] = hit
        return hit

    memo: dict = {}

    def ev(e, env):
        key = (e, tuple(id(env[v]) for v in sorted(deps(e), key=str) if v in env))
        if key in memo:
            return memo[key][0]
        out = _ev(e, env)
        memo[key] = (out, [env.get(v) for v in deps(e)])   # keep the bound arrays alive
        return out

    def _ev(e, env):
        if e.is_Symbol:
            if e in env:
                return env[e]
            if e in values:
                return values[e]
            raise KeyError(f"evaluate: no value for {e}")
        if e.is_Number or e.is_NumberSymbol:
            return np.float64(float(e))
        if e is sp.oo:
            return np.inf
        if isinstance(e, Defined):
            args = [ev(a, env) for a in e.args]
            if e._numeric is None:
                return ev(e._body.expr, {**env, **dict(zip(e._body.variables, args))})
            tkey = (type(e)._numeric, tuple(id(a) for a in args))
            if tkey not in twin_memo:
                twin_memo[tkey] = (e._numeric(*args), args)
            out = twin_memo[tkey][0]
            return out if e._entry is None else out[e._entry]
        if isinstance(e, sp.Piecewise):
            for expr_, cond in e.args:
                c = ev(cond, env)
                if np.ndim(c) == 0:
                    if bool(c):
                        return ev(expr_, env)
                    continue
                raise ValueError("evaluate: a Piecewise condition varies over the nodes")
            raise ValueError("evaluate: no Piecewise branch holds")
        if e is sp.true:
            return True
        if e is sp.false:
            return False
        if isinstance(e, sp.Eq):
            return ev(e.lhs, env) == ev(e.rhs, env)
        if isinstance(e, sp.Ne):
            return ev(e.lhs, env) != ev(e.rhs, env)
        if isinstance(e, (sp.Integral, sp.Sum)):
            (var, *_), = e.limits
            kind, *rest = _PRIMITIVES[var]
            body, pdf = _split_density(e, var, kind)
            # a nested primitive's parameters take the shape of the enclosing nodes (the
            # numeric rule broadcasts them so, ``mean + 0 * v``; sympy drops the ``0 * v``)
            shape = np.broadcast_shapes(*(np.shape(a) for a in env.values()))

            def par(x):
                return np.broadcast_to(ev(x, env), np.broadcast_shapes(shape, np.shape(ev(x, env))))

            if kind == "gamma":
                _, mean, relvar = pdf.args
                return nm.expect_gamma(lambda x: ev(body, {**env, var: x}), par(mean), par(relvar), n=rest[-1])
            if kind == "normal":
                _, mean, var_ = pdf.args
                return nm.expect_normal(lambda x: ev(body, {**env, var: x}), par(var_), par(mean), n=rest[-1])
            if kind == "lengths":
                (_, lo, hi), = e.limits
                if lo != 1:
                    raise ValueError("evaluate: a sum over row lengths starts at 1")
                return nm.sum_over_lengths(lambda x: ev(body, {**env, var: x}), ev(hi, env))
            raise ValueError(f"evaluate: no numeric primitive for {kind}")
        args = [ev(a, env) for a in e.args]
        if isinstance(e, sp.Add):
            out = args[0]
            for a in args[1:]:
                out = out + a
            return out
        if isinstance(e, sp.Mul):
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if isinstance(e, sp.Pow):
            b, x = args
            return 1.0 / b if e.exp == -1 else np.sqrt(b) if e.exp == sp.S.Half else b**x
        fn = _NUMPY.get(type(e).__name__)
        if fn is None:
            raise ValueError(f"evaluate: no numeric counterpart of {type(e).__name__}")
        return fn(*args)

    return ev(sp.sympify(expr), {})


def _split_density(node, var, kind):
    """(integrand without the density, the density factor) of an integral or sum that a
    primitive of this module made (as it stands in the expression, so that an edited
    expression is evaluated as edited)."""
    if kind == "lengths":
        return node.function, None
    pdf_name = {"gamma": "gamma_pdf", "normal": "normal_pdf"}[kind]
    factors = sp.Mul.make_args(node.function)
    pdfs = [f for f in factors if isinstance(f, Defined) and type(f) is _DEFINED[pdf_name] and f.args[0] == var]
    if len(pdfs) != 1:
        raise ValueError(f"evaluate: the {kind} integral over {var} has no single density factor")
    rest = list(factors)
    rest.remove(pdfs[0])
    return sp.Mul(*rest), pdfs[0]


_NUMPY = {
    "exp": lambda x: __import__("numpy").exp(x),
    "log": lambda x: __import__("numpy").log(x),
    "sin": lambda x: __import__("numpy").sin(x),
    "cos": lambda x: __import__("numpy").cos(x),
    "Abs": lambda x: __import__("numpy").abs(x),
    "Max": lambda *a: __import__("functools").reduce(__import__("numpy").maximum, a),
    "Min": lambda *a: __import__("functools").reduce(__import__("numpy").minimum, a),
    "acos": lambda x: __import__("numpy").arccos(x),
    "erf": lambda x: __import__("sigprop.backend.numeric", fromlist=["erf"]).erf(x),
}
