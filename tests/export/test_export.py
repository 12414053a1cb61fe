"""`sigprop export latex`: golden formula strings, layout, and documents (components, model,
solve; standalone and \\input fragments) that a real LaTeX engine compiles without errors or
overfull boxes, and a proof that the check catches an overfull box.

The compile tests need pdflatex (Debian: texlive-latex-base, texlive-latex-recommended); they
are skipped without it, unless SIGPROP_REQUIRE_LATEX=1 (set by .ci/run), which turns the skip
into a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import sympy as sp

from sigprop.export import components_latex, model_latex, solve_latex
from sigprop.export.components import rule_block
from sigprop.export.document import MACROS, PACKAGES
from sigprop.export.model import parse_line, update_maps
from sigprop.export.typeset import Block, Layout, Printer, tex_width
from sigprop.rules import get

# --------------------------------------------------------------------------- golden strings
# typed from the formulas (theory.md section 2), not produced by the code under test
GOLDEN = {
    ("linear", "x_var"): r"d_{\mathrm{in}} \sigma_{w}^{2} \left(\mu_{x}^{2} + \sigma_{x}^{2}\right) + \sigma_{b}^{2}",
    ("linear", "g_var"): r"d_{\mathrm{out}} \sigma_{g}^{2} \sigma_{w}^{2}",
    ("dropout", "x_var"): r"\frac{\mu_{x}^{2} p + \sigma_{x}^{2}}{1 - p}",
    ("dropout", "g_var"): r"\frac{\sigma_{g}^{2}}{1 - p}",
    ("relu", "x_mean"): r"\frac{\sqrt{2} \sigma_{x}}{2 \sqrt{\pi}}",
    ("relu", "x_var"): r"\frac{\sigma_{x}^{2} \left(-1 + \pi\right)}{2 \pi}",
    ("relu", "x_corr"): r"\frac{- r_{x} \arccos{\left(r_{x} \right)} + \pi r_{x} + \sqrt{1 - r_{x}^{2}} - 1}{-1 + \pi}",
}


@pytest.mark.parametrize("rule,moment", sorted(GOLDEN))
def test_golden_cell_strings(rule, moment):
    cells, defs = rule_block(get(rule))
    assert cells[moment].lines == [GOLDEN[rule, moment]]
    assert defs == []


def test_golden_strings_in_the_document():
    doc = components_latex([get("linear"), get("dropout"), get("relu")], fragment_only=True)
    for (rule, moment), tex in GOLDEN.items():
        assert rf"\sigpropfit{{{tex}}}" in doc
    assert r"\documentclass" not in doc and r"\begin{longtable}" in doc and r"\toprule" in doc


# --------------------------------------------------------------------------- layout

_NAME = re.compile(r"\b([tIS])_\{(\d+)\}")


def _check_definitions(cells, defs):
    """Every name used is defined exactly once, before use, numbered 1, 2, ... per letter."""
    defined = [_NAME.match(d.lhs).groups() for d in defs]
    assert len(set(defined)) == len(defined)
    for letter in "tIS":
        nums = [int(n) for l_, n in defined if l_ == letter]
        assert nums == list(range(1, len(nums) + 1))
    seen = set()
    for d, key in zip(defs, defined):
        for used in _NAME.findall(" ".join(d.lines)):
            assert used in seen, f"{used} used in {key} before its definition"
        seen.add(key)
    for c in cells.values():
        for used in _NAME.findall(" ".join(c.lines)):
            assert used in seen


def test_softmax_integrals_are_named_functions():
    cells, defs = rule_block(get("softmax"))
    _check_definitions(cells, defs)
    assert cells["x_var"].lines == ["I_{4}"]
    integrals = [d for d in defs if d.kind == "integral"]
    assert len(integrals) == 7 and all(r"\int\limits" in d.body() for d in integrals)
    # I_1(u): the inner Gaussian smoothing over epsilon, a function of the outer variable u
    assert integrals[0].lhs == r"I_{1}{\left(u \right)}" and r"\, d\varepsilon" in integrals[0].body()
    # no backend dummy names (e_{12}, u_{3}) reach the page
    text = " ".join(" ".join(d.lines) for d in defs)
    assert not re.search(r"\b[euxsw]_\{\d+\}", text)


def test_gelu_long_formulas_get_auxiliary_names_that_fit():
    cells, defs = rule_block(get("gelu"))
    _check_definitions(cells, defs)
    assert defs, "the exact GeLU moments do not fit a table cell unnamed"
    from sigprop.export.components import _column_em

    for key, c in cells.items():
        assert all(tex_width(x) <= _column_em(key) for x in c.lines), (key, c.lines)


def test_long_sum_breaks_at_plus_signs():
    xs = sp.symbols("x_1:31")
    block = Block(Printer(), Layout(output_width=20.0, def_width=40.0, output_lines=10))
    block.add("s", "s", sp.Add(*xs))
    cells, defs = block.build()
    lines = cells["s"].lines
    assert defs == [] and len(lines) > 1
    assert all(tex_width(x) <= 20.0 for x in lines)
    assert all(x.startswith("+ ") for x in lines[1:])
    # the terms in sympy's own printing order, each once, none lost
    order = re.findall(r"x_\{(\d+)\}", sp.latex(sp.Add(*xs)))
    assert re.findall(r"x_\{(\d+)\}", " ".join(lines)) == order and len(order) == 30
    assert r"\begin{aligned}[t]" in cells["s"].body()


def test_too_many_lines_become_named_parts():
    xs = sp.symbols("x_1:61")
    block = Block(Printer(), Layout(output_width=12.0, def_width=30.0, output_lines=2, def_lines=4))
    block.add("s", "s", sp.Add(*xs))
    cells, defs = block.build()
    _check_definitions(cells, defs)
    assert len(cells["s"].lines) <= 2 and all(len(d.lines) <= 4 for d in defs)
    found = [int(n) for d in defs for n in re.findall(r"x_\{(\d+)\}", " ".join(d.lines))]
    assert sorted(found) == list(range(1, 61))


# widths measured with pdflatex (10 pt Computer Modern, display style), in em
MEASURED = [
    (r"\frac{\left(e^{x} - 1\right) e^{y}}{\left(\left(L - 1\right) e^{z} + 1\right)^{2}}", 7.46),
    (r"e^{\frac{L \sigma_{x}^{2} \left(1 - r_{x}\right)}{L - 1}}", 4.29),
    (r"a + b", 2.18),
    (r"\left(\frac{a}{b}\right)", 1.96),
    (r"d_{\mathrm{out}}", 1.72),
    (r"2 r_{g} \left(\frac{\arcsin{\left(r_{x} \right)}}{2 \pi} + \frac{1}{4}\right)", 9.7),
]


@pytest.mark.parametrize("tex,em", MEASURED)
def test_width_estimate_against_tex(tex, em):
    assert tex_width(tex) == pytest.approx(em, rel=0.15)


# --------------------------------------------------------------------------- model

def test_update_maps_are_the_residual_and_layernorm_rules_composed():
    a, b = sp.Symbol("a", real=True), sp.Symbol("b", real=True)
    V, Gam = sp.Function("V_k"), sp.Function("Gamma_k")
    vLN, lam = sp.Function("v_LN"), sp.Function("lambda_LN")
    s, n = sp.Symbol("sigma_s", positive=True), sp.Symbol("n_s", positive=True)
    G = sp.Symbol("sigma_gnext", positive=True) ** 2
    sh2, rh = sp.Symbol("sigmahat_s", positive=True) ** 2, sp.Symbol("rhat_s", real=True)
    pre = dict((str(k), v) for k, v in update_maps(post=False))
    assert sp.simplify(pre["sigmahat_s**2"] - n**2 * vLN(s**2)) == 0
    assert sp.simplify(pre["sigma_next**2"] - (a**2 * s**2 + b**2 * V(sh2, rh))) == 0
    assert sp.expand(pre["sigma_gs**2"] - G * (a**2 + b**2 * n**2 * Gam(sh2, rh) * lam(s**2))) == 0
    post = dict((str(k), v) for k, v in update_maps(post=True))
    sz2, r = sp.Symbol("sigma_z", positive=True) ** 2, sp.Symbol("r_s", real=True)
    assert post["sigma_next**2"] == vLN(sz2)
    assert sp.expand(post["sigma_gs**2"] - G * lam(sz2) * (a**2 + b**2 * Gam(s**2, r))) == 0


def test_update_maps_for_the_other_layouts():
    """peri: the branch output passes the norm (v_N of its variance) and its backward gain;
    output: no input norm; parallel: both branches of one norm summed; RMSNorm: its own
    functions."""
    a, b = sp.Symbol("a", real=True), sp.Symbol("b", real=True)
    V, Gam = sp.Function("V_k"), sp.Function("Gamma_k")
    s, n = sp.Symbol("sigma_s", positive=True), sp.Symbol("n_s", positive=True)
    G = sp.Symbol("sigma_gnext", positive=True) ** 2
    sh2, rh = sp.Symbol("sigmahat_s", positive=True) ** 2, sp.Symbol("rhat_s", real=True)
    r = sp.Symbol("r_s", real=True)
    vLN, lam = sp.Function("v_LN"), sp.Function("lambda_LN")
    peri = dict((str(k), v) for k, v in update_maps(placement="peri"))
    assert sp.simplify(peri["sigma_next**2"] - (a**2 * s**2 + b**2 * vLN(V(sh2, rh)))) == 0
    assert sp.expand(peri["sigma_gs**2"] - G * (a**2 + b**2 * n**2 * lam(V(sh2, rh)) * Gam(sh2, rh) * lam(s**2))) == 0
    out = dict((str(k), v) for k, v in update_maps(placement="output"))
    assert "sigmahat_s**2" not in out
    assert sp.simplify(out["sigma_next**2"] - (a**2 * s**2 + b**2 * vLN(V(s**2, r)))) == 0
    assert sp.expand(out["sigma_gs**2"] - G * (a**2 + b**2 * lam(V(s**2, r)) * Gam(s**2, r))) == 0
    par = dict((str(k), v) for k, v in update_maps(parallel=True, norm="rmsnorm"))
    bA, bF = sp.Symbol("b_A", positive=True), sp.Symbol("b_F", positive=True)
    VA, VF = sp.Function("V_A")(sh2, rh), sp.Function("V_F")(sh2, rh)
    assert sp.simplify(par["sigma_next**2"] - (a**2 * s**2 + bA**2 * VA + bF**2 * VF)) == 0
    lrms = sp.Function("lambda_RMS")
    GA, GF = sp.Function("Gamma_A")(sh2, rh), sp.Function("Gamma_F")(sh2, rh)
    assert sp.expand(par["sigma_gs**2"] - G * (a**2 + n**2 * (bA**2 * GA + bF**2 * GF) * lrms(s**2))) == 0


def test_closed_form_lines_parse_back_into_sympy():
    kind, cond, lhs, rhs, note = parse_line("sigma2(l) = c*l + sigma2_0   [rsolve of sigma2(l+1) = sigma2(l) + c]")
    assert kind == "eq" and cond is None and note.startswith("rsolve")
    l_, c, s0 = sp.Symbol("l", integer=True, nonnegative=True), sp.Symbol("c", positive=True), sp.Symbol("sigma2_0", positive=True)
    assert sp.simplify(rhs - (c * l_ + s0)) == 0 and str(lhs) == "sigma2(l)"
    kind, cond, *_ = parse_line("  with gamma = c: g2(l) = g2_N * (N*c + sigma2_0)/(c*l + sigma2_0)   [telescopes]")
    assert kind == "eq" and str(cond) == "Eq(gamma, c)"
    assert parse_line("numbers: c = 0.0016; closed form at N = 4: 1.00657")[0] == "text"


# --------------------------------------------------------------------------- command line

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sigprop", "export", "latex", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_solve_defaults_to_24_layers_and_follows_the_verdict():
    """--what solve as typed: 24 layers (as predict and solve-init), unit-variance feasible with
    the gradient ratio it reaches; --strict gives the infeasible verdict."""
    r = _cli("--what", "solve", "--d-model", "64", "--heads", "2", "--d-ff", "128", "--seq-len", "16")
    assert r.returncode == 0, r.stderr
    assert "$N = 24$ layers" in r.stdout
    assert r"\textbf{Result:} feasible: forward variance within 0.01" in r.stdout
    assert "input/output $g_0/g_N$ = 0." in r.stdout and r"\textbf{Note:} Exact unit gradient variance" in r.stdout
    r = _cli("--what", "solve", "--strict", "--layers", "2", "--d-model", "64", "--heads", "2", "--d-ff", "128",
             "--seq-len", "16")
    assert r.returncode == 0, r.stderr
    assert r"\textbf{Result:} infeasible: unit-variance \texttt{-{}-strict}" in r.stdout
    r = _cli("--what", "components", "--strict")
    assert r.returncode == 2 and r.stdout == ""


_MATH = re.compile(r"\$[^$]*\$|\\texttt\{[^{}]*(?:\{\}[^{}]*)*\}")


def _prose(doc: str) -> str:
    """The text of the derivation's paragraphs, math and typewriter parts removed."""
    paras = [ln for ln in doc.splitlines() if ln.startswith(r"\noindent\textbf{")]
    return "\n".join(_MATH.sub(" ", p) for p in paras)


