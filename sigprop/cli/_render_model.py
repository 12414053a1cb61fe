"""Rich rendering of traces and summaries (no maths)."""

from __future__ import annotations

from sigprop.rope import RopeFreqs


def _f(v, fmt=".4g"):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, fmt)


def _g(v) -> str:
    return format(float(v), ".4g")


def _span(values) -> str:
    import numpy as np

    v = np.unique(np.concatenate([np.ravel(a) for a in values]))
    return _g(v[0]) if v.size == 1 else f"{_g(v.min())} to {_g(v.max())}"


def header_items(model, arch: bool = True) -> list[tuple[str, str]]:
    """The model a table describes, as (label, text) pairs: shape, blocks, init, dropout, and
    what is assumed of the input stream (where a preset derived it, from what) and of the
    gradient arriving at the top.  ``arch=False`` (several architectures under the same
    options): without the preset's name, placements, init and residual scales."""
    from sigprop import registry

    m, d, x, g = model, model.dropout, model.input, model.grad
    subs = [s for s in m.slots() if s.kind != "norm"]
    notes = m.notes or {}
    init = notes.get("init")
    stds = _span([s.std[w] for s in subs for w in s.std])
    biases = _span([s.bias_std[w] for s in subs for w in s.bias_std])
    ffn = f"{registry.activation(m.activation).glu_title} FFN" if m.ffn_kind == "glu" else m.activation
    if m.ffn_kind == "moe":
        e = m.moe
        ffn = (f"mixture of {e.n_experts} {registry.activation(m.activation).glu_title} experts (d_ff "
               f"{e.d_ff_expert}), top {e.top_k} by {e.router}" + (" renormalised" if e.norm_topk_prob else "")
               + (f" x {e.route_scale:g}" if e.route_scale != 1 else "")
               + (f", {e.topk_group} of {e.n_group} groups" if e.n_group > 1 else "")
               + (f", shared expert d_ff {e.d_ff_shared}" + (" gated" if e.shared_mix else "") if e.d_ff_shared else ""))
    att = [f"{m.n_heads} heads x {m.d_head}"
           + (f" ({m.n_kv_heads} key/value heads)" if m.n_kv_heads != m.n_heads else ""),
           f"{m.seq_len} tokens", "causal" if m.causal else "bidirectional"]
    if m.rope is not None:
        att.append(f"RoPE {m.rope.describe()}" if isinstance(m.rope, RopeFreqs) else f"RoPE base {m.rope:g}")
    if m.qk_norm is not None:
        att.append(f"QK-norm ({registry.norm(m.qk_norm).title})")
    items = [("model", (f"{m.arch}, " if arch else "") + f"{m.n_layers} layers, d_model {m.d_model}, "
                       f"d_ff {m.d_ff}, {ffn}"),
             ("attention", ", ".join(att))]
    nk = registry.norm(m.norm)
    # (a pointwise norm, sigprop.extend, has no eps)
    norm = [f"{nk.title} (pointwise)" if nk.pointwise else f"{nk.title} eps {m.norm_eps:g}"]
    if arch:
        norm.append("placement " + " and ".join(sorted(set().union(*(s.placements() for s in subs)))))
    norm.append(f"{m.block} blocks")
    if m.sublayers is not None:
        norm.append("layer: " + ", ".join(s.kind for s in m.sublayers))
    if m.final_norm:
        norm.append("final norm")
    items.append(("norm", ", ".join(norm)))
    if arch:
        items.append(("init", f"{init or '(from the model file)'}: weight std {stds}, bias std {biases}"))
        items.append(("residual", f"skip scale {_span([s.skip_scale for s in subs])}, branch scale "
                                  f"{_span([s.branch_scale for s in subs])}"))
    items.append(("dropout", f"attention {d.attention:g}, hidden {d.hidden:g}, ffn-inner {d.ffn_inner:g}"))
    items.append(("input", f"stream entering layer 1: mean {_g(x.mean)}, var {_g(x.var)}, token corr {_g(x.corr)}"))
    if notes.get("input"):
        items.append(("", f"assumed: {notes['input']}"))
    items.append(("gradient", f"upstream, at the top: var {_g(g.var)}, token corr {_g(g.corr)}"))
    hf = notes.get("hf")
    if hf:
        items.append(("config", f"Hugging Face {hf['family']}: seq_len {m.seq_len} ({hf['seq_len_source']}); "
                                f"{len(hf['notes'])} assumptions listed under \"hf\" in --json"))
    return items


