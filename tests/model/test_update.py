"""The step options (sigprop.model.update): defaults, validation, the refusal of a prediction."""

from __future__ import annotations

import pytest

from sigprop.errors import DomainError
from sigprop.model.update import refuse_prediction, settings


def test_defaults_and_forms():
    assert settings({}) is None and settings({"lr": None}) is None
    assert settings({"step": "adam", "lr": 1e-3}) == {"optimizer": "adam", "lr": 1e-3, "batch_size": 8,
                                                       "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    s = settings({"step": "adamw", "lr": 2, "batch_size": 3, "adam_betas": " 0.8, 0.95", "adam_eps": 0,
                  "weight_decay": 0.1})
    assert s == {"optimizer": "adamw", "lr": 2.0, "batch_size": 3, "betas": (0.8, 0.95), "eps": 0.0,
                 "weight_decay": 0.1}
    assert settings({"step": "adam", "lr": 1e-3, "adam_betas": (0.5, 0.5)})["betas"] == (0.5, 0.5)


@pytest.mark.parametrize("opts,match", [
    ({"lr": 1e-3}, "give --step"),
    ({"batch_size": 4, "adam_eps": 1e-6}, "describe an optimizer step"),
    ({"step": "adam"}, "needs --lr"),
    ({"step": "lion", "lr": 1}, "one of sgd, adam, adamw"),
    ({"step": "sgd", "lr": 1, "adam_eps": 1e-6}, "applies to adam and adamw"),
    ({"step": "sgd", "lr": 1, "adam_eps": 1e-6, "adam_betas": "0.9,0.9"}, "apply to adam"),
    ({"step": "adam", "lr": 0}, "--lr must be a finite number > 0"),
    ({"step": "adam", "lr": float("nan")}, "--lr must be"),
    ({"step": "adam", "lr": "1e-3"}, "--lr must be a number"),
    ({"step": "adam", "lr": 1e-3, "adam_eps": -1}, "--adam-eps must be"),
    ({"step": "adam", "lr": 1e-3, "weight_decay": float("inf")}, "--weight-decay must be"),
    ({"step": "adam", "lr": 1e-3, "batch_size": 0}, "--batch-size must be a positive integer"),
    ({"step": "adam", "lr": 1e-3, "batch_size": 2.0}, "--batch-size must be a positive integer"),
    ({"step": "adam", "lr": 1e-3, "adam_betas": "0.9"}, "two numbers"),
    ({"step": "adam", "lr": 1e-3, "adam_betas": "a,b"}, "two numbers"),
    ({"step": "adam", "lr": 1e-3, "adam_betas": "0.9,1"}, r"in \[0, 1\)"),
])
def test_bad_settings(opts, match):
    with pytest.raises(DomainError, match=match):
        settings(opts)


def test_refuse_prediction_says_what_exists():
    with pytest.raises(DomainError, match=r"plot --step: no analytic prediction .* only `sigprop check --step`"):
        refuse_prediction("plot")
