"""Benchmarks of the Monte Carlo's backends and of its Dask distribution (run on demand).

Every figure is a ratio against a baseline measured in the same run, repetitions interleaved
(a busy neighbour slows every contestant alike), medians; the load average is printed at the
start and the end.

``torch``: the whole-model simulation (``simulate(trials=1)``) of the reference model of
    benchmarks/check_speed.py (4 layers, d_model 256, 4 heads of 64, d_ff 1024, seq 128,
    batch 8, dropout 0.1, float32) on the torch CPU backend against the NumPy backend, Pre-LN
    and Post-LN; torch and NumPy's BLAS get the same thread count.
``dask``: a slice of the accuracy floor (``sigprop.mc.floor.run_one`` over configurations:
    by default Pre-LN and Post-LN, default init, 12 layers, dropout 0 and 0.1, bidirectional,
    2 trials x batch 2) in one process, one configuration after the other, against a Dask
    LocalCluster of ``--workers`` single-threaded processes (started once, before the timing;
    its start-up is reported separately) running the floor's ``--dask`` path
    (``sigprop.mc.floor.run_many``: every configuration's trials as the tasks, each
    configuration judged in this process as its trials complete).  Goal: at least 1.7x with 2
    workers.
``gpu``: on a CUDA device (torch or cupy backend): the device's float32 matmul rate (a
    large square product, synchronised) and the simulation's rate (its matrix-multiply FLOP
    per second of ``simulate``, which synchronises at every moment it records), their ratio
    (goal at least 0.5), and optionally (``--llama``) the time of one trial of a
    LLaMA-7B-sized model (d_model 4096, 32 heads, d_ff 11008, 32 layers, seq 4096, batch 1).

    python benchmarks/backend_speed.py torch [--repeats 7] [--threads N] [--layers 4]
    python benchmarks/backend_speed.py dask [--repeats 5] [--workers 2] [--trials 2] [--batch 2] [--threads N]
    python benchmarks/backend_speed.py gpu [--backend torch|cupy] [--repeats 5] [--llama] [--rng host|device]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from check_speed import (REFERENCE, BareGemm, blas_threads, gemm_flop, gemm_shapes, load_note,  # noqa: E402
                         set_blas_threads, torch_bare)

med = statistics.median


def bench_torch(args) -> None:
    import torch

    from sigprop.mc.backend import get_backend
    from sigprop.mc.model import simulate
    from sigprop.model import resolve

    if args.threads is not None and not set_blas_threads(args.threads):
        print("could not set OpenBLAS threads (set OPENBLAS_NUM_THREADS instead)")
    threads = blas_threads()
    torch.set_num_threads(threads)
    tb = get_backend("torch", "cpu")
    models = {a: resolve(a, n_layers=args.layers, **REFERENCE) for a in args.arch}
    print(f"torch CPU backend vs NumPy backend: {args.layers} layers, d_model 256, seq 128, batch {args.batch}, "
          f"float32; {threads} BLAS thread(s), torch {torch.__version__}; {load_note()} (start)")
    shapes = gemm_shapes(next(iter(models.values())), args.batch)
    gf = gemm_flop(shapes) / 1e9
    np_bare, t_bare = BareGemm(shapes), torch_bare(torch, shapes)
    for m in models.values():                                   # warm-up
        simulate(m, batch=args.batch, trials=1, seed=0)
        simulate(m, batch=args.batch, trials=1, seed=0, backend=tb)
    np_bare.run(), t_bare()
    t = {(a, b): [] for a in models for b in ("numpy", "torch")}
    bare = {"numpy": [], "torch": []}
    for r in range(args.repeats):
        bare["numpy"].append(np_bare.run())
        bare["torch"].append(t_bare())
        for a, m in models.items():
            t[a, "numpy"].append(simulate(m, batch=args.batch, trials=1, seed=r + 1).simulate_s)
            t[a, "torch"].append(simulate(m, batch=args.batch, trials=1, seed=r + 1, backend=tb).simulate_s)
    print(f"median of {args.repeats} (one trial each):")
    bn, bt = med(bare["numpy"]), med(bare["torch"])
    print(f"  bare float32 products of the trial's shapes: np.matmul {bn * 1e3:8.1f} ms ({gf / bn:.1f} GFLOP/s), "
          f"torch.matmul {bt * 1e3:8.1f} ms ({gf / bt:.1f} GFLOP/s); torch / numpy time {bt / bn:.2f}")
    for a in models:
        n, tt = med(t[a, "numpy"]), med(t[a, "torch"])
        print(f"  {a:7s} numpy {n * 1e3:8.1f} ms   torch {tt * 1e3:8.1f} ms   torch / numpy time {tt / n:.2f}")
    print(f"  ({load_note()} at the end)")


def _burn(seconds, q):
    t0, c0 = time.perf_counter(), time.process_time()
    x = 0
    while time.perf_counter() - t0 < seconds:
        x += 1
    q.put(time.process_time() - c0)


def cpu_capacity(n: int, seconds: float = 2.0) -> float:
    """Cores that ``n`` busy-looping processes get together (CPU seconds / wall seconds): on an
    idle machine about min(n, cores); where this process tree is held to a CPU share, the same
    figure for every n."""
    import multiprocessing as mp

    q = mp.Queue()
    ps = [mp.Process(target=_burn, args=(seconds, q)) for _ in range(n)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    return sum(q.get() for _ in ps) / seconds


FLOOR_SLICE = [("preln", "normal", 12, 0.0, False), ("preln", "normal", 12, 0.1, False),
               ("postln", "normal", 12, 0.0, False), ("postln", "normal", 12, 0.1, False)]


def bench_dask(args) -> None:
    from sigprop.mc.distributed import connect
    from sigprop.mc.floor import run_many, run_one

    if args.threads is not None and not set_blas_threads(args.threads):
        print("could not set OpenBLAS threads (set OPENBLAS_NUM_THREADS instead)")
    tasks = [(*cfg, args.trials, args.batch, 0) for cfg in FLOOR_SLICE]
    print(f"floor slice of {len(tasks)} configurations (d_model 256, seq 128, {args.trials} trials x batch "
          f"{args.batch}): one process ({blas_threads()} BLAS thread(s)) vs a LocalCluster of {args.workers} "
          f"single-threaded workers; {load_note()} (start)")
    c1, cn = cpu_capacity(1), cpu_capacity(args.workers)
    print(f"  CPU available: 1 busy process gets {c1:.2f} cores, {args.workers} get {cn:.2f} together "
          f"(the most a {args.workers}-worker cluster can gain here: {cn / c1:.2f}x)")
    t0 = time.perf_counter()
    dist = connect("local", args.workers)
    print(f"  LocalCluster start-up {time.perf_counter() - t0:.1f} s (not in the timings below)")
    with dist:
        run_many(list(FLOOR_SLICE)[:1], 2, 1, 0, dist)          # warm-up: imports, first-call costs
        for t in tasks[:1]:
            run_one(*t)
        serial, par, share, same = [], [], [], True
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            a = [run_one(*t) for t in tasks]
            serial.append(time.perf_counter() - t0)
            share.append((time.process_time() - c0) / serial[-1])
            t0 = time.perf_counter()
            b = run_many(list(FLOOR_SLICE), args.trials, args.batch, 0, dist)   # the floor's --dask path
            par.append(time.perf_counter() - t0)
            same &= all(_judged(x) == _judged(y) for x, y in zip(a, b))
            print(f"  repetition: one process {serial[-1]:.1f} s (it got {share[-1]:.2f} of a core), cluster "
                  f"{par[-1]:.1f} s ({load_note()})", flush=True)
    s, p = med(serial), med(par)
    print(f"median of {args.repeats}: one process {s:.2f} s, {args.workers} workers {p:.2f} s: speed-up "
          f"{s / p:.2f}x (goal >= 1.7x with 2 workers: {'met' if s / p >= 1.7 else 'NOT met'}); "
          f"verdicts and errors identical: {same}; the one process got {med(share):.2f} of a core (CPU time / wall)"
          + (": the machine's other load leaves no second core to gain" if med(share) < 0.8 else ""))
    print(f"  ({load_note()} at the end)")


def _judged(res: dict) -> tuple:
    return res["pass"], res["n_failures"], res["r2"]["forward_var"], res["r2"]["grad_var"]


def bench_gpu(args) -> None:
    from sigprop.mc.backend import get_backend
    from sigprop.mc.model import _flops, simulate
    from sigprop.model import resolve

    bk = get_backend(args.backend, "cuda")                      # DomainError without a device
    xp = bk.xp

    def sync():
        if bk.name == "torch":
            bk.native.cuda.synchronize()
        else:
            bk.native.cuda.Device().synchronize()

    n = 8192
    a = bk.asarray(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    b = bk.asarray(np.random.default_rng(1).standard_normal((n, n), dtype=np.float32))
    dims = dict(d_model=1024, n_heads=16, d_ff=4096, seq_len=1024, dropout=0.1)
    model = resolve("preln", n_layers=args.layers, **dims)
    batch = 8
    gf = _flops(model, batch) / 1e9
    print(f"{bk}: float32 {n}^3 matmul vs simulate of Pre-LN {args.layers} layers, d_model 1024, seq 1024, "
          f"batch {batch} ({gf:.1f} GFLOP per trial), rng {args.rng}; {load_note()} (start)")
    xp.matmul(a, b), simulate(model, batch=batch, trials=1, backend=bk, stream=args.rng)   # warm-up
    sync()
    mm, sim = [], []
    for r in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(5):
            xp.matmul(a, b)
        sync()
        mm.append((time.perf_counter() - t0) / 5)
        sim.append(simulate(model, batch=batch, trials=1, seed=r, backend=bk, stream=args.rng).simulate_s)
    peak = 2.0 * n**3 / med(mm) / 1e9
    rate = gf / med(sim)
    print(f"median of {args.repeats}: matmul {peak:.0f} GFLOP/s, simulate {med(sim) * 1e3:.1f} ms = {rate:.0f} GFLOP/s"
          f" = {rate / peak:.2f} of the matmul rate (goal >= 0.50: {'met' if rate >= 0.5 * peak else 'NOT met'})")
    if args.llama:
        big = resolve("preln", n_layers=32, d_model=4096, n_heads=32, d_ff=11008, seq_len=4096, dropout=0.0)
        t0 = time.perf_counter()
        meas = simulate(big, batch=1, trials=1, backend=bk, stream=args.rng)
        print(f"LLaMA-7B-sized trial (32 layers, d 4096, seq 4096, batch 1): {time.perf_counter() - t0:.1f} s, "
              f"{meas.gflop:.0f} GFLOP, {meas.gflop / meas.simulate_s:.0f} GFLOP/s")
    print(f"  ({load_note()} at the end)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--repeats", type=int, default=7)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--arch", nargs="+", default=["preln", "postln"])
    d = sub.add_parser("dask")
    d.add_argument("--repeats", type=int, default=5)
    d.add_argument("--workers", type=int, default=2)
    d.add_argument("--trials", type=int, default=2)
    d.add_argument("--batch", type=int, default=2)
    d.add_argument("--threads", type=int, default=None,
                   help="BLAS threads of the one process (default: NumPy's own setting); the workers use 1")
    g = sub.add_parser("gpu")
    g.add_argument("--backend", default="torch", choices=["torch", "cupy"])
    g.add_argument("--repeats", type=int, default=5)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--rng", default="device", choices=["host", "device"])
    g.add_argument("--llama", action="store_true")
    a = ap.parse_args(argv)
    if a.repeats < 5:
        ap.error("use at least 5 repetitions (medians)")
    {"torch": bench_torch, "dask": bench_dask, "gpu": bench_gpu}[a.what](a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
