"""Benchmark of `sigprop check`'s whole-model simulation (run on demand: `make bench`).

Every figure is a ratio against baselines measured in the same run, interleaved repetition by
repetition (so that a busy neighbour slows all of them alike), medians over the repetitions:

1. bare float32 matrix multiplies: exactly the products one simulated trial performs (same
   shapes, same count; contiguous operands, preallocated outputs), and a large square product
   for context.  Their FLOP count is checked against the ``gflop`` that ``simulate`` reports.
2. ``sigprop.mc.model.simulate`` on the reference model (d_model 256, 4 heads of 64, d_ff 1024,
   seq 128, batch 8, dropout 0.1 everywhere, float32), Pre-LN and Post-LN, one trial per
   repetition: GFLOP/s and the ratio to the bare products' GFLOP/s.
3. the same model written in PyTorch for the CPU (weights drawn with torch.randn per trial,
   forward with dropout in training mode, autograd for the gradients with respect to every
   residual-stream point, the same moments recorded), with ``torch.set_num_threads`` equal to
   NumPy's BLAS threads.  torch is imported here only; without it this part is skipped.

    python benchmarks/check_speed.py [--repeats 7] [--layers 4] [--batch 8] [--arch preln postln]
    python benchmarks/check_speed.py --shape 7b --layers 1 --batch 1 --repeats 3 --arch preln

``--shape 1b | 7b`` times the same blocks at a 1B and a 7B model's widths and 2,048 tokens
(what ``check`` costs per trial at real sizes; at least 3 repetitions there).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import math
import os
import statistics
import sys
import time

import numpy as np

REFERENCE = dict(d_model=256, n_heads=4, d_head=64, d_ff=1024, seq_len=128, dropout=0.1)
#: ``--shape``: the reference model, and the widths of a 1B and a 7B model at 2,048 tokens (the
#: same Pre-LN / Post-LN ReLU blocks, d_ff 4 d_model; run with --layers 1 --batch 1)
SHAPES = {"reference": REFERENCE,
          "1b": dict(d_model=2048, n_heads=16, d_head=128, d_ff=8192, seq_len=2048, dropout=0.1),
          "7b": dict(d_model=4096, n_heads=32, d_head=128, d_ff=16384, seq_len=2048, dropout=0.1)}


def _openblas():
    """NumPy's bundled OpenBLAS (ctypes handle) or None."""
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
        try:
            return ctypes.CDLL(path)
        except OSError:
            pass
    return None


def _blas_symbol(kind: str):
    lib = _openblas()
    for sym in (f"scipy_openblas_{kind}_num_threads64_", f"openblas_{kind}_num_threads64_",
                f"openblas_{kind}_num_threads"):
        if lib is not None and hasattr(lib, sym):
            return getattr(lib, sym)
    return None


def blas_threads() -> int:
    """Threads of NumPy's OpenBLAS (read from the library), else the CPU count."""
    get = _blas_symbol("get")
    return int(get()) if get is not None else (os.cpu_count() or 1)


def set_blas_threads(n: int) -> bool:
    fn = _blas_symbol("set")
    if fn is None:
        return False
    fn(int(n))
    return True


def load_note() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"
    except OSError:
        return "load average unavailable"


# --- 1. bare matrix multiplies --------------------------------------------------------------

def gemm_shapes(m, batch: int) -> list[tuple[int, int, int, int]]:
    """(count, M, K, N) of every product one trial of ``simulate`` performs, forward and
    backward (input gradients only), enumerated independently of ``simulate``'s own count."""
    B, L, d, H, dh, f = batch, m.seq_len, m.d_model, m.n_heads, m.d_head, m.d_ff
    hd, T = H * dh, batch * m.seq_len
    per_layer = [
        # attention forward: fused QKV projection, Q K^T and A V per (sequence, head), W_o
        (1, T, d, 3 * hd), (B * H, L, dh, L), (B * H, L, L, dh), (1, T, hd, d),
        # attention backward: G W_o^T, A^T G_O, G_O V^T, dS K, dS^T Q, [dQ dK dV] W_qkv^T
        (1, T, d, hd), (B * H, L, L, dh), (B * H, L, dh, L), (B * H, L, L, dh), (B * H, L, L, dh),
        (1, T, 3 * hd, d),
        # FFN forward and backward
        (1, T, d, f), (1, T, f, d), (1, T, d, f), (1, T, f, d),
    ]
    return per_layer * m.n_layers


def gemm_flop(shapes) -> float:
    return sum(2.0 * c * M * K * N for c, M, K, N in shapes)


