"""Rich rendering of `check --step` (the ``sigprop.step/1`` object of
:mod:`sigprop.mc.step_check`; no maths)."""

from __future__ import annotations

from sigprop.cli._render_model import _SUB, _c, _pm, model_header


def _rel(v: dict | None) -> str:
    return "-" if v is None or v.get("rel") is None else _pm(v["rel"], v.get("rel_se"))


def _where(d: dict) -> str:
    return f"layer {d['layer']} {d['sublayer']}, {d['name']}"


def render_step(model, obj: dict, every: int | None = None, full: bool = False) -> None:
    """The verdict and the largest changes first, then the model, the simulation and the step,
    then one row per point shown (about 40 rows unless ``every`` or ``full`` choose,
    :mod:`sigprop.cli._render_rows`): the stream's update on the step's batch and on a fresh one
    (rel ± SE), the sublayer's module with the largest relative output change (dY/Y: var(dY) /
    var(Y)) and its largest weight change (dW/W: ||dW|| / ||W||), and the attention logit
    variance before and after the step."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from sigprop.cli._render_rows import select

    c = Console()
    s, st = obj["summary"], obj["step"]
    c.print(f"[bold]verdict[/]: {escape(s['verdict'])}", highlight=False)
    if model.final_norm:
        c.print(f"[bold]output[/] (after the final norm): rel "
                f"{_pm(s['update_rel_output'], s['update_rel_output_se'])}, fresh batch "
                f"{_pm(s['update_fresh_rel_output'], s['update_fresh_rel_output_se'])}", highlight=False)
    m, w, lg = s["largest_module_rel"], s["largest_weight_rel"], s["max_logit_var_after"]
    if m:
        c.print(f"[bold]largest module change[/]: {escape(_where(m))}: var(dY)/var(Y) {_rel(m)}", highlight=False)
    if w:
        c.print(f"[bold]largest weight change[/]: {escape(_where(w))}: ||dW||/||W|| {_rel(w)}", highlight=False)
    if lg:
        c.print(f"[bold]largest logit variance after the step[/]: {_c(lg['value'])} at layer {lg['layer']} "
                f"(before: {_c(lg['before'])})", highlight=False)
    if s["eps_note"]:
        c.print(f"[yellow]eps[/]: {escape(s['eps_note'])}", highlight=False)
    c.print()
    for line in model_header(model):
        c.print(escape(line), highlight=False)
    step = f"{st['optimizer']}, lr {st['lr']:g}, batch {st['batch_size']}"
    if st["optimizer"] != "sgd":
        step += f", betas {st['adam_betas'][0]:g},{st['adam_betas'][1]:g}, eps {st['adam_eps']:g}"
    step += f", weight decay {st['weight_decay']:g}"
    c.print(escape(f"step      {step}"), highlight=False)
    c.print(escape(f"Monte Carlo: {obj['trials']} trials, seed {obj['seed']}, {obj['dtype']}, "
                   f"{obj['timing']['simulate_s']:.1f} s; no prediction (check --step measures only)"),
            highlight=False)
    for line in obj["notes"]:
        c.print(escape(f"assumes: {line}"), highlight=False, style="dim")
    c.print(escape("columns: dY/Y the sublayer's module with the largest var(dY)/var(Y) (step's batch), dW/W its "
                   "largest ||dW||/||W||, logit/after the attention logit variance before/after the step"),
            highlight=False, style="dim")
    pts = obj["measured"]
    rows = select([p["layer"] for p in pts], every, full)
    if rows.line:
        c.print(escape(rows.line), highlight=False)
    c.print()
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0))
    for col in ("layer", "rel ± SE", "fresh ± SE", "module", "dY/Y", "dW/W", "logit", "after"):
        t.add_column(col, justify="left" if col in ("layer", "module") else "right", no_wrap=True)
    for p in pts:
        if not rows.keep(p["layer"]):
            continue
        u, se = p["update"], p["se"]["update"]
        mods = p.get("modules") or {}
        top = max(mods.items(), key=lambda kv: -1.0 if kv[1]["rel"] is None else kv[1]["rel"], default=None)
        ws = [v["rel"] for k, v in (p.get("weights") or {}).items() if v["rel"] is not None]
        t.add_row(f"{p['layer']} {_SUB.get(p['sublayer'], p['sublayer'])}", _pm(u["rel"], se["rel"]),
                  _pm(u["fresh_rel"], se["fresh_rel"]),
                  "-" if top is None else escape(top[0]), "-" if top is None else _c(top[1]["rel"], 3),
                  _c(max(ws), 3) if ws else "-", _c(p["logit_var"], 3), _c(p["logit_var_after"], 3))
    c.print(t)
