"""The tables of docs/encoder-decoder.md: what Post-LN, Pre-LN and DeepNorm (the paper's and the
torchscale code's encoder constants) do to an encoder-decoder model at N = M, N >> M and N << M,
predicted by sigprop (sigprop.model.encdec: the same model `sigprop predict --encoder-layers N
--decoder-layers M --arch A` builds).

    python docs/encdec_schemes.py            print the tables (a few minutes on 2 cores)
    python docs/encdec_schemes.py --write    replace them in docs/encoder-decoder.md (between the markers)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "encoder-decoder.md"
BEGIN, END = "<!-- encdec_schemes: begin -->", "<!-- encdec_schemes: end -->"

#: (encoder layers N, decoder layers M)
DEPTHS = ((12, 12), (48, 48), (100, 100), (48, 6), (6, 48))
#: (row label, arch, DeepNorm variant)
SCHEMES = (("Post-LN", "postln", None), ("Pre-LN", "preln", None), ("DeepNorm (paper)", "deepnorm", None),
           ("DeepNorm (torchscale)", "deepnorm", "torchscale"))
#: the model options besides the depths and the arch (the presets' defaults otherwise)
OPTIONS = dict(seq_len=128)


def _g(x: float) -> str:
    return f"{x:.3g}"


def rows() -> list[str]:
    from sigprop.model import encdec

    out = []
    for n, m in DEPTHS:
        for label, arch, variant in SCHEMES:
            model = encdec.from_options(dict(OPTIONS, arch=arch), n, m, deepnorm_variant=variant)
            pred = encdec.predict(model)
            s = encdec.summary(pred)
            e, d, g = s["encoder"], s["decoder"], s["encoder_output_grad"]
            by = g["by_decoder_layer"]
            out.append(f"| {n} | {m} | {label} | {e['verdict_class']} | {_g(e['forward_var_growth'])} | "
                       f"{_g(e['grad_ratio_input_output'])} | {d['verdict_class']} | {_g(d['forward_var_growth'])} | "
                       f"{_g(d['grad_ratio_input_output'])} | {_g(g['var'])} | {_g(by[-1]['var'] / by[0]['var'])} |")
    return out


def render() -> str:
    head = ("| N | M | scheme | encoder | enc. fwd var x | enc. grad in/out | decoder | dec. fwd var x | "
            "dec. grad in/out | dL/dE var | top / first decoder layer's share |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(rows()) + "\n"


def main(argv: list[str]) -> int:
    table = render()
    if "--write" not in argv:
        print(table, end="")
        return 0
    text = DOC.read_text(encoding="utf-8")
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:a] + "\n" + table + text[b:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
