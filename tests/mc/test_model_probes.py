"""The whole-model Monte Carlo's causal attention, probed at one layer of its own forward
stream (sigprop.mc.model's sublayers, float64, trial t from the t-th child of
SeedSequence(seed)): what the predictor's causal rules model, measured directly on small
seeded models.  docs/validation.md gives the same measurements on the floor's models.

- the mean attention weight on the first keys, n_i E[P_ij] (1 for exchangeable keys), and
  position 0's token correlation with the others (the per-key weights, docs/design.md);
- what attention dropout does to the attention's input gradient, path by path (query, key,
  value), and the norm's backward on a dropped branch output (the `output` placement);
- the gradient's correlation over positions below a causal attention, and the branch's
  gradient for it against the same gradient with the correlation between positions removed."""

import numpy as np

from sigprop.mc import model as mcm
from sigprop.mc.backend import Rng, as_rng, numpy_backend
from sigprop.mc.sampling import correlated, keep_mask
from sigprop.model.presets import resolve

KEYS = (0, 1, 2, 3)
PATHS = ("q", "k", "v")
PAIRS = ((0, 1), (0, 2), (1, 2))


def _model(p, layers, std, placement="output"):
    return resolve("preln", "normal", n_layers=layers, d_model=32, n_heads=2, d_ff=64, seq_len=16,
                   dropout=p, causal=True, placement=placement, init_std=std)


def _sampled_trials(m, seed, trials, batch):
    """(t, rng, trial, X) per weight draw: the draw's own random stream, its sampled model
    (float64) and an input batch with the model's input moments, drawn from that stream."""
    for t, ts in enumerate(mcm.trial_seeds(seed, trials)):
        rng = as_rng(Rng(ts, numpy_backend(), "host"))
        tr = mcm._Trial(m, rng, np.float64)
        X = correlated(rng, (batch, m.seq_len, m.d_model), m.input.mean, m.input.var, m.input.corr, np.float64)
        yield t, rng, tr, X



# ---------------------------------------------------------------------- key weights