class BareGemm:
    """The products of ``shapes`` on preallocated contiguous float32 operands."""

    def __init__(self, shapes, seed=0):
        rng = np.random.default_rng(seed)
        cache = {}
        self.ops = []
        for c, M, K, N in shapes:
            key = (c, M, K, N)
            if key not in cache:
                a_shape, b_shape, o_shape = ((M, K), (K, N), (M, N)) if c == 1 else ((c, M, K), (c, K, N), (c, M, N))
                cache[key] = (rng.standard_normal(a_shape, dtype=np.float32),
                              rng.standard_normal(b_shape, dtype=np.float32), np.empty(o_shape, np.float32))
            self.ops.append(cache[key])

    def run(self) -> float:
        t0 = time.perf_counter()
        for A, Bm, O in self.ops:
            np.matmul(A, Bm, out=O)
        return time.perf_counter() - t0


def torch_bare(torch, shapes):
    """The same products with torch.matmul (its own BLAS), preallocated outputs."""
    gen = torch.Generator().manual_seed(0)
    cache, ops = {}, []
    for c, M, K, N in shapes:
        key = (c, M, K, N)
        if key not in cache:
            lead = () if c == 1 else (c,)
            cache[key] = (torch.randn(*lead, M, K, generator=gen), torch.randn(*lead, K, N, generator=gen),
                          torch.empty(*lead, M, N))
        ops.append(cache[key])

    def run():
        t0 = time.perf_counter()
        for A, Bm, O in ops:
            torch.matmul(A, Bm, out=O)
        return time.perf_counter() - t0
    return run


# --- 3. PyTorch implementation ----------------------------------------------------------------

def torch_trial(torch, m, batch: int, gen) -> float:
    """One trial of the same model in PyTorch; returns wall seconds."""
    F = torch.nn.functional
    B, L, d, H, dh = batch, m.seq_len, m.d_model, m.n_heads, m.d_head
    hd = H * dh
    t0 = time.perf_counter()

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    def correlated(mean, var, corr):
        x = randn(B, L, d, std=math.sqrt((1 - corr) * var))
        if corr > 0:
            x = x + randn(B, 1, d, std=math.sqrt(corr * var))
        return x + mean if mean else x

    def moments(x):
        s = x.sum(dim=1, dtype=torch.float64)
        sq = torch.sum(x * x, dtype=torch.float64) / x.numel()
        return (torch.sum(x, dtype=torch.float64) / x.numel(), sq,
                ((s * s).sum() / (B * d) - sq * L) / (L * (L - 1)))

    def bias(std, n):
        return randn(n, std=std) if std else None

    def attention(x, l):
        s = m.attention
        wqkv = torch.cat([randn(d, hd, std=float(s.std[w][l])) for w in "qkv"], dim=1)
        bqkv = [bias(float(s.bias_std[w][l]), hd) for w in "qkv"]
        wo = randn(hd, d, std=float(s.std["o"][l]))
        bo = bias(float(s.bias_std["o"][l]), d)
        z = x.reshape(B * L, d) @ wqkv
        if any(b is not None for b in bqkv):
            z = z + torch.cat([b if b is not None else torch.zeros(hd) for b in bqkv])
        q, k, v = z.reshape(B, L, 3, H, dh).permute(2, 0, 3, 1, 4)
        S = (q / math.sqrt(dh)) @ k.transpose(-1, -2)
        logits = (S.detach().mean(), (S.detach() ** 2).mean())
        if m.causal:
            S = S.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        A = F.dropout(torch.softmax(S, dim=-1), m.dropout.attention, training=True)
        y = (A @ v).transpose(1, 2).reshape(B * L, hd) @ wo
        if bo is not None:
            y = y + bo
        return y.reshape(B, L, d), logits

    def ffn(x, l):
        s = m.ffn
        w1, w2 = randn(d, m.d_ff, std=float(s.std["in"][l])), randn(m.d_ff, d, std=float(s.std["out"][l]))
        b1, b2 = bias(float(s.bias_std["in"][l]), m.d_ff), bias(float(s.bias_std["out"][l]), d)
        h = x.reshape(B * L, d) @ w1
        if b1 is not None:
            h = h + b1
        h = F.relu(h) if m.activation == "relu" else F.gelu(h)
        h = F.dropout(h, m.dropout.ffn_inner, training=True)
        y = h @ w2
        if b2 is not None:
            y = y + b2
        return y.reshape(B, L, d), None

    x = correlated(m.input.mean, m.input.var, m.input.corr).requires_grad_()
    stream, fw, lg = [x], [moments(x.detach())], []
    for l in range(m.n_layers):
        for kind, fn in (("attention", attention), ("ffn", ffn)):
            cols = getattr(m, kind)
            a, b, n = float(cols.skip_scale[l]), float(cols.branch_scale[l]), float(cols.norm_scale[l])
            if cols.post[l]:
                y, logits = fn(x, l)
                x = F.layer_norm(a * x + b * F.dropout(y, m.dropout.hidden, training=True), (d,), eps=1e-5)
            else:
                y, logits = fn(n * F.layer_norm(x, (d,), eps=1e-5), l)
                x = a * x + b * F.dropout(y, m.dropout.hidden, training=True)
            x.retain_grad()
            stream.append(x)
            fw.append(moments(x.detach()))
            lg.append(logits)
    x.backward(correlated(0.0, m.grad.var, m.grad.corr))
    bw = [moments(s.grad) for s in stream]
    float(torch.stack([torch.stack(v) for v in fw + bw]).sum())   # force every result
    return time.perf_counter() - t0


