"""Solve for the initialisation and residual scaling that conserve the moments
(``sigprop solve-init``; docs/solve-init.md).

Library entry points:

* :func:`solve` -- one call for every target: ``solve("unit-variance", arch="preln",
  n_layers=192, beta_k=0.96)``, ``solve("unit-forward", ...)``, ``solve("logit-var",
  value=1.0, arch=..., init=...)``, ``solve("max-depth", max_ratio=10.0, arch=..., init=...)``;
  ``solve("unit-forward", model=M)`` for a resolved model object M (any layout of the block
  description: pre, post, peri, output, parallel; LayerNorm or RMSNorm; plain or gated FFN);
  returns a :class:`~sigprop.solve.solver.Solution` (or a
  :class:`~sigprop.solve.depth.DepthResult`) with ``.model`` (a
  :class:`sigprop.model.spec.Model`, model JSON via ``.model.to_json()``), ``.feasible``
  and ``.reason``.
* :func:`steps` -- the derivation as data: a list of :class:`~sigprop.solve.explain.Step`
  (``.text``, ``.expr`` a sympy expression or equation or None; ``.as_tuple()``), for text or
  LaTeX rendering (``sympy.latex(step.expr)``).

The equations are sympy objects (:mod:`sigprop.solve.equations`), the branch gains come from
the registered rules along the model's block description (:mod:`sigprop.solve.blocks`,
:mod:`sigprop.model.blocks`), the solve is in
:mod:`sigprop.solve.solver`, the depth search in :mod:`sigprop.solve.depth`.
"""

from __future__ import annotations

import math

from sigprop.errors import DomainError

TARGETS = ("unit-variance", "unit-forward", "logit-var", "max-depth")
#: the modern-block features (:meth:`sigprop.model.spec.Model.features`) the solver implements
#: (rotary positions and grouped-query heads pass through the attention rule's parameters;
#: QK-norm would need its own logit equation: the logit variance no longer depends on the
#: query and key stds)
SUPPORTED = frozenset({"norm rmsnorm", "activation silu", "ffn_kind glu", "final_norm", "placement peri",
                       "placement output", "block parallel", "rope", "n_kv_heads"})


def require_supported(model) -> None:
    """Refuse (DomainError) a model whose modern-block features the solver does not implement."""
    from sigprop.model.spec import require

    require(model, SUPPORTED, "solve-init")


def solve(target: str = "unit-variance", *, arch: str = "preln", init: str | None = None,
          logit_var: float | None = None, value: float | None = None, max_ratio: float | None = None,
          n_max: int | None = None, tol: float | None = None, verify: bool = True, strict: bool = False,
          model=None, **options):
    """Solve ``target`` for the model described by ``arch``, ``init`` and the options of
    :func:`sigprop.model.presets.resolve` (n_layers, d_model, n_heads, ..., beta_k), or for
    ``model`` (a :class:`sigprop.model.spec.Model`, or a path to a model object as
    ``--spec`` reads it) with no options: the unit targets keep its layout, kinds and
    residual and norm scales and solve every weight std; logit-var solves its Q and K.

    * unit-variance / unit-forward: arch "preln" or "postln"; ``logit_var`` (default 1) fixes
      sigma_q sigma_k; beta^2 = beta_k / N.  Both solve the forward variance exactly;
      unit-variance also reports the solved model's gradient (``solution.extra["gradient"]``,
      ``solution.note``) and, with ``strict``, is infeasible unless the gradient is within
      ``tol`` of 1 at every sublayer.
    * logit-var: ``value`` (the logit variance), any arch and init.
    * max-depth: ``max_ratio`` R, any arch and init; ``n_max`` caps the search (default 4096).
    """
    from sigprop.solve import solver

    tol = solver.DEFAULT_TOL if tol is None else tol
    if model is not None and not hasattr(model, "n_layers"):
        from sigprop.model.spec import Model

        model = Model.load(model)
    if not (tol > 0 and math.isfinite(tol)):
        raise DomainError(f"tolerance must be a finite number > 0, got {tol!r}")
    if target in ("unit-variance", "unit-forward"):
        if init is not None:
            raise DomainError("init does not apply to the unit targets: they solve every weight std")
        if value is not None or max_ratio is not None:
            raise DomainError(f"{target}: --value and --max-grad-ratio belong to the logit-var and max-depth targets")
        if strict and target != "unit-variance":
            raise DomainError("--strict applies to --target unit-variance only")
        if target == "unit-variance" and not verify:
            raise DomainError("unit-variance decides feasibility from the prediction of the solved model: "
                              "it cannot skip it (use unit-forward)")
        return solver.solve_unit(arch, target, logit_var=solver.DEFAULT_LOGIT_VAR if logit_var is None else logit_var,
                                 tol=tol, verify=verify, strict=strict, model=model, **options)
    if strict:
        raise DomainError("--strict applies to --target unit-variance only")
    if target == "logit-var":
        if value is None:
            raise DomainError("target logit-var needs --value V (the attention logit variance)")
        if logit_var is not None or max_ratio is not None:
            raise DomainError("logit-var: give the variance with --value (not --logit-var); --max-grad-ratio "
                              "belongs to max-depth")
        return solver.solve_logit_var(value, arch, init, tol=tol, verify=verify, model=model, **options)
    if target == "max-depth":
        if model is not None:
            raise DomainError("max-depth searches the number of layers of a preset: it takes no model")
        from sigprop.solve.depth import DEFAULT_N_MAX, max_depth

        if max_ratio is None:
            raise DomainError("target max-depth needs --max-grad-ratio R")
        if value is not None or logit_var is not None:
            raise DomainError("max-depth: --value and --logit-var do not apply")
        if options.get("n_layers") is not None:
            raise DomainError("max-depth searches the number of layers: drop --layers")
        if not verify:
            raise DomainError("max-depth is a search on the prediction: it cannot skip it")
        return max_depth(max_ratio, arch, init, DEFAULT_N_MAX if n_max is None else n_max, **options)
    raise DomainError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")


def steps(solution) -> list:
    """The derivation of ``solution`` as a list of Step(text, expr)."""
    from sigprop.solve.explain import steps as _steps

    return _steps(solution)


__all__ = ["SUPPORTED", "TARGETS", "require_supported", "solve", "steps"]
