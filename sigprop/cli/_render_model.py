"""Rich rendering of traces and summaries (no maths)."""

from __future__ import annotations


def _f(v, fmt=".4g"):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, fmt)


def render_trace(model, tr: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = tr["model"]
    title = (f"{m['arch']}: {m['n_layers']} layers, d {m['d_model']}, {m['n_heads']} heads x {m['d_head']}, "
             f"d_ff {m['d_ff']}, L {m['seq_len']}, {m['activation']}, dropout "
             f"{m['dropout']['attention']}/{m['dropout']['hidden']}/{m['dropout']['ffn_inner']}"
             + (", causal" if m["causal"] else ""))
    t = Table(title=title)
    for col in ("layer", "sublayer", "mean", "var", "corr", "grad var", "grad corr", "logit var"):
        t.add_column(col, justify="left" if col == "sublayer" else "right")
    for p in tr["points"]:
        f, b = p["forward"], p["backward"]
        t.add_row(str(p["layer"]), p["sublayer"], _f(f["mean"]), _f(f["var"]), _f(f["corr"], ".4f"),
                  _f(b["var"]), _f(b["corr"], ".4f"), _f(p["logit_var"]))
    c = Console()
    c.print(t)
    s = tr["summary"]
    sat = s.get("saturation_layer")
    if sat is not None:
        last, at = ("the input", "at the input") if sat == 1 else (f"layer {sat - 1}", f"at the output of layer {sat - 1}")
        c.print(f"[bold red]trace stops[/] after {last}: layer {sat}'s attention leaves the rules' domain "
                f"({s['domain_note']}); the gradient at the top (--grad-var, --grad-corr) is given {at}")
    c.print(f"[bold]forward variance[/]: final {_f(s['forward_var_final'])}, growth x{_f(s['forward_var_growth'])} ({s['forward_law']})")
    c.print(f"[bold]gradient[/]: input/output ratio {_f(s['grad_ratio_input_output'])} ({s['grad_law']})")
    c.print(f"[bold]token correlation at the top[/]: {_f(s['corr_top'], '.4f')}; "
            f"[bold]largest logit variance[/]: {_f(s['max_logit_var'])}")
    c.print(f"[bold]verdict[/]: {s['verdict']}")


def render_symbolic(model) -> None:
    """The derivation's blocks; a closed form's comparison line in red when it is an
    approximation outside its range.  Lines are printed as text (their [notes] are not markup)."""
    from rich.console import Console
    from rich.markup import escape

    from sigprop.model.symbolic import derive

    c = Console()
    for block in derive(model):
        c.print(f"[bold]{escape(block.title)}[/]")
        off = {f.text(model.n_layers) for f in block.forms if not f.within_range}
        for line in block.lines:
            c.print(("  [red]" + escape(line) + "[/]") if line in off else "  " + escape(line))
        if block.assumption:
            c.print(f"  [dim]assumes: {escape(block.assumption)}[/]")


def render_check(model, res, meas, every: int) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{model.arch}, {model.n_layers} layers: predicted vs measured "
                    f"({meas.trials} trials x batch {meas.batch}, seed {meas.seed}, {meas.dtype})")
    for col in ("layer", "sublayer", "var pred", "var meas ± SE", "corr pred", "corr meas", "grad var pred",
                "grad var meas ± SE", "grad corr pred", "grad corr meas"):
        t.add_column(col, justify="left" if col == "sublayer" else "right")
    last = res.predicted[-1]["layer"]
    for p, m in zip(res.predicted, res.measured):
        if every > 1 and not (p["layer"] in (0, last) or p["layer"] % every == 0):
            continue
        t.add_row(str(p["layer"]), p["sublayer"], _f(p["forward"]["var"]),
                  f"{_f(m['forward']['var'])} ± {_f(m['se']['forward']['var'], '.2g')}",
                  _f(p["forward"]["corr"], ".4f"), _f(m["forward"]["corr"], ".4f"),
                  _f(p["backward"]["var"]), f"{_f(m['backward']['var'])} ± {_f(m['se']['backward']['var'], '.2g')}",
                  _f(p["backward"]["corr"], ".4f"), _f(m["backward"]["corr"], ".4f"))
    c = Console()
    c.print(t)
    for k, v in res.errors.items():
        if v["median"] is not None:
            c.print(f"{k}: median {v['median']:.4f}, p90 {v['p90']:.4f}, max {v['max']:.4f}")
    r2 = ", ".join(f"{k} {v:.4f}" for k, v in res.r2.items() if v is not None)
    c.print(f"R^2 of log predicted vs log measured variance: {r2 or '-'}")
    c.print(f"simulation {meas.simulate_s:.1f} s, {meas.gflop:.1f} GFLOP")
    if res.passed:
        c.print("[green]pass[/]: every point within tolerance")
    else:
        c.print(f"[red]{len(res.failures)} failures[/], e.g. " + "; ".join(res.failures[:3]))
