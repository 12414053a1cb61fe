"""Typesetting sympy expressions as LaTeX that stays inside the page.

Three tools, all pure (strings in, strings out; no TeX run):

* :class:`Printer`: sympy's LaTeX printer with the symbol names of :mod:`sigprop.symbols`
  (looked up by name, so a derivation's own symbol with other assumptions still gets its
  paper notation), ``\\arccos`` rather than ``\\operatorname{acos}``;
* :func:`tex_width`: an estimate of the typeset width (in em, display style) of a LaTeX math
  string, from its structure (fractions stack, scripts shrink, ...);
* :class:`Block`: turns named expressions into displayable equations that fit a width:
  integrals and sums become named functions of their free integration variables
  (``I_k(u)``, ``S_k``), large blocks go through common-subexpression elimination, and
  whatever is still too wide is broken at top-level ``+``/``-`` signs or has its widest
  subexpression named (``t_k``).

Every formula that reaches the page comes out of sympy's printer; the only LaTeX written
here is structure (``aligned``, table rules) and the :data:`MACROS` that scale a formula down
if, against the estimate, TeX finds it wider than the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.printing.latex import LatexPrinter

from sigprop import symbols
from sigprop.backend.symbolic import Defined, display_symbols

# --------------------------------------------------------------------------- printing


def symbol_table(extra: dict | None = None) -> dict[str, str]:
    """sympy symbol *name* -> LaTeX, from :data:`sigprop.symbols.SPEC` (plus ``extra``)."""
    table = {symbols.plain_name(n): latex for n, (latex, _) in symbols.SPEC.items()}
    table.update(extra or {})
    return table


class Printer(LatexPrinter):
    """sympy's LaTeX printer with sigprop's symbol names (matched by symbol name)."""

    def __init__(self, names: dict[str, str] | None = None, functions: dict[str, str] | None = None,
                 **settings):
        settings.setdefault("inv_trig_style", "full")
        super().__init__(settings)
        self._names = symbol_table(names)
        self._functions = dict(functions or {})

    def _print_Symbol(self, expr, style="plain"):
        if expr.name in self._names:
            return self._names[expr.name]
        return super()._print_Symbol(expr, style)

    def _print_Function(self, expr, exp=None):
        name = expr.func.__name__
        if isinstance(expr, AppliedUndef) and name in self._functions:
            tex = r"%s\left(%s\right)" % (self._functions[name], ", ".join(self._print(a) for a in expr.args))
            return tex if exp is None else r"\left(%s\right)^{%s}" % (tex, exp)
        return super()._print_Function(expr, exp)

    def add_terms(self, expr) -> list[tuple[str, str, sp.Basic]]:
        """The terms of a sum as sympy's ``_print_Add`` orders and signs them:
        ``[(sign, tex, term)]`` with sign "" for the first term, else "+" or "-"."""
        out = []
        for i, term in enumerate(self._as_ordered_terms(expr)):
            sign = ""
            if i:
                sign = "+"
                if term.could_extract_minus_sign():
                    sign, term = "-", -term
            tex = self._print(term)
            if self._needs_add_brackets(term):
                tex = r"\left(%s\right)" % tex
            out.append((sign, tex, term))
        return out


def escape_text(s: str) -> str:
    """Plain text for a LaTeX paragraph (assumptions, notes, titles)."""
    return "".join(_TEXT_ESCAPES.get(c, c) if ord(c) < 128 else _unicode(c) for c in s)


# only OT1 glyphs and math (no text-companion fonts, which would need METAFONT at run time)
_TEXT_ESCAPES = {"\\": r"$\backslash$", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\~{}", "^": r"\^{}", "<": r"$<$", ">": r"$>$",
                 "|": r"$\vert$"}
_UNICODE = {"±": r"$\pm$", "≤": r"$\le$", "≥": r"$\ge$", "≈": r"$\approx$", "×": r"$\times$",
            "→": r"$\to$", "–": "--", "—": "---", "’": "'", "‘": "`", "“": "``", "”": "''", "…": "...",
            "√": r"$\surd$", "∞": r"$\infty$", "·": r"$\cdot$", "−": "-"}


def _unicode(c: str) -> str:
    if c in _UNICODE:
        return _UNICODE[c]
    import unicodedata

    name = unicodedata.name(c, "")
    if name.startswith("GREEK SMALL LETTER ") or name.startswith("GREEK CAPITAL LETTER "):
        greek = name.split("LETTER ")[1].lower()
        greek = greek.capitalize() if "CAPITAL" in name else greek
        return rf"$\{greek}$"
    return "?"


# --------------------------------------------------------------------------- width estimate

# em widths of glyphs in Computer Modern at 10 pt (approximate, slightly generous)
_CHAR = 0.52
_DIGIT = 0.5
_UPPER = 0.72
_BIN = 0.78 + 2 * 0.222       # + - with \medmuskip on both sides
_REL = 0.78 + 2 * 0.278       # = with \thickmuskip
_STYLE_SCALE = (1.0, 1.0, 0.8, 0.65)  # display, text, script, scriptscript (7 and 5 pt fonts are relatively wide)
_SPACES = {r"\,": 0.167, r"\:": 0.222, r"\;": 0.278, r"\!": -0.167, r"\ ": 0.333, r"\quad": 1.0,
           r"\qquad": 2.0, r"\cdot": _BIN, r"\times": _BIN, r"\pm": _BIN, r"\mp": _BIN}
_BIG_OPS = {r"\int", r"\sum", r"\prod", r"\iint"}
_RELS = {"=", "<", ">", r"\leq", r"\geq", r"\le", r"\ge", r"\approx", r"\neq", r"\to", r"\equiv",
         r"\sim", r"\propto", r"\mapsto", r"\rightarrow"}
_TEXT_CMDS = {r"\mathrm", r"\text", r"\operatorname", r"\mathit", r"\textrm", r"\mathbf"}
_OPERATORS = {"arcsin", "arccos", "arctan", "sin", "cos", "tan", "sinh", "cosh", "tanh", "log", "ln",
              "exp", "max", "min", "det", "lim", "sup", "inf", "arg", "Pr", "operatorname"}
_TOKEN = re.compile(r"\\[A-Za-z]+\*?|\\.|[{}^_&]|[^\\{}^_&\s]|\s+")


def tex_width(tex: str) -> float:
    """Estimated width in em (10 pt font, display style) of a LaTeX math string."""
    toks = [t for t in _TOKEN.findall(tex) if not t.isspace()]
    w, _ = _parse(toks, 0, 0, stop=None)
    return w


def _group(toks, i, style):
    """Width of the argument starting at toks[i]: a {group} or a single token."""
    if i >= len(toks):
        return 0.0, i
    if toks[i] == "{":
        return _parse(toks, i + 1, style, stop="}")
    return _parse(toks[i:i + 1], 0, style, stop=None)[0], i + 1


def _raw_group(toks, i):
    """The tokens of a {group} (for \\text{...}, \\begin{...})."""
    if i < len(toks) and toks[i] == "{":
        depth, j = 1, i + 1
        while j < len(toks) and depth:
            depth += {"{": 1, "}": -1}.get(toks[j], 0)
            j += 1
        return toks[i + 1:j - 1], j
    return toks[i:i + 1], i + 1


def _parse(toks, i, style, stop):
    """Sum of widths up to the closing ``stop`` token; returns (width, index after it)."""
    scale = _STYLE_SCALE[min(style, 3)]
    total = 0.0
    last_was_atom = False          # binary + after an atom is spaced; a leading - is not
    limits = False                 # the previous token was a big operator with \limits
    op_width = 0.0
    while i < len(toks):
        t = toks[i]
        if t == stop:
            return total, i + 1
        i += 1
        if t in ("^", "_"):
            # sub/superscript: script style; a sub/sup pair shares its horizontal space
            w, i = _group(toks, i, max(style, 1) + 1 if style < 2 else 3)
            if limits:
                total += max(0.0, w - op_width)
                op_width = max(op_width, w)
            else:
                total += w
                if i < len(toks) and toks[i] in ("^", "_"):
                    w2, i = _group(toks, i + 1, max(style, 1) + 1 if style < 2 else 3)
                    total += max(0.0, w2 - w)
            continue
        limits = limits and t == r"\limits"
        if t == "{":
            w, i = _parse(toks, i, style, "}")
            total += w
            last_was_atom = True
        elif t in (r"\frac", r"\dfrac", r"\tfrac", r"\binom"):
            inner = {r"\dfrac": 1, r"\tfrac": 2}.get(t, style + 1)
            inner = max(inner, 1)
            a, i = _group(toks, i, inner)
            b, i = _group(toks, i, inner)
            total += max(a, b) + 0.24 * scale
            last_was_atom = True
        elif t == r"\sqrt":
            if i < len(toks) and toks[i] == "[":
                while i < len(toks) and toks[i] != "]":
                    i += 1
                i += 1
            w, i = _group(toks, i, style)
            total += w + 0.9 * scale
            last_was_atom = True
        elif t in (r"\left", r"\right", r"\big", r"\Big", r"\bigg", r"\Bigg"):
            if i < len(toks):
                d = toks[i]
                i += 1
                total += 0.0 if d == "." else 0.55 * scale
            last_was_atom = t != r"\left"
        elif t in _TEXT_CMDS:
            raw, i = _raw_group(toks, i)
            total += sum(0.5 if len(x) == 1 else 0.6 for x in raw) * scale + (0.17 if t == r"\operatorname" else 0)
            last_was_atom = True
        elif t == r"\begin":
            env, i = _raw_group(toks, i)
            env = "".join(env)
            if env.startswith("array") or env.startswith("tabular"):
                _, i = _raw_group(toks, i)
            w, i = _environment(toks, i, style, env)
            total += w
            last_was_atom = True
        elif t == r"\end":
            _, i = _raw_group(toks, i)
        elif t in _BIG_OPS:
            op_width = (1.0 if style == 0 else 0.6) * scale
            total += op_width + 0.1
            limits = style == 0 or (i < len(toks) and toks[i] == r"\limits")
            last_was_atom = False
        elif t in _SPACES:
            total += _SPACES[t] * (scale if style >= 2 else 1.0)
            last_was_atom = False
        elif t in _RELS:
            total += (_REL if style < 2 else 0.78) * scale
            last_was_atom = False
        elif t in ("+", "-"):
            total += (_BIN if (last_was_atom and style < 2) else 0.78) * scale
            last_was_atom = False
        elif t == ",":
            total += 0.28 * scale + (0.167 if style < 2 else 0)
            last_was_atom = False
        elif t in ("(", ")", "[", "]", "|", "/"):
            total += 0.39 * scale
            last_was_atom = t in (")", "]", "|")
        elif t == "&":
            last_was_atom = False
        elif t[1:] in _OPERATORS:
            total += (0.45 * len(t[1:]) + 0.12) * scale
            last_was_atom = True
        elif t.startswith("\\"):
            total += (1.0 if t == r"\infty" else 0.62) * scale
            last_was_atom = True
        else:
            total += (_DIGIT if t.isdigit() else _UPPER if t.isupper() else _CHAR) * scale
            last_was_atom = True
    return total, i


def _environment(toks, i, style, env):
    """Width of cases/aligned/matrix-like environments: widest row, columns added."""
    rows, row, cell = [], [], []
    depth = 0
    while i < len(toks):
        t = toks[i]
        if t == r"\end" and depth == 0:
            _, i = _raw_group(toks, i + 1)
            break
        if t == r"\begin":
            depth += 1
        elif t == r"\end":
            depth -= 1
        i += 1
        if depth == 0 and t == "&":
            row.append(cell)
            cell = []
        elif depth == 0 and t == r"\\":
            row.append(cell)
            rows.append(row)
            row, cell = [], []
        else:
            cell.append(t)
    row.append(cell)
    rows.append(row)
    inner = 1 if env == "cases" else style
    ncol = max(len(r) for r in rows)
    cols = [0.0] * ncol
    for r in rows:
        for k, c in enumerate(r):
            cols[k] = max(cols[k], _parse(c, 0, inner, None)[0])
    extra = {"cases": 0.9 + 1.0 * (ncol - 1)}.get(env, 0.5 * (ncol - 1))
    return sum(cols) + extra, i


# --------------------------------------------------------------------------- structuring

_LETTER = re.compile(r"[A-Za-z]+")
_INDEX = re.compile(r"\{(\d+)\}|_(\d+)$")
#: display letters of the integration variables the symbolic backend creates
#: (``e`` would read as Euler's number beside ``e^{...}``)
_VAR_LETTER = {"e": "varepsilon"}


def _letter(s: sp.Symbol) -> str:
    return _LETTER.match(s.name).group(0)


def _index(s: sp.Symbol) -> int:
    m = _INDEX.search(s.name)
    return int(next(g for g in m.groups() if g)) if m else 0


@dataclass
class Equation:
    """``lhs = rhs`` ready for the page: the LaTeX of the left side and of the lines of the
    right side (continuation lines start with their + or - sign)."""

    lhs: str
    lines: list[str]
    kind: str = ""            # "output", "integral", "sum", "aux", "named"

    def body(self) -> str:
        """``rhs`` alone (one line or an ``aligned`` block)."""
        return join_lines(self.lines)

    def latex(self, relation: str = "=") -> str:
        return f"{self.lhs} {relation} {join_lines(self.lines)}"


def join_lines(lines: list[str]) -> str:
    if len(lines) == 1:
        return lines[0]
    rows = [f"& {lines[0]}"] + [rf"&\quad {{}}{ln}" for ln in lines[1:]]
    return "\\begin{aligned}[t]\n" + " \\\\\n".join(rows) + "\n\\end{aligned}"


@dataclass
class Layout:
    """Widths (em) a :class:`Block` lays its equations out for."""

    output_width: float          # right side of an output (a table cell, or a display line)
    def_width: float             # a definition line, left side included
    output_lines: int = 3        # at most this many lines per output ...
    def_lines: int = 10          # ... and per definition (longer sums are split in parts)
    cse_ops: int = 300           # blocks larger than this go through sympy's cse first


@dataclass
class Block:
    """Named expressions laid out to fit, with the auxiliary definitions they need.

    ``add(key, lhs_tex, expr)`` collects outputs; :meth:`build` returns
    ``(outputs: {key: Equation}, definitions: [Equation])`` with the definitions in
    define-before-use order, numbered in that order.
    """

    printer: Printer
    layout: Layout
    _items: list = field(default_factory=list)

    def add(self, key: str, lhs_tex: str, expr, width: float | None = None) -> None:
        """An output ``lhs = expr``; ``width`` (em) overrides the layout's output width."""
        self._items.append((key, lhs_tex, sp.sympify(expr), width))

    # -- the pipeline --------------------------------------------------------------------
    def build(self):
        self._defs: dict[sp.Basic, tuple[sp.Basic, sp.Basic, str]] = {}   # name -> (lhs, rhs, kind)
        self._by_rhs: dict = {}
        self._count = 0
        self._locals: set = set()
        exprs = [e for _, _, e, _ in self._items]
        for node in _unique_nodes(exprs):
            if isinstance(node, (sp.Integral, sp.Sum)):
                self._locals |= set(node.variables)
        memo: dict = {}
        exprs = [self._extract(e, memo) for e in exprs]
        names = [n for n in self._defs]
        bodies = [self._defs[n][1] for n in names]
        if sum(sp.count_ops(e) for e in exprs + bodies) > self.layout.cse_ops:
            exprs, bodies = self._cse(exprs, names, bodies)
        # lay out: outputs first, then every definition (layout may add more)
        self._laid: dict = {}
        self._out_exprs = exprs
        outputs = {}
        for (key, lhs, _, width), e in zip(self._items, exprs):
            width = self.layout.output_width if width is None else width
            outputs[key] = (lhs, self._fit(e, width, self.layout.output_lines))
        done = set()
        while True:
            todo = [n for n in self._defs if n not in done]
            if not todo:
                break
            for n in todo:
                done.add(n)
                lhs, rhs, kind = self._defs[n]
                width = self.layout.def_width - tex_width(self.printer.doprint(lhs)) - 1.5
                self._laid[n] = self._fit(rhs, width, self.layout.def_lines, own=n)
        return self._finish(outputs)

    # -- integrals and sums -> named functions of their free integration variables --------
    def _extract(self, e, memo):
        if not isinstance(e, sp.Basic) or not e.args:
            return e
        if e in memo:
            return memo[e]
        args = [self._extract(a, memo) for a in e.args]
        out = e.func(*args) if any(a is not b for a, b in zip(args, e.args)) else e
        if isinstance(out, (sp.Integral, sp.Sum)):
            out = sp.S.Zero if out.function == 0 else self._name_integral(out)
        elif isinstance(out, Defined):
            self._define(out, memo)
        memo[e] = out
        return out

    def _define(self, inst, memo):
        """A named quantity's definition (once per quantity), in display symbols for its
        shown arguments; the integrals and named quantities of its body are extracted too."""
        cls = type(inst)
        named = self.__dict__.setdefault("_named", {})
        if cls in named:
            return
        named[cls] = None
        shown = display_symbols(cls)
        self._locals |= set(shown)
        rhs = cls._body.expr.xreplace(dict(zip(cls._body.variables, (*shown, *inst.hidden_args))))
        for node in _unique_nodes([rhs]):
            if isinstance(node, (sp.Integral, sp.Sum)):
                self._locals |= set(node.variables)
        rhs = self._extract(rhs, memo)
        lhs = cls(*shown, *inst.hidden_args)
        named[cls] = lhs
        self._defs[lhs] = (lhs, rhs, "named")

    def _free_locals(self, e) -> frozenset:
        """The integration variables free in ``e`` (sympy's free_symbols, restricted to them and
        memoised over the shared subexpressions of a large rule)."""
        memo = self.__dict__.setdefault("_fl_memo", {})
        if e in memo:
            return memo[e]
        if e.is_Symbol:
            out = frozenset((e,)) if e in self._locals else frozenset()
        else:
            out = frozenset().union(*(self._free_locals(a) for a in e.args)) if e.args else frozenset()
            if isinstance(e, (sp.Integral, sp.Sum)):
                out = out - frozenset(e.variables)
        memo[e] = out
        return out

    def _canonical_vars(self, free, own):
        groups: dict[str, list] = {}
        for v in list(free) + list(own):
            groups.setdefault(_letter(v), []).append(v)
        cmap = {}
        for letter, vs in groups.items():
            base = _VAR_LETTER.get(letter, letter)
            for k, v in enumerate(vs):
                cmap[v] = sp.Symbol(base if len(vs) == 1 else f"{base}_{k + 1}", **v.assumptions0)
        return cmap

    def _name_integral(self, node):
        own = list(node.variables)
        free = sorted(self._free_locals(node), key=lambda s: (_letter(s), _index(s)))
        cmap = self._canonical_vars(free, own)
        self._locals |= set(cmap.values())
        canon = node.xreplace(cmap)
        kind = "integral" if isinstance(node, sp.Integral) else "sum"
        args = tuple(cmap[v] for v in free)
        name = self._new_name("I" if kind == "integral" else "S", canon, args, kind)
        return name.xreplace({a: v for a, v in zip(args, free)}) if args else name

    def _new_name(self, letter, rhs, args, kind):
        """A (deduplicated) name for ``rhs``: a Symbol, or an applied function of ``args``."""
        key = (rhs, args)
        if key in self._by_rhs:
            return self._by_rhs[key]
        self._count += 1
        tag = f"{letter}_{{{self._count}}}"   # renumbered in define-before-use order later
        name = sp.Function(tag)(*args) if args else sp.Symbol(tag)
        self._defs[name] = (name, rhs, kind)
        self._by_rhs[key] = name
        return name

    # -- common subexpressions ------------------------------------------------------------
    def _cse(self, exprs, names, bodies):
        # cse over the largest subexpressions free of integration variables (what sympy's
        # ``ignore=`` does, without its repeated free-symbol scans)
        local_memo: dict = {}

        def has_local(e):
            if e not in local_memo:
                local_memo[e] = (e in self._locals) if e.is_Symbol else any(has_local(a) for a in e.args)
            return local_memo[e]

        roots: dict = {}

        def collect(e):
            if not has_local(e):
                if not e.is_Atom:
                    roots.setdefault(e, None)
                return
            for a in e.args:
                collect(a)

        everything = exprs + bodies
        for e in everything:
            collect(e)
        gen = (sp.Symbol(f"t_{{c{k}}}") for k in range(1, 10**6))
        repl, red_roots = sp.cse(list(roots), symbols=gen, optimizations=None)
        back = {r: rr for r, rr in zip(roots, red_roots) if r != rr}
        reduced = [e.xreplace(back) for e in everything]
        defs = dict(repl)           # in dependency order (a definition uses earlier ones)
        # inline what is too small to deserve a name, or used only once, in rounds
        while True:
            uses: dict = {sym: 0 for sym in defs}
            for e in list(reduced) + list(defs.values()):
                for node in sp.preorder_traversal(e):
                    if node in uses:
                        uses[node] += 1
            sub: dict = {}
            kept: dict = {}
            for sym, rhs in defs.items():
                rhs = rhs.xreplace(sub) if sub else rhs
                if uses[sym] <= 1 or sp.count_ops(rhs) <= 2 or self.width(rhs) <= 3.0:
                    sub[sym] = rhs
                else:
                    kept[sym] = rhs
            if not sub:
                break
            reduced = [e.xreplace(sub) for e in reduced]
            defs = kept
        n_out = len(exprs)
        exprs, bodies = reduced[:n_out], reduced[n_out:]
        for n, body in zip(names, bodies):
            lhs, _, kind = self._defs[n]
            self._defs[n] = (lhs, body, kind)
        for s, rhs in defs.items():
            self._defs[s] = (s, rhs, "aux")
        return exprs, bodies

    # -- fitting ----------------------------------------------------------------------------
    def tex(self, e) -> str:
        cache = self.__dict__.setdefault("_tex_cache", {})
        if e not in cache:
            cache[e] = self.printer.doprint(e)
        return cache[e]

    def width(self, e) -> float:
        return tex_width(self.tex(e))

    def _fit(self, e, width: float, max_lines: int, own=None) -> list[str]:
        # reuse names already given (a denominator equal to an earlier t_k becomes t_k)
        known = {rhs: n for n, (_, rhs, kind) in self._defs.items() if kind == "aux" and n != own}
        if known:
            e = e.xreplace(known) if e not in known else e
        if self.width(e) <= width:
            return [self.tex(e)]
        if not isinstance(e, sp.Add):
            return [self.tex(self._shrink(e, width))]
        indent, sign_w = 1.5, 1.3
        lines: list[list] = [[]]
        used = 0.0
        for sign, tex, term in self.printer.add_terms(e):
            room = width - indent - sign_w
            if tex_width(tex) > room:
                term = self._shrink(term, room)
                tex = self.tex(term)
                if self.printer._needs_add_brackets(term):
                    tex = r"\left(%s\right)" % tex
            w = tex_width(tex) + (sign_w if sign else 0.0)
            limit = width if len(lines) == 1 else width - indent
            if lines[-1] and used + w > limit:
                lines.append([])
                used = 0.0
            lines[-1].append((sign, tex, term))
            used += w
        if len(lines) > max_lines:
            # too long for one display: name groups of lines, then add the names
            per = max(1, max_lines - 1)
            parts = []
            for k in range(0, len(lines), per):
                terms = [(-t if s == "-" else t) for ln in lines[k:k + per] for s, _, t in ln]
                parts.append(self._aux(sp.Add(*terms, evaluate=False)))
            return self._fit(sp.Add(*parts, evaluate=False), width, max_lines)
        return [" ".join(f"{s} {t}" if s else t for s, t, _ in ln) for ln in lines]

    def _aux(self, e):
        args = tuple(sorted(e.free_symbols & self._locals, key=lambda s: s.name))
        return self._new_name("t", e, args, "aux")

    def _shrink(self, e, width: float):
        """Name the widest subexpressions of ``e`` until it fits ``width``."""
        for _ in range(200):
            if self.width(e) <= width:
                return e
            target = self._widest_child(e)
            if target is None:
                return e          # nothing left to name; TeX scales it down
            e = e.xreplace({target: self._aux(target)})
        return e

    def _widest_child(self, e):
        if isinstance(e, (sp.Integral, sp.Sum)):
            inner = self._widest_child(e.function)
            return inner if inner is not None else (e.function if not e.function.is_Atom else None)
        if isinstance(e, sp.Piecewise):
            cands = [c.expr for c in e.args if not c.expr.is_Atom]
        elif isinstance(e, Defined):          # a named quantity: name its widest printed argument
            cands = [a for a in e.shown_args if isinstance(a, sp.Expr)]
        elif isinstance(e, AppliedUndef):
            return None
        else:
            cands = [a for a in e.args if isinstance(a, sp.Expr)]
        # a named quantity stays as it is printed: its printed arguments are the candidates
        cands = [a for c in cands for a in ((c,) if not isinstance(c, Defined) else c.shown_args)
                 if isinstance(a, sp.Expr)]
        best, best_w = None, 0.0
        for c in cands:
            # name a power's base (x^2 stays visible) and a denominator's body
            while isinstance(c, sp.Pow) and not c.base.is_Atom and (c.exp.is_Integer or c.exp == sp.S.Half or c.exp == -sp.S.Half):
                c = c.base
            if c.is_Atom or isinstance(c, (AppliedUndef, Defined)) or (c.is_Symbol):
                continue
            w = self.width(c)
            if w > best_w:
                best, best_w = c, w
        if best is not None and best_w < 2.5:
            return None
        return best

    # -- numbering and output -------------------------------------------------------------
    def _finish(self, outputs):
        """Order the definitions define-before-use (depth first from the outputs, in reading
        order), renumber them per letter in that order, and return the equations."""
        tags = {_tag(n): n for n in self._defs}

        def refs(lines):
            found = []
            for m in _RENAME.finditer(" ".join(lines)):
                n = tags.get(m.group(0))
                if n is not None and n not in found:
                    found.append(n)
            return found

        order, seen = [], set()

        named = {type(lhs): lhs for lhs, (_, _, kind) in self._defs.items() if kind == "named"}

        def named_refs(e):
            found = []
            for node in _unique_nodes([e]):
                if isinstance(node, Defined) and type(node) in named and named[type(node)] not in found:
                    found.append(named[type(node)])
            return found

        def visit(n):
            if n in seen:
                return
            seen.add(n)
            for m in refs(self._laid[n]) + named_refs(self._defs[n][1]):
                visit(m)
            order.append(n)

        for e, (_, lines) in zip(self._out_exprs, outputs.values()):
            for n in refs(lines) + named_refs(e):
                visit(n)
        counters: dict[str, int] = {}
        rename = {}
        for n in order:
            if self._defs[n][2] == "named":
                continue
            letter = {"integral": "I", "sum": "S"}.get(self._defs[n][2], "t")
            counters[letter] = counters.get(letter, 0) + 1
            rename[_tag(n)] = f"{letter}_{{{counters[letter]}}}"

        def fix(tex: str) -> str:
            return _RENAME.sub(lambda m: rename.get(m.group(0), m.group(0)), tex)

        eqs = {k: Equation(lhs, [fix(x) for x in lines], "output") for k, (lhs, lines) in outputs.items()}
        out_defs = [Equation(fix(self.printer.doprint(self._defs[n][0])), [fix(x) for x in self._laid[n]],
                             self._defs[n][2]) for n in order]
        return eqs, out_defs


_RENAME = re.compile(r"\b[IS]_\{\d+\}|\bt_\{c?\d+\}")


def _unique_nodes(exprs):
    """Every distinct subexpression once (a rule's expression is a DAG with much sharing;
    sympy's preorder_traversal would walk it as a tree)."""
    seen, stack = set(), [e for e in exprs if isinstance(e, sp.Basic)]
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        yield e
        stack.extend(a for a in e.args if isinstance(a, sp.Basic))


def _tag(n) -> str:
    return n.func.__name__ if isinstance(n, (AppliedUndef, Defined)) else n.name
