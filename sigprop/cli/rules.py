"""`sigprop rules`: every rule with its assumptions and formulas."""

from __future__ import annotations

import typer

from sigprop.cli._app import app

#: a formula taller than this many lines (printed at the terminal's width) is named, not printed
MAX_LINES = 60
#: a rule whose five formulas hold more sympy nodes than this is summarised without printing
#: any (the attention rule holds ~80,000: millions of characters, minutes to format)
MAX_NODES = 5000


@app.command("rules")
def rules_cmd(
    name: list[str] = typer.Argument(None, help="Only these rules (default: all)."),
    latex: bool = typer.Option(False, "--latex", help="Print the formulas as LaTeX (amsmath align*)."),
) -> None:
    """List every moment rule with its parameters, assumptions and forward/backward formulas
    (formulas too long for a terminal are named, with a pointer to --latex)."""
    from sigprop import printing
    from sigprop.rules import REGISTRY, get

    selected = [get(n) for n in name] if name else list(REGISTRY.values())
    if latex:
        print("\n\n".join(printing.rule_latex(r) for r in selected))
        return

    import sympy as sp
    from rich.console import Console
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    console = Console()
    width = max(40, console.width - 4)
    for rule in selected:
        t = Table(show_header=False, box=None, pad_edge=False)
        t.add_column(style="bold cyan", no_wrap=True)
        t.add_column()
        t.add_row("parameters", escape("\n".join(f"{p.name} {p.describe()}: {p.doc}" for p in rule.params) or "-"))
        t.add_row("assumptions", escape("\n".join(f"- {a}" for a in rule.assumptions)))
        t.add_row("references", escape("; ".join(rule.references)))
        console.print(Panel(t, title=f"[bold]{rule.name}[/]: {escape(rule.title)}", expand=False))
        f = printing.formulas(rule)
        nodes = {k: sum(1 for _ in sp.preorder_traversal(e)) for k, e in f.items()}
        if sum(nodes.values()) > MAX_NODES:
            console.print(f"  formulas: {sum(nodes.values()):,} terms, too long to print here "
                          "(--latex prints them)", highlight=False)
            console.print()
            continue
        for key, expr in f.items():
            label = printing.MOMENT_LABELS[key][0]
            text = sp.pretty(expr, use_unicode=True, wrap_line=True, num_columns=width)
            lines = text.splitlines()
            if len(lines) > MAX_LINES:
                console.print(f"  [bold]{label}[/]: {len(lines)} lines long (--latex prints it)", highlight=False)
                continue
            console.print(f"  [bold]{label}[/] =", highlight=False)
            for line in lines:
                console.print("    " + escape(line), highlight=False, soft_wrap=True)
        console.print()
