"""Apply a sigprop model's initialisation (typically one ``sigprop solve-init`` solved) to a
PyTorch model, by module names (:mod:`sigprop.interop.torch_names`)."""

from __future__ import annotations

import json
from pathlib import Path

from sigprop.errors import DomainError
from sigprop.interop.torch_names import Layout, Weight, init_plan, layout as get_layout, require_init, scale_plan
from sigprop.model.spec import Model


def torch_module():
    """torch, or the one-line DomainError naming the extra."""
    try:
        import torch
    except ImportError:
        raise DomainError("this needs PyTorch: pip install 'sigprop[torch]'") from None
    return torch


def as_model(solution) -> Model:
    """A :class:`Model` from a Model, a model object or a solution/trace/check object (a dict
    with key "model"), or the path of a JSON file holding one."""
    if isinstance(solution, Model):
        return solution
    if isinstance(solution, (str, Path)):
        return Model.load(solution)
    if isinstance(solution, dict):
        obj = solution.get("model", solution) if "layers" not in solution else solution
        if obj is None:
            raise DomainError("the solution holds no model (the target was infeasible)")
        return Model.from_json(json.loads(json.dumps(obj)))
    raise DomainError(f"expected a sigprop Model, a solution object or a file, got {type(solution).__name__}")


def find_blocks(net, lay: Layout) -> tuple[str, list]:
    """(prefix, [block modules]) of ``net``: the modules named PREFIX + lay.block.format(i),
    i = 0, 1, ... (the first prefix under which block 0 exists)."""
    names = dict(net.named_modules())
    first = lay.block.format(0)
    prefix = None
    for n in names:
        if n == first or n.endswith("." + first):
            prefix = n[: len(n) - len(first)]
            break
    if prefix is None:
        raise DomainError(f"no module {first!r} in this model: is it in the {lay.name} layout?")
    blocks = []
    while prefix + lay.block.format(len(blocks)) in names:
        blocks.append(names[prefix + lay.block.format(len(blocks))])
    return prefix, blocks


def submodule(block, path: str, where: str):
    if not path:
        return block
    try:
        return block.get_submodule(path)
    except AttributeError:
        raise DomainError(f"{where}: no module {path!r}") from None


def weight_view(module, w: Weight, fan_in: int, fan_out: int, d_head: int, where: str):
    """(weight view, bias view or None) of sigprop weight ``w`` inside ``module``, checked to
    hold fan_in x fan_out entries."""
    W = getattr(module, "weight", None)
    if W is None or W.dim() != 2:
        raise DomainError(f"{where}: module {w.path!r} has no 2-D weight")
    bias = getattr(module, "bias", None)
    if w.split is None:
        view, bview = W, bias
    else:
        how, k, n = w.split
        if how == "cols":
            c = W.shape[1] // n
            view = W[:, k * c:(k + 1) * c]
            bview = None if bias is None else bias[k * c:(k + 1) * c]
        elif how == "rows":
            r = W.shape[0] // n
            view = W[k * r:(k + 1) * r]
            bview = None if bias is None else bias[k * r:(k + 1) * r]
        elif how == "qkv":                     # q (fan_out rows for k = 0), then k and v of equal size
            kv = fan_out if k else (W.shape[0] - fan_out) // 2
            start = (0, W.shape[0] - 2 * kv, W.shape[0] - kv)[k]
            rows = fan_out
            view = W[start:start + rows]
            bview = None if bias is None else bias[start:start + rows]
        elif how == "heads":
            heads = W.shape[0] // (n * d_head)
            view = W.view(heads, n, d_head, W.shape[1])[:, k]
            bview = None if bias is None else bias.view(heads, n, d_head)[:, k]
        else:
            raise DomainError(f"{where}: unknown split {how!r}")
    if view.numel() != fan_in * fan_out:
        raise DomainError(f"{where}: {w.path} holds {tuple(view.shape)}, the sigprop model says "
                          f"{fan_in} x {fan_out}: the model and the layout do not match")
    return view, bview


def is_norm(module) -> bool:
    """A LayerNorm or RMSNorm module (by class name: nn.LayerNorm, LlamaRMSNorm, ...)."""
    return type(module).__name__.endswith(("LayerNorm", "RMSNorm"))


