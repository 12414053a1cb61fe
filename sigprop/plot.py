"""Figures of signal propagation against depth (`sigprop plot`).

Four panels, one line per architecture: (a) forward variance of the residual stream,
(b) variance of the gradient dLoss/d(stream), (c) token correlation of the stream, (d)
variance of the attention logits.  Optional markers: a whole-model Monte Carlo measurement
(:func:`sigprop.mc.model.simulate`) of the same models, with one-standard-error bars.

Two steps, so that the data can be inspected without drawing: :func:`figure_data` turns
prediction rows (:class:`sigprop.compare.Row`) and measurements into plain arrays
(:class:`FigureData`), :func:`make_figure` draws them into a matplotlib ``Figure`` (Agg
canvas, no pyplot, no global state) and :func:`save` writes PNG, SVG or PDF.

Variance panels plot **log10 values** computed from the predictions' ``log_var`` /
``log_gvar`` (so a variance that overflows a double is still plotted, never ``inf``) on a
linear axis whose tick labels read as a log scale (10^k, or 1-2-5 values over a short range).

matplotlib is optional (``pip install sigprop[plot]``) and imported only inside
:func:`make_figure` / :func:`save`; :func:`require_matplotlib` raises
:class:`MissingExtra` (a DomainError: exit 2) when it is absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sigprop.compare import model_title
from sigprop.errors import DomainError

LOG10E = 1.0 / math.log(10.0)
FORMATS = ("png", "svg", "pdf")


class MissingExtra(DomainError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtra("plot needs matplotlib, which comes with the optional extra 'plot': "
                           "pip install 'sigprop[plot]'") from None


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    ylabel: str
    log: bool          # y values are log10 of the quantity


PANELS = (
    Panel("forward_var", "(a) forward variance", r"$\mathrm{Var}[x]$", True),
    Panel("grad_var", "(b) gradient variance", r"$\mathrm{Var}[\partial\mathcal{L}/\partial x]$", True),
    Panel("corr", "(c) token correlation", r"$\rho(x_i, x_j)$", False),
    Panel("logit_var", "(d) attention logits", r"$\mathrm{Var}[q\cdot k/\sqrt{d_h}]$", True),
)


@dataclass
class Curve:
    """One architecture's series in one panel (``y`` as plotted: log10 for log panels)."""

    label: str
    x: np.ndarray
    y: np.ndarray
    yerr: np.ndarray | None = None     # (2, n): below, above (markers only)
    row: int = 0                       # index of the row (architecture) it belongs to


@dataclass
class FigureData:
    panels: tuple
    lines: dict                          # panel key -> [Curve] (one per row)
    markers: dict = field(default_factory=dict)   # panel key -> [Curve] (measured rows only)
    archs: list = field(default_factory=list)     # row arch names, for styles
    title: str = ""
    mc_note: str = ""                    # legend text of the markers


def depth(p) -> float:
    """Position on the depth axis, in layers: input 0, layer l's attention at l - 1/2, its
    FFN at l."""
    if p.sublayer == "input":
        return 0.0
    return p.layer - 0.5 if p.sublayer == "attention" else float(p.layer)


def predicted_series(points) -> dict:
    """panel key -> (x, y) for one prediction (a list of StreamPoint)."""
    x = np.array([depth(p) for p in points])
    att = [p for p in points if p.logit_var is not None]
    with np.errstate(divide="ignore"):
        logit = np.log10(np.array([p.logit_var for p in att], dtype=float))
    return {
        "forward_var": (x, np.array([p.log_var for p in points]) * LOG10E),
        "grad_var": (x, np.array([p.log_gvar for p in points]) * LOG10E),
        "corr": (x, np.array([p.corr for p in points], dtype=float)),
        "logit_var": (np.array([depth(p) for p in att]), logit),
    }


def marked_layers(n_layers: int, every: int) -> set:
    return {l for l in range(n_layers + 1) if l in (0, 1, n_layers) or l % every == 0}


def default_mark_every(n_layers: int) -> int:
    """About 16 markers per line."""
    return max(1, round(n_layers / 16))


def _log10_with_err(v: np.ndarray, se: np.ndarray):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y = np.log10(v)
        lo = np.where(v - se > 0, y - np.log10(np.maximum(v - se, 1e-300)), 1.0)
        hi = np.log10(v + se) - y
    lo = np.where(np.isfinite(lo), np.minimum(lo, 1.0), 0.0)
    hi = np.where(np.isfinite(hi), hi, 0.0)
    return y, np.vstack([lo, hi])


