"""`sigprop rules`: every rule with its assumptions and formulas."""

from __future__ import annotations

import typer

from sigprop.cli._app import app

#: a formula taller than this many lines (printed at the terminal's width) is named, not printed
MAX_LINES = 60
#: a named quantity's definition taller than this many lines is named, not printed
MAX_DEF_LINES = 12
#: a formula with more terms than this, written out (shared parts counted each time they
#: occur), is summarised without formatting it (formatting would take minutes)
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
        import sigprop.backend.symbolic as sm

        named = sm.where(f.values())
        for key, expr in f.items():
            _print_formula(console, sp, printing.MOMENT_LABELS[key][0], expr, width, MAX_LINES)
        if named:
            console.print("  [bold]where[/] (named quantities, each defined once):", highlight=False)
            long = []
            for lhs, rhs in named:
                if not _print_formula(console, sp, sp.pretty(lhs, use_unicode=True), rhs, width, MAX_DEF_LINES,
                                      quiet=True):
                    long.append(sp.pretty(lhs, use_unicode=True))
            if long:
                console.print(f"  and {', '.join(long)}: too long to print here (--latex prints them)",
                              highlight=False)
        console.print()


def _tree_size(expr, memo=None) -> int:
    """Terms of ``expr`` written out (a shared subexpression counted where it occurs)."""
    memo = {} if memo is None else memo
    if expr in memo:
        return memo[expr]
    out = memo[expr] = 1 + sum(_tree_size(a, memo) for a in getattr(expr, "args", ()))
    return out


def _print_formula(console, sp, label, expr, width, max_lines, quiet=False) -> bool:
    """Print ``label = expr`` if it fits ``max_lines``; else a one-line note (``quiet``: nothing).
    Returns whether the formula was printed."""
    from rich.markup import escape

    size = _tree_size(expr)
    if size > MAX_NODES:
        if not quiet:
            console.print(f"  [bold]{escape(label)}[/]: {size:,} terms written out, too long to print here "
                          "(--latex prints it)", highlight=False)
        return False
    text = sp.pretty(expr, use_unicode=True, wrap_line=True, num_columns=width)
    lines = text.splitlines()
    if len(lines) > max_lines:
        if not quiet:
            console.print(f"  [bold]{escape(label)}[/]: {len(lines)} lines long (--latex prints it)", highlight=False)
        return False
    console.print(f"  [bold]{escape(label)}[/] =", highlight=False)
    for line in lines:
        console.print("    " + escape(line), highlight=False, soft_wrap=True)
    return True
