"""`sigprop solve-init`: derive the initialisation and residual scaling that conserve the
moments (the library is sigprop.solve; rendering in sigprop.cli._render_solve)."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from sigprop.cli._app import app
from sigprop.cli._model_options import model_options, solve_options
from sigprop.solve import TARGETS


#: the targets of :func:`sigprop.solve.solve` (unit-variance, ...), as choices of --target
Target = Enum("Target", {t.replace("-", "_"): t for t in TARGETS}, type=str)


@app.command("solve-init")
@model_options
def solve_init_cmd(
    target: Target = typer.Option(Target.unit_variance, "--target",
                                  help="unit-variance (forward variance 1 at every sublayer, the gradient as flat as "
                                       "the free quantities allow; --strict: the gradient too), "
                                       "unit-forward (forward only), logit-var (Q/K for --value), "
                                       "max-depth (largest N within --max-grad-ratio)."),
    value: Optional[float] = typer.Option(None, "--value", help="logit-var: the attention logit variance V."),
    logit_var: Optional[float] = typer.Option(None, "--logit-var",
                                              help="unit targets: the logit variance that fixes sigma_q sigma_k "
                                                   "(default 1, DeepScaleLM's)."),
    max_grad_ratio: Optional[float] = typer.Option(None, "--max-grad-ratio",
                                                   help="max-depth: allowed gradient ratio R between input and output."),
    max_layers: Optional[int] = typer.Option(None, "--max-layers", min=1,
                                             help="max-depth: search cap (default 4096)."),
    tol: float = typer.Option(0.01, "--tol", help="Tolerance of the targets (relative; default 0.01)."),
    verify: bool = typer.Option(True, "--verify/--no-verify",
                                help="Predict the solved model (sigprop predict) and judge the target on it; "
                                     "unit-forward and logit-var can skip it."),
    strict: bool = typer.Option(False, "--strict",
                                help="unit-variance: also require the gradient variance within --tol of 1 at every "
                                     "sublayer (exit 1 otherwise)."),
    explain: bool = typer.Option(False, "--explain", help="Print the equations and every solving step."),
    latex: bool = typer.Option(False, "--latex", help="With --explain: LaTeX instead of text."),
    as_json: bool = typer.Option(False, "--json", help="Print the solution object as JSON (with the resolved model)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="Write the solution object (JSON, with key \"model\") to FILE; "
                                               "`sigprop predict --spec FILE` reads it."),
    emit: Optional[str] = typer.Option(None, "--emit", metavar="torch",
                                       help="Print, instead of the report, a Python function (torch only) that "
                                            "applies the solved init to a PyTorch model (see --layout)."),
    layout: Optional[str] = typer.Option(None, "--layout", metavar="plain|hf:FAMILY",
                                         help="With --emit torch: the model's module names (default: the "
                                              "--hf-config family, else plain)."),
    model_opts: dict = None,
) -> None:
    """Derive the init and residual scaling that conserve the moments, from the rules (exit 1 if infeasible).

    --layers defaults to 24 (max-depth searches it)."""
    import sys

    from sigprop.cli._render_solve import render, solution_json
    from sigprop.errors import DomainError
    from sigprop.solve import solve

    t = target.value
    if emit is not None and emit != "torch":
        raise DomainError(f"--emit: the only output is torch, got {emit!r}")
    if emit is None and layout is not None:
        raise DomainError("--layout goes with --emit torch")
    if emit is not None and (as_json or explain or t == "max-depth"):
        raise DomainError("--emit torch prints the code alone: drop --json/--explain (and max-depth has no init)")
    if emit is not None:
        from sigprop.interop.torch_names import layout as get_layout

        if layout is None and (model_opts or {}).get("hf_config") is not None:
            from sigprop.model.options import build_hf

            layout = "hf:" + build_hf(model_opts["hf_config"], {}).family
        layout = get_layout(layout or "plain").name        # an unknown layout is refused before solving
    arch, init, opts = solve_options(model_opts, t)
    if latex and not explain:
        raise DomainError("--latex goes with --explain")
    sol = solve(t, arch=arch, init=init, logit_var=logit_var, value=value, max_ratio=max_grad_ratio,
                n_max=max_layers, tol=tol, verify=verify, strict=strict, **opts)
    steps = None
    if explain:
        from sigprop.solve import steps as get_steps

        steps = get_steps(sol)
    obj = None
    if as_json or output is not None:
        obj = solution_json(sol, steps)
        given = opts.get("model")
        if given is not None and "hf" in given.notes:
            obj["hf"] = given.notes["hf"]
    if output is not None:
        from sigprop.output import write_text

        try:
            write_text(output, json.dumps(obj) + "\n")
        except OSError as e:
            raise DomainError(f"cannot write {str(output)!r}: {e.strerror or e}") from None
    if as_json:
        print(json.dumps(obj))
    elif emit is not None:
        if sol.feasible and sol.model is not None:
            from sigprop.export.torch_code import torch_init_code

            sys.stdout.write(torch_init_code(sol.model, layout))
    else:
        render(sol, steps, latex)
    if not sol.feasible:
        from sigprop.solve.prose import plain

        sys.stderr.write(f"sigprop: infeasible: {plain(sol.reason or '')}\n")
        raise typer.Exit(1)