def model_blocks(net, model, lay) -> tuple:
    """(prefix, blocks) of ``net`` in layout ``lay`` (:func:`find_blocks`), one block per layer
    of the sigprop ``model`` (DomainError otherwise)."""
    prefix, blocks = find_blocks(net, lay)
    if len(blocks) != model.n_layers:
        raise DomainError(f"the PyTorch model has {len(blocks)} blocks ({prefix}{lay.block}), the sigprop "
                          f"model {model.n_layers} layers")
    return prefix, blocks


def plan_views(model, lay, plan: list, prefix: str, blocks: list):
    """For every step of an :func:`init_plan` (layer, kind, weight name): (the step, the block's
    name, the layout's weight entry, its module, the view of the weight and of its bias, or
    None, that the step's std and bias_std describe)."""
    for step in plan:
        i, kind, name = step["layer"], step["kind"], step["name"]
        where = f"{prefix}{lay.block.format(i)}"
        try:
            w = lay.weights[kind][name]
        except KeyError:
            raise DomainError(f"layout {lay.name} has no {kind} weight {name!r}") from None
        mod = submodule(blocks[i], w.path, where)
        view, bview = weight_view(mod, w, *model.fans(kind, name), model.d_head, where)
        yield step, where, w, mod, view, bview


def apply_init(net, solution, *, layout: str | None = None, seed: int | None = None, generator=None):
    """Set ``net``'s weights to the init of ``solution`` (a sigprop Model, a solution or model
    object, or a JSON file of one): every mapped weight matrix iid N(0, std^2) with its layer's
    std (a branch scale folded into the output matrix, or, in the plain layout, the skip,
    branch and norm scales set as the blocks' attributes, :func:`init_plan`), its bias N(0,
    bias_std^2) (0 when bias_std is 0), every LayerNorm/RMSNorm gain 1 and bias 0 (Gemma's
    (1 + w) norms: w = 0).  ``layout``: "plain" or "hf:FAMILY" (default: the Hugging Face
    model_type of ``net.config``, else "plain").  ``seed`` or ``generator``: the random stream
    (default torch's global one).  Returns ``net``."""
    torch = torch_module()
    model = as_model(solution)
    lay = get_layout(layout or default_layout(net))
    require_init(lay)
    if generator is None and seed is not None:
        generator = torch.Generator(device="cpu").manual_seed(int(seed))
    prefix, blocks = model_blocks(net, model, lay)
    plan = init_plan(model, scales=lay.scales is not None)
    for attr, vals in scale_plan(model, lay).items():
        for i, blk in enumerate(blocks):
            if hasattr(blk, attr):
                setattr(blk, attr, vals[i])
            elif vals[i] != 1.0:
                raise DomainError(f"{prefix}{lay.block.format(i)} has no attribute {attr!r} for the scale "
                                  f"{vals[i]:g}")
    with torch.no_grad():
        for step, where, w, mod, view, bview in plan_views(model, lay, plan, prefix, blocks):
            _normal(torch, view, step["std"], generator)
            if bview is not None:
                if step["bias_std"] > 0:
                    _normal(torch, bview, step["bias_std"], generator)
                else:
                    bview.zero_()
            elif step["bias_std"] > 0:
                raise DomainError(f"{where}: {w.path} has no bias, the sigprop model's bias_std is "
                                  f"{step['bias_std']:g}")
        for mod in net.modules():
            if is_norm(mod):
                if getattr(mod, "weight", None) is not None:
                    mod.weight.fill_(lay.norm_gain_weight)
                if getattr(mod, "bias", None) is not None:
                    mod.bias.zero_()
    return net


def _normal(torch, view, std: float, generator) -> None:
    # normal_ on a strided view writes through to the parameter
    if std == 0.0:
        view.zero_()
    else:
        view.normal_(0.0, std, generator=generator)


def default_layout(net) -> str:
    cfg = getattr(net, "config", None)
    mt = getattr(cfg, "model_type", None)
    return f"hf:{mt}" if mt else "plain"
