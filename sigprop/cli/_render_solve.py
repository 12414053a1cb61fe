"""Rendering of `sigprop solve-init` results: a rich table, the derivation steps (text or
LaTeX), and the JSON solution object (schema sigprop.solve/1, with the resolved model
under key "model" so that `predict --spec` / `check --spec` read the file unchanged)."""

from __future__ import annotations


from sigprop.model.trace import json_num
from sigprop import __version__

WEIGHT_LABELS = (
    ("attention", ("q", "k"), "attention Q, K std"),
    ("attention", ("v", "o"), "attention V, O std"),
    ("ffn", ("in", "out"), "FFN in, out std"),
)




def _columns(sol) -> list[tuple[str, str, object]]:
    """(label, key, Formula) per weight group; groups whose members differ are split."""
    import numpy as np

    from sigprop.solve.formula import compress

    out = []
    m = sol.model
    groups = [(kind, names, label) for kind, names, label in WEIGHT_LABELS if kind == "attention"]
    groups.append(("ffn", m.ffn.names, "FFN " + ", ".join(m.ffn.names) + " std"))
    for kind, names, label in groups:
        cols = [np.asarray(getattr(m, kind).std[w]) for w in names]
        if all(np.array_equal(cols[0], c) for c in cols[1:]):
            out.append((label, f"{kind}.{'/'.join(names)}", compress(cols[0])))
        else:
            for w, c in zip(names, cols):
                out.append((f"{kind} {w} std", f"{kind}.{w}", compress(c)))
    for attr, label in (("skip_scale", "skip scale (lambda)"), ("branch_scale", "branch scale (beta)")):
        c = np.asarray(getattr(m.attention, attr))
        f = np.asarray(getattr(m.ffn, attr))
        out.append((label, attr, compress(c if np.array_equal(c, f) else np.concatenate([c, f]))))
    return out


def _formula_json(f) -> dict:
    return {"law": f.law, "formula": f.text, "first": json_num(f.first), "last": json_num(f.last),
            "min": json_num(f.lo), "max": json_num(f.hi)}


def _jsonable(v):
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, bool) or v is None:
        return v
    return json_num(v)


def solution_json(sol, steps=None) -> dict:
    """The solution object (``--json`` and ``-o``)."""
    import sympy as sp

    from sigprop.solve.explain import latex as to_latex

    obj = {"schema": "sigprop.solve/1", "version": __version__, "target": sol.target, "arch": sol.arch,
           "feasible": bool(sol.feasible), "reason": None if sol.reason is None else sol.reason.replace("$", "")}
    if sol.target == "max-depth":
        obj.update({
            "init": sol.init, "max_grad_ratio": sol.max_ratio, "max_layers": sol.n_max,
            "max_depth": sol.max_depth, "grad_ratio_at_max": json_num(sol.ratio_at_max),
            "first_outside": sol.first_outside, "grad_ratio_outside": json_num(sol.ratio_outside),
            "grad_law": sol.law, "limited_by": sol.law_detail,
            "evaluations": [{"n_layers": n, "grad_ratio": json_num(r)} for n, r in sol.evaluations],
        })
    else:
        obj["tolerance"] = sol.tol
        obj["logit_var"] = sol.logit_var
        if sol.beta_k is not None and sol.target != "logit-var":
            obj["beta_k"] = sol.beta_k
        obj["solution"] = {key: _formula_json(f) for _, key, f in _columns(sol)} if sol.model is not None else None
        dev = sol.deviations() if sol.points else {}
        obj["prediction"] = {k: json_num(v) for k, v in dev.items()}
        if "logit_var_max_dev" in sol.extra:
            obj["prediction"]["logit_var_max_dev"] = json_num(sol.extra["logit_var_max_dev"])
        if sol.target == "unit-variance":
            from sigprop.solve.prose import plain

            obj["strict"] = bool(sol.strict)
            obj["gradient"] = _jsonable(sol.extra.get("gradient"))
            obj["note"] = plain(sol.note) if sol.note else None
    obj["timing"] = {k: round(v, 4) for k, v in sol.timings.items()}
    if steps is not None:
        from sigprop.solve.prose import plain

        obj["steps"] = [{"text": plain(s.text),
                         "expr": None if s.expr is None else sp.sstr(s.expr),
                         "latex": None if s.expr is None else to_latex(s.expr)} for s in steps]
    obj["model"] = sol.model.to_json() if sol.model is not None else None
    return obj


def render_steps(steps, latex: bool) -> None:
    import sympy as sp

    from sigprop.solve.explain import latex as to_latex

    from sigprop.solve.prose import plain, tex

    if latex:
        for s in steps:
            print(tex(s.text))
            if s.expr is not None:
                print(r"\begin{equation}" + to_latex(s.expr) + r"\end{equation}")
            print()
        return
    for i, s in enumerate(steps, 1):
        print(f"{i:2d}. {plain(s.text)}")
        if s.expr is not None:
            print("      " + sp.sstr(s.expr))
    print()