def measured_series(meas, points, every: int) -> dict:
    """panel key -> (x, y, yerr) for one Monte Carlo measurement (``meas``: a
    :class:`sigprop.mc.model.ModelMeasurement` of the model whose prediction is ``points``),
    at the input, the FFN output of every ``every``-th layer (and the first and last) and the
    attention sublayers of the same layers (logits)."""
    n = points[-1].layer
    keep = marked_layers(n, every)
    idx = [k for k, p in enumerate(points) if p.layer in keep and p.sublayer in ("input", "ffn", "block")]
    att = [k for k, p in enumerate(points) if p.layer in keep and meas.logit_var[k] is not None]
    x = np.array([depth(points[k]) for k in idx])
    f = [meas.forward[k] for k in idx]
    b = [meas.backward[k] for k in idx]
    fy, fe = _log10_with_err(np.array([m.var for m in f], float), np.nan_to_num(np.array([m.var_se for m in f], float)))
    gy, ge = _log10_with_err(np.array([m.var for m in b], float), np.nan_to_num(np.array([m.var_se for m in b], float)))
    cse = np.nan_to_num(np.array([m.corr_se for m in f], float))
    ly, le = _log10_with_err(np.array([meas.logit_var[k][0] for k in att], float),
                             np.nan_to_num(np.array([meas.logit_var[k][1] for k in att], float)))
    return {
        "forward_var": (x, fy, fe),
        "grad_var": (x, gy, ge),
        "corr": (x, np.array([m.corr for m in f], float), np.vstack([cse, cse])),
        "logit_var": (np.array([depth(points[k]) for k in att]), ly, le),
    }


def measure(rows, batch: int, trials: int, seed: int, dtype):
    """Yield ``(row, measurement)`` per row, simulating each in turn: a prediction that stops
    before a saturated softmax is that of the model cut off there (the upstream gradient
    given at its top), so that model is simulated; None for a row whose prediction is the
    input point alone."""
    from sigprop.mc.model import simulate
    from sigprop.model.checking import require_representable

    for r in rows:
        if getattr(r, "stack", None):
            raise DomainError("plot --check does not simulate encoder-decoder models (yet): sigprop check does")
    for r in rows:
        sat = r.saturation_layer
        if sat == 1:
            yield r, None
            continue
        require_representable(r.points, np.dtype(dtype).name)
        yield r, simulate(r.model if sat is None else r.model.truncated(sat - 1), batch=batch, trials=trials,
                          seed=seed, dtype=dtype)


def figure_data(rows, measurements=None, mark_every: int | None = None, title: str | None = None) -> FigureData:
    """Arrays for the figure.  ``rows``: :class:`sigprop.compare.Row` (or anything with
    ``arch``, ``label``, ``model``, ``points``); ``measurements``: None or a list parallel to
    ``rows`` (an entry may be None)."""
    lines = {p.key: [] for p in PANELS}
    markers = {p.key: [] for p in PANELS}
    for i, r in enumerate(rows):
        for key, (x, y) in predicted_series(r.points).items():
            lines[key].append(Curve(r.label, x, y, None, i))
    note = ""
    if measurements is not None:
        for i, (r, meas) in enumerate(zip(rows, measurements)):
            if meas is None:
                continue
            every = mark_every or default_mark_every(r.model.n_layers)
            for key, (x, y, e) in measured_series(meas, r.points, every).items():
                markers[key].append(Curve(r.label, x, y, e, i))
            note = (f"Monte Carlo ± 1 SE\n({meas.trials} trials × batch {meas.batch}, seed {meas.seed}"
                    + (f", {meas.dtype})" if meas.dtype != "float32" else ")"))
    if title is None:
        title = model_title(rows[0].model) if rows else ""
    return FigureData(PANELS, lines, markers, [getattr(r, "style_key", r.arch) for r in rows], title, note)


# ---------------------------------------------------------------------------------------
# drawing (matplotlib from here on, imported lazily)
# ---------------------------------------------------------------------------------------

#: one colour, marker and line style per preset, the same in every figure: lines that lie on
#: top of each other (Post-LN and DeepNorm both hold the forward variance at 1) stay
#: distinguishable, the upper one's gaps showing the lower one's colour
STYLE = {
    "preln": ("#0072B2", "o", "-"), "postln": ("#D55E00", "s", (0, (4, 2))),
    "dslm": ("#009E73", "^", (0, (1, 1.5))), "deepnorm": ("#CC79A7", "D", (2, (5, 2, 1, 2))),
    "lns": ("#E69F00", "v", (0, (2.5, 1.5))), "mixln": ("#56B4E9", "P", (1, (6, 1.5, 1, 1.5, 1, 1.5))),
    "dslm-post": ("#000000", "X", (0, (3, 1, 1, 1))),
}
_FALLBACK = [("#7F7F7F", "*", (0, (3, 2))), ("#8C564B", "h", (0, (1, 2))), ("#BCBD22", "<", (0, (5, 1, 1, 1))),
             ("#17BECF", ">", (0, (2, 2)))]
