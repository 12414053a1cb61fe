"""Your own components: pointwise activations from a function and its derivative, and the
plugin files that register them (docs/extending.md).

    import numpy as np
    import sigprop.extend

    sigprop.extend.elementwise("relu2", lambda x: np.maximum(x, 0) ** 2, lambda x: 2 * np.maximum(x, 0))

registers ``relu2`` as an activation (``--activation relu2``, ``"activation": "relu2"``; the
plain and the gated FFN): its forward and backward moment rules are derived from ``f`` and
``df`` by quadrature (expectations over the Gaussian law of one token and of two tokens with
their correlation, the same iterated form as the SiLU rule), symbolically an unevaluated
integral of the function ``relu2``; its Monte Carlo component applies ``f`` and ``df`` to the
sampled arrays; ``sigprop rules relu2`` lists it.  ``--plugin FILE.py`` (and
``SIGPROP_PLUGINS``) imports such a file before the model is read: the file is your own code,
and it runs (docs/security.md).

The same name is also a norm kind (``--norm relu2``, ``"norm": "relu2"``): f applied entry by
entry in place of each norm of the model, as DyT replaces LayerNorm (:func:`pointwise_norm_entry`;
bidirectional models only).

Not yet: components that are not pointwise (their rules are tied to the predictor's fixed
block; a model graph of components would free them).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import numpy as np

from sigprop import registry
from sigprop.backend import numeric
from sigprop.errors import DomainError, SigpropError

#: the standardised variable's range (the Gaussian weight beyond it: < 1e-22)
Z_MAX = 10.0
#: the fixed panel edges in z (the kinks' are added per configuration)
Z_EDGES = (-Z_MAX, -6.0, -3.0, -1.5, 0.0, 1.5, 3.0, 6.0, Z_MAX)
#: Gauss-Legendre nodes per panel
NODES = 24
_T, _W = np.polynomial.legendre.leggauss(NODES)
_PHI = 1.0 / math.sqrt(2.0 * math.pi)
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")


def expect_panels(f, var, mean=0.0, kinks=(0.0,)):
    """E[f(X)], X ~ N(mean, var), by Gauss-Legendre panels in z = (X - mean)/sd over
    |z| <= Z_MAX (edges ``Z_EDGES``), split further where X crosses each of ``kinks`` (where f or its derivatives may
    jump: exponential convergence needs f smooth on each panel).  The quadrature axes come
    first (panel, node), so calls nest: an inner call's ``mean`` may carry the outer nodes."""
    var = np.asarray(var, dtype=float)
    mean = np.asarray(mean, dtype=float)
    shape = np.broadcast_shapes(var.shape, mean.shape)
    sd = np.sqrt(var)
    edges = [np.full(shape, z) for z in Z_EDGES]
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in kinks:
            zk = np.where(sd > 0, (k - mean) / np.where(sd > 0, sd, 1.0), np.where(k > mean, Z_MAX, -Z_MAX))
            edges.append(np.broadcast_to(np.clip(zk, -Z_MAX, Z_MAX), shape))
    e = np.sort(np.stack(edges), axis=0)
    lo, hi = e[:-1], e[1:]
    extra = (1,) * len(shape)
    half = ((hi - lo) / 2)[:, None]
    z = lo[:, None] + half * (_T.reshape((1, -1) + extra) + 1.0)
    w = half * _W.reshape((1, -1) + extra) * (_PHI * np.exp(-z * z / 2))
    vals = f(z * sd + mean)
    return np.sum(w * vals, axis=(0, 1))


class _Panels:
    """The numeric namespace with the Gaussian expectations of a user's function by panels
    (:func:`expect_panels`): what :func:`sigprop.rules.activation.gaussian_moments` reads."""

    def __init__(self, kinks):
        self.kinks = tuple(kinks)

    def expect_normal_strip(self, f, var, mean=0.0):
        return expect_panels(f, var, mean, self.kinks)


