"""`sigprop export latex`: formula tables and derivations as LaTeX documents."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sigprop.cli._app import SigpropTyper, _version_option, app
from sigprop.cli._model_options import build_model, model_options, solve_options

export_app = SigpropTyper(name="export", help="Export formulas and derivations.", no_args_is_help=True)
app.add_typer(export_app, name="export")


@export_app.callback()
def _export(_version: bool = _version_option()) -> None:
    """Export formulas and derivations."""

WHAT = ("components", "model", "solve")


@export_app.command("latex")
@model_options
def latex_cmd(
    what: str = typer.Option("components", "--what", help="components (one row per rule), model (update maps "
                             "and closed forms in N of the chosen model) or solve (the solve-init derivation)."),
    fragment: bool = typer.Option(False, "--fragment", help="Only the table or equations, for \\input "
                                  "(no preamble; the packages it needs are listed in its first line)."),
    rule: list[str] = typer.Option(None, "--rule", help="components: only this rule (repeatable)."),
    target: str = typer.Option("unit-variance", "--target", help="solve: the solve-init target (unit-variance, "
                               "unit-forward, logit-var, max-depth)."),
    value: Optional[float] = typer.Option(None, "--value", help="solve, logit-var: the attention logit variance."),
    logit_var: Optional[float] = typer.Option(None, "--logit-var", help="solve, unit targets: the logit variance "
                                              "that fixes sigma_q sigma_k (default 1)."),
    max_grad_ratio: Optional[float] = typer.Option(None, "--max-grad-ratio", help="solve, max-depth: the allowed "
                                                   "gradient ratio."),
    strict: bool = typer.Option(False, "--strict", help="solve, unit-variance: the verdict also requires the "
                                "gradient variance within 1% of 1 (as solve-init --strict)."),
    output: Path = typer.Option(None, "-o", "--output", help="Write to FILE instead of stdout."),
    model_opts: dict = None,
) -> None:
    """A LaTeX document (amsmath, booktabs) that compiles as it is; every formula printed by sympy."""
    from sigprop.errors import DomainError

    if what not in WHAT:
        raise DomainError(f"--what must be one of {', '.join(WHAT)}, got {what!r}")
    if rule and what != "components":
        raise DomainError("--rule applies to --what components only")
    if what == "components" and model_opts:
        raise DomainError("model options apply to --what model and --what solve only")
    solve_given = [f for f, v in (("--value", value), ("--logit-var", logit_var), ("--max-grad-ratio", max_grad_ratio))
                   if v is not None] + (["--target"] if target != "unit-variance" else []) + (["--strict"] if strict else [])
    if solve_given and what != "solve":
        raise DomainError(f"{', '.join(solve_given)} applies to --what solve only")
    from sigprop import export

    if what == "components":
        from sigprop.rules import get

        text = export.components_latex([get(n) for n in rule] if rule else None, fragment_only=fragment)
    elif what == "model":
        text = export.model_latex(build_model(model_opts, default_layers=24), fragment_only=fragment)
    else:
        if not export.solve_available():
            raise export.ExportUnavailable(export.SOLVE_UNAVAILABLE)
        from sigprop.solve import solve

        arch, init, opts = solve_options(model_opts, target)
        sol = solve(target, arch=arch, init=init, logit_var=logit_var, value=value,
                    max_ratio=max_grad_ratio, strict=strict, **opts)
        text = export.solve_latex(sol, fragment_only=fragment)
    if output is None:
        sys.stdout.write(text)
        return
    from sigprop.output import write_text

    try:
        write_text(output, text)
    except OSError as e:
        raise DomainError(f"cannot write {output}: {e.strerror}") from None
