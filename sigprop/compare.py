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
    #: an encoder-decoder model's stack ("encoder" or "decoder"; None for a one-stack model): the
    #: row's model is that stack (the encoder with the decoder's gradient into its output)
    stack: str | None = None

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
        return name + (f" [{self.stack}]" if self.stack else "") + self.stop_note

    @property
    def style_key(self) -> str:
        """The plot's style name: the arch, the decoder of an encoder-decoder model apart."""
        return self.arch if self.stack != "decoder" else f"{self.arch} decoder"

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


def stack_rows(model) -> list[Row]:
    """An encoder-decoder model's rows (sigprop.model.encdec): the encoder's, then the
    decoder's, each judged on its own."""
    from sigprop.model import encdec
    from sigprop.model.trace import summary

    pred = encdec.predict(model)
    enc = model.encoder.replace(grad=pred.e_grad)
    dec = encdec.decoder_with_encoder(model, pred.e_state)
    return [Row(model.arch, enc, pred.encoder, summary(pred.encoder), "encoder"),
            Row(model.arch, dec, pred.decoder, summary(pred.decoder), "decoder")]


def compare(models) -> list[Row]:
    """One row per model, in the given order (an encoder-decoder model: a row per stack)."""
    from sigprop.model.encdec import is_encdec

    out = []
    for m in models:
        out += stack_rows(m) if is_encdec(m) else [row(m)]
    return out


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
                  **({"stack": r.stack} if r.stack else {}),
                  **({"hf": r.model.notes["hf"]} if "hf" in (r.model.notes or {}) else {})} for r in rows],
    }
