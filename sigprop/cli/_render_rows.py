"""Which rows of a per-layer table the text output shows (``predict``'s trace, ``check``'s
comparison): a terminal's worth by default, every K-th layer with ``--every K``, every row
with ``--full``.  Display only: the JSON output is not thinned by any of this.

The default keeps the input and the layers of the densest "ladder" whose rows fit
:data:`ROWS`: every layer; else 1-8 and four layers per doubling (10, 12, 14, 16, 20, ...);
else 1-4 and two per doubling (6, 8, 12, 16, 24, ...); else the powers of 2, then of 4, 8,
...  The top layer is always kept.  A ladder is geometric, so a power law reads off it as
equal steps and the first layers, where most models change fastest, are all there.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

#: the rows a thinned table aims at (at most, but for the sparsest ladder): a terminal's height
#: less the summary and the model's description above the table
ROWS = 42

#: the mantissas of a ladder per doubling, densest first (after "every layer")
_MANTISSAS = ((1.0, 1.25, 1.5, 1.75), (1.0, 1.5), (1.0,))


class Selection(NamedTuple):
    """The layers a table shows (0 is the input) and the line that says so (None: every row
    is shown)."""

    layers: frozenset
    line: str | None

    def keep(self, layer: int) -> bool:
        return layer in self.layers


def conflict(every: int | None, full: bool) -> None:
    """--full and --every K both choose the rows: bad input when both are given."""
    if full and every is not None:
        from sigprop.errors import DomainError

        raise DomainError("--full and --every both choose the rows shown: give one of them")


def ladder(top: int, level: int) -> list[int]:
    """The layers 1..``top`` of ladder ``level`` (0: every layer; 1-3: :data:`_MANTISSAS`;
    4 and up: the powers of 2^(level - 2)), and ``top``."""
    if level == 0:
        return list(range(1, top + 1))
    out = set()
    if level <= len(_MANTISSAS):
        octave = 1
        while octave <= top:
            out.update(int(octave * m) for m in _MANTISSAS[level - 1] if (octave * m).is_integer())
            octave *= 2
    else:
        step, v = 2 ** (level - len(_MANTISSAS) + 1), 1
        while v <= top:
            out.add(v)
            v *= step
    return sorted({v for v in out if v <= top} | {top})


def select(layers: Sequence[int], every: int | None = None, full: bool = False, rows: int = ROWS,
           also: Sequence[int] = ()) -> Selection:
    """The rows to show of a table whose points are at ``layers`` (one entry per point, in
    order; 0 the input): all with ``full``, the input, every ``every``-th layer and the top
    one with ``every``, else the input and the densest ladder within ``rows`` rows (module
    docstring); the layers ``also`` (check: those of the first points outside tolerance) are
    shown in either thinning, beyond the ladder's rows."""
    conflict(every, full)
    per_layer: dict[int, int] = {}
    for v in layers:
        per_layer[v] = per_layer.get(v, 0) + 1
    top = max(per_layer, default=0)
    if full or top == 0:
        return Selection(frozenset(per_layer), None)
    if every is not None:
        chosen = [v for v in per_layer if v > 0 and (v % every == 0 or v == top)]
    else:
        level = 0
        while True:
            chosen = ladder(top, level)
            n = per_layer.get(0, 0) + sum(per_layer.get(v, 0) for v in chosen)
            if n <= rows or chosen == [1, top] or chosen == [top]:
                break
            level += 1
    kept = frozenset([0, *chosen, *also]) & frozenset(per_layer)
    shown = sum(per_layer[v] for v in kept)
    if shown == len(layers):
        return Selection(kept, None)
    return Selection(kept, f"showing {shown:,} of {len(layers):,} points ({_describe(sorted(kept))}); --full for all")


def _describe(layers: list[int]) -> str:
    """'layers 1-4, 6, 8, ..., 512, 768' (the input, always shown, unnamed): runs of
    consecutive layers joined, at most the first three items and the last two of a long list."""
    items, run = [], []
    for v in (v for v in layers if v > 0):
        if run and v == run[-1] + 1:
            run.append(v)
            continue
        if run:
            items += _run(run)
        run = [v]
    if run:
        items += _run(run)
    if len(items) > 6:
        items = items[:3] + ["..."] + items[-2:]
    if not items:
        return "the input"
    return ("layer " if len(items) == 1 and "-" not in items[0] else "layers ") + ", ".join(items)


def _run(run: list[int]) -> list[str]:
    """A run of consecutive layers as items: '3-7', or the layers themselves when one or two."""
    return [f"{run[0]}-{run[-1]}"] if len(run) > 2 else [str(v) for v in run]
