"""`sigprop compare`: one row per architecture (final variance, gradient ratio, correlation,
logit variance, growth laws, verdict)."""

from __future__ import annotations

import json

import typer

from sigprop.cli._app import app
from sigprop.cli._model_options import build_models, model_options
from sigprop.cli._step import refuse as refuse_step, step_options


@app.command("compare")
@model_options(multi_arch=True, default_layers=24)
@step_options
def compare_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print the sigprop.compare/1 object."),
    model_opts: dict = None,
    step_opts: dict = None,
) -> None:
    """Compare architectures side by side under the same model options (one prediction each)."""
    refuse_step("compare", step_opts)
    from sigprop.cli._report import done
    from sigprop.compare import compare, to_json

    rows = compare(build_models(model_opts, default_layers=24, encdec=True))
    if as_json:
        print(json.dumps(to_json(rows)))
    else:
        _render(rows)
    done()


def _f(v, fmt=".3g"):
    if v is None:
        return "-"
    return v if isinstance(v, str) else format(v, fmt)


def _render(rows) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from rich.markup import escape

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for col in ("arch", "var out", "grad in/out", "corr top", "logit var max", "forward law", "grad law"):
        left = col in ("arch", "forward law", "grad law")
        t.add_column(col, justify="left" if left else "right", no_wrap=left, min_width=None if left else 8)
    for r in rows:
        s = r.summary
        t.add_row(escape(_name(r)) + ("*" if r.saturation_layer is not None else ""), _f(s["forward_var_final"]), _f(s["grad_ratio_input_output"]), _f(s["corr_top"]),
                  _f(s["max_logit_var"]), s["forward_law"], s["grad_law"])
    c = Console()
    for line in _header(rows):
        c.print(escape(line), highlight=False)
    c.print()
    c.print(t)
    if any(r.saturation_layer is not None for r in rows):
        c.print("* the prediction stops before the layer whose softmax saturates (see the verdict); "
                "the row's values describe the layers before it")
    c.print()
    for r in rows:
        c.print(f"[bold]{escape(_name(r))}[/] (init {r.init or 'from --spec'}): {r.summary['verdict']}")


def _name(r) -> str:
    """The row's arch, with its stack for an encoder-decoder model ("postln [decoder]")."""
    return r.arch + (f" [{r.stack}]" if getattr(r, "stack", None) else "")


def _header(rows) -> list[str]:
    """The models' description: a line the architectures share once, a line in which they
    differ (a model preset's own sizes, blocks or input) once per architecture."""
    from sigprop.cli._render_model import header_items

    def keyed(its):        # (label, n): the n-th line with that label ("" continues the line above)
        return {(k, sum(1 for kk, _ in its[:i] if kk == k)): v for i, (k, v) in enumerate(its)}

    items = [keyed(header_items(r.model, arch=False)) for r in rows]
    keys: list = []
    for its in items:                   # every row's lines, each kept after the line it follows
        at = 0
        for key in its:
            if key not in keys:
                keys.insert(at, key)
            at = keys.index(key) + 1
    lines = []
    for key in keys:
        texts = [its.get(key) for its in items]
        if all(t == texts[0] for t in texts):
            lines.append(f"{key[0]:<10}{texts[0]}")
            continue
        lines += [f"{key[0] if i == 0 else '':<10}{_name(r)}: {t}" for i, (r, t) in enumerate(zip(rows, texts))
                  if t is not None]
    return lines
