"""Side-by-side comparison of architectures (`sigprop compare`, `sigprop plot`).

Pure library code: resolved models in, one :class:`Row` per model out (its prediction points
and the trace summary of :func:`sigprop.model.trace.summary`), and the JSON object
``{"schema": "sigprop.compare/1", "version": ..., "rows": [{"arch", "init", "model",
"summary"}, ...]}``.  No rendering, no matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass

from sigprop.errors import DomainError

#: what `compare` and `plot` show when no ``--arch`` is given
DEFAULT_ARCHS = ("preln", "postln", "dslm", "deepnorm", "lns", "mixln")

SCHEMA = "sigprop.compare/1"


@dataclass
class Row:
    """One architecture: its resolved model, prediction points and summary."""

    arch: str
    model: object           # sigprop.model.spec.Model
    points: list            # list of sigprop.model.predict.StreamPoint (input, then each sublayer)
    summary: dict           # sigprop.model.trace.summary(points)

    @property
    def init(self) -> str | None:
        """The init scheme's name when the model came from a preset (None for a --spec model)."""
        return (self.model.notes or {}).get("init")

    @property
    def label(self) -> str:
        """A human name: the preset's title, plus the init when it is not the preset's own,
        plus where the prediction stops when a softmax saturates."""
        from sigprop.model.presets import ARCHS

        info = ARCHS.get(self.arch)
        if info is None:
            name = self.arch
        else:
            init = self.init
            name = info.title if init in (None, info.default_init) else f"{info.title}, {init} init"
        return name + self.stop_note

    @property
    def saturation_layer(self) -> int | None:
        """The layer whose softmax saturation ended the prediction (None: complete)."""
        return self.summary.get("saturation_layer")

    @property
    def stop_note(self) -> str:
        """" (saturates at layer l)" for a row whose prediction stops there, else ""."""
        sat = self.saturation_layer
        return "" if sat is None else f" (saturates at layer {sat})"


def parse_archs(text: str) -> tuple[str, ...]:
    """``"preln,postln"`` -> ``("preln", "postln")``; every name checked (DomainError for an
    unknown, empty or repeated name)."""
    from sigprop.model.presets import OPTIONS

    names = [s.strip() for s in str(text).split(",")]
    if any(not n for n in names):
        raise DomainError(f"--arch: empty architecture name in {text!r} (give a comma-separated list, e.g. preln,postln)")
    seen = set()
    for n in names:
        OPTIONS["arch"].check(n)
        if n in seen:
            raise DomainError(f"--arch: {n!r} listed twice")
        seen.add(n)
    return tuple(names)


def row(model) -> Row:
    """The row of one model (its prediction, stopped where a softmax saturates)."""
    from sigprop.model.predict import predict
    from sigprop.model.trace import summary

    pts = predict(model, stop_at_saturation=True)
    return Row(model.arch, model, pts, summary(pts))


def compare(models) -> list[Row]:
    """One row per model, in the given order."""
    return [row(m) for m in models]


def model_title(model) -> str:
    """One line naming the shared model options (mathtext, for the figure's title)."""
    m, d = model, model.dropout
    return (f"{m.n_layers} layers, $d$ = {m.d_model}, {m.n_heads} heads × {m.d_head}, $d_{{ff}}$ = {m.d_ff}, "
            f"$L$ = {m.seq_len}, {m.activation}, dropout {d.attention:g}/{d.hidden:g}/{d.ffn_inner:g}"
            + (", causal" if m.causal else ""))


def to_json(rows: list[Row]) -> dict:
    """The ``sigprop.compare/1`` object (summary values as in the trace: overflowed numbers
    are the strings "inf"/"-inf")."""
    from sigprop import __version__

    return {
        "schema": SCHEMA,
        "version": __version__,
        "rows": [{"arch": r.arch, "init": r.init, "model": r.model.to_json(), "summary": r.summary,
                  **({"hf": r.model.notes["hf"]} if "hf" in (r.model.notes or {}) else {})} for r in rows],
    }
