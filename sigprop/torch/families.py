"""Every Hugging Face family sigprop reads, at reduced sizes, measured as transformers builds
it (``sigprop measure``) against the prediction: the accuracy table of docs/validation.md.

``SMALL`` holds one config per family (4 layers, d_model 128, 4 heads of 32, vocabulary 256,
context 64: the families' own field names, everything else their defaults); :func:`reduced`
makes the larger size from it (8 layers, d_model 256, the heads and key-value heads doubled so
that head_dim and the heads / kv-heads ratio stay, the FFN width doubled, context 64).  Each
family is measured at two inputs: the stream the family's embedding hands to layer 1 (a
Gaussian stream of the embedding's variance: the model's default input) and a unit-variance
stream (``input_var=1``).

``python -m sigprop.torch.families --out docs/validation/hf-families.md`` runs the table (an
hour or more on 2 cores; ``--families``, ``--sizes`` and ``--inputs`` select a part) and
writes the Markdown section that ``python -m sigprop.mc.validate --assemble`` appends.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

_D = dict(vocab_size=256, max_position_embeddings=64, initializer_range=0.02)
_LLAMA = dict(_D, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False)

#: one small config per family (the PyTorch interop tests build these too)
SMALL = {
    "gpt2": dict(model_type="gpt2", vocab_size=256, n_positions=64, n_embd=128, n_layer=4, n_head=4,
                 initializer_range=0.02),
    "bert": dict(_D, model_type="bert", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=512, hidden_act="gelu"),
    "llama": dict(_LLAMA, model_type="llama", rope_theta=10000.0),
    "mistral": dict(_LLAMA, model_type="mistral", rope_theta=10000.0, sliding_window=None),
    "qwen2": dict(_LLAMA, model_type="qwen2", rope_theta=10000.0, use_sliding_window=False),
    "gpt_neox": dict(_D, model_type="gpt_neox", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=512, rotary_pct=1.0, use_parallel_residual=True, hidden_act="gelu"),
    "gptj": dict(model_type="gptj", vocab_size=256, n_positions=64, n_embd=128, n_layer=4, n_head=4,
                 rotary_dim=32, initializer_range=0.02),
    "olmo2": dict(_LLAMA, model_type="olmo2", rope_theta=10000.0),
    "gemma2": dict(_LLAMA, model_type="gemma2", head_dim=32, query_pre_attn_scalar=32,
                   hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None, final_logit_softcapping=None,
                   sliding_window=64),
    "gemma3_text": dict(_LLAMA, model_type="gemma3_text", head_dim=32, query_pre_attn_scalar=32,
                        hidden_activation="gelu_pytorch_tanh", sliding_window=64),
    "qwen3": dict(_LLAMA, model_type="qwen3", head_dim=32, rope_theta=10000.0, use_sliding_window=False),
    "roberta": dict(_D, model_type="roberta", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=512, hidden_act="gelu", max_position_embeddings=66, pad_token_id=1,
                    type_vocab_size=1),
    "distilbert": dict(vocab_size=256, max_position_embeddings=64, initializer_range=0.02, model_type="distilbert",
                       dim=128, n_layers=4, n_heads=4, hidden_dim=512, activation="gelu", dropout=0.0,
                       attention_dropout=0.1),
    "starcoder2": dict(_D, model_type="starcoder2", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=512, hidden_act="gelu_pytorch_tanh", use_bias=True,
                       sliding_window=None, rope_theta=10000.0),
    "phi3": dict(_LLAMA, model_type="phi3", rope_theta=10000.0, sliding_window=None, pad_token_id=0,
                 bos_token_id=1, eos_token_id=2),
    "gemma": dict(_LLAMA, model_type="gemma", head_dim=32, hidden_act="gelu_pytorch_tanh"),
    "cohere": dict(_D, model_type="cohere", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=256, layer_norm_eps=1e-5, hidden_act="silu",
                   rope_theta=10000.0, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "granite": dict(_LLAMA, model_type="granite", rope_theta=10000.0, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=0.03125 * 0.5, logits_scaling=8.0),
    "olmo3": dict(_LLAMA, model_type="olmo3", rope_theta=10000.0, sliding_window=64, pad_token_id=1,
                  eos_token_id=2),
    "smollm3": dict(_LLAMA, model_type="smollm3", rope_theta=10000.0, no_rope_layers=[1, 1, 1, 1],
                    pad_token_id=1, eos_token_id=2),
    "stablelm": dict(_D, model_type="stablelm", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=256, hidden_act="silu", partial_rotary_factor=1.0,
                     use_parallel_residual=True, qk_layernorm=True, use_qkv_bias=True, rope_theta=10000.0),
    "phi": dict(_D, model_type="phi", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=512, hidden_act="gelu_new", partial_rotary_factor=1.0, qk_layernorm=True,
                resid_pdrop=0.1, rope_theta=10000.0),
}

#: the sizes measured: (layers, width factor, sequence length)
SIZES = {"A": (4, 1, 32), "B": (8, 2, 64)}
#: the inputs measured: name -> model options
INPUTS = {"embedding": {}, "unit": {"input_var": 1.0}}

#: the families' names for depth, width, heads, key-value heads and FFN width
_KEYS = (("num_hidden_layers", "n_layer", "n_layers"), ("hidden_size", "n_embd", "dim"),
         ("num_attention_heads", "n_head", "n_heads"), ("num_key_value_heads",),
         ("intermediate_size", "hidden_dim", "n_inner"))


def reduced(family: str, size: str = "A") -> dict:
    """``family``'s config at ``size`` (:data:`SIZES`): the small one, or that with the depth
    set and width, heads, key-value heads and FFN width scaled (head_dim kept)."""
    cfg = dict(SMALL[family])
    layers, factor, _ = SIZES[size]
    depth, *widths = _KEYS
    for k in depth:
        if k in cfg:
            cfg[k] = layers
    if isinstance(cfg.get("no_rope_layers"), list):
        cfg["no_rope_layers"] = [1] * layers
    for keys in widths:
        for k in keys:
            if cfg.get(k) is not None:
                cfg[k] = cfg[k] * factor
    return cfg                            # (gptj's rotary_dim is per head: it stays)


def measure_one(family: str, size: str = "A", inputs: str = "embedding", *, trials: int = 8, batch: int = 4,
                seed: int = 0) -> dict:
    """One row of the table: ``family`` at ``size`` with ``inputs``, measured as transformers
    builds it (``trials`` builds x ``batch`` sequences, ``seed``) against the prediction."""
    from sigprop.interop import hf
    from sigprop.interop.torch_names import layout
    from sigprop.torch.measure import compare_measured, hf_source, measure

    from sigprop.errors import DomainError

    seq_len = SIZES[size][2]
    t0 = time.perf_counter()
    try:
        r = hf.resolve(reduced(family, size), seq_len=seq_len, **INPUTS[inputs])
    except DomainError as e:
        return {"family": family, "size": size, "inputs": inputs, "refused": str(e), "passed": None}
    src = hf_source(r.transformers_config(), r.family, layout=layout("hf:" + r.family))
    meas = measure(r.model, src, trials=trials, batch=batch, seed=seed, threads=1)
    t1 = time.perf_counter()
    _, res = compare_measured(r.model, meas)
    t2 = time.perf_counter()
    m = r.model
    return {"family": family, "size": size, "inputs": inputs, "layers": m.n_layers, "d_model": m.d_model,
            "heads": f"{m.n_heads}/{m.n_kv_heads or m.n_heads}", "seq_len": m.seq_len, "input_var": m.input.var,
            "passed": res.passed, "errors": res.errors, "failures": res.failures[:3], "trials": trials,
            "batch": batch, "seed": seed, "measure_s": t1 - t0, "predict_s": t2 - t1}


def _pct(e: dict, key: str, stat: str) -> str:
    v = e[key][stat]
    return "-" if v is None else f"{100 * v:.1f}"


def _abs(e: dict, key: str) -> str:
    v = e[key]["max"]
    return "-" if v is None else f"{v:.3f}"


def markdown(rows: list[dict], command: str) -> str:
    """The section of docs/validation.md: one row per family, size and input."""
    done = [r for r in rows if "refused" not in r]
    n_pass = sum(r["passed"] for r in done)
    trials, batch, seed = done[0]["trials"], done[0]["batch"], done[0]["seed"]
    said = {"A": "A: 4 layers, d_model 128, 4 heads of 32, 32 tokens",
            "B": "B: 8 layers, d_model 256, heads and key-value heads doubled, the FFN width too, 64 tokens"}
    present = [k for k in SIZES if any(r["size"] == k for r in rows)]
    sizes = (f"{'one reduced size' if len(present) == 1 else 'reduced sizes'} ("
             + "; ".join(said[k] for k in present) + ")")
    head = f"""
