"""Whole-model Monte Carlo of an encoder-decoder model (sigprop.model.encdec), with exactly the
specified semantics: the encoder stack on its own input (its seq_len), its output E after its
final norm where it has one; the decoder stack, whose cross-attention sublayers take their queries
from the decoder stream as an attention sublayer does (placement, norm, norm scale) and their keys
and values from E (the cross_attention component's forward and hand-written backward); the
upstream gradient at the decoder's top only; every cross-attention's gradient into E summed, then
the encoder's backward pass from that sum.  One encoder sequence per decoder sequence; weights
drawn independently for every layer, both stacks, every trial.  Points: the encoder's
(sigprop.mc.model.point_labels), then the decoder's; each stack pooled over the trials as
sigprop.mc.model.pooled pools one model."""

from __future__ import annotations

import time

import numpy as np

from sigprop.errors import DomainError
from sigprop.mc import model as M
from sigprop.mc.backend import as_rng, numpy_backend
from sigprop.mc.components import get as component
from sigprop.mc.sampling import correlated
from sigprop.mc.stats import raw_moments


def _cross_params(m, l, cols, Lk):
    p = dict(d=m.d_model, n_heads=m.n_heads, d_head=m.d_head, L=m.seq_len, L_enc=Lk, p=m.dropout.attention)
    for w in ("q", "k", "v", "o"):
        p[f"{w}_std"] = float(cols.std[w][l])
        p[f"{w}_bias_std"] = float(cols.bias_std[w][l])
    if m.qk_norm is not None:
        from sigprop import registry

        p["qk_norm"] = registry.norm(m.qk_norm).qk_code
        p["qk_eps"] = m.norm_eps
    return p


class _DecoderTrial(M._Trial):
    """The decoder's trial: its cross-attention branches read E and add their gradient into E
    to ``self.dE`` in the backward pass."""

    EXTRA_FEATURES = frozenset({"cross_attention"})

    def __init__(self, model, rng, dtype, E):
        super().__init__(model, rng, dtype)
        self.E = E
        self.dE = None
        self.cross = component("cross_attention")

    def branch_forward(self, cols, l, X, n_in, c_out):
        if isinstance(cols, str) or cols.kind != "cross_attention":
            return super().branch_forward(cols, l, X, n_in, c_out)
        prm = _cross_params(self.m, l, cols, int(self.E.shape[1]))
        W = self.cross.sample_weights(self.rng, prm, self.dtype)
        self._scale(W["q"], n_in)              # the norm scale multiplies the queries' input only
        self._scale(W["o"], c_out)
        self._scale(W["bo"], c_out)
        Y, cache = self.cross.forward_pair(X, self.E, W, prm, self.rng)

        def backward(G):
            gx, ge = self.cross.backward_pair(G, cache)
            if self.dE is None:
                self.dE = ge
            else:
                self.dE += ge
            return gx
        return Y, backward, cache["logits"]


def _forward_stack(tr, m, X):
    kinds = M._steps(m)
    n_points = 1 + len(kinds) * m.n_layers
    fw, lg = np.zeros((n_points, 3)), np.full((n_points, 2), np.nan)
    fw[0] = raw_moments(X)
    backs, i = [], 0
    for l in range(m.n_layers):
        for kind in kinds:
            i += 1
            X, back, logits = tr.step(kind, l, X)
            fw[i] = raw_moments(X)
            if logits is not None:
                lg[i] = logits
            backs.append(back)
    return X, fw, lg, backs


def _backward_stack(G, top, backs, n_points):
    bw = np.zeros((n_points, 3))
    if top is not None:
        G = top(G)
    bw[n_points - 1] = raw_moments(G)
    for j in range(len(backs) - 1, -1, -1):
        G = backs[j](G)
        backs[j] = None
        bw[j] = raw_moments(G)
    return bw


def run_trial(model, batch: int, rng, dtype=np.float32):
    """One weight draw of both stacks: ((fw, bw, lg) of the encoder, (fw, bw, lg) of the
    decoder), as :func:`sigprop.mc.model.run_trial` gives them for one model."""
    enc, dec = model.encoder, model.decoder
    rng = as_rng(rng)
    te = M._Trial(enc, rng, dtype)
    X = correlated(rng, (batch, enc.seq_len, enc.d_model), enc.input.mean, enc.input.var, enc.input.corr, dtype)
    X, fw_e, lg_e, backs_e = _forward_stack(te, enc, X)
    E, top_e = te.final(X)
    td = _DecoderTrial(dec, rng, dtype, E)
    Xd = correlated(rng, (batch, dec.seq_len, dec.d_model), dec.input.mean, dec.input.var, dec.input.corr, dtype)
    Xd, fw_d, lg_d, backs_d = _forward_stack(td, dec, Xd)
    Xd, top_d = td.final(Xd)
    G = correlated(rng, Xd.shape, 0.0, dec.grad.var, dec.grad.corr, dtype)
    Xd = X = None
    bw_d = _backward_stack(G, top_d, backs_d, len(fw_d))
    bw_e = _backward_stack(td.dE, top_e, backs_e, len(fw_e))
    return (fw_e, bw_e, lg_e), (fw_d, bw_d, lg_d)


def simulate(model, *, batch: int = 8, trials: int = 8, seed: int = 0, dtype=np.float32, progress=None):
    """``trials`` independent draws (trial t from the t-th child of SeedSequence(seed)):
    {"encoder": ModelMeasurement, "decoder": ModelMeasurement}.  NumPy arrays."""
    from sigprop.mc.backend import Rng

    bk = numpy_backend()
    for s in (model.encoder, model.decoder):
        M.check_supported(s, bk, frozenset({"cross_attention"}) if s is model.decoder else frozenset())
        M.check_memory(s, batch, dtype, bk)
    seeds = M.trial_seeds(seed, trials)
    t0 = time.perf_counter()
    out = []
    for t in range(trials):
        out.append(run_trial(model, batch, Rng(seeds[t], bk, "host"), dtype))
        if progress:
            progress(t + 1, trials)
    dt = time.perf_counter() - t0
    return {name: M.pooled(model.stack(name), [o[k] for o in out], batch=batch, seed=seed, dtype=dtype,
                           backend=bk, seconds=dt)
            for k, name in enumerate(("encoder", "decoder"))}


def require_numpy(backend: str, rng: str, dask) -> None:
    if backend != "numpy" or dask is not None or rng != "host":
        raise DomainError("an encoder-decoder model is simulated on the numpy backend, host random stream, "
                          "without Dask (yet)")
