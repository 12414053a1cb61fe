"""The step options of the update analysis (docs/update.md; docs/formats.md, "One optimizer
step"): their defaults, their validation, and what the commands without a step simulation say.

``--step sgd|adam|adamw --lr LR`` with ``--batch-size B`` (default 8), ``--adam-betas B1,B2``
(default 0.9,0.999), ``--adam-eps EPS`` (default 1e-8) and ``--weight-decay WD`` (default 0).
:func:`settings` resolves the options a user gave into the keyword arguments of
:func:`sigprop.mc.step.simulate_step`.  What exists of the analysis is the Monte Carlo
(``sigprop check --step``); no analytic prediction of the step does (:func:`refuse_prediction`).
"""

from __future__ import annotations

import math

from sigprop.errors import DomainError

OPTIMIZERS = ("sgd", "adam", "adamw")

#: option -> default (None: required with --step / no default)
DEFAULTS = {"step": None, "lr": None, "batch_size": 8, "adam_betas": (0.9, 0.999), "adam_eps": 1e-8,
            "weight_decay": 0.0}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def given(opts: dict) -> dict:
    """The step options of ``opts`` that were given (not None)."""
    return {k: v for k, v in opts.items() if k in DEFAULTS and v is not None}


def _betas(value) -> tuple[float, float]:
    given = value
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        try:
            value = tuple(float(p) for p in parts)
        except ValueError:
            raise DomainError(f"--adam-betas takes two numbers B1,B2 (e.g. 0.9,0.999), got {value!r}") from None
    try:
        b1, b2 = (float(b) for b in value)
    except (TypeError, ValueError):
        raise DomainError(f"--adam-betas takes two numbers B1,B2 (e.g. 0.9,0.999), got {given!r}") from None
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise DomainError(f"--adam-betas must each lie in [0, 1), got {b1:g},{b2:g}")
    return b1, b2


def _number(name: str, value, lo: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and type(value).__module__ != "numpy":
        raise DomainError(f"{flag(name)} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or (v <= lo if strict else v < lo):
        raise DomainError(f"{flag(name)} must be a finite number {'>' if strict else '>='} {lo:g}, got {v:g}")
    return v


def settings(opts: dict) -> dict | None:
    """The step the options ``opts`` ask for, as :func:`sigprop.mc.step.simulate_step`'s
    keywords (optimizer, lr, batch_size, betas, eps, weight_decay), or None when no step
    option was given.  DomainError for a step option without ``--step``, ``--step`` without
    ``--lr``, an unknown optimizer or a value out of range; the Adam options with sgd."""
    g = given(opts)
    if not g:
        return None
    if "step" not in g:
        raise DomainError(f"{', '.join(flag(k) for k in g)} describe{'s' if len(g) == 1 else ''} an optimizer step: "
                          "give --step sgd|adam|adamw")
    opt = g["step"]
    opt = getattr(opt, "value", opt)
    if opt not in OPTIMIZERS:
        raise DomainError(f"--step must be one of {', '.join(OPTIMIZERS)}, got {opt!r}")
    if "lr" not in g:
        raise DomainError("--step needs --lr LR (the learning rate of the step)")
    if opt == "sgd":
        bad = [flag(k) for k in ("adam_betas", "adam_eps") if k in g]
        if bad:
            raise DomainError(f"{' and '.join(bad)} appl{'ies' if len(bad) == 1 else 'y'} to adam and adamw, not to "
                              "--step sgd")
    bs = g.get("batch_size", DEFAULTS["batch_size"])
    if isinstance(bs, bool) or not isinstance(bs, int) and not type(bs).__name__.startswith(("int", "uint")) \
            or int(bs) < 1:
        raise DomainError(f"--batch-size must be a positive integer, got {bs!r}")
    return {"optimizer": opt, "lr": _number("lr", g["lr"], 0.0, True), "batch_size": int(bs),
            "betas": _betas(g.get("adam_betas", DEFAULTS["adam_betas"])),
            "eps": _number("adam_eps", g.get("adam_eps", DEFAULTS["adam_eps"]), 0.0, False),
            "weight_decay": _number("weight_decay", g.get("weight_decay", DEFAULTS["weight_decay"]), 0.0, False)}


def refuse_prediction(command: str) -> None:
    """DomainError for ``command --step`` (predict, compare, plot): sigprop has no analytic
    prediction of the optimizer step (docs/update.md says what was derived and checked);
    ``check --step`` simulates it."""
    raise DomainError(f"{command} --step: no analytic prediction of the optimizer step exists yet; only "
                      "`sigprop check --step` (the Monte Carlo of the step) is available (docs/update.md)")