def _elementwise_rule(name: str, title: str, f, df, kinks):
    from sigprop.rules.activation import _ASSUMPTIONS, _HiddenUnit, _backward_from_kernel, _forward_from_cross, \
        gaussian_moments
    from sigprop.rules.base import Rule

    panels = _Panels(kinks)

    def functions(m):
        """(namespace, f, f') for the math namespace ``m``: numeric, the panels and the user's
        NumPy functions; symbolic, sympy's integrals of the undefined function ``name``."""
        if m is numeric:
            return panels, f, df
        import sympy as sp

        F = sp.Function(name)
        return m, (lambda t: F(t)), (lambda t: sp.Derivative(F(t), t))

    class Elementwise(_HiddenUnit, Rule):
        __doc__ = (f"{title}: a pointwise function registered with sigprop.extend.elementwise; its moments are "
                   "Gaussian expectations of f and f' by quadrature (sigprop.extend.expect_panels).")
        params = ()
        assumptions = _ASSUMPTIONS + (
            f"f and f' as given to sigprop.extend.elementwise; expectations by {NODES}-node Gauss-Legendre panels "
            f"over |z| <= {Z_MAX:g} ({len(Z_EDGES) - 1} panels), split at x = {', '.join(f'{k:g}' for k in kinks) or 'nowhere'} (exact to "
            "rounding for f smooth between those points and growing at most polynomially; measured in "
            "tests/test_extend.py and docs/extending.md).",)
        references = ("sigprop.extend (docs/extending.md)",)
        zero_mean_input = True

        def unit_moments(self, var):
            e = lambda g: float(expect_panels(g, var, 0.0, kinks))
            return (e(lambda t: f(t) ** 2), e(lambda t: f(t) ** 4), e(lambda t: df(t) ** 2),
                    e(lambda t: (df(t) * f(t)) ** 2))

        def forward(self, m, x, p):
            ns, fn, _ = functions(m)
            mean, second, cross = gaussian_moments(ns, fn, x.var, x.corr)
            return _forward_from_cross(mean, second - mean**2, cross)

        def backward(self, m, x, g, p):
            ns, _, dfn = functions(m)
            _, k_var, k_cross = gaussian_moments(ns, dfn, x.var, x.corr)
            return _backward_from_kernel(g, k_var, k_cross)

    rule = Elementwise()
    rule.name, rule.title = name, title
    return rule


def _component(name: str, f, df):
    from sigprop.mc.components._util import PointwiseActivation, activation_sweep

    class ElementwiseMC(PointwiseActivation):
        array_api = False

        def forward(self, X, W, params, rng):
            X = np.asarray(X)
            return np.asarray(f(X), dtype=X.dtype), np.asarray(df(X), dtype=X.dtype)

        def flops(self, params, batch):
            L, d, _ = self.dims(params)
            return 10.0 * batch * L * d

    comp = ElementwiseMC()
    comp.name = comp.rule = name
    sweep = activation_sweep(comp, 600_000, {k: None for k in ("x_mean", "x_var", "x_corr", "g_var", "g_corr")})
    return comp, sweep


def _code_digest(*fns) -> str:
    import marshal

    h = hashlib.sha256()
    for fn in fns:
        code = getattr(fn, "__code__", None)
        h.update(marshal.dumps(code) if code is not None else repr(fn).encode())
        for cell in getattr(fn, "__closure__", None) or ():
            h.update(repr(cell.cell_contents).encode())
    return h.hexdigest()


def elementwise(name: str, f, df, *, title: str | None = None, kinks=(0.0,)) -> registry.Activation:
    """Register the pointwise function ``f`` (with derivative ``df``; both map a NumPy array to
    one of the same shape) as the activation ``name`` (lower case, letters, digits and ``_``),
    its gated FFN core ``{name}glu``, and the norm kind ``name`` (f entry by entry in place of
    each norm: :func:`pointwise_norm_entry`).  ``kinks``: the points where f or its derivative is
    not smooth (default 0, where ReLU-like functions bend; () for an analytic f).  Returns the
    registry entry."""
    from sigprop.mc import components as mc
    from sigprop.rules import REGISTRY
    from sigprop.rules.base import register
    from sigprop.rules.glu import GLU

    if not isinstance(name, str) or not _NAME.match(name):
        raise DomainError(f"a component name is 1-32 lower-case letters, digits or _, starting with a letter; "
                          f"got {name!r}")
    glu = f"{name}glu"
    for n in (name, glu):
        if n in REGISTRY or n in mc.COMPONENTS:
            raise DomainError(f"{n!r} is a component's name already")
    if not (callable(f) and callable(df)):
        raise DomainError(f"elementwise {name!r}: f and df must be callables mapping a NumPy array to one of "
                          "its shape")
    kinks = tuple(float(k) for k in kinks)
    probe = np.linspace(-3.0, 3.0, 7)
    for what, fn in (("f", f), ("df", df)):
        try:
            out = np.asarray(fn(probe), dtype=float)
        except Exception as e:  # the user's code: whatever it raises is reported, not propagated
            raise DomainError(f"elementwise {name!r}: {what} failed on an array: {type(e).__name__}: {e}") from None
        if out.shape != probe.shape or not np.all(np.isfinite(out)):
            raise DomainError(f"elementwise {name!r}: {what} must map an array to finite values of its shape, "
                              f"got {out.shape} from {probe.shape}")
    title = title or name
    rule = register(_elementwise_rule(name, title, f, df, kinks))
    gated = type(f"{name.title()}GLU", (GLU,), {"name": glu, "title": f"{title} gated FFN {name}(x W_g) * (x W_u)",
                                                 "activation": name})()
    register(gated)
    comp, sweep = _component(name, f, df)
    mc.register(comp, sweep)
    mc.register(mc.glu_component(glu, name))
    digest = _code_digest(f, df) + repr(kinks)
    registry.register(pointwise_norm_entry(name, title, rule.name, comp.name, digest,
                                           float(np.asarray(f(np.zeros(1)), dtype=float)[0])))
    return registry.register(registry.Activation(
        name, title, rule=rule.name, component=comp.name, torch=None, glu=glu, glu_title=f"{title}-GLU",
        digest=digest))