# --- driver -------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--arch", nargs="+", default=["preln", "postln"])
    ap.add_argument("--threads", type=int, default=None,
                    help="BLAS threads for NumPy and PyTorch alike (default: NumPy's own setting)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="reference")
    args = ap.parse_args(argv)
    if args.repeats < (5 if args.shape == "reference" else 3):
        ap.error("use at least 5 repetitions (medians; 3 at --shape 1b or 7b)")
    if args.threads is not None and not set_blas_threads(args.threads):
        print("could not set OpenBLAS threads (set OPENBLAS_NUM_THREADS instead)")

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from sigprop.mc.model import simulate
    from sigprop.model import resolve

    threads = blas_threads()
    torch = None
    if not args.no_torch:
        try:
            import torch  # noqa: F811  (benchmark only; never a dependency of sigprop)
            torch.set_num_threads(threads)
        except ImportError:
            print("PyTorch is not installed: the PyTorch comparison is skipped (pip install torch)")
    shape = SHAPES[args.shape]
    models = {a: resolve(a, n_layers=args.layers, **shape) for a in args.arch}
    shapes = gemm_shapes(next(iter(models.values())), args.batch)
    flop = gemm_flop(shapes)
    bare = BareGemm(shapes)
    n_sq = 1024
    square = BareGemm([(1, n_sq, n_sq, n_sq)])
    print(f"check speed: {args.layers} layers, d_model {shape['d_model']}, {shape['n_heads']} heads x "
          f"{shape['d_head']}, d_ff {shape['d_ff']}, seq {shape['seq_len']}, batch {args.batch}, "
          f"dropout 0.1, float32; {threads} BLAS thread(s); {load_note()} (start)")

    # warm up every path once (page faults, thread pools, first-call costs)
    bare.run(), square.run()
    for a, m in models.items():
        meas = simulate(m, batch=args.batch, trials=1, seed=0)
        if abs(meas.gflop * 1e9 - flop) > 1e-6 * flop:
            raise SystemExit(f"simulate reports {meas.gflop:.4f} GFLOP, the products it performs are {flop / 1e9:.4f}")
    if torch is not None:
        gen = torch.Generator().manual_seed(0)
        tbare = torch_bare(torch, shapes)
        tbare()
        for m in models.values():
            torch_trial(torch, m, args.batch, gen)

    t_bare, t_sq, t_tbare = [], [], []
    t_sim = {a: [] for a in models}
    t_torch = {a: [] for a in models}
    for r in range(args.repeats):
        t_bare.append(bare.run())
        t_sq.append(square.run())
        if torch is not None:
            t_tbare.append(tbare())
        for a, m in models.items():
            t_sim[a].append(simulate(m, batch=args.batch, trials=1, seed=r + 1).simulate_s)
            if torch is not None:
                t_torch[a].append(torch_trial(torch, m, args.batch, gen))

    med = statistics.median
    gf = flop / 1e9
    peak = gf / med(t_bare)
    sq_peak = 2.0 * n_sq**3 / 1e9 / med(t_sq)
    print(f"median of {args.repeats} (one trial each; {gf:.2f} GFLOP of matrix products per trial):")
    print(f"  bare float32 matmul, the trial's own shapes   {med(t_bare) * 1e3:8.1f} ms  {peak:6.1f} GFLOP/s")
    print(f"  bare float32 matmul, {n_sq}^3 (context)           {med(t_sq) * 1e3:8.1f} ms  {sq_peak:6.1f} GFLOP/s")
    if torch is not None:
        print(f"  torch.matmul, the trial's own shapes (context) {med(t_tbare) * 1e3:8.1f} ms  "
              f"{gf / med(t_tbare):6.1f} GFLOP/s")
    verdicts = []
    for a in models:
        ts = med(t_sim[a])
        ratio = gf / ts / peak
        print(f"  sigprop simulate {a:7s}  {ts * 1e3:8.1f} ms  {gf / ts:6.1f} GFLOP/s  "
              f"= {ratio:.2f} of same-shape matmul, {gf / ts / sq_peak:.2f} of {n_sq}^3 matmul")
        verdicts.append(f"{a}: {ratio:.2f} of matmul throughput (goal >= 0.50: {'met' if ratio >= 0.5 else 'NOT met'})")
        if torch is not None:
            tt = med(t_torch[a])
            print(f"  PyTorch {torch.__version__:9s} {a:7s}  {tt * 1e3:8.1f} ms  {gf / tt:6.1f} GFLOP/s  "
                  f"-> sigprop is {tt / ts:.2f}x PyTorch's speed")
            verdicts.append(f"{a}: {tt / ts:.2f}x PyTorch (goal >= 1: {'met' if tt >= ts else 'NOT met'})")
    print(f"  ({load_note()} at the end)")
    print("; ".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
