"""A whole model's derivation as LaTeX: per-sublayer update maps, the FFN block, the block
gains and the closed forms in N, each with the assumptions it needs.

Sources, never formulas typed here:

* the update maps are composed from the ``layernorm`` and ``residual`` rules with the sympy
  backend, the branch entering through its moment map as undefined functions ``V_k, r_k,
  Gamma_k`` of its input state;
* the FFN block, the block gains and the closed forms come from
  :func:`sigprop.model.symbolic.derive` (``sigprop predict --symbolic``): the FFN block as the
  sympy expressions it derives, the closed forms parsed back from sympy's own string form of
  its ``rsolve``/``product`` results (a line that does not parse is printed as text).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import sympy as sp

from sigprop import registry, symbols
from sigprop.export.document import Page, equation_list, fragment, itemize, standalone
from sigprop.export.typeset import Block, Equation, Layout, Printer, escape_text, tex_width

PAGE = Page(landscape=False, margin_mm=20)

#: the derivation's own symbols (sympy name -> LaTeX), beside the rules' central map
NAMES = {
    # update maps (this module)
    "sigma_s": r"\sigma_{s}", "sigma_next": r"\sigma_{s+1}", "r_s": "r_{s}", "r_next": "r_{s+1}",
    "sigmahat_s": r"\hat{\sigma}_{s}", "rhat_s": r"\hat{r}_{s}", "sigma_z": r"\sigma_{z}", "r_z": "r_{z}",
    "sigma_gs": r"\sigma_{g,s}", "sigma_gnext": r"\sigma_{g,s+1}", "r_gnext": r"r_{g,s+1}", "n_s": "n_{s}",
    # sigprop.model.symbolic
    "d_ff": r"d_{\mathrm{ff}}", "sigma_in": r"\sigma_{\mathrm{in}}", "sigma_out": r"\sigma_{\mathrm{out}}",
    "p_f": r"p_{\mathrm{ffn}}", "p_h": r"p_{\mathrm{h}}", "r_l": "r", "n": "n",
    "sigma2_0": r"\sigma^{2}\left(0\right)", "g2_N": r"\sigma^{2}_{g}\left(N\right)",
}
FUNCTIONS = {
    "V_k": "V_{k}", "r_k": "r_{k}", "Gamma_k": r"\Gamma_{k}", "V_F": "V_{F}", "r_F": "r_{F}",
    "Gamma_F": r"\Gamma_{F}", "v_LN": r"v_{\mathrm{LN}}", "r_LN": r"r_{\mathrm{LN}}",
    "lambda_LN": r"\lambda_{\mathrm{LN}}", "v_RMS": r"v_{\mathrm{RMS}}", "r_RMS": r"r_{\mathrm{RMS}}",
    "lambda_RMS": r"\lambda_{\mathrm{RMS}}", "sigma2": r"\sigma^{2}", "g2": r"\sigma^{2}_{g}",
    "V_A": "V_{A}", "r_A": "r_{A}", "Gamma_A": r"\Gamma_{A}",
}


def printer() -> Printer:
    return Printer(NAMES, FUNCTIONS)


# ------------------------------------------------------------------------------- maps

def _S(name, **kw):
    return sp.Symbol(name, **({"positive": True} if not kw else kw))


def norm_functions(norm: str = "layernorm"):
    """v_N, r_N, lambda_N (N = LN or RMS): the norm rule's forward variance, forward
    correlation and backward gain (gradient variance per unit upstream gradient variance),
    as sympy."""
    from sigprop.rules import get

    tag = registry.norm(norm).tag
    f = get(norm).symbolic()
    lam = f["g_var"].subs(symbols.symbol("g_std"), 1)
    return {f"v_{tag}": (symbols.symbol("x_var"), f["x_var"]), f"r_{tag}": (symbols.symbol("x_corr"), f["x_corr"]),
            f"lambda_{tag}": (symbols.symbol("x_var"), lam)}


def layernorm_functions():
    """:func:`norm_functions` of LayerNorm."""
    return norm_functions("layernorm")


def update_maps(post: bool = False, placement: str | None = None, norm: str = "layernorm",
                parallel: bool = False) -> list[tuple[sp.Basic, sp.Basic]]:
    """[(lhs, rhs)] of one residual unit, composed from the residual rule (skip and branch,
    and the norm scale n as a residual with b = 0, as `sigprop predict` does) and the norm
    functions; the branch enters as V_k, r_k, Gamma_k of its input state.  ``placement``
    (pre, post, peri, output; default: post if ``post`` else pre) sets where the norms sit
    (sigprop.model.blocks.PLACEMENT_NORMS); ``parallel``: the attention (V_A ...) and FFN
    (V_F ...) branches of one norm, summed."""
    import sigprop.backend.symbolic as sm
    from sigprop.model.blocks import PLACEMENT_NORMS
    from sigprop.rules import get
    from sigprop.state import Backward, Forward

    placement = placement or ("post" if post else "pre")
    in_norm, out_norm, post = PLACEMENT_NORMS[placement]
    res = get("residual")
    a, b, n = symbols.symbol("a"), symbols.symbol("b"), _S("n_s")
    s2, r = _S("sigma_s") ** 2, _S("r_s", real=True)
    G, rg = _S("sigma_gnext") ** 2, _S("r_gnext", real=True)
    V, rk, Gam = sp.Function("V_k"), sp.Function("r_k"), sp.Function("Gamma_k")
    tag = registry.norm(norm).tag
    vLN, rLN, lam = sp.Function(f"v_{tag}"), sp.Function(f"r_{tag}"), sp.Function(f"lambda_{tag}")

    def scale(c, state=None, grad=None):
        """The residual rule with skip scale c and no branch (a pure scaling)."""
        p = SimpleNamespace(a=c, b=0, y_mean=0, y_var=0, y_corr=0)
        return res.forward(sm, state, p) if grad is None else res.backward(sm, state, grad, p)

    x = Forward(0, s2, r)
    eqs = []
    if parallel:
        h = scale(n, Forward(0, vLN(s2), rLN(r)))           # n * N(x), shared by both branches
        sh2, rh = _S("sigmahat_s") ** 2, _S("rhat_s", real=True)
        eqs += [(sh2, h.var), (_S("rhat_s", real=True), h.corr)]
        bA, bF = sp.Symbol("b_A", positive=True), sp.Symbol("b_F", positive=True)
        yA = Forward(0, sp.Function("V_A")(sh2, rh), sp.Function("r_A")(sh2, rh))
        yF = Forward(0, sp.Function("V_F")(sh2, rh), sp.Function("r_F")(sh2, rh))
        mid = res.forward(sm, x, SimpleNamespace(a=a, b=bA, y_mean=0, y_var=yA.var, y_corr=yA.corr))
        out = res.forward(sm, mid, SimpleNamespace(a=1, b=bF, y_mean=0, y_var=yF.var, y_corr=yF.corr))
        eqs += [(_S("sigma_next") ** 2, out.var), (_S("r_next", real=True), out.corr)]
        g_top = Backward(G, rg)
        skip = scale(a, grad=g_top)
        branch = (scale(bA, grad=g_top).var * sp.Function("Gamma_A")(sh2, rh)
                  + scale(bF, grad=g_top).var * sp.Function("Gamma_F")(sh2, rh))
        eqs.append((_S("sigma_gs") ** 2, skip.var + scale(n, grad=Backward(branch, rg)).var * lam(s2)))
        return eqs
    if in_norm:
        h = scale(n, Forward(0, vLN(s2), rLN(r)))           # n * N(x)
        sh2, rh = _S("sigmahat_s") ** 2, _S("rhat_s", real=True)
        eqs += [(sh2, h.var), (_S("rhat_s", real=True), h.corr)]
        y = Forward(0, V(sh2, rh), rk(sh2, rh))
        out_gain = 1
        if out_norm:                                       # N on the branch output
            out_gain = lam(y.var)
            y = Forward(0, vLN(y.var), rLN(y.corr))
        out = res.forward(sm, x, SimpleNamespace(a=a, b=b, y_mean=0, y_var=y.var, y_corr=y.corr))
        eqs += [(_S("sigma_next") ** 2, out.var), (_S("r_next", real=True), out.corr)]
        g_top = Backward(G, rg)
        skip = res.backward(sm, x, g_top, SimpleNamespace(a=a, b=b, y_mean=0, y_var=y.var, y_corr=y.corr))
        into_branch = scale(b, grad=g_top)                 # the branch sees b * g
        branch_in = Backward(into_branch.var * out_gain * Gam(sh2, rh), into_branch.corr)
        ln_out = scale(n, grad=branch_in)                   # back through the norm scale
        eqs.append((_S("sigma_gs") ** 2, skip.var + ln_out.var * lam(s2)))
    elif out_norm:                                         # output: x' = a x + b N(F(x))
        y0 = Forward(0, V(s2, r), rk(s2, r))
        y = Forward(0, vLN(y0.var), rLN(y0.corr))
        out = res.forward(sm, x, SimpleNamespace(a=a, b=b, y_mean=0, y_var=y.var, y_corr=y.corr))
        eqs += [(_S("sigma_next") ** 2, out.var), (_S("r_next", real=True), out.corr)]
        g_top = Backward(G, rg)
        skip = scale(a, grad=g_top)
        into_branch = scale(b, grad=g_top)
        eqs.append((_S("sigma_gs") ** 2, skip.var + into_branch.var * lam(y0.var) * Gam(s2, r)))
    else:
        y = Forward(0, V(s2, r), rk(s2, r))
        z = res.forward(sm, x, SimpleNamespace(a=a, b=b, y_mean=0, y_var=y.var, y_corr=y.corr))
        sz2, rz = _S("sigma_z") ** 2, _S("r_z", real=True)
        eqs += [(sz2, z.var), (rz, z.corr), (_S("sigma_next") ** 2, vLN(sz2)), (_S("r_next", real=True), rLN(rz))]
        g_z = Backward(G * lam(sz2), rg)                    # back through the LayerNorm
        skip = scale(a, grad=g_z)
        into_branch = scale(b, grad=g_z)
        eqs.append((_S("sigma_gs") ** 2, skip.var + into_branch.var * Gam(s2, r)))
    return eqs


_PLACEMENT_TITLE = {"pre": "Pre-LN", "post": "Post-LN", "peri": "Peri-LN (norm before and after the branch)",
                    "output": "Output-LN (norm on the branch output)"}


# ------------------------------------------------------------------------------- derive()

_LINE = re.compile(r"^\s*(?:with (?P<cond>[^:]+):\s*)?(?P<lhs>[A-Za-z_][A-Za-z0-9_]*(?:\([^()]*\))?)\s*=\s*"
                   r"(?P<rhs>.+?)(?:\s{2,}\[(?P<note>[^\]]*)\])?\s*$")


def _local_dict():
    from sigprop.model import symbolic as ms

    d = {"l": ms.l, "N": ms.N, "k": ms.k, "sigma2": ms.s, "g2": ms.g, "sigma2_0": ms.s0, "g2_N": ms.gN,
         "r_l": ms.r, "r_g": ms.rg, "RisingFactorial": sp.RisingFactorial, "harmonic": sp.harmonic}
    for name in ("c", "gamma", "Lambda", "rho", "C"):
        d[name] = sp.Symbol(name, positive=True)
    return d


def parse_line(line: str):
    """A line of :func:`derive` output as ``("eq", cond, lhs, rhs, note)`` (sympy objects,
    parsed from sympy's string form) or ``("text", line)``."""
    from sympy.parsing.sympy_parser import parse_expr

    m = _LINE.match(line)
    if m:
        try:
            loc = _local_dict()
            lhs = parse_expr(m.group("lhs"), local_dict=loc)
            rhs = parse_expr(m.group("rhs"), local_dict=loc)
            cond = None
            if m.group("cond"):
                cl, cr = m.group("cond").split("=")
                cond = sp.Eq(parse_expr(cl, local_dict=loc), parse_expr(cr, local_dict=loc), evaluate=False)
            return ("eq", cond, lhs, rhs, m.group("note"))
        except Exception:  # noqa: BLE001  (anything sympy cannot read stays text)
            pass
    return ("text", line.strip())


# ------------------------------------------------------------------------------- document

def _fmt(v) -> str:
    a = np.asarray(v, dtype=float)
    if a.ndim == 0 or np.allclose(a, a.flat[0], rtol=1e-12, atol=0):
        return f"{float(a.flat[0]):.6g}"
    return f"{float(a[0]):.6g} (layer 1) \\dots\\ {float(a[-1]):.6g} (layer {a.size})"


def _settings_table(model) -> str:
    sym = symbols.latex_name
    att, ffn = model.attention, model.ffn

    def placement(col):
        return "post" if col.all() else "pre" if not col.any() else "mixed"

    rows = [
        ("architecture (preset)", escape_text(str(model.arch))),
        ("layers $N$", str(model.n_layers)),
        (f"width ${sym('d')}$, heads ${sym('n_heads')}$, head width ${sym('d_head')}$",
         f"{model.d_model}, {model.n_heads}, {model.d_head}"),
        (f"FFN width ${NAMES['d_ff']}$, activation", f"{model.d_ff}, {escape_text(model.activation)}"),
        (f"sequence length ${sym('L')}$, causal", f"{model.seq_len}, {'yes' if model.causal else 'no'}"),
        ("dropout: attention, hidden $p_{\\mathrm{h}}$, FFN $p_{\\mathrm{ffn}}$",
         f"{model.dropout.attention:g}, {model.dropout.hidden:g}, {model.dropout.ffn_inner:g}"),
        (f"input ${sym('x_mean')}$, ${sym('x_var')}$, ${sym('x_corr')}$",
         f"{model.input.mean:.6g}, {model.input.var:.6g}, {model.input.corr:.6g}"),
        (f"gradient at the top ${sym('g_var')}$, ${sym('g_corr')}$", f"{model.grad.var:.6g}, {model.grad.corr:.6g}"),
    ]
    for kind, col in (("attention", att), ("FFN", ffn)):
        rows.append((f"{kind}: placement", placement(col.post)))
        rows.append((f"{kind}: skip ${sym('a')}$", _fmt(col.skip_scale)))
        rows.append((f"{kind}: branch ${sym('b')}$", _fmt(col.branch_scale)))
        rows.append((f"{kind}: norm scale $n$", _fmt(col.norm_scale)))
    body = "\n".join(f"{k} & {v} \\\\" for k, v in rows)
    return ("\\begin{center}\n\\begin{tabular}{@{}ll@{}}\n\\toprule\n" + body +
            "\n\\bottomrule\n\\end{tabular}\n\\end{center}")


def _block_eqs(pairs, P, width) -> list[Equation]:
    """``lhs = rhs`` pairs laid out for the text width (with any definitions they need)."""
    block = Block(P, Layout(output_width=width, def_width=width))
    for i, (lhs, rhs) in enumerate(pairs):
        lhs_tex = P.doprint(lhs)
        block.add(str(i), lhs_tex, rhs, width=width - 1.5 - tex_width(lhs_tex))
    outs, defs = block.build()
    return defs + list(outs.values())


def model_latex(model, fragment_only: bool = False) -> str:
    """The derivation for one resolved model (:class:`sigprop.model.spec.Model`)."""
    from sigprop.model.spec import require
    from sigprop.model.symbolic import SUPPORTED, derive
    from sigprop.rules import get

    require(model, SUPPORTED, "the LaTeX model export")
    P = printer()
    width = PAGE.textwidth_em * 0.95
    parts = [rf"\section*{{Signal propagation of the {escape_text(str(model.arch))} model, $N = {model.n_layers}$ layers}}",
             _settings_table(model)]

    # -- update maps ------------------------------------------------------------------
    from sigprop.model.spec import PLACEMENTS

    used = sorted(model.attention.placements() | model.ffn.placements(), key=PLACEMENTS.index)
    norm_rule = model.norm
    parts.append(r"\section*{Per-sublayer update maps}")
    parts.append(
        "Sublayer $s$ of kind $k$ (attention $A$ or FFN $F$) maps the stream's variance "
        "$\\sigma_{s}^{2}$ and token correlation $r_{s}$ to those after it, and the gradient "
        "variance $\\sigma_{g,s+1}^{2}$ after it to $\\sigma_{g,s}^{2}$ before it. Composed with "
        "sympy from the \\texttt{residual} rule (skip scale $a$, branch scale $b$; the norm scale "
        f"$n$ as a residual with no branch) and the \\texttt{{{norm_rule}}} rule; the branch, hidden dropout "
        "included, enters through its moment map at its input state: output variance $V_{k}$, output "
        "token correlation $r_{k}$ and backward gain $\\Gamma_{k}$ (gradient variance at its input per "
        "unit gradient variance at its output).")
    tag = registry.norm(norm_rule).tag
    if model.block == "parallel":
        parts.append(r"\subsection*{Parallel blocks (one norm, attention and FFN branches summed)}")
        parts.append(equation_list(_block_eqs(update_maps(norm=norm_rule, parallel=True), P, width)))
    else:
        for placement in used:
            title = _PLACEMENT_TITLE[placement].replace("LN", registry.norm(norm_rule).short) + (" sublayers" if len(used) > 1 else "")
            parts.append(rf"\subsection*{{{title}}}")
            parts.append(equation_list(_block_eqs(update_maps(placement=placement, norm=norm_rule), P, width)))
    parts.append(rf"\subsection*{{Norm functions (\texttt{{{norm_rule}}} rule)}}")
    ln_pairs = [(sp.Function(name)(arg), expr) for name, (arg, expr) in norm_functions(norm_rule).items()]
    parts.append(equation_list(_block_eqs(ln_pairs, P, width)))
    res, ln = get("residual"), get(norm_rule)
    parts.append(r"\noindent\textbf{Assumptions.}")
    parts.append(itemize([escape_text(x) for x in (res.assumptions[0], ln.assumptions[0])] +
                         ["The branch's weights are independent of the stream, so skip and branch paths add "
                          "in the backward pass as in the forward pass."]))

    # -- derive(): FFN block, gains, closed forms ------------------------------------------------
    blocks = derive(model)            # [FFN block, maps (text; composed above instead), gains, closed forms]
    ffn_der = blocks[0]
    parts.append(r"\section*{FFN block}")
    parts.append(escape_text(ffn_der.title) + r"\par")
    n2, rr = sp.Symbol("n", positive=True) ** 2, _local_dict()["r_l"]
    ffn_pairs = [(sp.Function(f)(n2, rr), e) for f, e in zip(("V_F", "r_F", "Gamma_F"), ffn_der.exprs)]
    parts.append(equation_list(_block_eqs(ffn_pairs, P, width)))
    parts.append(r"\noindent\textbf{Assumes:} " + escape_text(ffn_der.assumption) + r"\par")
    for der in blocks[2:]:
        parts.append(rf"\section*{{{escape_text(der.title)}}}")
        if der.pairs:       # definitions as sympy pairs (the attention block): typeset, not parsed
            import sigprop.backend.symbolic as sm

            shown = {f"{sp.sstr(a)} = {sp.sstr(b)}" for a, b in sm.where([b for _, b in der.pairs]) + der.pairs}
            parts.append(itemize([escape_text(x) for x in der.lines if x.strip() and x not in shown]))
            parts.append(equation_list(_block_eqs(der.pairs, P, width)))
            if der.assumption:
                parts.append(r"\noindent\textbf{Assumes:} " + escape_text(der.assumption) + r"\par")
            continue
        texts: list[str] = []
        for line in der.lines:
            if not line.strip():
                continue
            item = parse_line(line)
            if item[0] == "text":
                texts.append(escape_text(item[1]))
                continue
            parts.append(itemize(texts))
            texts = []
            _, cond, lhs, rhs, note = item
            if cond is not None:
                parts.append(r"\noindent with $" + P.doprint(cond) + r"$:\par")
            parts.append(equation_list(_block_eqs([(lhs, rhs)], P, width)))
            if note:
                parts.append(r"{\small " + escape_text(note) + r"}\par\smallskip")
        parts.append(itemize(texts))
        if der.assumption:
            parts.append(r"\noindent\textbf{Assumes:} " + escape_text(der.assumption) + r"\par")
    body = "\n\n".join(p for p in parts if p)
    if fragment_only:
        return fragment(body, f"model {model.arch}")
    return standalone(body, PAGE, f"sigprop model derivation: {model.arch}")
