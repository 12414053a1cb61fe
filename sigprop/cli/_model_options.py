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

# option name -> (type, help); all default to None ("not given")
OPTIONS: dict[str, tuple[type, str]] = {
    "arch": (str, "Architecture preset: preln, postln, dslm, dslm-post, deepnorm, lns, mixln."),
    "init": (str, "Init scheme: normal, xavier, torch-default, scaled, dslm, deepnorm (default: the arch's own)."),
    "layers": (int, "Number of layers N (each has an attention and an FFN sublayer)."),
    "d_model": (int, "Model width (default 1024)."),
    "heads": (int, "Attention heads (default 16)."),
    "d_head": (int, "Head width (default d_model / heads)."),
    "d_ff": (int, "FFN width (default 4 d_model)."),
    "seq_len": (int, "Sequence length L (default 256)."),
    "dropout": (float, "Sets attention, hidden and FFN-inner dropout (default: 0.1, 0.1 and 0, the DSLM figure model)."),
    "attn_dropout": (float, "Dropout on the attention probabilities."),
    "hidden_dropout": (float, "Dropout on each branch output."),
    "ffn_dropout": (float, "Dropout after the FFN activation."),
    "activation": (str, "relu or gelu (default relu)."),
    "causal": (bool, "Causal (decoder) attention."),
    "input_mean": (float, "Mean of the stream entering layer 1."),
    "input_var": (float, "Variance of the stream entering layer 1."),
    "input_corr": (float, "Token correlation of the stream entering layer 1."),
    "grad_var": (float, "Variance of dLoss/dx at the top."),
    "grad_corr": (float, "Token correlation of dLoss/dx at the top."),
    "skip_scale": (float, "Override the skip scale a of every sublayer."),
    "branch_scale": (float, "Override the branch scale b of every sublayer."),
    "mixln_alpha": (float, "Mix-LN: fraction of Post-LN layers (default 0.25)."),
    "init_std": (float, "Std of the normal / scaled inits (default 0.02)."),
    "beta_k": (float, "DSLM: beta^2 = k / N (default 1)."),
}
_RENAME = {"layers": "n_layers", "heads": "n_heads", "ffn_dropout": "ffn_dropout"}

_MULTI_ARCH_HELP = ("Comma-separated architecture presets, e.g. preln,postln,dslm (default: preln, postln, "
                    "dslm, deepnorm, lns, mixln); each uses its own default init unless --init is given.")


def model_options(fn=None, *, multi_arch: bool = False):
    if fn is None:
        return functools.partial(model_options, multi_arch=multi_arch)
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.name != "model_opts"]
    extra = []
    for name, (typ, help_) in OPTIONS.items():
        if multi_arch and name == "arch":
            help_ = _MULTI_ARCH_HELP
        flag = "--" + name.replace("_", "-")
        if typ is bool:
            opt = typer.Option(None, f"{flag}/--no-{flag[2:]}", help=help_, rich_help_panel="Model")
        else:
            opt = typer.Option(None, flag, help=help_, rich_help_panel="Model")
        extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=Optional[typ]))
    extra.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                                   default=typer.Option(None, "--config", help="TOML file with the same keys; flags override it.", rich_help_panel="Model")))
    extra.append(inspect.Parameter("spec", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                                   default=typer.Option(None, "--spec", help="A resolved model object (JSON), e.g. from solve-init or a trace.", rich_help_panel="Model")))

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
    merged = {}
    if config is not None:
        from sigprop.model.config import load_config

        merged.update(load_config(config))
    merged.update(opts)
    if "layers" not in merged and "n_layers" not in merged and default_layers is not None:
        merged["layers"] = default_layers
    kwargs = {_RENAME.get(k, k): v for k, v in merged.items()}
    return presets.resolve(**kwargs)


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
