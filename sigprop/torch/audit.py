"""The init audit (``sigprop audit``): a PyTorch model as its own code initialises it (a
Hugging Face config built by transformers, or a user's factory), compared tensor by tensor
with the init the sigprop model assumes.

torch's global generator is seeded with ``seed`` and the model built once.  Then, by module
names (:mod:`sigprop.interop.torch_names`):

* every mapped weight matrix (a fused matrix's part on its own: GPT-2's ``c_attn`` as q, k, v)
  against the sigprop model's ``std`` of that layer and weight (a branch scale folded into the
  output weight where the layout has no scale attributes, as :func:`sigprop.torch.apply_init`
  writes it): its sample std and its sample mean (assumed 0);
* its bias against ``bias_std`` (std and mean; a bias_std of 0: every entry 0);
* every LayerNorm/RMSNorm: gain (the layout's ``norm_gain_weight``: 1, or 0 for Gemma's
  ``x_hat * (1 + w)`` norms) and bias 0, entry by entry.

Sampling tolerance: n iid N(0, s^2) entries have a sample std with relative standard error
about 1/sqrt(2n) and a sample mean with standard error s/sqrt(n); a tensor matches when
``|std / s - 1| <= Z / sqrt(2n) + REL`` and ``|mean| / s <= Z / sqrt(n) + REL`` (Z = 5, REL =
0.01).  What should be exactly 0 or exactly the norm gain is allowed :data:`EXACT` (absolute).

Parameters that sigprop has no assumption for (embeddings, an output head) are listed as not
compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sigprop.errors import DomainError
from sigprop.interop.torch_names import OUTPUT_WEIGHTS, init_plan

#: standard errors allowed, and the relative slack on top
Z = 5.0
REL = 0.01
#: absolute tolerance of a value that should be exact (a zero bias, a norm gain)
EXACT = 1e-6
#: bytes of one float32 parameter, and the factor for what building and initialising holds
#: besides the parameters themselves
_BYTES, _OVERHEAD = 4, 1.5


@dataclass
class Row:
    name: str                 # the tensor's full module name (with [q] etc. for a fused part)
    group: str                # attention.q, ffn.out, attention.o bias, norm gain, ...
    n: int
    std: float
    mean: float
    assumed_std: float
    assumed_mean: float
    ok: bool
    deviation: float          # |std / assumed - 1| (or, assumed exact: max |x - assumed|)
    why: str = ""             # where the assumed value comes from
    layer: int | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "group": self.group, "layer": None if self.layer is None else self.layer + 1,
                "n": self.n, "std": self.std, "mean": self.mean, "assumed_std": self.assumed_std,
                "assumed_mean": self.assumed_mean, "ok": self.ok, "deviation": self.deviation, "why": self.why}


@dataclass
class AuditResult:
    rows: list
    seed: int
    not_compared: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def mismatches(self) -> list:
        return [r for r in self.rows if not r.ok]

    def summary(self) -> list[dict]:
        """Per group, in first-seen order: tensors, mismatches, the largest deviation."""
        out: dict = {}
        for r in self.rows:
            g = out.setdefault(r.group, {"group": r.group, "tensors": 0, "mismatches": 0, "max_deviation": 0.0,
                                         "exact": r.assumed_std == 0.0})
            g["tensors"] += 1
            g["mismatches"] += 0 if r.ok else 1
            g["max_deviation"] = max(g["max_deviation"], r.deviation)
        return list(out.values())

    def to_json(self) -> dict:
        return {"schema": "sigprop.audit/1", "passed": self.passed, "seed": self.seed,
                "tolerance": {"z": Z, "rel": REL, "exact": EXACT,
                              "rule": "|std/assumed - 1| <= z/sqrt(2n) + rel and |mean|/assumed <= z/sqrt(n) + rel; "
                                      "an assumed 0 or norm gain: max |x - assumed| <= exact"},
                "mismatches": len(self.mismatches), "tensors": [r.to_json() for r in self.rows],
                "summary": self.summary(), "not_compared": self.not_compared}


def require_libraries(transformers: bool = False) -> None:
    """The one-line DomainError naming the extra when torch (or transformers) is missing."""
    import importlib.util

    for name, needed in (("torch", True), ("transformers", transformers)):
        if needed and importlib.util.find_spec(name) is None:
            raise DomainError(f"sigprop audit needs {'PyTorch' if name == 'torch' else 'transformers'}: "
                              "pip install 'sigprop[torch]'")


def parameter_estimate(model, vocab: int | None = None, positions: int | None = None) -> int:
    """Parameters of the model sigprop describes: every layer's weights and biases, its norms,
    and an embedding of ``vocab`` (and ``positions``) rows where given."""
    per_layer = 0
    for kind in ("attention", "ffn"):
        for name in model.sublayer_columns(kind).names:
            fi, fo = model.fans(kind, name)
            per_layer += fi * fo + fo
    per_layer += 4 * model.d_model
    return model.n_layers * per_layer + ((vocab or 0) + (positions or 0) + 2) * model.d_model


def check_size(model, vocab: int | None, positions: int | None, reduce_hint: str) -> None:
    """DomainError when building the model would need more than the available memory."""
    from sigprop.mc import component

    need = parameter_estimate(model, vocab, positions) * _BYTES * _OVERHEAD
    have = component.available_memory()
    if have is None or need <= have:
        return
    raise DomainError(f"building this model ({model.n_layers} layers, d_model {model.d_model}, d_ff {model.d_ff}"
                      f"{f', vocabulary {vocab}' if vocab else ''}) needs about {need / 2**30:.3g} GiB, more than the "
                      f"{have / 2**30:.3g} GiB available: {reduce_hint}")


def _stats(torch, t) -> tuple[int, float, float, float]:
    """(entries, std (population), mean, max |x|) in double precision."""
    x = t.detach().double().reshape(-1)
    n = int(x.numel())
    if n == 0:
        return 0, 0.0, 0.0, 0.0
    mean = float(x.mean())
    return n, float(x.std(unbiased=False)), mean, float(x.abs().max())


def judge(n: int, std: float, mean: float, amax: float, assumed: float) -> tuple[bool, float]:
    """(matches, deviation) of a tensor of n entries against N(0, assumed^2) (assumed 0: all 0)."""
    if assumed == 0.0:
        return amax <= EXACT, amax
    dev = abs(std / assumed - 1.0)
    return dev <= Z / math.sqrt(2 * n) + REL and mean_ok(n, mean, assumed), dev


def mean_ok(n: int, mean: float, assumed: float) -> bool:
    """Whether the sample mean of n entries of N(0, assumed^2) is within the tolerance."""
    return abs(mean) / assumed <= Z / math.sqrt(n) + REL


def _why(model, kind: str, name: str, layer: int, std: float, init_std: float | None) -> str:
    if init_std is not None and init_std > 0:
        if math.isclose(std, init_std, rel_tol=1e-9):
            return "initializer_range"
        scaled = init_std / math.sqrt(2 * model.n_layers)
        if name in OUTPUT_WEIGHTS and math.isclose(std, scaled, rel_tol=1e-9):
            return f"scaled init: initializer_range/sqrt(2 x {model.n_layers})"
    return f"layer {layer + 1} {kind} {name}"


def audit(model, source, *, seed: int = 0, init_std: float | None = None) -> AuditResult:
    """Build ``source``'s model once (torch's global generator seeded with ``seed``; the caller's
    generator state is restored) and compare its tensors with ``model``'s init.  ``init_std``:
    the family's initializer_range (for the explanation of an assumed std only)."""
    from sigprop.torch.init import is_norm, model_blocks, plan_views
    from sigprop.torch.measure import _guarded, require_libraries

    torch, _ = require_libraries()
    lay = source.layout
    if lay.init_refused:
        raise DomainError(f"layout {lay.name} cannot be audited (its modules do not hold sigprop's stds one to "
                          f"one): {lay.init_refused}")
    plan = init_plan(model, scales=lay.scales is not None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        net = _guarded(source.build, "building the model")
    if not isinstance(net, torch.nn.Module):
        raise DomainError(f"{source.description or 'the factory'} returned {type(net).__name__}, not a "
                          "torch.nn.Module (the model to audit)")
    prefix, blocks = model_blocks(net, model, lay)
    param_names = {id(p): n for n, p in net.named_parameters()}
    seen: set = set()
    rows = []
    for step, where, w, mod, view, bview in plan_views(model, lay, plan, prefix, blocks):
        i, kind, name = step["layer"], step["kind"], step["name"]
        part = f"[{name}]" if w.split is not None else ""
        base = f"{where}.{w.path}" if w.path else where
        seen.add(id(mod.weight))
        why = _why(model, kind, name, i, step["std"], init_std)
        n, s, mu, amax = _stats(torch, view)
        ok, dev = judge(n, s, mu, amax, step["std"])
        rows.append(Row(f"{base}.weight{part}", f"{kind}.{name}", n, s, mu, step["std"], 0.0, ok, dev, why, i))
        if bview is not None:
            seen.add(id(mod.bias))
            n, s, mu, amax = _stats(torch, bview)
            ok, dev = judge(n, s, mu, amax, step["bias_std"])
            rows.append(Row(f"{base}.bias{part}", f"{kind}.{name} bias", n, s, mu, step["bias_std"], 0.0, ok, dev,
                            f"layer {i + 1} {kind} {name} bias_std", i))
        elif step["bias_std"] > 0:
            rows.append(Row(f"{base}.bias{part}", f"{kind}.{name} bias", 0, 0.0, 0.0, step["bias_std"], 0.0, False,
                            math.inf, "the module has no bias", i))
    g = float(lay.norm_gain_weight)
    block_names = [f"{prefix}{lay.block.format(i)}." for i in range(len(blocks))]
    for mname, mod in net.named_modules():
        if not is_norm(mod):
            continue
        layer = next((i for i, b in enumerate(block_names) if mname.startswith(b)), None)
        for attr, target, group in (("weight", g, "norm gain"), ("bias", 0.0, "norm bias")):
            p = getattr(mod, attr, None)
            if p is None or not torch.is_tensor(p):
                continue
            seen.add(id(p))
            x = p.detach().double().reshape(-1)
            n = int(x.numel())
            dev = float((x - target).abs().max()) if n else 0.0
            rows.append(Row(f"{mname}.{attr}", group, n, float(x.std(unbiased=False)) if n else 0.0,
                            float(x.mean()) if n else 0.0, 0.0, target, dev <= EXACT, dev,
                            "gain 1 (x_hat * (1 + w): w = 0)" if group == "norm gain" and g == 0.0 else
                            ("gain 1" if group == "norm gain" else "bias 0"), layer))
    not_compared = [n for pid, n in param_names.items() if pid not in seen]
    return AuditResult(rows, int(seed), not_compared)