## Hugging Face families against transformers' own models

`{command}` (sigprop/torch/families.py): every family of docs/hf.md that the PyTorch interop
tests build, at {sizes}, built by transformers {_version()} from the config with the family's own
random init and measured with hooks in training mode (`sigprop measure`: {trials} builds x {batch} sequences,
seed {seed}, float32), against the prediction from the same config. Inputs: "embedding", a
Gaussian stream of the variance the family's embedding hands to layer 1 (the default), and
"unit", variance 1. Pass: `check`'s default rule (5% relative for variances or 0.03 absolute for
correlations, or within 4 standard errors). Errors over every point: median / max in percent
(correlations and the logit variance: max). {n_pass} of {len(done)} rows measured pass
({len(rows) - len(done)} refused by the prediction, named below the table).

| family | size | input | heads (q/kv) | result | fwd var % med / max | grad var % med / max | fwd corr max | grad corr max | logit var % max | s (measure / predict) |
|---|---|---|---|---|---|---|---|---|---|---|
"""
    body = []
    for r in done:
        e = r["errors"]
        body.append(f"| {r['family']} | {r['size']} | {r['inputs']} | {r['heads']} | "
                    f"{'pass' if r['passed'] else 'FAIL'} | {_pct(e, 'forward_var_relerr', 'median')} / "
                    f"{_pct(e, 'forward_var_relerr', 'max')} | {_pct(e, 'grad_var_relerr', 'median')} / "
                    f"{_pct(e, 'grad_var_relerr', 'max')} | {_abs(e, 'forward_corr_abserr')} | "
                    f"{_abs(e, 'grad_corr_abserr')} | {_pct(e, 'logit_var_relerr', 'max')} | "
                    f"{r['measure_s']:.0f} / {r['predict_s']:.0f} |")
    fails = [r for r in done if not r["passed"]]
    tail = ""
    if fails:
        tail += "\nFailures (the first points outside tolerance):\n\n" + "\n".join(
            f"- {r['family']} {r['size']} {r['inputs']}: " + "; ".join(r["failures"]) for r in fails) + "\n"
    refused = [r for r in rows if "refused" in r]
    if refused:
        tail += "\nRefused (sigprop names what it cannot model):\n\n" + "\n".join(
            f"- {r['family']} {r['size']} {r['inputs']}: {r['refused']}" for r in refused) + "\n"
    return head + "\n".join(body) + "\n" + tail


def _version() -> str:
    try:
        import transformers
        return transformers.__version__
    except ImportError:                       # pragma: no cover - the table needs transformers
        return "?"


def _stored_rows(path: str) -> dict:
    """The rows of a ``--rows`` file by (family, size, input, trials, batch, seed); a missing
    file is empty, a line that does not parse is skipped (a run killed while writing)."""
    from pathlib import Path

    from sigprop import files

    out = {}
    if not Path(path).is_file():
        return out
    for line in files.read_text(path, "--rows file", limit=64 << 20).splitlines():
        try:
            row = json.loads(line)
            key = tuple(row.pop("key"))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        out[key] = row
    return out


def _append_row(path: str, row: dict) -> None:
    """One JSON line at the end of ``path`` (on a line of its own after a half-written one)."""
    import os

    with open(path, "ab") as f:
        if f.tell() > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write(b"\n")
        f.write((json.dumps(row) + "\n").encode("utf-8"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sigprop.torch.families", description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(SMALL), help="comma-separated (default: all)")
    ap.add_argument("--sizes", default="A,B")
    ap.add_argument("--inputs", default="embedding,unit")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the Markdown section here (default: print it)")
    ap.add_argument("--rows", help="a JSON-lines file of measured rows: each row is appended as it is measured, "
                    "and a row already there (same family, size, input, trials, batch and seed) is taken "
                    "from it instead of measured again (a long run resumes)")
    a = ap.parse_args(argv)
    fams = [f for f in a.families.split(",") if f]
    for name, known, what in ((fams, SMALL, "family"), (a.sizes.split(","), SIZES, "size"),
                              (a.inputs.split(","), INPUTS, "input")):
        bad = [x for x in name if x not in known]
        if bad:
            print(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}", file=sys.stderr)
            return 2
    stored = _stored_rows(a.rows) if a.rows else {}
    rows = []
    for fam in fams:
        for size in a.sizes.split(","):
            for inp in a.inputs.split(","):
                key = (fam, size, inp, a.trials, a.batch, a.seed)
                row = stored.get(key)
                if row is None:
                    row = measure_one(fam, size, inp, trials=a.trials, batch=a.batch, seed=a.seed)
                    if a.rows:
                        _append_row(a.rows, {"key": list(key), **row})
                rows.append(row)
                if "refused" in row:
                    print(f"{fam} {size} {inp}: refused: {row['refused']}", file=sys.stderr, flush=True)
                else:
                    print(f"{fam} {size} {inp}: {'pass' if row['passed'] else 'FAIL'} "
                          f"({row['measure_s']:.0f} + {row['predict_s']:.0f} s)", file=sys.stderr, flush=True)
    command = "python -m sigprop.torch.families" + "".join(
        f" --{k} {v}" for k, v in (("families", a.families), ("sizes", a.sizes), ("inputs", a.inputs))
        if v != ap.get_default(k))
    text = markdown(rows, command)
    if a.out:
        from pathlib import Path
        Path(a.out).write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0 if all(r["passed"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