#: the largest PNG drawn (pixels): a bound on --dpi x --width x --height (~200 MB of canvas)
MAX_PIXELS = 50_000_000

#: sizes for print at the default size, one column of a two-column paper (3.4 in wide): fonts
#: 6.5-7.5 pt, as in the paper's own captions; a wider --width keeps them
RC = {
    "font.size": 7.5, "axes.titlesize": 7.5, "axes.labelsize": 7.5, "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5, "legend.fontsize": 6.5, "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.4, "axes.linewidth": 0.6,
    "lines.linewidth": 1.1, "lines.markersize": 2.8, "xtick.major.size": 2.5, "ytick.major.size": 2.5,
    "xtick.major.width": 0.6, "ytick.major.width": 0.6, "xtick.major.pad": 2, "ytick.major.pad": 2,
    "axes.titlepad": 3, "axes.labelpad": 2, "legend.handlelength": 1.6, "legend.columnspacing": 1.0,
    "figure.constrained_layout.h_pad": 0.02, "figure.constrained_layout.w_pad": 0.02,
    "mathtext.default": "regular", "svg.fonttype": "none", "pdf.fonttype": 42,
}

#: default figure size (inches) and PNG resolution
WIDTH, HEIGHT, DPI = 3.4, 3.6, 300


def _styles(archs):
    out, used, fb = [], set(), iter(_FALLBACK * 10)
    for a in archs:
        s = STYLE.get(a) if a not in used else None
        out.append(s or next(fb))
        used.add(a)
    return out


def _matplotlib():
    require_matplotlib()
    import sys

    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:   # never switch an interactive Python process's backend
        matplotlib.use("Agg")
    return matplotlib


def _fmt_value(v: float) -> str:
    if v == 0:
        return "0"
    e = math.floor(math.log10(abs(v)) + 1e-12)
    if -3 <= e <= 4:
        return f"{v:.6g}"
    m = v / 10**e
    return f"$10^{{{e}}}$" if abs(m - 1) < 1e-9 else f"${m:.3g}\\times10^{{{e}}}$"


def log_ticks(lo: float, hi: float) -> tuple[list, list]:
    """Tick positions (log10 values) and labels for a log10 axis from ``lo`` to ``hi``:
    whole decades over a long range, 1-2-5 values over one or two decades, evenly spaced
    values (in the quantity itself) over a short range."""
    from matplotlib.ticker import MaxNLocator

    span = hi - lo
    if span >= 2.5:
        pos = [float(t) for t in MaxNLocator(nbins=5, integer=True).tick_values(lo, hi) if lo <= t <= hi]
        return pos, [f"$10^{{{int(round(t))}}}$" for t in pos]
    if span >= 0.7:
        vals = [m * 10.0**e for e in range(math.floor(lo) - 1, math.ceil(hi) + 1) for m in (1, 2, 5)]
    else:
        vals = list(MaxNLocator(nbins=4, steps=[1, 2, 5, 10]).tick_values(10**lo, 10**hi))
    vals = [v for v in vals if v > 0 and lo <= math.log10(v) <= hi]
    return [math.log10(v) for v in vals], [_fmt_value(v) for v in vals]


