"""`sigprop rules`: every rule with its assumptions and formulas."""

from __future__ import annotations

import typer

from sigprop.cli._app import app


@app.command("rules")
def rules_cmd(
    name: list[str] = typer.Argument(None, help="Only these rules (default: all)."),
    latex: bool = typer.Option(False, "--latex", help="Print the formulas as LaTeX (amsmath align*)."),
) -> None:
    """List every moment rule with its assumptions and forward/backward formulas."""
    from sigprop import printing
    from sigprop.rules import REGISTRY, get

    selected = [get(n) for n in name] if name else list(REGISTRY.values())
    if latex:
        print("\n\n".join(printing.rule_latex(r) for r in selected))
        return

    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    console = Console()
    for rule in selected:
        t = Table(show_header=False, box=None, pad_edge=False)
        t.add_column(style="bold cyan", no_wrap=True)
        t.add_column()
        t.add_row("parameters", "\n".join(f"{p.name} {p.describe()}: {p.doc}" for p in rule.params) or "-")
        t.add_row("assumptions", "\n".join(f"- {a}" for a in rule.assumptions))
        t.add_row("references", "; ".join(rule.references))
        defs, outputs = printing.structured(rule)
        if defs:
            t.add_row("where", "\n".join(f"{a} = {b}" for a, b in defs))
        for key, expr in outputs.items():
            t.add_row(printing.MOMENT_LABELS[key][0], str(expr) if defs else printing.to_text(expr))
        console.print(Panel(t, title=f"[bold]{rule.name}[/]: {rule.title}", expand=False))