@pytest.mark.parametrize("target,arch,kw", [("unit-variance", "preln", {}), ("unit-variance", "postln", {"strict": True}),
                                           ("unit-forward", "preln", {}), ("logit-var", "lns", {"value": 2.0}),
                                           ("max-depth", "preln", {"max_ratio": 3.0, "n_max": 8})])
def test_solve_prose_is_plain_latex(target, arch, kw):
    """No ASCII mathematics in the sentences: no lambda^2 (typeset as a circumflex), no
    sigma_q (an escaped underscore), no --target (LaTeX joins the dashes), no Greek names as
    words; every formula in math mode."""
    from sigprop.solve import solve

    opts = dict(d_model=64, n_heads=2, d_ff=128, seq_len=16)
    if target != "max-depth":
        opts["n_layers"] = 3
    doc = solve_latex(solve(target, arch=arch, **kw, **opts))
    prose = _prose(doc)
    assert prose.count(r"\textbf{") >= 4
    for bad in (r"\^{}", r"\_", "--", "->", "<=", "V-hat"):
        assert bad not in prose, (bad, [ln for ln in prose.splitlines() if bad in ln][:2])
    words = re.findall(r"(?<![\\A-Za-z])(lambda|beta|sigma|Gamma|rho|ell|sqrt)(?![A-Za-z])", prose)
    assert words == [], words
    assert "$" in doc and r"\lambda" in doc or target in ("logit-var", "max-depth")