def model_header(model, arch: bool = True) -> list[str]:
    """:func:`header_items` as plain lines."""
    return [f"{k:<10}{v}" for k, v in header_items(model, arch)]


def render_trace(model, tr: dict, shown: str | None = None) -> None:
    """The summary (verdict, laws, notes), the model's description, then the table of the
    trace's points (``tr``: a trace object, its points already the rows to show; ``shown``:
    the line that says which, :mod:`sigprop.cli._render_rows`)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    c = Console()
    _print_summary(c, tr["summary"])
    c.print()
    for line in model_header(model):
        c.print(escape(line), highlight=False)
    if shown:
        c.print(escape(shown), highlight=False)
    t = Table()
    for col in ("layer", "sublayer", "mean", "var", "corr", "grad var", "grad corr", "logit var"):
        t.add_column(col, justify="left" if col == "sublayer" else "right")
    for p in tr["points"]:
        f, b = p["forward"], p["backward"]
        t.add_row(str(p["layer"]), p["sublayer"], _f(f["mean"]), _f(f["var"]), _f(f["corr"], ".4f"),
                  _f(b["var"]), _f(b["corr"], ".4f"), _f(p["logit_var"]))
    c.print(t)


def _print_summary(c, s: dict) -> None:
    """The verdict first, then where the trace stops (if it does), the laws and the notes."""
    c.print(f"[bold]verdict[/]: {s['verdict']}")
    sat = s.get("saturation_layer")
    if sat is not None:
        last, at = ("the input", "at the input") if sat == 1 else (f"layer {sat - 1}", f"at the output of layer {sat - 1}")
        c.print(f"[bold red]trace stops[/] after {last}: layer {sat}'s attention leaves the rules' domain "
                f"({s['domain_note']}); the gradient at the top (--grad-var, --grad-corr) is given {at}")
    c.print(f"[bold]forward variance[/]: final {_f(s['forward_var_final'])}, growth x{_f(s['forward_var_growth'])} ({s['forward_law']})")
    c.print(f"[bold]gradient[/]: input/output ratio {_f(s['grad_ratio_input_output'])} ({s['grad_law']})")
    c.print(f"[bold]token correlation at the top[/]: {_f(s['corr_top'], '.4f')}; "
            f"[bold]largest logit variance[/]: {_f(s['max_logit_var'])}")
    _print_approximations(c, s.get("approximation_notes") or ())


def _print_approximations(c, notes) -> None:
    """One line per approximation note (sigprop.model.predict.approximation_notes)."""
    from rich.markup import escape

    for line in notes:
        c.print(f"[yellow]approximate[/]: {escape(line)}", highlight=False)


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


def _c(v, digits: int = 4) -> str:
    """A number in a few characters: ``digits`` significant digits from 0.01 up to where
    Python switches to exponents, else one digit fewer in scientific notation without the
    exponent's '+' and leading zeros (1.026e6, 9.15e-6)."""
    if v is None or isinstance(v, str) or v != v or v in (float("inf"), float("-inf")):
        return _f(v)
    s = format(v, f".{digits}g")
    if "e" in s or (v != 0 and abs(v) < 0.01):
        m, e = format(v, f".{max(digits - 1, 1)}e").split("e")
        m = m.rstrip("0").rstrip(".") if "." in m else m
        return f"{m}e{int(e)}"
    return s


