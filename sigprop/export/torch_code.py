"""PyTorch code that applies a sigprop model's init (``sigprop solve-init --emit torch``).

:func:`torch_init_code` prints a self-contained Python function (it imports torch only) that
sets, by module names (:mod:`sigprop.interop.torch_names`), every weight matrix of a model in
the given layout iid N(0, std^2) with the per-layer std of the sigprop model (a branch scale
folded into the branch's output matrix; the plain layout's blocks take the skip, branch and
norm scales as attributes), every bias of those matrices to 0 (or N(0, bias_std^2)
where the sigprop model gives one), and every LayerNorm/RMSNorm gain to 1 and bias to 0 --
what :func:`sigprop.torch.apply_init` does from Python.  A printer: no torch import here.
"""

from __future__ import annotations

from sigprop.interop.torch_names import init_plan, layout as get_layout, require_init, scale_plan

FUNCTION = "apply_sigprop_init"


def _num(x: float) -> str:
    return repr(float(f"{x:.7g}"))


def _values(vals: list[float]) -> str:
    """A per-layer list, written as [v] * n where every layer has the same value."""
    if all(v == vals[0] for v in vals):
        return f"[{_num(vals[0])}] * {len(vals)}"
    return "[" + ", ".join(_num(v) for v in vals) + "]"


def torch_init_code(model, layout: str) -> str:
    """The source of ``apply_sigprop_init(model, generator=None)`` for a model in ``layout``
    ("plain" or "hf:FAMILY") holding ``model``'s init (a sigprop Model)."""
    lay = get_layout(layout)
    require_init(lay)
    plan = init_plan(model, scales=lay.scales is not None)
    scales = scale_plan(model, lay)
    n = model.n_layers
    names = [(kind, name) for kind in ("attention", "ffn") for name in model.sublayer_columns(kind).names]
    std = {name: [0.0] * n for _, name in names}
    bstd = {name: [0.0] * n for _, name in names}
    for step in plan:
        std[step["name"]][step["layer"]] = step["std"]
        bstd[step["name"]][step["layer"]] = step["bias_std"]
    any_bias = any(v for vals in bstd.values() for v in vals)
    splits = {lay.weights[kind][name].split[0] for kind, name in names if lay.weights[kind][name].split}
    block0 = lay.block.format(0)
    what = "a Hugging Face " + lay.name[3:] if lay.name.startswith("hf:") else "a plain-layout"
    L = []
    L.append("import torch")
    L.append("")
    L.append("")
    L.append(f"def {FUNCTION}(model, generator=None):")
    L.append(f'    """Set the weights of {what} PyTorch model ({n} blocks "{lay.block}") to sigprop\'s init:')
    L.append("    each matrix iid N(0, std^2) with its layer's std, biases "
             + ("N(0, bias_std^2)" if any_bias else "0") + ", norm gains 1 and biases 0.")
    L.append(f'    Written by sigprop ({model.arch}, {n} layers, d_model {model.d_model})."""')
    L.append("    std = {")
    for _, name in names:
        L.append(f'        "{name}": {_values(std[name])},')
    L.append("    }")
    if any_bias:
        L.append("    bias_std = {")
        for _, name in names:
            L.append(f'        "{name}": {_values(bstd[name])},')
        L.append("    }")
    if scales:
        L.append("    scales = {  # block attributes: residual and norm scales")
        for attr, vals in scales.items():
            L.append(f'        "{attr}": {_values(vals)},')
        L.append("    }")
    L.append("    # (module under block i, sigprop weight, fused part: (how, index, parts) or None)")
    L.append("    targets = [")
    for kind, name in names:
        w = lay.weights[kind][name]
        L.append(f'        ("{w.path}", "{name}", {w.split!r}),')
    L.append("    ]")
    L.append("    modules = dict(model.named_modules())")
    L.append(f'    first = next((k for k in modules if k == "{block0}" or k.endswith(".{block0}")), None)')
    L.append("    if first is None:")
    L.append(f'        raise ValueError("no module {block0!r}: not a {lay.name} model")')
    L.append(f'    prefix = first[: len(first) - {len(block0)}]')
    L.append(f'    block = prefix + "{lay.block}"')
    L.append(f"    if block.format({n}) in modules or block.format({n - 1}) not in modules:")
    L.append(f'        raise ValueError("the model does not have {n} blocks")')
    if "heads" in splits:
        L.append(f"    d_head = {model.d_head}")
    if scales:
        L.append(f"    for i in range({n}):")
        L.append("        for attr, vals in scales.items():")
        L.append("            if hasattr(modules[block.format(i)], attr):")
        L.append("                setattr(modules[block.format(i)], attr, vals[i])")
        L.append("            elif vals[i] != 1.0:")
        L.append("                raise ValueError(f\"block {i} has no attribute {attr} for the scale {vals[i]}\")")
    L.append("    with torch.no_grad():")
    L.append(f"        for i in range({n}):")
    L.append("            for path, name, split in targets:")
    L.append("                m = modules[block.format(i) + \".\" + path]")
    L.append("                w, b = m.weight, m.bias")
    if splits:
        L.append("                if split is not None:")
        L.append("                    how, k, parts = split")
        if "cols" in splits:
            L.append("                    if how == \"cols\":  # (in, out) weight: column blocks")
            L.append("                        c = w.shape[1] // parts")
            L.append("                        w = w[:, k * c:(k + 1) * c]")
            L.append("                        b = None if b is None else b[k * c:(k + 1) * c]")
        if "heads" in splits:
            L.append("                    if how == \"heads\":  # (out, in) weight, rows interleaved per head")
            L.append("                        heads = w.shape[0] // (parts * d_head)")
            L.append("                        w = w.view(heads, parts, d_head, w.shape[1])[:, k]")
            L.append("                        b = None if b is None else b.view(heads, parts, d_head)[:, k]")
    L.append("                w.normal_(0.0, std[name][i], generator=generator)")
    L.append("                if b is not None:")
    if any_bias:
        L.append("                    b.normal_(0.0, bias_std[name][i], generator=generator)")
    else:
        L.append("                    b.zero_()")
    L.append("        for m in model.modules():")
    L.append("            if type(m).__name__.endswith((\"LayerNorm\", \"RMSNorm\")):")
    gain = _num(lay.norm_gain_weight)
    note = "  # (1 + w) norms: w = 0 is gain 1" if lay.norm_gain_weight == 0.0 else ""
    L.append("                if getattr(m, \"weight\", None) is not None:")
    L.append(f"                    m.weight.fill_({gain}){note}")
    L.append("                if getattr(m, \"bias\", None) is not None:")
    L.append("                    m.bias.zero_()")
    L.append("    return model")
    return "\n".join(L) + "\n"
