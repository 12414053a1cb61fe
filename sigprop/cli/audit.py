"""`sigprop audit`: a real PyTorch model's init (as transformers or the user's factory draws
it) against the init the sigprop model assumes, tensor by tensor (the logic is
sigprop.torch.audit; torch and transformers are imported only when the command runs)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from sigprop.cli._app import app
from sigprop.cli._model_options import build_model, model_options

#: the model options that may go with --hf-config here: the depth and the init std, which the
#: config transformers builds from says (the sizes are the config's own), and the sequence
#: length (no weight depends on it; a shorter one lets a config with local attention resolve)
AUDIT_OVERRIDES = frozenset(("layers", "init_std", "seq_len"))


@app.command("audit")
@model_options(default_layers=12)
def audit_cmd(
    module: Optional[str] = typer.Option(None, "--module", metavar="PACKAGE.MODULE:FACTORY",
                                         help="A factory returning your own nn.Module in the plain layout "
                                              "(docs/torch.md); the model options or --spec describe it."),
    layout: Optional[str] = typer.Option(None, "--layout", metavar="plain|hf:FAMILY",
                                         help="Module names of the model (default: the config's family, or plain "
                                              "with --module)."),
    seed: int = typer.Option(0, min=0, help="Seed of torch's generator for the one build (reported)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print every tensor's row as JSON (schema sigprop.audit/1)."),
    model_opts: dict = None,
) -> None:
    """Build a real PyTorch model once as its own code initialises it (a Hugging Face config
    through transformers, or your factory) and compare every weight's std and mean, every
    bias and every norm's gain and bias with the init sigprop's prediction assumes (exit 1 on
    a mismatch).  Needs torch and transformers: pip install 'sigprop[torch]'."""
    from sigprop.errors import DomainError
    from sigprop.interop.torch_names import layout as get_layout
    from sigprop.torch import audit as ta
    from sigprop.torch import measure as tm

    opts = dict(model_opts or {})
    hf_path = opts.pop("hf_config", None)
    init_std = None
    extra: dict = {}
    if hf_path is not None:
        from sigprop.cli._model_options import hf_for_torch

        res = hf_for_torch(hf_path, opts, module, "audit", AUDIT_OVERRIDES)
        model = res.model
        lay = get_layout(layout or f"hf:{res.family}")
        cfg = res.transformers_config()
        vocab = cfg.get("vocab_size") if isinstance(cfg.get("vocab_size"), int) else None
        positions = next((cfg[k] for k in ("n_positions", "max_position_embeddings")
                          if isinstance(cfg.get(k), int)), None)
        ta.check_size(model, vocab, positions, "audit fewer layers (--layers N: the size a Hugging Face config "
                                               "lets the command change)")
        ta.require_libraries(transformers=True)
        source = tm.hf_source(cfg, res.family, layout=lay)
        init_std = res.init_std
        extra["hf"] = {"family": res.family, "notes": list(res.notes)}
    elif module is not None:
        model = build_model(opts, default_layers=12)
        lay = get_layout(layout or "plain")
        ta.check_size(model, None, None, "describe a smaller model (--layers, --d-model, --d-ff, --heads)")
        ta.require_libraries()
        source = tm.module_source(tm.load_factory(module), layout=lay, description=module)
    else:
        raise DomainError("give the model to audit: --hf-config FILE or --module PACKAGE.MODULE:FACTORY")
    result = ta.audit(model, source, seed=seed, init_std=init_std)
    if as_json:
        obj = result.to_json()
        obj["model"] = model.to_json()
        obj["measured_model"] = {"layout": source.layout.name, "built_by": source.description}
        obj.update(extra)
        print(json.dumps(obj))
    else:
        _render(result, source)
    raise typer.Exit(0 if result.passed else 1)


def _render(result, source) -> None:
    rows, bad = result.rows, result.mismatches
    where = f"{source.description} ({source.layout.name} layout), torch seed {result.seed}"
    if bad:
        print(f"audit: FAIL: {len(bad)} of {len(rows)} tensors differ from the init sigprop assumed ({where})")
    else:
        print(f"audit: ok: all {len(rows)} tensors match the init sigprop assumed ({where})")
    for r in bad:
        if r.n == 0:
            print(f"  {r.name}: missing, sigprop assumed std {r.assumed_std:.3g} ({r.why})")
        elif r.assumed_std == 0.0:
            print(f"  {r.name}: max |x - {r.assumed_mean:g}| {r.deviation:.3g} (std {r.std:.3g}, mean {r.mean:.3g}), "
                  f"sigprop assumed every entry {r.assumed_mean:g} ({r.why})")
        else:
            from sigprop.torch.audit import mean_ok

            mean = "" if mean_ok(r.n, r.mean, r.assumed_std) else f", mean {r.mean:.3g} (assumed 0)"
            print(f"  {r.name}: std {r.std:.4f}{mean}, sigprop assumed {r.assumed_std:.3g} ({r.why})")
    print()
    head = ("weights", "tensors", "mismatches", "max deviation")
    body = []
    for g in result.summary():
        dev = (f"{g['max_deviation']:.3g} (abs)" if g["exact"] else f"{100 * g['max_deviation']:.2f}% (std)")
        body.append((g["group"], str(g["tensors"]), str(g["mismatches"]), dev))
    widths = [max(len(x[k]) for x in (head, *body)) for k in range(4)]
    for line in (head, *body):
        print("  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(line, widths))).rstrip())
    if result.not_compared:
        shown = ", ".join(result.not_compared[:4]) + (", ..." if len(result.not_compared) > 4 else "")
        print(f"not compared (sigprop assumes nothing for them here): {len(result.not_compared)} tensor"
              f"{'' if len(result.not_compared) == 1 else 's'}: {shown}")
    print(f"tolerance: std within {ta_z()} standard errors (relative 1/sqrt(2n) for n entries) plus 1% of the "
          f"assumed std, mean within {ta_z()} standard errors (std/sqrt(n)) plus 1%; zeros and norm gains exact")


def ta_z() -> str:
    from sigprop.torch.audit import Z

    return f"{Z:g}"
