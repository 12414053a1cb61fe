"""The cross terms between decoder layers in the gradient reaching an encoder-decoder model's
encoder output (docs/validation.md, "Encoder-decoder models"): per weight draw, every decoder
layer's cross-attention contribution to dLoss/dE kept apart, E|sum|^2 against sum E|part|^2 (16
draws x 8 sequences, float64, seed 0; d_model 256, 4 heads, d_ff 1024, decoder 16 tokens, encoder 24).
Usage: python -m sigprop.mc.encdec_cross_terms ARCH N M FINAL_NORM(0/1) DROPOUT"""

import sys, numpy as np
from sigprop.model import encdec as ED
from sigprop.mc import encdec as mc
from sigprop.mc import model as M
from sigprop.mc.backend import Rng, numpy_backend
arch, N, Mm, fn, drop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]=='1', float(sys.argv[5])
m=ED.from_options(dict(arch=arch, init='xavier', d_model=256, n_heads=4, d_ff=1024, seq_len=16, final_norm=fn, dropout=drop), N, Mm, encoder_seq_len=24)
parts=[]
orig = mc._DecoderTrial.branch_forward
def bf(self, cols, l, X, n_in, c_out):
    Y, back, lg = orig(self, cols, l, X, n_in, c_out)
    if isinstance(cols, str) or cols.kind != "cross_attention":
        return Y, back, lg
    def back2(G):
        before = None if self.dE is None else self.dE.copy()
        gx = back(G)
        parts.append(self.dE - (0 if before is None else before))
        return gx
    return Y, back2, lg
mc._DecoderTrial.branch_forward = bf
seeds=M.trial_seeds(0, 16); tot=[]; ssum=[]; cross=[]
for t in range(16):
    parts.clear()
    mc.run_trial(m, 8, Rng(seeds[t], numpy_backend(), 'host'), np.float64)
    S = sum(parts)
    v_tot = (S**2).mean(); v_parts = sum((p**2).mean() for p in parts)
    tot.append(v_tot); ssum.append(v_parts); cross.append(v_tot - v_parts)
tot, ssum, cross = map(np.array, (tot, ssum, cross))
print(arch, N, Mm, 'final_norm', fn, 'dropout', drop, ': E|sum|^2 %.5g, sum E|part|^2 %.5g, cross %.4g +- %.2g (%.2f%% of the sum)' % (tot.mean(), ssum.mean(), cross.mean(), cross.std(ddof=1)/4, 100*cross.mean()/ssum.mean()))
