"""The branch-output-norm sweep (sigprop.mc.outnorm): one point agrees with the Monte Carlo and
the report renders every configuration with its percentiles."""

from __future__ import annotations

from sigprop.mc import outnorm


def test_one_point_agrees_and_the_report_lists_it():
    r = outnorm.point("geglu", 64, 2, "output", 0.05, trials=24, batch=4, seed=3)
    # the input gradient of an output-placed GeGLU block at d 64, within 4 standard errors
    assert abs(r["grad_meas"] - r["grad_pred"]) < 4 * r["grad_se"]
    assert r["passed"]
    text = outnorm.report([r, dict(r, placement="peri", passed=False)], 24, 4, 3, 1.0)
    assert "| geglu | 64 | 128 | output | 0.05 |" in text and text.count("| geglu |") == 2
    assert "1 of 2 configurations pass" in text and "FAIL" in text