def _pointwise_branch_output_stats(t, width, d, x, x_kappa, in_norm):
    """A pointwise norm on a branch output F = W h: (1, 1), no kappa and no factor.  Its
    forward and backward are entry by entry (E[f(F)^2], E[f'(F)^2] at F's variance); what this
    leaves out is F's per-token scale fluctuating with |h|^2 (relative variance k_b/width) and
    its covariance with the hidden layer's Jacobian (k_ab/width): terms of order 1/width, which
    a LayerNorm's 1/rms(F) turns into its kappa and factor (rules.layernorm.branch_output_terms)
    and which here enter only through the curvature of E[f^2] and E[f'^2] in the variance."""
    return 1.0, 1.0


def pointwise_norm_entry(name: str, title: str, rule: str, component: str, digest: str = "",
                         f_zero: float = 0.0) -> registry.Norm:
    """The norm kind ``name`` of a pointwise function (``"norm": name``, ``--norm name``): f applied
    entry by entry in place of each norm, as DyT replaces LayerNorm.  Its rule is the activation's
    (no parameters); its Jacobian diag(f'(x)) removes no direction (no generic share); a gradient
    independent of the input keeps its share along the all-ones vector below it, and along the
    input's direction gets E[x^2 f'^2]/(E[x^2] E[f'^2]), which no term reads (shares_below (1, 1));
    it does not divide by the token's scale (no per-token slope); it is no QK-norm.  Measured
    (10^4 draws, d 128, tanh(0.5 x)): the share along 1 below it is 1.00 within 1.3% at input
    variances 0.03, 1 and 4; along the input's direction 0.97, 0.54 and 0.23, as
    E[x^2 f'^2]/(E[x^2] E[f'^2]) gives (0.97, 0.53, 0.23)."""
    return registry.Norm(
        name, title, short=title, tag=name, rule=rule, component=component, torch=None, qk_code=None,
        params=lambda d, eps, tok, g_generic: {}, generic_key=None, generic_share=None, shares_below=(1.0, 1.0),
        slope_key=None, branch_output_stats=_pointwise_branch_output_stats, digest=digest, pointwise=True,
        f_zero=f_zero)


def load_plugins(paths) -> list[str]:
    """Import each plugin file (your own code: it runs) once per process; returns their module
    names.  A path that is not a regular ``.py`` file, or a file that raises, is bad input
    (SigpropError, one line)."""
    import importlib.util
    import stat
    import sys

    names = []
    for p in paths:
        path = os.path.abspath(os.fspath(p))
        try:
            st = os.stat(path)
        except OSError as e:
            raise SigpropError(f"--plugin {p}: {e.strerror or e}") from None
        if not stat.S_ISREG(st.st_mode) or not path.endswith(".py"):
            raise SigpropError(f"--plugin {p}: not a regular .py file")
        mod_name = "sigprop_plugin_" + hashlib.sha256(path.encode()).hexdigest()[:16]
        if mod_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            try:
                spec.loader.exec_module(module)
            except SigpropError as e:
                del sys.modules[mod_name]
                raise SigpropError(f"--plugin {p}: {e}") from None
            except BaseException as e:  # the user's file: anything it raises is one line
                del sys.modules[mod_name]
                if isinstance(e, KeyboardInterrupt):
                    raise
                raise SigpropError(f"--plugin {p}: {type(e).__name__}: {e}") from None
        names.append(mod_name)
    return names


def plugin_paths(args: list[str], environ=os.environ) -> tuple[list[str], list[str]]:
    """(the plugin files named by ``SIGPROP_PLUGINS`` (OS path separator) and by every
    ``--plugin FILE`` / ``--plugin=FILE`` of ``args``, the arguments without those)."""
    paths = [p for p in environ.get("SIGPROP_PLUGINS", "").split(os.pathsep) if p]
    rest, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest += args[i:]
            break
        if a == "--plugin":
            if i + 1 >= len(args):
                raise SigpropError("--plugin needs a file (--plugin FILE.py)")
            paths.append(args[i + 1])
            i += 2
            continue
        if a.startswith("--plugin="):
            paths.append(a[len("--plugin="):])
        else:
            rest.append(a)
        i += 1
    return paths, rest

