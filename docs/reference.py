"""Write docs/reference.md, the reference of every command and option, from the command-line
application itself (the typer app of sigprop.cli), so the page cannot drift from the code.

    python docs/reference.py            # print the page
    python docs/reference.py --write    # rewrite docs/reference.md

tests/test_docs.py checks that the committed page equals what this script writes.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference.md"

HEADER = """# Command reference

Generated from the command-line application by `python docs/reference.py --write`; do not
edit by hand (a test compares this page with the script's output). What the commands do, with
examples: [guide.md](guide.md) and [tutorial.md](tutorial.md). The other references:

- the JSON formats, input files and exit codes: [formats.md](formats.md);
- the Python API (`sigprop.predict`, `check`, `solve_init`, `compare`, `build_model`): [api.md](api.md);
- the presets, inits and config-file keys: [presets.md](presets.md);
- the Hugging Face fields read by `--hf-config`: [hf.md](hf.md).

Every command takes `-h` / `--help` and `--version`, and `--plugin FILE.py` (repeatable; also the
`SIGPROP_PLUGINS` environment variable) to import your own components first
([extending.md](extending.md)). Exit codes: 0 success, 1 a negative verdict (`check`,
`check-component`, `measure` outside tolerance, `audit` on a mismatch, `solve-init`
infeasible), 2 bad input (one line on stderr, `sigprop COMMAND: error: ...`, nothing on stdout),
3 a numerical failure ([formats.md](formats.md#exit-codes-every-command)).

Environment: `SIGPROP_CACHE_DIR` (the table store, default `~/.cache/sigprop`; `off` disables
it), `SIGPROP_PROGRESS` (`1` forces the spinner on stderr, `0` silences it), `SIGPROP_PLUGINS`,
`OPENBLAS_NUM_THREADS` / `MKL_NUM_THREADS` (BLAS threads; one unless set).
"""


def _app():
    import typer

    from sigprop.cli import load

    return typer.main.get_command(load())


def _type(p) -> str:
    t = p.type
    choices = getattr(t, "choices", None)
    if choices:
        return "|".join(str(c.value if isinstance(c, enum.Enum) else c) for c in choices)
    if getattr(p, "is_flag", False):
        return "flag"
    name = type(t).__name__
    if name == "IntRange" or name == "FloatRange":
        base = "INT" if name == "IntRange" else "FLOAT"
        lo, hi = t.min, t.max
        rng = []
        if lo is not None:
            rng.append(f">{'' if t.min_open else '='} {lo:g}")
        if hi is not None:
            rng.append(f"<{'' if t.max_open else '='} {hi:g}")
        return f"{base} ({', '.join(rng)})" if rng else base
    return p.metavar or t.name.upper()


def _default(p) -> str:
    d = p.default
    if getattr(p, "is_flag", False) and p.secondary_opts:
        return p.opts[0] if d else p.secondary_opts[0]
    if d is None or (getattr(p, "is_flag", False) and d is False) or d == () or d == []:
        return ""
    if isinstance(d, enum.Enum):
        d = d.value
    if isinstance(d, float):
        return f"{d:g}"
    return str(d)


def _cell(text: str) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _opts(p) -> str:
    names = "/".join(p.opts + p.secondary_opts) if p.secondary_opts else ", ".join(sorted(p.opts, key=len, reverse=True))
    return f"`{names}`" + (" (repeatable)" if p.multiple else "")


def _row(p) -> str:
    return f"| {_opts(p)} | {_cell(_type(p))} | {_cell(_default(p))} | {_cell(p.help)} |"


def _table(ps) -> list[str]:
    return ["| option | value | default | meaning |", "|---|---|---|---|"] + [_row(p) for p in ps] + [""]


def _key(p):
    return (p.opts, p.secondary_opts, p.default, p.help)


def _command(path: str, cmd, model: dict) -> list[str]:
    from typer.core import TyperArgument

    out = [f"## `{path}`", "", _cell(cmd.help or "").strip(), ""]
    args = [p for p in cmd.params if isinstance(p, TyperArgument)]
    opts = [p for p in cmd.params if not isinstance(p, TyperArgument) and not getattr(p, "hidden", False)
            and p.name not in ("_version", "_plugin")]
    usage = " ".join([f"sigprop {path[len('sigprop '):]}"] + [
        (a.name.upper() + ("..." if a.nargs == -1 else "")) if a.required else
        f"[{a.name.upper()}{'...' if a.nargs == -1 else ''}]" for a in args] + ["[OPTIONS]"])
    out += ["```", usage, "```", ""]
    for a in args:
        out += [f"Argument `{a.name.upper()}`: {_cell(getattr(a, 'help', '') or '')}", ""]
    own = [p for p in opts if getattr(p, "rich_help_panel", None) != "Model"]
    mod = [p for p in opts if getattr(p, "rich_help_panel", None) == "Model"]
    out += _table(own)
    if mod:
        names = {p.name for p in mod}
        missing = [f"`{model[n].opts[0]}`" for n in model if n not in names]
        differ = [p for p in mod if p.name not in model or _key(p) != _key(model[p.name])]
        out += ["The [model options](#model-options)" + (f" except {', '.join(missing)}" if missing else "")
                + (", with these differences:" if differ else "."), ""]
        if differ:
            out += _table(differ)
    return out


def _model_section(model: dict) -> list[str]:
    return ["## Model options", "",
            "The commands that take a model (`predict`, `check`, `compare`, `plot`, `solve-init`, "
            "`measure`, `audit`, `export latex`) share these options; a command's own section names "
            "any that differ there. A `--config` file's keys are these names without `--` "
            "([presets.md](presets.md#config-files)).", ""] + _table(model.values())


def _commands(root) -> list:
    """The app's commands in sigprop.cli.COMMANDS's order (the app's own order is the order the
    command modules were first imported in, which a process that ran some commands before
    changes)."""
    from sigprop.cli import COMMANDS

    order = {name: k for k, name in enumerate(COMMANDS)}
    return sorted(root.commands.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))


def render() -> str:
    root = _app()
    model = {p.name: p for p in root.commands["predict"].params if getattr(p, "rich_help_panel", None) == "Model"
             and not getattr(p, "hidden", False)}
    lines = [HEADER.rstrip("\n"), "", "Commands: " + ", ".join(
        f"[`{n}`](#sigprop-{n.replace(' ', '-')})" for n in _names(root)) + "; [model options](#model-options).", ""]
    for name, cmd in _commands(root):
        sub = getattr(cmd, "commands", None)
        if sub:
            for sname, scmd in sub.items():
                lines += _command(f"sigprop {name} {sname}", scmd, model)
        else:
            lines += _command(f"sigprop {name}", cmd, model)
    lines += _model_section(model)
    return "\n".join(lines).rstrip("\n") + "\n"


def _names(root) -> list[str]:
    out = []
    for name, cmd in _commands(root):
        sub = getattr(cmd, "commands", None)
        out += [f"{name} {s}" for s in sub] if sub else [name]
    return out


def main(argv: list[str]) -> int:
    text = render()
    if "--write" in argv:
        OUT.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