def _key_weights(m, trials, batch, seed):
    """Per trial and attention layer: the mean n_i P_ij over the batch, the heads and the rows
    i >= L/2 for the keys j in KEYS; (corr(position 0, the others), the mean correlation over
    pairs) at the attention's input; (key 0's, the median other key's) variance of the last
    row's logit about its row mean."""
    L = m.seq_len
    kinds = mcm._kinds(m)
    n = np.arange(1.0, L + 1)
    rows = slice(L // 2, L)
    weights = np.zeros((trials, m.n_layers, len(KEYS)))
    corr0 = np.zeros((trials, m.n_layers, 2))
    zvar = np.zeros((trials, m.n_layers, 2))
    for t, rng, tr, X in _sampled_trials(m, seed, trials, batch):
        fwd = tr.attn.forward
        got = {}

        def recording(X, W, params, r, _fwd=fwd, _got=got):
            Y, cache = _fwd(X, W, params, r)
            P = np.asarray(cache["P"] if isinstance(cache, dict) else cache[4])       # (B, H, L, L)
            _got["w"] = [float(np.mean(P[:, :, rows, j] * n[rows])) for j in KEYS]
            Qs, K = (cache["Qs"], cache["Ke"]) if isinstance(cache, dict) else (cache[1], cache[2])
            z = (np.asarray(Qs) @ np.swapaxes(np.asarray(K), -1, -2))[:, :, -1, :]   # the last row's logits
            z = z - z.mean(axis=-1, keepdims=True)
            zv = np.mean(z * z, axis=(0, 1))
            _got["z"] = (float(zv[0]), float(np.median(zv[1:])))
            C = np.einsum("bif,bjf->ij", X, X) / (X.shape[0] * X.shape[2])
            C = C / np.sqrt(np.outer(np.diag(C), np.diag(C)))
            _got["c"] = (float(C[0, 1:].mean()), float(C[~np.eye(L, dtype=bool)].mean()))
            return Y, cache

        tr.attn.forward = recording                 # this trial's component instance only
        try:
            for l in range(m.n_layers):
                for kind in kinds:
                    X, _, _ = tr.step(kind, l, X)
                    if kind == "attention":
                        weights[t, l], corr0[t, l], zvar[t, l] = got["w"], got["c"], got["z"]
        finally:
            del tr.attn.forward
    return weights, corr0, zvar


def test_exchangeable_input_gives_uniform_key_weights():
    """Layer 1 sees exchangeable positions (the sampled input), so n_i E[P_ij] = 1 for every
    key up to the noise, and position 0 correlates like any other pair."""
    w, c, _ = _key_weights(_model(0.0, 1, 0.1), trials=4, batch=8, seed=0)
    assert np.all(np.abs(w[:, 0].mean(axis=0) - 1.0) < 0.15)
    assert abs(c[:, 0, 0].mean() - c[:, 0, 1].mean()) < 0.05


def test_first_keys_draw_weight_once_logits_are_large():
    """Deeper in a causal stack position 0 is less correlated with the rest; with small
    logits (init std 0.02) the weights stay near uniform, with large ones (0.3, no norm
    before the attention) the rows attend to key 0 well beyond its uniform weight."""
    w_small, c, _ = _key_weights(_model(0.0, 6, 0.02), trials=4, batch=4, seed=0)
    assert c[:, -1, 0].mean() < c[:, -1, 1].mean() - 0.05
    assert abs(w_small[:, -1, 0].mean() - 1.0) < 0.1
    w, _, z = _key_weights(_model(0.0, 6, 0.3), trials=4, batch=4, seed=0)
    assert w[:, -1, 0].mean() > 1.3
    assert z[:, -1, 0].mean() > z[:, -1, 1].mean()


# ---------------------------------------------------------------------- dropout, by path

def _norm_parts(F, G):
    """(per-token rms s, normalised output y, G projected off y and the all-ones vector) of a
    LayerNorm (gain 1, eps 0) over the last axis of F."""
    C = F - F.mean(-1, keepdims=True)
    s = np.sqrt((C * C).mean(-1, keepdims=True))
    y = C / s
    Gc = G - G.mean(-1, keepdims=True)
    return s, y, Gc - y * (Gc * y).mean(-1, keepdims=True)


def _dropout_paths(m, trials, batch, seed, at):
    """Per layer in ``at`` (1-based), lists over the trials (keys (layer, name)): ``amp_q``,
    ``amp_k``, ``amp_v``, ``amp``: the attention's input-gradient energy by path with its
    probability dropout over the same with none (same input, weights and upstream gradient G of
    iid N(0, 1) entries); ``proj/iso_<path>``: the norm's backward on the branch output after
    the hidden dropout, G projected off each token's normalised output over G isotropic."""
    d, L = m.d_model, m.seq_len
    p_att, p_hid = m.dropout.attention, m.dropout.hidden
    kinds = mcm._kinds(m)
    out: dict = {}
    add = lambda l, k, v: out.setdefault((l, k), []).append(float(v))   # noqa: E731
    for t, rng, tr, X in _sampled_trials(m, seed, trials, batch):
        for l in range(max(at)):
            if l + 1 in at:
                G = np.random.default_rng([seed, t, l]).standard_normal((batch, L, d))
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
                F, cache = tr.attn.forward(X, W, prm, rng)
                keep = np.asarray(keep_mask(rng, np.shape(F), p_hid)) if p_hid > 0 else 1.0
                s, y, Gp = _norm_parts(np.asarray(F) * keep / (1 - p_hid), G)
                sbar = np.sqrt(np.mean(s * s))
                e = {}
                for tag, GF in (("iso", G / sbar), ("proj", Gp / sbar)):
                    GF = GF * keep / (1 - p_hid)
                    e[tag] = {k: float(np.mean(np.asarray(g) ** 2)) for k, g in tr.attn.backward_paths(GF, cache).items()}
                    e[tag]["all"] = sum(e[tag][k] for k in PATHS)
                for k in (*PATHS, "all"):
                    add(l + 1, f"proj/iso_{k}", e["proj"][k] / e["iso"][k])
            for kind in kinds:
                X, _, _ = tr.step(kind, l, X)
    return out


def test_attention_dropout_amplifies_the_logit_paths():
    """Without dropout the two backward passes are the same computation (ratio 1 to rounding);
    with attention dropout and large logits the masks' uncancelled terms raise the key and query
    paths' gradient well above the value path's."""
    r0 = _dropout_paths(_model(0.0, 3, 0.3), trials=2, batch=2, seed=0, at=[2])
    for k in ("amp_q", "amp_k", "amp_v", "amp"):
        assert np.allclose(r0[(2, k)], 1.0, rtol=1e-12)
    r = _dropout_paths(_model(0.1, 3, 0.3), trials=4, batch=4, seed=0, at=[3])
    assert np.mean(r[(3, "amp_k")]) > 1.1
    assert np.mean(r[(3, "amp_k")]) > np.mean(r[(3, "amp_v")])
    # the projection off each token's output removes at least the isotropic 2/d
    assert np.mean(r[(3, "proj/iso_all")]) < 1.0


# ---------------------------------------------------------------------- gradient correlation

def _grad_correlation(m, trials, batch, seed, at):
    """Per layer in ``at`` (1-based), lists over the trials (keys (layer, name)), from a forward
    and a backward pass of the whole model (top gradient iid N(0, 1), seeded by (seed, trial)):
    at each attention sublayer, G the actual gradient at its output: ``mean_corr`` its mean
    correlation over pairs of positions, ``prof_0`` position 0's variance over the mean, and
    ``real/resigned`` the branch's gradient energy for G over that for G with every (sequence,
    position) multiplied by an independent random sign (the profile kept, the correlation
    between positions removed)."""
    d, L = m.d_model, m.seq_len
    kinds = mcm._kinds(m)
    out: dict = {}
    add = lambda l, k, v: out.setdefault((l, k), []).append(float(v))   # noqa: E731
    for t, rng, tr, X in _sampled_trials(m, seed, trials, batch):
        backs = []
        for l in range(m.n_layers):
            for kind in kinds:
                X, back, _ = tr.step(kind, l, X)
                backs.append((l + 1, kind, back))
        g0 = np.random.default_rng([seed, t])
        G = g0.standard_normal((batch, L, d))
        for l, kind, back in reversed(backs):
            if kind == "attention" and l in at:
                ms = float(np.mean(G * G))
                K = np.einsum("bif,bjf->ij", G, G) / (batch * d)
                add(l, "mean_corr", (K.sum() - np.trace(K)) / (L * (L - 1)) / (np.trace(K) / L))
                add(l, "prof_0", K[0, 0] / np.mean(np.diag(K)))
                real = float(np.mean((back(G.copy()) - G) ** 2)) / ms
                Gs = G * np.where(g0.random((batch, L, 1)) < 0.5, -1.0, 1.0)
                resigned = float(np.mean((back(Gs.copy()) - Gs) ** 2)) / ms
                add(l, "real/resigned", real / resigned)
            G = back(G)
    return out


def test_key_path_anticorrelates_the_positions():
    """Every causal row's key-path gradient sums to zero over its keys, so with large logits
    (the key path's share large) the gradient below a causal attention is anticorrelated over
    positions on average; the first positions carry more than their share of it; the re-signed
    gradient keeps the profile, so the branch ratio stays near 1."""
    r = _grad_correlation(_model(0.1, 3, 0.3), trials=4, batch=4, seed=0, at=[2])
    assert np.mean(r[(2, "mean_corr")]) < -0.005
    assert 0.5 < np.mean(r[(2, "real/resigned")]) < 2.0
    assert np.mean(r[(2, "prof_0")]) > 1.0
