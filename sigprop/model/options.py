"""Model options as the commands and the Python API take them, resolved into a
:class:`sigprop.model.spec.Model`: defaults < a config (TOML file, or a dict in the API) <
options, or a fully resolved spec (which excludes the shaping options), or a Hugging Face
config (``hf_config``: a config.json, a directory holding one, or its dict; see
:mod:`sigprop.interop.hf`), whose values the options of
:data:`sigprop.interop.hf.OVERRIDES` and ``seq_len`` replace."""

from __future__ import annotations

from sigprop.model.presets import OPTIONS as _PRESET_OPTIONS

#: The model options, written once in :data:`sigprop.model.presets.OPTIONS` (name, type,
#: default, meaning, range, choices); here: parameter name (the flag without ``--``, dashes as
#: underscores: ``layers``, ``d_model``) -> that option.
OPTIONS = {(o.cli or o.name): o for o in _PRESET_OPTIONS.values()}


def _load_config(config) -> dict:
    from sigprop.model.config import check_config, load_config

    if isinstance(config, dict):
        return check_config(config)
    _require_path(config, "config", "a TOML file's path (str or os.PathLike) or the parsed dict")
    return load_config(config)


def _require_path(value, name: str, wanted: str) -> None:
    """DomainError unless ``value`` is a str or an os.PathLike (a file argument of the API)."""
    import os

    from sigprop.errors import DomainError

    if not isinstance(value, (str, os.PathLike)):
        raise DomainError(f"{name} must be {wanted}, got {type(value).__name__}")


def _load_spec(spec, encdec: bool = False):
    from sigprop.model.encdec import EncoderDecoder, REFUSED
    from sigprop.model.spec import Model

    if isinstance(spec, EncoderDecoder):
        if not encdec:
            from sigprop.errors import DomainError

            raise DomainError(REFUSED)
        return spec
    return spec if isinstance(spec, Model) else Model.load(spec, encdec=encdec)


def build_model(opts: dict, default_layers: int | None = None, encdec: bool = False):
    """Resolve options into a :class:`sigprop.model.spec.Model` (library calls only).
    ``default_layers``: the number of layers when neither the options nor the preset (the
    model presets have their own) give one.  ``encdec``: the caller takes an encoder-decoder
    model (sigprop.model.encdec.EncoderDecoder: a --spec holding one, or the options
    encoder_layers and decoder_layers); otherwise one is refused in one line."""
    from sigprop.errors import DomainError
    from sigprop.model import presets

    opts = {k: v for k, v in opts.items() if not (k in presets.ENCDEC_OPTIONS and v is None)}
    if any(k in opts for k in presets.ENCDEC_OPTIONS):
        for k in ("spec", "hf_config"):
            if opts.get(k) is not None:
                raise DomainError(f"--encoder-layers and --decoder-layers build the model from the model options: "
                                  f"drop --{k.replace('_', '-')}")
    spec = opts.pop("spec", None)
    config = opts.pop("config", None)
    hf_config = opts.pop("hf_config", None)
    if hf_config is not None:
        return build_hf(hf_config, opts, spec, config).model
    if spec is not None:
        if opts or config is not None:
            raise DomainError("--spec gives a fully resolved model: drop the other model options "
                              f"({', '.join('--' + k.replace('_', '-') for k in opts) or '--config'})")
        return _load_spec(spec, encdec)
    # canonical name -> (label for messages, value): config values (already checked against
    # the file's keys), then flags, labelled as typed ("--layers must be a positive integer")
    merged = {}
    if config is not None:
        merged.update({k: (k, v) for k, v in _load_config(config).items()})
    for k, v in opts.items():
        o = OPTIONS[k]
        # (arch and init are resolve's own arguments; a choice reads "unknown activation 'x'")
        merged[o.name] = (o.name if o.choices else o.flag, v)
    if any(k in merged for k in presets.ENCDEC_OPTIONS):
        return _build_encdec(merged, encdec)
    if "n_layers" not in merged and default_layers is not None and not _preset_sets_layers(merged):
        merged["n_layers"] = ("n_layers", default_layers)
    return presets.resolve(**{label: v for label, v in merged.values()})


def _build_encdec(merged: dict, allowed: bool):
    """The encoder-decoder model of encoder_layers N, decoder_layers M (encoder_seq_len) and the
    other model options (``merged``: canonical name -> (label, value), from a config file and the
    flags; sigprop.model.encdec.from_options)."""
    from sigprop.errors import DomainError
    from sigprop.model import encdec, presets

    if not allowed:
        raise DomainError(encdec.REFUSED)
    ed = {k: merged.pop(k)[1] for k in presets.ENCDEC_OPTIONS if k in merged}
    if "encoder_layers" not in ed or "decoder_layers" not in ed:
        raise DomainError("an encoder-decoder model needs both encoder_layers and decoder_layers "
                          "(--encoder-layers, --decoder-layers)")
    if "n_layers" in merged:
        raise DomainError("--layers and --encoder-layers/--decoder-layers both give the depth: give the latter only")
    kw = {k: v for k, (_, v) in merged.items()}          # (canonical names: from_options sets causal, seq_len)
    presets.check_options({**kw, **ed})
    return encdec.from_options(kw, ed["encoder_layers"], ed["decoder_layers"], ed.get("encoder_seq_len"),
                               deepnorm_variant=ed.get("deepnorm_variant"))


