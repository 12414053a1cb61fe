"""The trace of a real PyTorch model, measured with hooks (``sigprop measure``).

Every trial builds the model afresh from its own seed (so the weights are a new draw of the
model's own random init, or of a sigprop init applied with :func:`sigprop.torch.apply_init`),
puts it in training mode (dropout active) and runs one forward and backward pass of a batch:

* input: the model's Gaussian stream (mean, variance, token correlation of the sigprop
  model's ``input``) fed as the residual stream entering layer 1 (a forward pre-hook on the
  first block replaces its hidden states, so the embedding does not matter), or, with
  ``tokens``, random token ids through the model's own embedding (the input point is then the
  stream the embedding hands to block 1; the ids repeat within a sequence as the embedding
  rule assumes, :func:`token_ids`);
* upstream gradient: the sigprop model's ``grad`` (Gaussian, zero mean, its token correlation)
  at the model's output (after the final norm where the model has one): the loss is
  sum(output * G);
* recorded per trace point (:func:`sigprop.interop.torch_names.stream_points`: the tensor that
  is the residual stream after each sublayer, found by module hooks) the raw moments of the
  stream and of its gradient (tensor hooks) exactly as the Monte Carlo records them
  (:func:`sigprop.mc.stats.raw_moments`, pooled over trials by :func:`sigprop.mc.stats.pool`),
  and per attention the mean and second moment of all L x L pre-softmax logits (the queries
  and keys as the attention function receives them: after rotary positions and QK-norm, times
  the attention's own scaling), pooled by :func:`sigprop.mc.model.logit_stats`.

Hugging Face models run with ``attn_implementation="eager"``; the logits are read by wrapping
the family's ``eager_attention_forward`` for the duration of the measurement.  Plain models
(:data:`sigprop.interop.torch_names.PLAIN`) are called as ``net(x)`` with the stream entering
layer 1; their logits come from the outputs of ``attn.q`` and ``attn.k`` (not measured where
the sigprop model has rotary positions or QK-norm, which act between the projection and the
logits).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sigprop.errors import DomainError
from sigprop.interop.torch_names import Layout, stream_points
from sigprop.mc.model import ModelMeasurement, check_memory, logit_stats, point_labels, trial_seeds
from sigprop.mc.sampling import correlated
from sigprop.mc.stats import pool, raw_moments
from sigprop.torch.init import apply_init, find_blocks, submodule, torch_module

HINT = "pip install 'sigprop[torch]'"


def require_libraries(transformers: bool = False):
    """(torch, transformers or None), or the one-line DomainError naming the extra."""
    try:
        import torch
    except ImportError:
        raise DomainError(f"sigprop measure needs PyTorch: {HINT}") from None
    tf = None
    if transformers:
        try:
            import transformers as tf
        except ImportError:
            raise DomainError(f"sigprop measure --hf-config needs transformers: {HINT}") from None
    return torch, tf


@dataclass
class Source:
    """What to measure: ``build()`` returns a fresh model (called after seeding torch's global
    generator, so that the model's own init is that trial's draw); ``layout`` names its
    modules; ``hf``: a Hugging Face model (called with ``input_ids``) rather than a plain one
    (called with the stream); ``vocab``: its vocabulary size (for ``tokens``)."""

    build: Callable
    layout: Layout
    hf: bool
    vocab: int | None = None
    description: str = ""


def hf_source(config: dict, family: str, *, layout: Layout) -> Source:
    """A Hugging Face model built from ``config`` (a config.json dict) with transformers' own
    random init (``AutoModel.from_config``: no weights are downloaded), eager attention."""
    _, tf = require_libraries(transformers=True)
    tf.logging.set_verbosity_error()            # its notes on unused config fields are not ours
    if config.get("model_type") == "gemma3" and isinstance(config.get("text_config"), dict):
        config = config["text_config"]            # the language model (gemma3_text)
    cfg_dict = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version", "architectures")}
    try:
        cfg = tf.AutoConfig.for_model(family, **cfg_dict)
    except (ValueError, KeyError, TypeError) as e:
        raise DomainError(f"transformers cannot build a {family!r} config: {e}") from None
    cfg._attn_implementation = "eager"
    try:        # import the family's modeling code now, not inside the first timed trial
        tf.models.auto.modeling_auto.MODEL_MAPPING[type(cfg)]
    except (KeyError, AttributeError, ValueError):
        raise DomainError(f"transformers {tf.__version__} has no model for {family!r}") from None

    def build():
        return tf.AutoModel.from_config(cfg, attn_implementation="eager")
    return Source(build, layout, True, int(getattr(cfg, "vocab_size", 0) or 0) or None,
                  f"transformers {tf.__version__} {family}")


def module_source(factory: Callable, *, layout: Layout, description: str = "") -> Source:
    return Source(factory, layout, False, None, description)


def load_factory(spec: str) -> Callable:
    """``package.module:factory`` -> the callable (DomainError when it cannot be imported).
    The current directory is put first on ``sys.path`` (as ``python -m`` does; the console
    script does not), so that ``my_model:build`` finds ``./my_model.py``."""
    import importlib
    import os

    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise DomainError(f"--module must be package.module:factory, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:          # noqa: BLE001 - any import failure is the user's input
        raise DomainError(f"cannot import {mod_name!r}: {type(e).__name__}: {e}") from None
    obj = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise DomainError(f"module {mod_name!r} has no {attr!r}")
    if not callable(obj):
        raise DomainError(f"{spec!r} is not callable")
    return obj


@contextlib.contextmanager
def _logit_probe(torch, net, attn_index: dict, logits: dict):
    """Wrap the eager attention function of ``net``'s modeling module: each call from an
    attention module in ``attn_index`` (id -> point index) records the (mean, second moment)
    of its scaled logits."""
    mods = {sys.modules[type(m).__module__] for m in net.modules() if id(m) in attn_index}
    patched = []
    for mod in mods:
        orig = getattr(mod, "eager_attention_forward", None)
        if orig is None:
            continue

        def probe(module, query, key, value, attention_mask, *args, _orig=orig, **kwargs):
            k = attn_index.get(id(module))
            if k is not None:
                scaling = kwargs.get("scaling", args[0] if args else None)
                if scaling is None:
                    scaling = query.shape[-1] ** -0.5
                logits[k] = _logit_moments(torch, query, key, float(scaling))
            return _orig(module, query, key, value, attention_mask, *args, **kwargs)
        mod.eager_attention_forward = probe
        patched.append((mod, orig))
    try:
        yield
    finally:
        for mod, orig in patched:
            mod.eager_attention_forward = orig


def _logit_moments(torch, q, k, scaling: float) -> tuple[float, float]:
    """Mean and second moment of all L x L logits scaling * q_i . k_j over batch and heads
    (q: (B, H, L, dh), k: (B, H_kv, L, dh); query head h uses key head h // (H / H_kv))."""
    with torch.no_grad():
        q64, k64 = q.detach().double(), k.detach().double()
        if k64.shape[1] != q64.shape[1]:
            k64 = k64.repeat_interleave(q64.shape[1] // k64.shape[1], dim=1)
        s = torch.matmul(q64, k64.transpose(-1, -2)) * scaling
        return float(s.mean()), float((s * s).mean())


def token_ids(rng, batch: int, L: int, vocab: int) -> np.ndarray:
    """Random token ids (batch, L) in which two positions of a sequence hold the same token with
    probability about r0 = :data:`sigprop.model.presets.R0_EMBEDDING`, the embedding rule's
    assumption: each position takes its sequence's shared token with probability sqrt(r0),
    else a uniform one (same-token probability r0 + (1 - r0) / vocab)."""
    from sigprop.model.presets import R0_EMBEDDING

    shared = rng.integers(0, vocab, size=(batch, 1))
    own = rng.integers(0, vocab, size=(batch, L))
    take = rng.random((batch, L)) < math.sqrt(R0_EMBEDDING)
    return np.where(take, shared, own).astype(np.int64)


def _guarded(fn, what: str):
    """fn(); an error raised by the user's model or by transformers becomes one DomainError line."""
    try:
        return fn()
    except DomainError:
        raise
    except Exception as e:          # noqa: BLE001 - the model's code, not sigprop's
        msg = " ".join(str(e).split())
        raise DomainError(f"{what} failed: {type(e).__name__}: {msg[:300]}") from None


def _first_tensor(x):
    if isinstance(x, (tuple, list)):
        return x[0]
    return x


def measure(model, source: Source, *, trials: int = 4, batch: int = 4, seed: int = 0, dtype: str = "float32",
            tokens: bool = False, init=None, progress=None, threads: int | None = None) -> ModelMeasurement:
    """Measure ``source``'s model against the sigprop ``model`` that describes it: ``trials``
    fresh builds (trial t seeded from the t-th child of ``SeedSequence(seed)``), each one
    forward and backward pass of ``batch`` sequences of ``model.seq_len`` tokens.  ``init``: a
    sigprop model or solution applied with :func:`apply_init` to every build (from the same
    trial seed).  ``threads``: torch's intra-op threads for the run (default: as set; small
    models on a busy machine run far faster on 1).  Returns the measurement in the form of the Monte Carlo's
    (:class:`sigprop.mc.model.ModelMeasurement`, backend "torch")."""
    torch, _ = require_libraries()
    if trials < 2:
        raise DomainError(f"trials must be >= 2 (a standard error needs two), got {trials}")
    if batch < 1:
        raise DomainError(f"batch must be >= 1, got {batch}")
    if dtype not in ("float32", "float64"):
        raise DomainError(f"dtype must be float32 or float64, got {dtype!r}")
    if tokens and not source.hf:
        raise DomainError("--tokens needs a model with an embedding (--hf-config)")
    tdt = getattr(torch, dtype)
    m = model
    check_memory(m, batch, dtype)        # (a forward and backward holds what the Monte Carlo's draw holds)
    parallel = m.block == "parallel"
    labels = point_labels(m)
    n_points = len(labels)
    pts = stream_points(source.layout, parallel)
    seeds = trial_seeds(seed, trials)
    fw = np.zeros((trials, n_points, 3))
    bw = np.zeros((trials, n_points, 3))
    lg = np.full((trials, n_points, 2), np.nan)
    old_threads = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise DomainError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    try:
        # each trial seeds torch's global generator (the model's own init draws from it); the
        # caller's generator state is restored afterwards, as are its thread count
        with torch.random.fork_rng(devices=[]):
            fw, bw, lg, sim_s = _trials(torch, m, source, pts, seeds, batch, tdt, tokens, init, progress, fw, bw, lg)
    finally:
        torch.set_num_threads(old_threads)
    from sigprop.mc.model import _flops

    flops = trials * _flops(m, batch) / 1e9
    forward = [pool(fw[:, k]) for k in range(n_points)]
    backward = [pool(bw[:, k], centred=False) for k in range(n_points)]
    return ModelMeasurement(forward, backward, logit_stats(lg), trials, batch, seed, dtype, sim_s, flops, lg,
                            "torch", "cpu", "torch", None, labels)


def _trials(torch, m, source, pts, seeds, batch, tdt, tokens, init, progress, fw, bw, lg):
    trials = len(seeds)
    t0 = time.perf_counter()
    for t in range(trials):
        ss = seeds[t]
        rng = np.random.default_rng(ss)
        torch_seed = int(ss.generate_state(1, dtype=np.uint64)[0] & ((1 << 63) - 1))
        torch.manual_seed(torch_seed)
        net = _guarded(source.build, "building the model")
        if not isinstance(net, torch.nn.Module):
            raise DomainError(f"{source.description or 'the factory'} returned {type(net).__name__}, not a "
                              "torch.nn.Module (the model to measure)")
        if init is not None:
            apply_init(net, init, layout=source.layout.name,
                       generator=torch.Generator().manual_seed(torch_seed ^ 0x5EED))
        net = net.to(tdt)
        net.train()
        fw[t], bw[t], lg[t] = _one_trial(torch, net, m, source, pts, batch, rng, tdt, tokens)
        del net
        if progress:
            progress(t + 1, trials)
    return fw, bw, lg, time.perf_counter() - t0


def _one_trial(torch, net, m, source: Source, pts, batch: int, rng, tdt, tokens: bool):
    lay = source.layout
    prefix, blocks = find_blocks(net, lay)
    if len(blocks) != m.n_layers:
        raise DomainError(f"the PyTorch model has {len(blocks)} blocks ({prefix}{lay.block}), the sigprop "
                          f"model {m.n_layers} layers")
    n_points = 1 + len(pts) * m.n_layers
    L, d = m.seq_len, m.d_model
    captured: dict = {}
    grads: dict = {}
    logits: dict = {}
    handles = []

    def record(k, x):
        if not torch.is_tensor(x) or x.dim() != 3 or x.shape[-1] != d:
            raise DomainError(f"trace point {k}: expected the residual stream (batch, seq, {d}), got "
                              f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
        captured[k] = x
        if x.requires_grad:
            x.register_hook(lambda g, k=k: grads.__setitem__(k, g))

    X = None
    if not tokens:
        X = torch.from_numpy(correlated(rng, (batch, L, d), m.input.mean, m.input.var, m.input.corr,
                                        np.float64)).to(tdt).requires_grad_(True)

    def pre_first(module, args, kwargs):
        if X is None:
            h = args[0] if args else kwargs.get("hidden_states")
            record(0, h)
            return None
        record(0, X)
        if args:
            return (X, *args[1:]), kwargs
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": X}
        raise DomainError("cannot find the hidden states among the first block's arguments")

    handles.append(blocks[0].register_forward_pre_hook(pre_first, with_kwargs=True))
    attn_index = {}
    for i, blk in enumerate(blocks):
        where = f"{prefix}{lay.block.format(i)}"
        for j, (kind, path, side) in enumerate(pts):
            k = 1 + i * len(pts) + j
            mod = submodule(blk, path, where)
            if side == "out":
                handles.append(mod.register_forward_hook(lambda _m, _a, out, k=k: record(k, _first_tensor(out))))
            else:
                def pre(_m, args, kwargs, k=k):
                    record(k, args[0] if args else kwargs.get("hidden_states"))
                handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
            if kind in ("attention", "block") and lay.attention:
                attn_index[id(submodule(blk, lay.attention, where))] = k
    probe_ctx = contextlib.nullcontext()
    if source.hf:
        probe_ctx = _logit_probe(torch, net, attn_index, logits)
    elif m.rope is None and m.qk_norm is None:
        _plain_logit_hooks(torch, m, blocks, lay, attn_index, logits, handles, prefix)
    try:
        with probe_ctx:
            if source.hf:
                if tokens:
                    ids = torch.from_numpy(token_ids(rng, batch, L, source.vocab))
                else:
                    ids = torch.zeros((batch, L), dtype=torch.long)
                out = _guarded(lambda: net(input_ids=ids), "the forward pass")
                top = out.last_hidden_state if hasattr(out, "last_hidden_state") else _first_tensor(out)
            else:
                top = _first_tensor(_guarded(lambda: net(X), "the forward pass"))
            if tuple(top.shape) != (batch, L, d):
                raise DomainError(f"the model's output has shape {tuple(top.shape)}, expected {(batch, L, d)}")
            G = torch.from_numpy(correlated(rng, (batch, L, d), 0.0, m.grad.var, m.grad.corr, np.float64)).to(top.dtype)
            (top * G).sum().backward()
    finally:
        for h in handles:
            h.remove()
    missing = [k for k in range(n_points) if k not in captured or k not in grads]
    if missing:
        raise DomainError(f"trace points not reached by the hooks: {missing[:5]} (is the model in the "
                          f"{lay.name} layout?)")
    fw = np.array([raw_moments(captured[k].detach().cpu().numpy()) for k in range(n_points)])
    bw = np.array([raw_moments(grads[k].detach().cpu().numpy()) for k in range(n_points)])
    lg = np.full((n_points, 2), np.nan)
    for k, v in logits.items():
        lg[k] = v
    for k in attn_index.values():
        if k not in logits and (source.hf or (m.rope is None and m.qk_norm is None)):
            raise DomainError(f"trace point {k}: the attention logits were not seen (the logit probe found no "
                              "eager attention function)")
    return fw, bw, lg


def _plain_logit_hooks(torch, m, blocks, lay: Layout, attn_index: dict, logits: dict, handles: list, prefix: str):
    """Plain layout: the logits from the outputs of attn.q and attn.k, split into heads."""
    H, Hkv, dh = m.n_heads, m.n_kv_heads, m.d_head
    for i, blk in enumerate(blocks):
        where = f"{prefix}{lay.block.format(i)}"
        att = submodule(blk, lay.attention, where)
        k_point = attn_index[id(att)]
        q_mod = submodule(blk, lay.weights["attention"]["q"].path, where)
        k_mod = submodule(blk, lay.weights["attention"]["k"].path, where)
        box = {}

        def on_q(_m, _a, out, box=box):
            box["q"] = out

        def on_k(_m, _a, out, box=box, k_point=k_point):
            q = box.pop("q", None)
            if q is None:
                return
            B, L = out.shape[0], out.shape[1]
            qh = q.reshape(B, L, H, dh).transpose(1, 2)
            kh = out.reshape(B, L, Hkv, dh).transpose(1, 2)
            logits[k_point] = _logit_moments(torch, qh, kh, dh ** -0.5)
        handles.append(q_mod.register_forward_hook(on_q))
        handles.append(k_mod.register_forward_hook(on_k))


def compare_measured(model, meas, tol: dict | None = None):
    """Predict ``model`` and compare it with the measurement with ``check``'s comparator:
    (points, CheckResult)."""
    from sigprop.model.checking import compare, require_complete
    from sigprop.model.predict import predict

    points = predict(model, stop_at_saturation=True)
    require_complete(points)
    return points, compare(points, meas, tol)


def measure_object(model, res, meas, *, source: Source, tokens: bool, extra: dict | None = None) -> dict:
    """The check object (schema sigprop.check/1) with "source": "torch" and what was measured."""
    from sigprop.model.checking import check_object

    obj = check_object(model, res, meas, meas.seed, meas.trials, meas.batch)
    obj["source"] = "torch"
    obj["measured_model"] = {"layout": source.layout.name, "built_by": source.description,
                             "input": "token ids through the embedding" if tokens else
                             "Gaussian stream replacing the first block's input"}
    if extra:
        obj.update(extra)
    return obj
