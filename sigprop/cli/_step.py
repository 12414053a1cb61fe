"""The step options (``--step sgd|adam|adamw --lr LR --batch-size B --adam-betas B1,B2
--adam-eps EPS --weight-decay WD``; docs/formats.md, "One optimizer step") shared by check,
predict, compare and plot.

``@step_options`` adds them to a command's signature (help panel "Step"); the command
receives one argument ``step_opts`` (only the options the user gave) and resolves it with
:func:`sigprop.model.update.settings`.  ``check --step`` runs the step's Monte Carlo; the
others refuse it (:func:`sigprop.model.update.refuse_prediction`): no analytic prediction of
the step exists.
"""

from __future__ import annotations

import functools
import inspect
from typing import Optional

import typer

from sigprop.cli._choices import Optimizer

_PANEL = "Step"


def _params() -> list[inspect.Parameter]:
    def opt(name, annotation, option):
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)

    return [
        opt("step", Optional[Optimizer], typer.Option(
            None, "--step", help="One step of this optimizer from the initialisation (torch.optim's first step; "
            "dropout off). check simulates it; predict, compare and plot refuse it (no analytic prediction yet).",
            rich_help_panel=_PANEL)),
        opt("lr", Optional[float], typer.Option(None, "--lr", metavar="LR", help="The step's learning rate (needed "
                                                "with --step).", rich_help_panel=_PANEL)),
        opt("batch_size", Optional[int], typer.Option(None, "--batch-size", metavar="B", help="Sequences in the "
                                                      "step's batch (default 8).", rich_help_panel=_PANEL)),
        opt("adam_betas", Optional[str], typer.Option(None, "--adam-betas", metavar="B1,B2", help="Adam's betas "
                                                      "(default 0.9,0.999; the first step does not depend on "
                                                      "them).", rich_help_panel=_PANEL)),
        opt("adam_eps", Optional[float], typer.Option(None, "--adam-eps", metavar="EPS", help="Adam's eps "
                                                      "(default 1e-8).", rich_help_panel=_PANEL)),
        opt("weight_decay", Optional[float], typer.Option(None, "--weight-decay", metavar="WD", help="Weight decay "
                                                          "(default 0): coupled L2 for sgd and adam, decoupled "
                                                          "for adamw.", rich_help_panel=_PANEL)),
    ]


NAMES = ("step", "lr", "batch_size", "adam_betas", "adam_eps", "weight_decay")


def step_options(fn):
    """Add the step options to a command (module docstring)."""
    sig = inspect.signature(fn)
    # (model_opts, which @model_options fills, is left out: it passes through **kwargs)
    params = [p for p in sig.parameters.values() if p.name not in ("step_opts", "model_opts")]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        opts = {k: kwargs.pop(k) for k in NAMES}
        opts = {k: getattr(v, "value", v) for k, v in opts.items() if v is not None}
        return fn(*args, step_opts=opts, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*params, *_params()])
    return wrapper


def refuse(command: str, step_opts: dict) -> None:
    """``command`` has no step analysis: bad input when a step option was given."""
    if step_opts:
        from sigprop.model.update import refuse_prediction, settings

        settings(step_opts)                      # (a malformed step is named as such first)
        refuse_prediction(command)