def render(sol, steps=None, latex: bool = False) -> None:
    if steps is not None:
        render_steps(steps, latex)
        if latex:
            return
    from rich.console import Console
    from rich.table import Table

    c = Console()
    if sol.target == "max-depth":
        _render_depth(c, sol)
        return
    m = sol.model
    if m is None:
        c.print(f"solve-init {sol.target}: {sol.arch}, {sol.n_layers} layers: no solution")
        c.print("[red]infeasible[/] (reason on stderr)")
        return
    title = (f"solve-init {sol.target}: {sol.arch}, {m.n_layers} layers, d {m.d_model}, {m.n_heads} heads x "
             f"{m.d_head}, d_ff {m.d_ff}, L {m.seq_len}, {m.activation}, dropout {m.dropout.attention:g}/"
             f"{m.dropout.hidden:g}/{m.dropout.ffn_inner:g}" + (", causal" if m.causal else ""))
    t = Table(title=title)
    for col in ("quantity", "value (l = layer, 1-based)", "range"):
        t.add_column(col, justify="left")
    for label, _, f in _columns(sol):
        rng = "-" if f.law == "constant" else f"{f.lo:.6g} .. {f.hi:.6g}"
        t.add_row(label, f.text, rng)
    c.print(t)
    if sol.sublayers:
        _render_layers(c, sol)
    dev = sol.deviations() if sol.points else {}
    if dev:
        c.print(f"prediction of the solved model: max |forward var - 1| = {dev['forward_var_max_dev']:.3g}; "
                f"gradient input/output {dev['grad_ratio_input_output']:.4g} "
                f"(max |g/g_top - 1| = {dev['grad_var_max_dev']:.3g})")
    grad = sol.extra.get("gradient")
    if grad:
        att = grad.get("attention_gain_ratio")
        c.print(f"gradient: input/output {grad['ratio_input_output']:.4g}"
                + (f"; attention Gamma/V {att['min']:.3g} .. {att['max']:.3g}" if att else "")
                + (" (within the tolerance)" if grad["within_tol"] else
                   " (not within the tolerance: the gradient is as flat as the free quantities allow)"),
                markup=False)
    if sol.note:
        from sigprop.solve.prose import plain

        c.print("note: " + plain(sol.note), markup=False)
    if "logit_var_max_dev" in sol.extra:
        c.print(f"predicted logit variance within {sol.extra['logit_var_max_dev']:.2g} (relative) of {sol.logit_var:g}")
    if sol.feasible and grad and not grad["within_tol"]:
        c.print(f"[green]feasible[/]: forward variance 1 within {sol.tol:g} at every sublayer; gradient "
                f"input/output {grad['ratio_input_output']:.4g} (--strict requires it within {sol.tol:g} of 1)")
    else:
        c.print("[green]feasible[/]" if sol.feasible else "[red]infeasible[/] (reason on stderr)")


def _render_layers(c, sol) -> None:
    from rich.table import Table

    att = [s for s in sol.sublayers if s.kind == "attention"]
    ffn = [s for s in sol.sublayers if s.kind == "ffn"]
    n = len(att)
    picks = sorted({0, n // 4, n // 2, (3 * n) // 4, n - 1})
    t = Table(title="selected layers (r: token correlation of the stream entering the attention sublayer)")
    for col in ("layer", "r", "V-hat_A / d w", "V, O std", "FFN std", "Q, K std"):
        t.add_column(col, justify="right")
    w = sol.model.n_heads * sol.model.d_head * sol.model.d_model
    for i in picks:
        a, f = att[i], ffn[i]
        t.add_row(str(a.layer), f"{a.x.corr:.4f}", f"{a.vhat / w:.5f}", f"{a.stds['v']:.6g}",
                  f"{f.stds[sol.model.ffn.names[0]]:.6g}", f"{a.stds['q']:.6g}")
    c.print(t)


def _render_depth(c, res) -> None:
    from rich.table import Table

    t = Table(title=f"solve-init max-depth: {res.arch}, init {res.init}, gradient ratio within "
                    f"[1/{res.max_ratio:g}, {res.max_ratio:g}]")
    t.add_column("layers N", justify="right")
    t.add_column("gradient input/output", justify="right")
    for n, r in res.evaluations:
        t.add_row(str(n), f"{r:.5g}")
    c.print(t)
    if res.max_depth is None:
        c.print(f"no limit up to N = {res.n_max} ({res.law}: {res.law_detail})")
    elif res.max_depth == 0:
        c.print(f"not even one layer: {res.reason}")
    else:
        c.print(f"max depth N = {res.max_depth} (ratio {res.ratio_at_max:.4g}); N = {res.first_outside} gives "
                f"{res.ratio_outside:.4g}; limited by the gradient's {res.law} growth law")
