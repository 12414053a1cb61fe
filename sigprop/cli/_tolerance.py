"""The comparison tolerances of the commands that judge measurements against predictions
(`check`, `measure`): one set of options, their defaults `checking.DEFAULT_TOL`."""

from __future__ import annotations

import typer

from sigprop.model.checking import DEFAULT_TOL

TOL_VAR = typer.Option(DEFAULT_TOL["forward_var"], "--tol-var", min=0.0, help="Relative tolerance, forward variance.")
TOL_GRAD = typer.Option(DEFAULT_TOL["grad_var"], "--tol-grad", min=0.0, help="Relative tolerance, gradient variance.")
TOL_CORR = typer.Option(DEFAULT_TOL["corr"], "--tol-corr", min=0.0, help="Absolute tolerance, correlations.")
TOL_LOGIT = typer.Option(DEFAULT_TOL["logit_var"], "--tol-logit", min=0.0, help="Relative tolerance, logit variance.")
Z = typer.Option(DEFAULT_TOL["z"], "--z", min=0.0, help="Also pass within z standard errors.")


def tolerance_values(tol_var: float, tol_grad: float, tol_corr: float, tol_logit: float, z: float) -> dict:
    """The options as checking.tolerances takes them."""
    return {"forward_var": tol_var, "grad_var": tol_grad, "corr": tol_corr, "logit_var": tol_logit, "z": z}
