"""Shared test helpers."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

# the predictor's table store (sigprop.model.store): one fresh directory per test session,
# never the user's cache (tests of the store itself set their own)
os.environ["SIGPROP_CACHE_DIR"] = tempfile.mkdtemp(prefix="sigprop-test-cache-")


def symbolic_value(rule, x, g, params: dict) -> dict:
    """Evaluate ``rule.symbolic()`` at a point by substitution + evalf (the independent path
    to the numbers: sympy's own arithmetic and special functions, mpmath for integrals)."""
    from sigprop import symbols

    subs = {symbols.symbol("x_std"): math.sqrt(x.var), symbols.symbol("x_corr"): x.corr,
            symbols.symbol("g_std"): math.sqrt(g.var), symbols.symbol("g_corr"): g.corr}
    if not rule.zero_mean_input:
        subs[symbols.symbol("x_mean")] = x.mean
    full = {q.name: q.default for q in rule.params}
    full.update(params)
    for name, value in full.items():
        if name in symbols.SQUARES:
            subs[symbols.symbol(symbols.SQUARES[name])] = math.sqrt(value)
        else:
            subs[symbols.symbol(name)] = value
    out = {}
    for key, expr in rule.symbolic().items():
        v = expr.subs(subs) if hasattr(expr, "subs") else expr
        out[key] = float(v.evalf(30)) if hasattr(v, "evalf") else float(v)
    return out


def numeric_value(rule, x, g, params: dict) -> dict:
    y, gb = rule.evaluate(x, g, **params)
    return {"x_mean": float(y.mean), "x_var": float(y.var), "x_corr": float(y.corr),
            "g_var": float(gb.var), "g_corr": float(gb.corr)}


def finite_difference_check(component, params, x_shape, seed=0, eps=1e-6):
    """<G, J V> (central differences of the forward) vs <backward(G), V>, float64, with the
    component's randomness (weights, dropout masks) frozen by reseeding."""
    rng = np.random.default_rng(seed)
    W = component.sample_weights(rng, params, np.float64)
    X = rng.standard_normal(x_shape)
    V = rng.standard_normal(x_shape)

    def fwd(X_):
        return component.forward(X_, W, params, np.random.default_rng(seed + 1))

    Y, cache = fwd(X)
    G = np.random.default_rng(seed + 2).standard_normal(Y.shape)
    analytic = float(np.sum(component.backward(G, cache) * V))
    numeric = float(np.sum(G * (fwd(X + eps * V)[0] - fwd(X - eps * V)[0])) / (2 * eps))
    return analytic, numeric


def _process_state():
    """What the generated pages and every later test read from the process-wide registries:
    the rules' metadata, the sweeps' grids, the registered components (only when loaded)."""
    import sys

    if "sigprop.rules" not in sys.modules:
        return None
    from sigprop.rules import REGISTRY

    rules = [(n, type(r).__name__, r.title, tuple(r.assumptions), tuple(r.references),
              tuple((p.name, p.describe(), p.doc) for p in r.params)) for n, r in REGISTRY.items()]
    sweeps = None
    if "sigprop.mc.components" in sys.modules:
        C = sys.modules["sigprop.mc.components"]
        sweeps = ([(k, s.component.rule, repr(s.grid), repr(s.variants), tuple(s.moments))
                   for k, s in C.SWEEPS.items()], tuple(C.COMPONENTS))
    store = Path(__file__).resolve().parents[1] / "docs" / "validation"
    stored = tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in store.glob("*.json")))
    return rules, sweeps, stored


@pytest.fixture(autouse=True)
def _leaves_the_process_as_it_found_it(request):
    """A test that registers a rule or component, or edits a sweep's grid, and does not undo it
    changes what later tests in the same worker see (docs/rules.py renders the registries):
    fail the test that did it."""
    before = _process_state()
    yield
    after = _process_state()
    if before is None:
        return
    changed = [b[0] for b, a in zip(before[0], after[0]) if a != b]
    if len(before[0]) != len(after[0]):
        changed.append("the rule list")
    if before[1] is not None and after[1] != before[1]:
        changed.append("the sweeps or components")
    if after[2] != before[2]:
        changed.append("docs/validation/*.json")
    if changed:
        pytest.fail(f"{request.node.nodeid} changed the process-wide registries ({changed}); "
                    "undo registrations in the test (see tests/test_extend.py's scratch_registry)")
