"""`sigprop measure`: a real PyTorch model's trace (hooks) against the prediction (the logic
is sigprop.torch.measure; torch and transformers are imported only when the command runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from sigprop.cli._app import app
from sigprop.cli._choices import DType
from sigprop.cli._model_options import build_model, model_options
from sigprop.cli._tolerance import TOL_CORR, TOL_GRAD, TOL_LOGIT, TOL_VAR, Z, tolerance_values

#: the model options that may go with --hf-config here: what is fed and compared, and what the
#: config transformers builds from can say (HFModel.transformers_config: depth, init std,
#: attention and branch dropout)
MEASURE_OVERRIDES = frozenset(("seq_len", "input_mean", "input_var", "input_corr", "grad_var", "grad_corr",
                               "layers", "init_std", "attn_dropout", "hidden_dropout"))
#: the model fields a solution applied with --init must share with the measured model
STRUCTURE = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_head", "d_ff", "ffn_kind", "activation", "norm",
             "block", "causal", "rope", "qk_norm", "final_norm")


@app.command("measure")
@model_options(default_layers=12)
def measure_cmd(
    module: Optional[str] = typer.Option(None, "--module", metavar="PACKAGE.MODULE:FACTORY",
                                         help="A factory returning your own nn.Module in the plain layout "
                                              "(docs/torch.md); the model options or --spec describe it."),
    layout: Optional[str] = typer.Option(None, "--layout", metavar="plain|hf:FAMILY",
                                         help="Module names of the model (default: the config's family, or plain "
                                              "with --module)."),
    init_from: Optional[Path] = typer.Option(None, "--init-from", metavar="SOLUTION.json",
                                        help="Apply this init (a solve-init -o file or a model object) to every "
                                             "draw and predict that model."),
    tokens: bool = typer.Option(False, "--tokens",
                                help="Feed random token ids through the model's embedding instead of the Gaussian "
                                     "stream at layer 1."),
    trials: int = typer.Option(4, min=2, help="Independent builds of the model (weight draws)."),
    batch: int = typer.Option(4, min=1, help="Sequences per draw."),
    seed: int = typer.Option(0, min=0, help="Random seed (reported)."),
    dtype: DType = typer.Option(DType.float32, help="Precision of the PyTorch model."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1,
                                          help="PyTorch CPU threads (default: PyTorch's; small models on a busy "
                                               "machine run faster on 1)."),
    tol_var: float = TOL_VAR,
    tol_grad: float = TOL_GRAD,
    tol_corr: float = TOL_CORR,
    tol_logit: float = TOL_LOGIT,
    z: float = Z,
    every: Optional[int] = typer.Option(None, min=1, metavar="K", help="Show only every K-th layer (and the input "
                                        "and the top layer) in the table (default: about 40 rows)."),
    full: bool = typer.Option(False, "--full", help="Show every row of the table."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the result as JSON (schema sigprop.check/1, \"source\": \"torch\")."),
    model_opts: dict = None,
) -> None:
    """Measure a real PyTorch model (a Hugging Face config built with its own random init, or your
    own module) with hooks, in training mode, and compare every point with the prediction (exit 1
    on failure).  Needs torch and transformers: pip install 'sigprop[torch]'."""
    from sigprop.cli._render_rows import conflict
    from sigprop.errors import DomainError
    from sigprop.model.checking import tolerances
    from sigprop.torch import measure as tm
    from sigprop.interop.torch_names import layout as get_layout

    conflict(every, full)
    tol = tolerances(tolerance_values(tol_var, tol_grad, tol_corr, tol_logit, z))
    opts = dict(model_opts or {})
    hf_path = opts.pop("hf_config", None)
    extra = {}
    if hf_path is not None:
        from sigprop.cli._model_options import hf_for_torch

        res = hf_for_torch(hf_path, opts, module, "measure", MEASURE_OVERRIDES)
        model = res.model
        lay = get_layout(layout or f"hf:{res.family}")
        tm.require_libraries(transformers=True)
        source = tm.hf_source(res.transformers_config(), res.family, layout=lay)
        extra["hf"] = {"family": res.family, "seq_len": res.seq_len, "notes": list(res.notes)}
    elif module is not None:
        model = build_model(opts, default_layers=12)
        lay = get_layout(layout or "plain")
        tm.require_libraries()
        source = tm.module_source(tm.load_factory(module), layout=lay, description=module)
    else:
        raise DomainError("give the model to measure: --hf-config FILE or --module PACKAGE.MODULE:FACTORY")
    solution = None
    if init_from is not None:
        from sigprop.model.spec import Model

        solution = Model.load(init_from)
        for k in STRUCTURE:
            if getattr(solution, k) != getattr(model, k):
                raise DomainError(f"--init-from {init_from.name}: its {k} {getattr(solution, k)!r} is not the measured "
                                  f"model's {getattr(model, k)!r}")
        model = solution
    meas = tm.measure(model, source, trials=trials, batch=batch, seed=seed, dtype=dtype.value, tokens=tokens,
                      init=solution, threads=threads)
    _, res = tm.compare_measured(model, meas, tol)
    if as_json:
        print(json.dumps(tm.measure_object(model, res, meas, source=source, tokens=tokens, extra=extra)))
    else:
        from sigprop.cli._render_model import render_check

        where = (f"torch: {source.description} ({source.layout.name} layout), "
                 f"{'token ids through the embedding' if tokens else 'Gaussian stream at layer 1'}")
        render_check(model, res, meas, every, full, where)
    raise typer.Exit(0 if res.passed else 1)
