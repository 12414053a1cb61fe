"""The model options shared by the whole-model commands (predict, check, compare, plot, ...).

``@model_options`` adds the options to a command's signature; the command receives one
argument ``model_opts`` (only the options the user actually gave), and calls
:func:`build_model` to resolve them: defaults < ``--config FILE.toml`` < flags, or a fully
resolved ``--spec FILE`` (which excludes the shaping flags), or a Hugging Face ``config.json``
(``--hf-config FILE|DIR``, :mod:`sigprop.interop.hf`; the flags that replace a config's values
apply with it, the others conflict).  The resolution itself is the
library's (:mod:`sigprop.model.options`), shared with the Python API.

``@model_options(multi_arch=True)`` (compare, plot): the same options, but ``--arch`` takes a
comma-separated list; the command calls :func:`build_models` for one model per architecture.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Optional

import typer

from sigprop.model.options import OPTIONS, build_model, build_models, solve_options  # noqa: F401 (re-exported)

_MULTI_ARCH_HELP = ("Comma-separated architecture presets, each of {choices} (default: {default}); each uses "
                    "its own default init unless --init is given.")


def _help(o, default_layers: int | None) -> str:
    from sigprop.model.presets import PRESET_OPTIONS

    text = o.doc[0].upper() + o.doc[1:]
    if o.choices:                                   # "Initialisation scheme: normal, ... (default: ...)"
        head, sep, tail = text.partition(" (")
        text = f"{head}: {', '.join(o.choices)}" + (f" ({tail}" if sep else "")
    default = default_layers if o.name == "n_layers" else o.default
    preset = ", or the preset's" if o.name in PRESET_OPTIONS else ""
    if o.type is bool:
        if preset:
            text += f" (default {'on' if default else 'off'}{preset})"
    elif default is not None:
        text += f" (default {default:g}{preset})" if isinstance(default, float) else f" (default {default}{preset})"
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

    extra.append(inspect.Parameter("hf_config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                                   default=typer.Option(None, "--hf-config", metavar="FILE|DIR",
                                                        help="A Hugging Face config.json (or a directory holding "
                                                        "one): the model as transformers initialises it (no "
                                                        "network). --layers, --seq-len (default "
                                                        "min(max_position_embeddings, 2048)), --init, --init-std, "
                                                        "the dropouts, the input and gradient options and the "
                                                        "residual scales replace its values; other model options "
                                                        "conflict with it.", rich_help_panel="Model")))

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        opts = {k: kwargs.pop(k) for k in list(OPTIONS) + ["config", "spec", "hf_config"]}
        return fn(*args, model_opts={k: v for k, v in opts.items() if v is not None}, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*params, *extra])
    return wrapper


def hf_for_torch(hf_path, opts: dict, module, command: str, overrides):
    """The Hugging Face config ``hf_path`` resolved for a command that has transformers build
    the model itself (``measure``, ``audit``): only the options in ``overrides`` apply, and
    ``--module`` is exclusive with it (DomainError otherwise).  Returns
    ``sigprop.model.options.build_hf``'s result."""
    from sigprop.errors import DomainError
    from sigprop.model.options import build_hf

    if module is not None:
        raise DomainError(f"--hf-config and --module are exclusive: {command} one model")
    def flags(keys) -> str:
        return ", ".join("--" + k.replace("_", "-") for k in keys)

    other = sorted(k for k in opts if k not in overrides)
    if other:
        raise DomainError(f"{command} has transformers build the model from the Hugging Face config: drop "
                          f"{flags(other)} (what applies: {flags(sorted(overrides))})")
    return build_hf(hf_path, opts)