def _pm(v, se) -> str:
    return f"{_c(v, 3)}±{_c(se, 2)}" if se is not None else _c(v, 3)


_SUB = {"input": "in", "attention": "att", "ffn": "ffn", "block": "blk"}
_ERRORS = (("forward_var_relerr", "forward var", True), ("grad_var_relerr", "gradient var", True),
           ("forward_corr_abserr", "forward corr", False), ("grad_corr_abserr", "gradient corr", False),
           ("logit_var_relerr", "logit var", True))


def render_check(model, res, meas, every: int | None = None, full: bool = False, where: str | None = None) -> None:
    """The verdict and the errors first, then the model, ``where`` (what ran the model, one
    line) and the simulation, then predicted beside measured, one row per point shown (fits 80
    columns; about 40 rows unless ``every`` or ``full`` choose, :mod:`sigprop.cli._render_rows`,
    and always the layers of the first three points outside tolerance)."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from sigprop.cli._render_rows import select

    c = Console()
    failed = res.failed_points or [False] * len(res.predicted)
    n_bad = sum(failed)
    if res.passed:
        c.print("[green]pass[/]: every point within tolerance")
    else:
        c.print(f"[red]{n_bad} of {len(res.predicted)} points outside tolerance[/]; the first:")
        for f in res.failures[:3]:
            c.print("  " + escape(f), highlight=False)
    _print_approximations(c, res.approximation_notes)
    e = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True, padding=(0, 1))
    for col in ("error", "median", "p90", "max"):
        e.add_column(col, justify="left" if col == "error" else "right")
    for key, label, rel in _ERRORS:
        v = res.errors.get(key, {})
        if v.get("median") is not None:
            e.add_row(label, *(f"{100 * v[q]:.2f}%" if rel else f"{v[q]:.4f}" for q in ("median", "p90", "max")))
    c.print()
    c.print(e)
    r2 = ", ".join(f"{'forward' if k == 'forward_var' else 'gradient'} {v:.4g}"
                   for k, v in res.r2.items() if v is not None)
    c.print(f"R^2 of log variance, predicted vs measured: {r2 or '-'}", highlight=False)
    c.print(f"simulation {meas.simulate_s:.1f} s, {meas.gflop:.1f} GFLOP", highlight=False)
    c.print()
    for line in model_header(model):
        c.print(escape(line), highlight=False)
    if where:
        c.print(escape(where), highlight=False)
    c.print(f"Monte Carlo: {meas.trials} trials x batch {meas.batch}, seed {meas.seed}, {meas.dtype} "
            "(x: outside tolerance)", highlight=False)
    bad_layers = [p["layer"] for p, bad in zip(res.predicted, failed) if bad][:3]
    rows = select([p["layer"] for p in res.predicted], every, full, also=bad_layers)
    if rows.line:
        c.print(escape(rows.line), highlight=False)
    c.print()
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0))
    for col in ("layer", "var", "meas ± SE", "corr", "meas", "gvar", "meas ± SE", "gcorr", "meas", ""):
        t.add_column(col, justify="left" if col == "layer" else "right", no_wrap=True, min_width=1 if not col else None)
    for p, m, bad in zip(res.predicted, res.measured, failed):
        if not rows.keep(p["layer"]):
            continue
        t.add_row(f"{p['layer']} {_SUB.get(p['sublayer'], p['sublayer'])}", _c(p["forward"]["var"]),
                  _pm(m["forward"]["var"], m["se"]["forward"]["var"]),
                  _f(p["forward"]["corr"], ".3f"), _f(m["forward"]["corr"], ".3f"),
                  _c(p["backward"]["var"]), _pm(m["backward"]["var"], m["se"]["backward"]["var"]),
                  _f(p["backward"]["corr"], ".3f"), _f(m["backward"]["corr"], ".3f"),
                  "[red]x[/]" if bad else "")
    c.print(t)