@pytest.mark.parametrize("args", [["--what", "nope"], ["--layers", "3"], ["--value", "1"]])
def test_cli_bad_input_exits_2(args):
    r = _cli(*args)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr and r.stderr.strip()


def test_cli_writes_the_file(tmp_path):
    out = tmp_path / "t.tex"
    r = _cli("--rule", "dropout", "--fragment", "-o", str(out))
    assert r.returncode == 0 and r.stdout == ""
    assert rf"\sigpropfit{{{GOLDEN['dropout', 'x_var']}}}" in out.read_text()


# --------------------------------------------------------------------------- compiling

def _engine():
    exe = shutil.which("pdflatex")
    if exe is None:
        if os.environ.get("SIGPROP_REQUIRE_LATEX") == "1":
            pytest.fail("pdflatex not found but SIGPROP_REQUIRE_LATEX=1 (apt-get install texlive-latex-base "
                        "texlive-latex-recommended)")
        pytest.skip("pdflatex not installed")
    return exe


def latex_problems(log: str) -> list[str]:
    """LaTeX errors ("! ...") and overfull boxes in a pdflatex log."""
    return [ln for ln in log.splitlines() if ln.startswith("! ") or ln.startswith("Overfull \\hbox")
            or ln.startswith("Overfull \\vbox")]