def make_figure(data: FigureData, width: float = WIDTH, height: float = HEIGHT):
    """Draw :class:`FigureData` into a new matplotlib ``Figure`` (2 x 2 panels in the order
    of :data:`PANELS`, a shared legend below).  Artists carry ids: the prediction line of row
    ``i`` in panel ``key`` has gid ``prediction-{key}-{i}``, its Monte Carlo markers
    ``mc-{key}-{i}`` (also the element ids in SVG output)."""
    mpl = _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FixedFormatter, MaxNLocator

    styles = _styles(data.archs)
    with mpl.rc_context(RC):
        fig = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(2, 2, sharex=True).ravel()
        for ax, panel in zip(axes, data.panels):
            for curve in data.lines[panel.key]:
                colour, _, ls = styles[curve.row]
                y = np.where(np.isfinite(curve.y), curve.y, np.nan)
                ax.plot(curve.x, y, color=colour, ls=ls, label=curve.label, zorder=2,
                        gid=f"prediction-{panel.key}-{curve.row}")
            for curve in data.markers.get(panel.key, []):
                colour, marker, _ = styles[curve.row]
                y = np.where(np.isfinite(curve.y), curve.y, np.nan)
                cont = ax.errorbar(curve.x, y, yerr=curve.yerr, fmt=marker, color=colour, mfc="white", mew=1.0,
                                   elinewidth=0.7, capsize=0, zorder=3, label="_nolegend_")
                cont.lines[0].set_gid(f"mc-{panel.key}-{curve.row}")
            ax.set_title(panel.title, loc="left")
            ax.set_ylabel(panel.ylabel)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
            ax.set_xlim(left=0)
            if panel.log:
                lo, hi = _finite_range(data, panel.key)
                if hi - lo < 0.02:           # a constant: show a short range around it
                    mid = (lo + hi) / 2
                    lo, hi = mid - 0.05, mid + 0.05
                    ax.set_ylim(lo, hi)
                else:
                    lo, hi = ax.get_ylim()
                pos, labels = log_ticks(lo, hi)
                ax.yaxis.set_major_locator(FixedLocator(pos))
                ax.yaxis.set_major_formatter(FixedFormatter(labels))
        for ax in axes[2:]:
            ax.set_xlabel("layer")
        handles = [Line2D([], [], color=styles[curve.row][0], ls=styles[curve.row][2], label=curve.label)
                   for curve in data.lines[data.panels[0].key]]
        if any(data.markers.get(p.key) for p in data.panels):
            handles.append(Line2D([], [], color="0.3", marker="o", mfc="white", ls="none", label=data.mc_note))
        ncol = max(1, min(len(handles), int(width / 1.6)))
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False)
        if data.title:
            fig.suptitle(wrap(data.title, int(width * 72 / (RC["font.size"] * 0.52))), fontsize=RC["font.size"])
    return fig


def wrap(text: str, max_chars: int) -> str:
    """Break a comma-separated title into lines of at most ``max_chars`` visible characters
    (mathtext markup not counted)."""
    def visible(t):
        return len(t.replace("$", "").replace("{", "").replace("}", "").replace("_", ""))

    lines, cur = [], ""
    for part in text.split(", "):
        cand = f"{cur}, {part}" if cur else part
        if cur and visible(cand) > max_chars:
            lines.append(cur + ",")
            cur = part
        else:
            cur = cand
    return "\n".join(lines + [cur])


def _finite_range(data: FigureData, key: str) -> tuple[float, float]:
    ys = [c.y[np.isfinite(c.y)] for c in data.lines[key] + data.markers.get(key, [])]
    ys = [y for y in ys if y.size]
    if not ys:
        return 0.0, 1.0
    allv = np.concatenate(ys)
    return float(allv.min()), float(allv.max())


def output_format(path) -> str:
    """'png' | 'svg' | 'pdf' from the file name (DomainError otherwise)."""
    suffix = str(path).rsplit(".", 1)[-1].lower() if "." in str(path) else ""
    if suffix not in FORMATS:
        raise DomainError(f"output file {str(path)!r} must end in .png, .svg or .pdf")
    return suffix


def check_size(path, width: float, height: float, dpi: int) -> None:
    """DomainError for a PNG of more than :data:`MAX_PIXELS` pixels (or a size or resolution
    that is not a positive finite number)."""
    for name, v in (("width", width), ("height", height), ("dpi", dpi)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise DomainError(f"{name} must be a positive number, got {v!r}")
    if output_format(path) == "png" and width * height * dpi * dpi > MAX_PIXELS:
        raise DomainError(f"a {width:g} x {height:g} inch PNG at {dpi} dpi has {width * height * dpi * dpi:.3g} "
                          f"pixels, more than the {MAX_PIXELS / 1e6:g} million sigprop draws: lower --dpi or the size")


def save(fig, path, dpi: int = DPI) -> None:
    """Write the figure (format from the suffix); unwritable paths raise DomainError."""
    fmt = output_format(path)
    w, h = fig.get_size_inches()
    check_size(path, float(w), float(h), dpi)
    mpl = _matplotlib()
    metadata = {"png": {"Software": "sigprop"}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}[fmt]
    from sigprop.output import replacing

    try:
        with mpl.rc_context(RC), replacing(path, "wb") as f:
            fig.savefig(f, format=fmt, dpi=dpi, metadata=metadata)
    except OSError as e:
        raise DomainError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
