"""The attention sublayer of an `output`-placement model (x' = a x + b N(Dropout(Att(x)))) with
dropout, taken apart at chosen layers of the model's own forward stream, float64.

    python benchmarks/dropout_output_norm.py [--arch preln] [--init normal] [--placement output]
        [--layers 48] [--d-model 256] [--heads 4] [--d-ff 1024] [--seq-len 128]
        [--dropout 0.1] [--causal 1] [--trials 4] [--batch 4] [--seed 0] [--at 7,13,25,43]

The stream is the Monte Carlo's own (sigprop.mc.model's sublayers, trial t from the t-th child of
SeedSequence(seed)); at each layer in ``--at`` a fresh draw of that layer's attention weights is
applied to the stream entering it, with an upstream gradient G of iid N(0, 1) entries (seeded by
(trial, layer)).  Printed per layer, means over the draws with standard errors:

* ``amp_q``, ``amp_k``, ``amp_v``, ``amp``: the attention's input-gradient energy by path (query,
  key, value) with its attention-probability dropout at ``--dropout`` over the same with none (same
  input, weights and G): how much the dropout masks amplify each path;
* ``kappa``: the relative variance of the dropped branch output's per-token variance, in units of
  its Gaussian value 2/(d-1) (the LayerNorm rule's kappa);
* the norm's backward, three ways, on the branch output after the hidden dropout: ``iso`` the
  gradient energy at the input for G divided by one rms for all tokens (what composing the rules
  with an isotropic upstream gradient gives), ``proj`` the same for G projected off each token's
  normalised output (and the all-ones vector), ``exact`` the norm's own backward, each token
  divided by its own rms; by path, as the ratios proj/iso (the share the projection removes:
  about 2/d for an isotropic gradient) and exact/proj (the per-token rms), and their product
  exact/iso.

Only the NumPy backend; the layers below the deepest in ``--at`` are simulated forward only."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from sigprop.mc import model as mcm
from sigprop.mc.sampling import keep_mask
from sigprop.model.presets import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the shared benchmark helpers
from _model_args import add_model_args, sampled_trials  # noqa: E402

PATHS = ("q", "k", "v")


def _norm_parts(F, G):
    """(per-token rms s, normalised output y, G projected off y and the all-ones vector) of a
    LayerNorm (gain 1, eps 0) over the last axis of F."""
    C = F - F.mean(-1, keepdims=True)
    s = np.sqrt((C * C).mean(-1, keepdims=True))
    y = C / s
    Gc = G - G.mean(-1, keepdims=True)
    return s, y, Gc - y * (Gc * y).mean(-1, keepdims=True)


def measure(m, trials: int, batch: int, seed: int, at: list) -> dict:
    """Per layer in ``at`` (1-based), lists over the trials of the quantities in the module
    docstring (keys (layer, name))."""
    d, L = m.d_model, m.seq_len
    p_att, p_hid = m.dropout.attention, m.dropout.hidden
    kinds = mcm._kinds(m)
    out: dict = {}
    add = lambda l, k, v: out.setdefault((l, k), []).append(float(v))   # noqa: E731
    for t, rng, tr, X in sampled_trials(m, seed, trials, batch):
        for l in range(max(at)):
            if l + 1 in at:
                g0 = np.random.default_rng([seed, t, l])
                G = g0.standard_normal((batch, L, d))
                prm = mcm._attention_params(m, l)
                W = tr.attn.sample_weights(rng, prm, np.float64)
                energy = {}
                for pp in (p_att, 0.0):
                    F, cache = tr.attn.forward(X, W, dict(prm, p=pp), rng)
                    energy[pp] = {k: float(np.mean(np.asarray(g) ** 2))
                                  for k, g in tr.attn.backward_paths(G, cache).items()}
                for k in PATHS:
                    add(l + 1, "amp_" + k, energy[p_att][k] / energy[0.0][k])
                add(l + 1, "amp", sum(energy[p_att].values()) / sum(energy[0.0].values()))
                # the branch with its own dropouts: Att, the hidden dropout, the norm
                F, cache = tr.attn.forward(X, W, prm, rng)
                keep = np.asarray(keep_mask(rng, np.shape(F), p_hid)) if p_hid > 0 else 1.0
                Fd = np.asarray(F) * keep / (1 - p_hid)
                s, y, Gp = _norm_parts(Fd, G)
                add(l + 1, "kappa", np.var(s * s) / np.mean(s * s) ** 2 * (d - 1) / 2)
                sbar = np.sqrt(np.mean(s * s))
                e = {}
                for tag, GF in (("iso", G / sbar), ("proj", Gp / sbar), ("exact", Gp / s)):
                    GF = GF * keep / (1 - p_hid)
                    e[tag] = {k: float(np.mean(np.asarray(g) ** 2)) for k, g in tr.attn.backward_paths(GF, cache).items()}
                    e[tag]["all"] = sum(e[tag][k] for k in PATHS)
                for k in (*PATHS, "all"):
                    add(l + 1, f"proj/iso_{k}", e["proj"][k] / e["iso"][k])
                    add(l + 1, f"exact/proj_{k}", e["exact"][k] / e["proj"][k])
                    add(l + 1, f"exact/iso_{k}", e["exact"][k] / e["iso"][k])
                    add(l + 1, f"share_{k}", e["iso"][k] / e["iso"]["all"])
            for kind in kinds:
                X, _, _ = tr.step(kind, l, X)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap, dropout=0.1)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--at", default="7,13,25,43", help="comma list of layers (1-based)")
    a = ap.parse_args()
    at = sorted({int(x) for x in a.at.split(",")})
    if a.trials < 2 or not at or at[0] < 1 or at[-1] > a.layers:
        raise SystemExit("dropout_output_norm: --trials >= 2 and layers in 1..--layers")
    m = resolve(a.arch, a.init, n_layers=a.layers, d_model=a.d_model, n_heads=a.heads, d_ff=a.d_ff,
                seq_len=a.seq_len, dropout=a.dropout, causal=bool(a.causal), placement=a.placement)
    if m.norm != "layernorm":
        raise SystemExit("dropout_output_norm: LayerNorm models only")
    res = measure(m, a.trials, a.batch, a.seed, at)
    print(json.dumps(dict(arch=a.arch, init=a.init, placement=a.placement, layers=a.layers, d_model=a.d_model,
                          heads=a.heads, d_ff=a.d_ff, seq_len=a.seq_len, dropout=a.dropout, causal=a.causal,
                          trials=a.trials, batch=a.batch, seed=a.seed)))
    for l in at:
        row = {"layer": l}
        for (ll, k), v in sorted(res.items()):
            if ll == l:
                v = np.array(v)
                row[k] = [round(float(v.mean()), 4), round(float(v.std(ddof=1) / np.sqrt(len(v))), 4)]
        print(json.dumps(row))


if __name__ == "__main__":
    main()
