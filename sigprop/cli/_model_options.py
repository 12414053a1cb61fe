"""The model options shared by the whole-model commands (predict, check, compare, plot, ...).

``@model_options`` adds the options to a command's signature; the command receives one
argument ``model_opts`` (only the options the user actually gave), and calls
:func:`build_model` to resolve them: defaults < ``--config FILE.toml`` < flags, or a fully
resolved ``--spec FILE`` (which excludes the shaping flags).

``@model_options(multi_arch=True)`` (compare, plot): the same options, but ``--arch`` takes a
comma-separated list; the command calls :func:`build_models` for one model per architecture.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Optional

import typer

from sigprop.model.presets import OPTIONS as _PRESET_OPTIONS

#: The model options, written once in :data:`sigprop.model.presets.OPTIONS` (name, type,
#: default, meaning, range, choices); here: parameter name (the flag without ``--``, dashes as
#: underscores: ``layers``, ``d_model``) -> that option.
OPTIONS = {(o.cli or o.name): o for o in _PRESET_OPTIONS.values()}

_MULTI_ARCH_HELP = ("Comma-separated architecture presets, each of {choices} (default: {default}); each uses "
                    "its own default init unless --init is given.")


def _help(o, default_layers: int | None) -> str:
    text = o.doc[0].upper() + o.doc[1:]
    if o.choices:                                   # "Initialisation scheme: normal, ... (default: ...)"
        head, sep, tail = text.partition(" (")
        text = f"{head}: {', '.join(o.choices)}" + (f" ({tail}" if sep else "")
    default = default_layers if o.name == "n_layers" else o.default
    if default is not None and o.type is not bool:
        text += f" (default {default:g})" if isinstance(default, float) else f" (default {default})"
    return text + "."


def model_options(fn=None, *, multi_arch: bool = False, default_layers: int | None = None):
    """Add the model options to a command (see the module docstring).  ``default_layers``: the
    number of layers the command uses when ``--layers`` is not given (shown in the help; the
    command passes the same number to :func:`build_model`)."""
    if fn is None:
        return functools.partial(model_options, multi_arch=multi_arch, default_layers=default_layers)
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.name != "model_opts"]
    extra = []
    for name, o in OPTIONS.items():
        help_ = _help(o, default_layers)
        # choices: listed in the help; checked with the other values by presets (an Enum type
        # per option would cost start-up time for every command)
        metavar = "NAME" if o.choices else None
        if o.choices and multi_arch and name == "arch":
            from sigprop.compare import DEFAULT_ARCHS

            help_ = _MULTI_ARCH_HELP.format(choices=", ".join(o.choices), default=",".join(DEFAULT_ARCHS))
            metavar = "A,B,..."
        if o.type is bool:
            opt = typer.Option(None, f"{o.flag}/--no-{o.flag[2:]}", help=help_, rich_help_panel="Model")
        else:
            opt = typer.Option(None, o.flag, help=help_, metavar=metavar, rich_help_panel="Model")
        extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=Optional[o.type]))
    extra.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                                   default=typer.Option(None, "--config", help="TOML file with the same keys (names "
                                                        "without the leading --); flags override it.",
                                                        rich_help_panel="Model")))
    extra.append(inspect.Parameter("spec", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                                   default=typer.Option(None, "--spec", help="A resolved model object (JSON), e.g. "
                                                        "from solve-init or a trace.", rich_help_panel="Model")))

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        opts = {k: kwargs.pop(k) for k in list(OPTIONS) + ["config", "spec"]}
        return fn(*args, model_opts={k: v for k, v in opts.items() if v is not None}, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*params, *extra])
    return wrapper


def build_model(opts: dict, default_layers: int | None = None):
    """Resolve options into a :class:`sigprop.model.spec.Model` (library calls only)."""
    from sigprop.errors import DomainError
    from sigprop.model import presets
    from sigprop.model.spec import Model

    opts = dict(opts)
    spec = opts.pop("spec", None)
    config = opts.pop("config", None)
    if spec is not None:
        if opts or config is not None:
            raise DomainError("--spec gives a fully resolved model: drop the other model options "
                              f"({', '.join('--' + k.replace('_', '-') for k in opts) or '--config'})")
        return Model.load(spec)
    # canonical name -> (label for messages, value): config values (already checked against
    # the file's keys), then flags, labelled as typed ("--layers must be a positive integer")
    merged = {}
    if config is not None:
        from sigprop.model.config import load_config

        merged.update({k: (k, v) for k, v in load_config(config).items()})
    for k, v in opts.items():
        o = OPTIONS[k]
        # (arch and init are resolve's own arguments; a choice reads "unknown activation 'x'")
        merged[o.name] = (o.name if o.choices else o.flag, v)
    if "n_layers" not in merged and default_layers is not None:
        merged["n_layers"] = ("n_layers", default_layers)
    return presets.resolve(**{label: v for label, v in merged.values()})


def build_models(opts: dict, default_layers: int | None = None, default_archs=None) -> list:
    """One resolved model per architecture of a comma-separated ``arch`` option (compare,
    plot).  Without ``--arch``: the config file's ``arch`` if it names one, otherwise
    ``default_archs`` (:data:`sigprop.compare.DEFAULT_ARCHS`).  Every name is checked before
    any model is built.  ``--spec`` gives exactly one model."""
    from sigprop.compare import DEFAULT_ARCHS, parse_archs

    if opts.get("spec") is not None:
        return [build_model(opts, default_layers)]
    if "arch" in opts:
        archs = parse_archs(opts["arch"])
    else:
        archs = tuple(default_archs or DEFAULT_ARCHS)
        if opts.get("config") is not None:
            from sigprop.model.config import load_config

            named = load_config(opts["config"]).get("arch")
            if named is not None:
                archs = (named,)
    return [build_model({**opts, "arch": a}, default_layers) for a in archs]


def solve_options(model_opts: dict) -> tuple[str | None, str | None, dict]:
    """(arch, init, resolve() options) from the model flags and --config (flags win): for
    commands that build the model themselves (solve-init, export --what solve)."""
    from sigprop.errors import DomainError
    from sigprop.model.presets import canonical_name

    opts = dict(model_opts)
    if opts.pop("spec", None) is not None:
        raise DomainError("solve-init builds the model itself: --spec does not apply (give the model options)")
    merged = {}
    config = opts.pop("config", None)
    if config is not None:
        from sigprop.model.config import load_config

        merged.update(load_config(config))
    for k, v in opts.items():
        merged[canonical_name(k) or k] = v
    return merged.pop("arch", None), merged.pop("init", None), merged
