"""Target max-depth: the largest number of layers N for which the predicted gradient ratio
between the model's input and its output, rho(N) = g_0 / g_N, stays within [1/R, R], for a
given architecture and initialisation (any preset), by bisection on the prediction.

Search: rho(1), rho(2), rho(4), ... until the ratio leaves the band or N reaches ``n_max``,
then bisection between the last depth inside and the first outside.  This assumes that the
ratio leaves the band once and for all (true for the presets' growth laws: hyperbolic,
exponential, constant); every evaluation is recorded.  The growth law that limits the depth
is the prediction's own classification (sigprop.model.trace.summary) at the first depth
outside the band.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

from sigprop.errors import DomainError
from sigprop.solve import require_supported

DEFAULT_N_MAX = 4096


@dataclass
class DepthResult:
    target: str
    arch: str
    init: str
    max_ratio: float
    n_max: int
    max_depth: int | None          # None: no limit up to n_max; 0: not even one layer
    ratio_at_max: float | None
    first_outside: int | None
    ratio_outside: float | None
    law: str
    law_detail: str
    evaluations: list = field(default_factory=list)   # [(N, rho)]
    model: object = None          # the model at max_depth (or at n_max when unlimited)
    feasible: bool = True
    reason: str | None = None
    timings: dict = field(default_factory=dict)


def max_depth(max_ratio: float, arch: str = "preln", init: str | None = None, n_max: int = DEFAULT_N_MAX,
              **options) -> DepthResult:
    from sigprop.model import presets
    from sigprop.model.predict import predict
    from sigprop.model.trace import summary

    if not (max_ratio > 1 and math.isfinite(max_ratio)):
        raise DomainError(f"--max-grad-ratio must be a finite number > 1, got {max_ratio!r}")
    if not (isinstance(n_max, int) and n_max >= 1):
        raise DomainError(f"--max-layers must be a positive integer, got {n_max!r}")
    options = {k: v for k, v in options.items() if v is not None}
    options.pop("n_layers", None)
    t0 = time.perf_counter()
    limit = math.log(max_ratio)
    cache: dict = {}

    def evaluate(n: int):
        if n not in cache:
            m = presets.resolve(arch, init, n_layers=n, **options)
            require_supported(m)
            pts = predict(m)
            lr = pts[0].log_gvar - math.log(m.grad.var) if m.grad.var > 0 else math.nan
            cache[n] = (m, pts, lr)
        return cache[n]

    evals = []

    def inside(n: int) -> bool:
        _, _, lr = evaluate(n)
        bisect.insort(evals, (n, math.exp(lr) if lr < 709 else math.inf))   # kept sorted by N
        return abs(lr) <= limit

    ok1 = inside(1)
    init_name = str(evaluate(1)[0].notes.get("init", init))
    if not ok1:
        m, pts, lr = evaluate(1)
        law = summary(pts)["grad_law"]
        return DepthResult("max-depth", arch, init_name, max_ratio, n_max, 0, None, 1, math.exp(lr), law,
                           "a single layer already exceeds the ratio", evals, m, False,
                           f"even one layer has gradient ratio {math.exp(lr):.4g}, outside [1/{max_ratio:g}, {max_ratio:g}]",
                           {"solve_s": time.perf_counter() - t0})
    good, bad = 1, None
    n = 1
    while n < n_max:
        n = min(2 * n, n_max)
        if inside(n):
            good = n
        else:
            bad = n
            break
    if bad is None:
        m, pts, lr = evaluate(good)
        s = summary(pts)
        return DepthResult("max-depth", arch, init_name, max_ratio, n_max, None, math.exp(lr), None, None,
                           s["grad_law"], f"gradient input/output {math.exp(lr):.4g} at N = {good}", evals, m,
                           True, None, {"solve_s": time.perf_counter() - t0})
    while bad - good > 1:
        mid = (good + bad) // 2
        if inside(mid):
            good = mid
        else:
            bad = mid
    m_good, _, lr_good = evaluate(good)
    _, pts_bad, lr_bad = evaluate(bad)
    s = summary(pts_bad)
    detail = (f"gradient input/output {math.exp(lr_good):.4g} at N = {good}, {math.exp(lr_bad):.4g} at N = {bad}; "
              f"{s['verdict']}")
    return DepthResult("max-depth", arch, init_name, max_ratio, n_max, good, math.exp(lr_good), bad, math.exp(lr_bad),
                       s["grad_law"], detail, evals, m_good, True, None, {"solve_s": time.perf_counter() - t0})
