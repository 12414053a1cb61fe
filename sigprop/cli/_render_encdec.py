"""`sigprop predict` and `sigprop check` of an encoder-decoder model (sigprop.model.encdec): JSON
(the trace and the check object, every point with its "stack"), or text, one section per stack
(the encoder first), each with its own summary or comparison."""

from __future__ import annotations

import json


def predict_encdec(model, every: int | None, as_json: bool, full: bool) -> None:
    from sigprop.cli import _render_rows
    from sigprop.model import encdec as ED

    pred = ED.predict(model)
    if as_json:
        print(ED.trace_text(pred, every or 1))
        return
    from rich.console import Console

    from sigprop.cli._render_model import render_trace
    from sigprop.model.trace import point_json, summary

    s = ED.summary(pred)
    c = Console()
    c.print(f"[bold]encoder-decoder[/] {model.arch}: {s['verdict']}", highlight=False)
    e, g = s["encoder_output"], s["encoder_output_grad"]
    c.print(f"encoder output E: var {e['var']:.4g}, corr {e['corr']:.4f}; its gradient (the sum over the "
            f"decoder's {len(g['by_decoder_layer'])} cross-attentions): var {g['var']:.4g}, corr {g['corr']:.4f}",
            highlight=False)
    for name in ED.STACKS:
        pts = getattr(pred, name)
        c.print()
        c.print(f"[bold]{name}[/] ({model.stack(name).n_layers} layers, seq_len {model.stack(name).seq_len})")
        rows = _render_rows.select([p.layer for p in pts], every, full)
        tr = {"points": [point_json(p, False) for p in pts if rows.keep(p.layer)], "summary": summary(pts)}
        render_trace(model.stack(name), tr, rows.line)


def check_encdec(model, tol, trials, batch, seed, dtype, backend, rng, dask, as_json, every, full) -> bool:
    from sigprop.mc.encdec import require_numpy
    from sigprop.model import encdec as ED

    require_numpy(backend, rng, dask)
    pred, meas, res = ED.check(model, tol, trials=trials, batch=batch, seed=seed, dtype=dtype)
    if as_json:
        print(json.dumps(ED.check_object(model, res, meas, seed, trials, batch)))
        return res.passed
    from rich.console import Console

    from sigprop.cli._render_model import render_check

    c = Console()
    c.print(f"[bold]encoder-decoder[/] {model.arch}: " + ("[green]pass[/]: every point of both stacks within tolerance"
                                                          if res.passed else f"[red]{len(res.failures)} failures[/]"))
    for name in ED.STACKS:
        c.print()
        c.print(f"[bold]{name}[/] ({model.stack(name).n_layers} layers, seq_len {model.stack(name).seq_len})")
        render_check(model.stack(name), res.parts[name], meas[name], every, full, "numpy on cpu, random numbers: host")
    return res.passed