def compile_tex(tex: str, tmp_path, name: str = "doc"):
    """(problems, log, pdf path) of one pdflatex run on ``tex``."""
    exe = _engine()
    src = tmp_path / f"{name}.tex"
    src.write_text(tex)
    r = subprocess.run([exe, "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", src.name],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    log = (tmp_path / f"{name}.log").read_text(errors="replace")
    problems = latex_problems(log)
    if r.returncode != 0 and not problems:
        problems = [f"pdflatex exit {r.returncode}"]
    return problems, log, tmp_path / f"{name}.pdf"


def _scales(log: str) -> list[float]:
    return [float(b) / float(a) for a, b in re.findall(r"sigprop-fit: scaled ([\d.]+)pt to ([\d.]+)pt", log)]


def _wrap(body: str, geometry: str) -> str:
    return "\n".join([r"\documentclass[10pt]{article}", rf"\usepackage[{geometry}]{{geometry}}",
                      rf"\usepackage{{{','.join(PACKAGES)}}}", r"\begin{document}", body, r"\end{document}"])


@pytest.fixture(scope="module")
def components_doc():
    return components_latex()


def test_components_document_compiles(components_doc, tmp_path):
    problems, log, pdf = compile_tex(components_doc, tmp_path)
    assert problems == [], problems
    assert pdf.stat().st_size > 10_000
    assert all(s >= 0.75 for s in _scales(log)), _scales(log)


def test_components_fragment_compiles_when_input(tmp_path):
    frag = components_latex([get(n) for n in ("linear", "gelu", "softmax", "layernorm")], fragment_only=True)
    (tmp_path / "table.tex").write_text(frag)
    problems, log, _ = compile_tex(_wrap(r"\input{table}", "a4paper,landscape,margin=12mm"), tmp_path)
    assert problems == [], problems
    # a portrait page with LaTeX's default margins is far too narrow for six columns: the
    # formulas are scaled down, but nothing may run off the page
    problems, log, _ = compile_tex(_wrap(r"\input{table}", "a4paper"), tmp_path, "narrow")
    assert problems == [], problems
    assert len(_scales(log)) > 0


@pytest.mark.parametrize("arch", ["postln", "mixln", "preln", "dslm", "lns"])  # mixln: Pre-LN and Post-LN sublayers
def test_model_document_compiles(arch, tmp_path):
    from sigprop.model import presets

    model = presets.resolve(arch=arch, n_layers=4, d_model=64, n_heads=4, seq_len=16)
    doc = model_latex(model)
    assert (r"\subsection*{Pre-LN" in doc) == (arch in ("mixln", "preln", "dslm", "lns"))
    assert (r"\subsection*{Post-LN" in doc) == (arch in ("mixln", "postln"))
    # every closed form with its error against the layer-by-layer value (none for Mix-LN)
    assert ("relative error" in doc) == (arch != "mixln")
    problems, log, _ = compile_tex(doc, tmp_path)
    assert problems == [], problems
    assert _scales(log) == []
    problems, _, _ = compile_tex(_wrap(model_latex(model, fragment_only=True), "a4paper,margin=20mm"), tmp_path, "frag")
    assert problems == [], problems


@pytest.mark.parametrize("layout", ["peri", "output", "parallel"])
def test_model_document_compiles_for_each_layout(layout, tmp_path):
    from sigprop.model import presets
    from sigprop.model.spec import Sublayers

    m = presets.resolve(arch="preln", n_layers=4, d_model=64, n_heads=4, seq_len=16)
    if layout == "parallel":
        model = m.replace(block="parallel", norm="rmsnorm")
    else:
        model = m.replace(**{k: Sublayers(k, layout, getattr(m, k).skip_scale, getattr(m, k).branch_scale,
                                          getattr(m, k).norm_scale, getattr(m, k).std, getattr(m, k).bias_std)
                             for k in ("attention", "ffn")})
    doc = model_latex(model)
    assert (r"\subsection*{Parallel" in doc) == (layout == "parallel")
    assert (r"\subsection*{Peri-LN" in doc) == (layout == "peri")
    problems, log, _ = compile_tex(doc, tmp_path)
    assert problems == [], problems


@pytest.mark.parametrize("target,arch,strict", [("unit-variance", "preln", False), ("unit-variance", "postln", True),
                                                ("unit-forward", "postln", False)])
def test_solve_document_compiles(target, arch, strict, tmp_path):
    from sigprop.solve import solve, steps

    sol = solve(target, arch=arch, n_layers=2, d_model=64, n_heads=4, seq_len=16, strict=strict)
    assert sol.feasible != strict
    doc = solve_latex(sol)
    n_steps = len(steps(sol))
    assert len(re.findall(r"\\noindent\\textbf\{\d+\.\}", doc)) == n_steps
    assert r"\sigma_{q}" in doc and r"\ell" in doc and "sigma_{" not in doc.replace(r"\sigma_{", "")
    problems, log, _ = compile_tex(doc, tmp_path)
    assert problems == [], problems
    assert all(x >= 0.75 for x in _scales(log)), _scales(log)


TOO_WIDE = r"\[ " + " + ".join(rf"\frac{{x_{{{i}}}}}{{1 + y_{{{i}}}}}" for i in range(40)) + r" \]"


def test_the_check_catches_an_overfull_box_and_an_error(tmp_path):
    problems, _, _ = compile_tex(_wrap(TOO_WIDE, "a4paper"), tmp_path, "wide")
    assert any(p.startswith("Overfull \\hbox") for p in problems)
    problems, _, _ = compile_tex(_wrap(r"\vbox to 1.5\textheight{\hrule\vfil}", "a4paper"), tmp_path, "tall")
    assert any(p.startswith("Overfull \\vbox") for p in problems)
    problems, _, _ = compile_tex(_wrap(r"\undefinedmacro", "a4paper"), tmp_path, "err")
    assert any(p.startswith("! Undefined control sequence") for p in problems)


def test_sigpropfit_scales_what_the_estimate_missed(tmp_path):
    body = MACROS + "\n" + TOO_WIDE.replace(r"\[ ", r"\[ \sigpropfit{").replace(r" \]", r"} \]")
    problems, log, _ = compile_tex(_wrap(body, "a4paper"), tmp_path, "fit")
    assert problems == [] and len(_scales(log)) == 1 and _scales(log)[0] < 0.8


# --------------------------------------------------------------------------- modern attention
# typed from the definitions (the Fejer mean of cos((i - k) phi) over the n (n - 1) ordered
# pairs of distinct positions; kbar the mean of (2/d_h) sum_i cos(t b^(-2i/d_h)) over them)
GOLDEN_FEJER = (r"\begin{cases} 1 & \text{for}\: \sin{\left(\frac{\phi}{2} \right)} = 0 \\"
                r"\frac{- n + \frac{\sin^{2}{\left(\frac{n \phi}{2} \right)}}{\sin^{2}{\left(\frac{\phi}{2} \right)}}}"
                r"{n \left(n - 1\right)} & \text{otherwise} \end{cases}")
GOLDEN_GAMMA = (r"\frac{s^{-1 + \frac{1}{\delta}} \left(\delta m\right)^{- \frac{1}{\delta}} "
                r"e^{- \frac{s}{\delta m}}}{\Gamma\left(\frac{1}{\delta}\right)}")


@pytest.fixture(scope="module")
def attention_block():
    return rule_block(get("attention"))


def test_attention_cells_branch_on_the_rotary_base(attention_block):
    """The component table's attention cells: the rotary branch and the plain one."""
    cells, defs = attention_block
    _check_definitions(cells, [d for d in defs if d.kind != "named"])
    for key in ("x_var", "x_corr", "g_var", "g_corr"):
        assert re.fullmatch(r"\\begin\{cases\} t_\{\d+\} & \\text\{for\}\\: b_\{\\mathrm\{rope\}\} = 0 \\\\"
                            r"t_\{\d+\} & \\text\{otherwise\} \\end\{cases\}", cells[key].body()), cells[key].body()
    body = " ".join(" ".join(d.lines) for d in defs)
    assert r"\nu_{qk}" in body and r"\epsilon_{qk}" in body          # the QK-norm branches


def test_attention_named_quantities_defined_once(attention_block):
    """The rotary cosine-sum factor, the Fejer mean, the softmax row statistics and the Gamma
    density: each defined exactly once, in sympy's LaTeX of the definitions."""
    _, defs = attention_block
    named = {d.lhs: d for d in defs if d.kind == "named"}
    assert len(named) == len([d for d in defs if d.kind == "named"])
    assert named[r"F\left(n, \phi\right)"].lines == [GOLDEN_FEJER]
    assert named[r"g_{\Gamma}\left(s, m, \delta\right)"].lines == [GOLDEN_GAMMA]
    kb = named[r"\bar{\kappa}\left(n\right)"].lines
    m = re.fullmatch(r"\\frac\{2 (S_\{\d+\})\{\\left\(n \\right\)\}\}\{d_\{h\}\}", kb[0])
    assert m, kb
    sums = {d.lhs: d.lines for d in defs if d.kind == "sum"}
    assert sums[m.group(1) + r"{\left(n \right)}"] == [
        r"\sum_{i=0}^{\frac{d_{h}}{2} - 1} F\left(n, b_{\mathrm{rope}}^{- \frac{2 i}{d_{h}}}\right)"]
    for lhs in (r"A_{2}\left(v, n\right)", r"A_{2}^{(4)}\left(v, n\right)", r"C_{2}\left(v, \rho, L\right)",
                r"W_{\kappa}\left(n\right)", r"M_{\kappa}\left(n\right)", r"\kappa_{f}\left(n\right)"):
        assert lhs in named, lhs


@pytest.mark.parametrize("arch", ["llama", "olmo2"])
def test_modern_model_export_has_the_rotary_and_qknorm_terms(arch):
    """`sigprop export` of a LLaMA / OLMo 2 model: an attention section with the rotary
    cosine-sum factor and its Fejer mean (and, for OLMo 2, the QK-norm mean row logit
    variance), printed from the attention rule's definitions."""
    from sigprop.model import presets

    model = presets.resolve(arch=arch, n_layers=4, d_model=64, n_heads=4, seq_len=16)
    doc = model_latex(model, fragment_only=True)
    assert r"\section*{Attention block" in doc
    assert r"\sigpropeq{F\left(n, \phi\right) = " + GOLDEN_FEJER + "}" in doc
    base = {"llama": "10000.0", "olmo2": "500000.0"}[arch]
    # d_head 16: the sum over its 8 frequency planes, theta_i = base^(-2i/16) = base^(-i/8)
    assert r"\sum_{i=0}^{7} F\left(n, {" + base + r"}^{- \frac{i}{8}}\right)" in doc
    assert re.search(r"\\bar\{\\kappa\}\\left\(n\\right\) = \\frac\{S_\{\d+\}\{\\left\(n \\right\)\}\}\{8\}", doc)
    assert (r"\bar{v}{\left(r \right)}" in doc) == (arch == "olmo2")
    assert doc.count(r"\sigpropeq{F\left(n, \phi\right)") == 1


@pytest.mark.parametrize("arch", ["llama", "olmo2"])
def test_modern_model_document_compiles(arch, tmp_path):
    from sigprop.model import presets

    model = presets.resolve(arch=arch, n_layers=4, d_model=64, n_heads=4, seq_len=16)
    problems, log, _ = compile_tex(model_latex(model), tmp_path)
    assert problems == [], problems