def build_hf(hf_config, opts: dict, spec=None, config=None):
    """The :class:`sigprop.interop.hf.HFModel` of a Hugging Face config (a path to config.json
    or to a directory holding one, or the parsed dict) and the model options that replace its
    values (parameter names as in :data:`OPTIONS`); ``spec`` and ``config`` must not be given
    with it."""
    from pathlib import Path

    from sigprop.errors import DomainError
    from sigprop.interop import hf

    if spec is not None:
        raise DomainError("--hf-config and --spec both give the model: give one of them")
    if config is not None:
        raise DomainError("--hf-config and --config both give the model: give one of them (the flags that "
                          "apply with --hf-config replace its values)")
    if isinstance(hf_config, dict):
        cfg, where = hf_config, "Hugging Face config"
    else:
        _require_path(hf_config, "hf_config", "a path (str or os.PathLike) to config.json or to a directory "
                                              "holding one, or the parsed dict")
        p = Path(hf_config)
        cfg, where = hf.read_config(p), str(p / "config.json" if p.is_dir() else p)
    canonical = {(OPTIONS[k].name if k in OPTIONS else k): v for k, v in opts.items()}
    return hf.resolve(cfg, where=where, **canonical)


def _preset_sets_layers(merged: dict) -> bool:
    """Whether the architecture named in ``merged`` (canonical name -> (label, value)) has its
    own number of layers (the model presets), which then wins over a command's default."""
    from sigprop.model.presets import ARCHS

    arch = merged.get("arch", (None, "preln"))[1]
    info = ARCHS.get(arch) if isinstance(arch, str) else None
    return info is not None and "n_layers" in info.defaults


def build_models(opts: dict, default_layers: int | None = None, default_archs=None, encdec: bool = False) -> list:
    """One resolved model per architecture of a comma-separated ``arch`` option (compare,
    plot).  Without ``--arch``: the config file's ``arch`` if it names one, otherwise
    ``default_archs`` (:data:`sigprop.compare.DEFAULT_ARCHS`).  Every name is checked before
    any model is built.  ``--spec`` gives exactly one model.  ``encdec``: as for
    :func:`build_model` (compare and plot take encoder-decoder models, a row per stack)."""
    from sigprop.compare import DEFAULT_ARCHS, parse_archs

    if opts.get("spec") is not None or opts.get("hf_config") is not None:
        return [build_model(opts, default_layers, encdec)]
    if "arch" in opts:
        archs = parse_archs(opts["arch"])
    else:
        archs = tuple(default_archs or DEFAULT_ARCHS)
        if opts.get("config") is not None:
            named = _load_config(opts["config"]).get("arch")
            if named is not None:
                archs = (named,)
    return [build_model({**opts, "arch": a}, default_layers, encdec) for a in archs]


def solve_options(model_opts: dict, target: str | None = None,
                  default_layers: int = 24) -> tuple[str, str | None, dict]:
    """(arch, init, resolve() options) from the model flags and --config (flags win): for
    commands that build the model themselves (solve-init, export --what solve, the API's
    solve_init).  arch defaults to preln; n_layers to ``default_layers`` unless ``target`` is
    max-depth (which searches it) or the preset has its own.  With ``hf_config``: (the
    family, None, {"model": the resolved model}), for :func:`sigprop.solve.solve`'s ``model``."""
    from sigprop.errors import DomainError
    from sigprop.model.presets import canonical_name

    opts = dict(model_opts)
    if opts.get("hf_config") is not None:
        # the model is fully resolved from the config: the solver keeps its layout (arch informational)
        model = build_model(opts)
        return model.arch, None, {"model": model}
    if opts.pop("spec", None) is not None:
        raise DomainError("solve-init builds the model itself: --spec does not apply (give the model options)")
    merged = {}
    config = opts.pop("config", None)
    if config is not None:
        merged.update(_load_config(config))
    for k, v in opts.items():
        merged[canonical_name(k) or k] = v
    if target != "max-depth" and merged.get("n_layers") is None and \
            not _preset_sets_layers({k: (k, v) for k, v in merged.items()}):
        merged["n_layers"] = default_layers
    return merged.pop("arch", None) or "preln", merged.pop("init", None), merged
