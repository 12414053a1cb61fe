"""Fuzzing `sigprop predict` for the README's promise (docs/formats.md, "Exit codes"): whatever
the model options (flags with random values, garbage strings, huge, negative and non-finite
numbers), the --config TOML file, the --spec JSON file or the --hf-config file hold, the exit
code is 0, 1, 2 or 3; a failure is exactly one line on stderr with nothing on stdout; no
traceback ever; each example within a time bound, and (in a subprocess under RLIMIT_AS) a
memory bound.

Reproducible: hypothesis runs derandomized (a fixed seed, no example database), so CI draws the
same examples every time.  The models stay tiny (4 layers, d_model 64, 4 heads, d_ff 128, 16
tokens unless a drawn option replaces one) so an example takes milliseconds to a second.

Left out on purpose (the strategies marked NARROWED; widen them once the fixes are merged):

* hostile files (huge, /dev/zero, FIFOs, directories, nesting 10^5 deep) are not drawn but
  tried one by one (:func:`test_hostile_files`);
* for time: rotary positions (with a causal mask or QK-norm, a first prediction builds its
  tables for tens of seconds on a loaded machine, for every size drawn), the presets and
  Hugging Face families that have them (llama, olmo2, gemma, qwen2, mistral, gpt-neox, gpt-j),
  and valid sizes beyond a few layers and tokens (a valid million-layer model takes minutes:
  that is work, not a fault).

``SIGPROP_FUZZ_SCALE=K`` runs K times as many examples (a longer search on one's own machine).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
import sys
import time
import warnings

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sigprop.model.options import OPTIONS  # noqa: E402
from tests._cli import cli  # noqa: E402
from tests._paths import DATA  # noqa: E402

M = ["--layers", "4", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "16"]
HF_DIR = DATA / "hf"

#: seconds one example may take in-process (a tiny model predicts in well under a second once
#: its tables are built; a first build of an attention table is a few seconds on a loaded CI
#: machine)
DEADLINE_S = 30.0

#: SIGPROP_FUZZ_SCALE=K runs K times the examples (a longer local search; CI runs 1)
SCALE = int(os.environ.get("SIGPROP_FUZZ_SCALE", "1"))
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])


# ---------------------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------------------

#: strings that are not what any option expects, or only nearly
GARBAGE = st.one_of(
    st.sampled_from(["", " ", "-", "--", "nan", "NaN", "inf", "-inf", "+inf", "1e999", "-1e999", "0x10",
                     "1_000", " 3", "3 ", "٣", "1.5", "1e3", "-0", "true", "yes", "None", "null", "[]",
                     "{}", "\t", "é", "💥", "a" * 300, "1" * 400, "--layers", "=", "0b1"]),
    st.text(max_size=12),
)

FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-320, 5e-324, 1e-300, 1e300, 1.7976931348623157e308,
                     -1e300, float("nan"), float("inf"), float("-inf"), 1e10, -1e10, 0.999999, 1.000001]),
    st.floats(allow_nan=True, allow_infinity=True),
)
INTS = st.one_of(st.sampled_from([0, -1, 1, 2, 3, 4, 8, 16, 2**31, 2**53, 2**53 + 1, 2**63, 10**30, -10**30]),
                 st.integers(-10**6, 10**6))


def _small(name: str):
    """A value of the integer option ``name`` that is valid and keeps the model tiny (valid but
    large values cost a prediction of that size: a million layers is minutes)."""
    return {"layers": st.integers(1, 6), "seq_len": st.integers(2, 64), "heads": st.sampled_from([1, 2, 4, 8]),
            "kv_heads": st.sampled_from([1, 2, 4]), "d_head": st.sampled_from([1, 8, 16, 64]),
            "d_model": st.sampled_from([1, 8, 64, 10**6, 10**12]),
            "d_ff": st.sampled_from([1, 64, 128, 10**9]),
            "encoder_layers": st.integers(1, 4), "decoder_layers": st.integers(1, 4),
            "encoder_seq_len": st.integers(2, 32)}[name]


def _int_text(name: str):
    """An integer option's value on the command line: a valid small one, or any integer that
    validation refuses before any work (out of its range), or garbage."""
    o = OPTIONS[name]
    out_of_range = st.one_of(st.integers(max_value=int(o.lo) - 1), st.sampled_from([int(o.lo) - 1, -2**63, -10**30]))
    if o.hi is not None:
        out_of_range = st.one_of(out_of_range, st.integers(min_value=int(o.hi) + 1),
                                 st.sampled_from([int(o.hi) + 1, 10**30]))
    return st.one_of(_small(name).map(str), out_of_range.map(str), FLOATS.map(repr), GARBAGE)


def _float_text(name: str):
    return st.one_of(FLOATS.map(repr), FLOATS.map(lambda v: f"{v:.3g}"), INTS.map(str), GARBAGE)


def _choice_text(name: str):
    o = OPTIONS[name]
    return st.one_of(st.sampled_from(tuple(o.choices)), GARBAGE, st.sampled_from([c.upper() for c in o.choices]))


#: NARROWED: the presets and switches whose first prediction builds slow tables (llama, olmo2,
#: the qk-norm and sampled-law paths: tens of seconds each on a loaded machine) are drawn
#: rarely: see CHEAP_ARCHS
CHEAP_ARCHS = ["preln", "postln", "lns", "bert", "peri", "mixln", "dslm", "deepnorm", "gpt2", "dslm-post"]


def _flag(name: str):
    """[--flag, value] (or [--flag] / [--no-flag] for a switch) with a drawn value."""
    o = OPTIONS[name]
    if o.type is bool:
        return st.sampled_from([[o.flag], ["--no-" + o.flag[2:]], [o.flag + "=1"]])
    if name == "arch":
        values = st.one_of(st.sampled_from(CHEAP_ARCHS), GARBAGE)
    elif o.choices:
        values = _choice_text(name)
    elif o.type is int:
        values = _int_text(name)
    else:
        values = _float_text(name)
    return st.tuples(st.just(o.flag), values, st.booleans()).map(
        lambda t: [f"{t[0]}={t[1]}"] if t[2] else [t[0], t[1]])


FLAG_NAMES = sorted(OPTIONS)


def _cheap(args: list[str]) -> bool:
    """NARROWED: no rotary positions (with a causal mask or QK-norm, their first prediction
    builds tables for tens of seconds on a loaded machine, for each size drawn)."""
    return "--rope" not in args


FLAGS = st.lists(st.sampled_from(FLAG_NAMES), max_size=5).flatmap(
    lambda names: st.tuples(*[_flag(n) for n in names]).map(lambda parts: [a for p in parts for a in p])).filter(_cheap)
STRAY = st.sampled_from([[], [], [], ["--bogus"], ["extra"], ["--every", "0"], ["--every", "-3"], ["--every", "x"],
                         ["--every", "2"], ["--json", "--json"], ["--symbolic"], ["--"], ["-"]])


# ---------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)              # a TOML basic string is a JSON string (BMP escapes)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


#: integer-valued floats for integer keys (``layers = 4.0``), integers beyond int64 and beyond
#: float64 (the input readers refuse them: one line), nesting to four levels
TOML_LEAF = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.integers(-10**400, 10**400),
                      FLOATS, st.sampled_from([4.0, 16.0, 64.0, 1e20]), st.text(max_size=10))
TOML_VALUE = st.recursive(TOML_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=2)), max_leaves=6)


def _config_key_value(name: str):
    """A key of a config file (the flag's name, dashes or underscores) with a value: small and
    valid, or any TOML value."""
    key = st.sampled_from([name.replace("_", "-"), name])
    o = OPTIONS[name]
    if o.type is int:
        good = _small(name)
    elif o.type is bool:
        good = st.booleans()
    elif name == "arch":
        good = st.sampled_from(CHEAP_ARCHS)
    elif o.choices:
        good = st.sampled_from(tuple(o.choices))
    else:
        good = FLOATS.filter(lambda v: not (math.isfinite(v) and v == int(v)) or v == 0)
    return st.tuples(key, st.one_of(good, good, TOML_VALUE))


CONFIG_TEXT = st.one_of(
    st.lists(st.sampled_from(FLAG_NAMES + ["n_layers", "n_heads"]), max_size=6).flatmap(
        lambda names: st.tuples(*[_config_key_value(n if n in OPTIONS else "layers") for n in names])).map(
        lambda kvs: "".join(f"{k} = {_toml_value(v)}\n" for k, v in kvs)),
    st.dictionaries(st.text(min_size=1, max_size=8), TOML_VALUE, max_size=3).map(
        lambda d: "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in d.items())),
    st.text(max_size=60),                                  # mostly not TOML at all
    st.sampled_from(["[table]\nlayers = 4\n", "layers = 4\nlayers = 5\n", "layers = \n", "= 4\n", "\x00",
                     "[[arch]]\n", "arch = ['preln']\n", "layers = 4 # ok\n"]),
)


def _base_model() -> dict:
    """The "model" object of the tiny preln model (predict --json's), the root of spec mutations."""
    from sigprop.model.options import build_model

    return build_model({"d_model": 64, "heads": 4, "d_ff": 128, "seq_len": 16, "layers": 4}).to_json()


def _paths(obj, prefix=()):
    """Every path (tuple of keys and indices) to a node of ``obj``."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


#: JSON leaves with integer-valued floats standing in for integers and integers beyond float64;
#: replacement values nested to four levels
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-10**15, 10**15), st.integers(-10**400, 10**400),
                      FLOATS, st.sampled_from([4.0, 16.0, 64.0]), st.text(max_size=8))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=2)), max_leaves=6)


def _mutated(base):
    """A strategy of JSON documents: ``base`` with up to three nodes replaced, deleted or
    given an extra key."""
    paths = [p for p in _paths(base) if p]

    def apply(doc, edits):
        doc = json.loads(json.dumps(doc))
        for path, kind, value in edits:
            node = doc
            try:
                for k in path[:-1]:
                    node = node[k]
                if kind == "set":
                    node[path[-1]] = value
                elif kind == "del":
                    del node[path[-1]]
                elif isinstance(node, dict):
                    node["extra_" + str(value)[:5]] = value
            except (KeyError, IndexError, TypeError):
                pass
        return doc

    def replacement(path):
        node = base
        for k in path:
            node = node[k]
        if isinstance(node, bool):
            near = st.booleans()
        elif isinstance(node, (int, float)):
            near = st.one_of(FLOATS, INTS, st.integers(0, 8))
        elif isinstance(node, str):
            near = st.one_of(st.sampled_from(CHEAP_ARCHS + ["relu", "gelu", "silu", "layernorm", "rmsnorm", "pre",
                                                            "post", "glu", "mlp", "parallel"]), GARBAGE)
        else:
            near = JSON_VALUE
        return st.tuples(st.just(path), st.sampled_from(["set", "set", "set", "set", "del", "add"]),
                         st.one_of(near, near, JSON_VALUE))

    edit = st.sampled_from(paths).flatmap(replacement)
    return st.lists(edit, min_size=1, max_size=2).map(lambda edits: apply(base, edits))


def _json_text(docs):
    whole = docs.map(lambda d: json.dumps(d, allow_nan=True))
    return st.one_of(
        whole, whole, whole, whole,
        docs.map(lambda d: json.dumps(d, allow_nan=True)[: len(json.dumps(d, allow_nan=True)) // 2]),  # cut short
        st.text(max_size=40),
        st.sampled_from(["", "null", "[]", "{}", "1", '"model"', '{"model": null}', '{"model": []}', "\ufeff{}",
                         '{"a": 1, "a": 2}', "NaN", '{"model": {}}']),
    )


def _hf_base(name: str) -> dict:
    """A Hugging Face config of tests/data/hf with its sizes made tiny (keys per family)."""
    cfg = json.loads((HF_DIR / name).read_text())
    tiny = {"num_hidden_layers": 2, "n_layer": 2, "hidden_size": 64, "n_embd": 64, "num_attention_heads": 4,
            "n_head": 4, "intermediate_size": 128, "n_inner": 128, "num_key_value_heads": 2, "head_dim": 16}
    for k, v in tiny.items():
        if k in cfg:
            cfg[k] = v
    return cfg


#: NARROWED: the families whose first prediction is cheap (the rotary ones, llama, gemma, olmo2,
#: qwen2, mistral, gpt-neox, gpt-j, build slow tables)
HF_FILES = ["gpt2-small.json", "bert-base.json"]


@pytest.fixture(scope="module")
def spec_base():
    return _base_model()


# ---------------------------------------------------------------------------------------
# the promise
# ---------------------------------------------------------------------------------------

def _promise(code: int, out: str, err: str, caught: list, seconds: float, args) -> None:
    where = f"sigprop {' '.join(map(str, args))!r}"[:600]
    assert code in (0, 1, 2, 3), (where, code, err[-800:])
    assert "Traceback" not in err, (where, err[-2000:])
    assert seconds < DEADLINE_S, (where, seconds)
    if code in (2, 3):
        # on a real console a Python warning is two more lines on stderr
        lines = err.splitlines() + [f"{w.category.__name__}: {w.message}" for w in caught]
        assert len(lines) == 1, (where, code, lines)
        assert re.match(r"sigprop( [a-z-]+)*: error: ", lines[0]), (where, lines[0])
        assert out == "", (where, out[:300])
    elif code == 0 and "--json" in args and "--symbolic" not in args and "-h" not in args:
        json.loads(out)


def _run(capsys, args):
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = cli(capsys, *args)
    _promise(code, out, err, caught, time.perf_counter() - t0, args)
    return code


def _fuzz(capsys, args):
    hypothesis.event(f"exit {_run(capsys, args)}")


@settings(FUZZ, max_examples=120 * SCALE)
@given(flags=FLAGS, stray=STRAY, as_json=st.booleans())
def test_flags(capsys, flags, stray, as_json):
    _fuzz(capsys, ["predict", *M, *flags, *stray, *(["--json"] if as_json else [])])


@settings(FUZZ, max_examples=60 * SCALE)
@given(text=CONFIG_TEXT, flags=FLAGS.map(lambda f: f[:2]))
def test_config_files(capsys, tmp_path_factory, text, flags):
    path = tmp_path_factory.mktemp("cfg") / "model.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _fuzz(capsys, ["predict", *M, "--config", str(path), *flags, "--json"])


@settings(FUZZ, max_examples=60 * SCALE)
@given(data=st.data())
def test_spec_files(capsys, tmp_path_factory, spec_base, data):
    doc = data.draw(st.one_of(_mutated(spec_base), _mutated({"model": spec_base})))
    text = data.draw(_json_text(st.just(doc)))
    path = tmp_path_factory.mktemp("spec") / "spec.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    extra = data.draw(st.sampled_from([[], [], ["--layers", "3"], ["--every", "2"]]))
    _fuzz(capsys, ["predict", "--spec", str(path), *extra, "--json"])


@settings(FUZZ, max_examples=50 * SCALE)
@given(data=st.data())
def test_hf_config_files(capsys, tmp_path_factory, data):
    base = _hf_base(data.draw(st.sampled_from(HF_FILES)))
    text = data.draw(_json_text(_mutated(base)))
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    extra = data.draw(st.sampled_from([[], [], ["--seq-len", "16"], ["--layers", "2"], ["--dropout", "0.5"],
                                       ["--d-model", "64"], ["--arch", "preln"]]))
    _fuzz(capsys, ["predict", "--hf-config", str(path), *extra, "--json"])


#: the other commands that take the model options (compare on three cheap presets: its default
#: is every preset, llama and olmo2 included)
OTHER_COMMANDS = [["compare", "--arch", "preln,postln,bert"], ["solve-init"], ["solve-init", "--target", "unit-forward"],
                  ["solve-init", "--target", "logit-var", "--value", "1"], ["export", "latex", "--what", "model"],
                  ["solve-init", "--target", "max-depth", "--max-grad-ratio", "2", "--max-layers", "8"]]


@settings(FUZZ, max_examples=25 * SCALE)
@given(command=st.sampled_from(OTHER_COMMANDS), flags=FLAGS, stray=STRAY)
def test_flags_of_the_other_commands(capsys, command, flags, stray):
    _fuzz(capsys, [*command, *M, *flags, *stray])


# ---------------------------------------------------------------------------------------
# a few in a subprocess: the real console, its stderr (warnings included) and a memory bound
# ---------------------------------------------------------------------------------------

#: address space for one `python -m sigprop predict` (a tiny causal one runs within 700 MB)
MEMORY_BYTES = 1 << 30


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


@settings(FUZZ, max_examples=8 * SCALE)
@given(flags=FLAGS.filter(lambda f: not any("\x00" in a for a in f)), as_json=st.booleans())
def test_flags_in_a_subprocess_under_a_memory_limit(flags, as_json):
    args = ["predict", *M, *flags, *(["--json"] if as_json else [])]
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, text=True, timeout=DEADLINE_S * 2,
                       preexec_fn=_limit_memory, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    _promise(r.returncode, r.stdout, r.stderr, [], time.perf_counter() - t0 - 1.0, args)
    hypothesis.event(f"exit {r.returncode}")


def test_the_strategies_reach_every_exit_path(capsys, tmp_path):
    """The fuzzer's values are not all refused: examples of each kind that predict (0), that are
    bad input (2) and a numerical failure (3) are inside what it draws."""
    assert _run(capsys, ["predict", *M, "--json"]) == 0
    assert _run(capsys, ["predict", *M, "--layers", "nan"]) == 2
    assert _run(capsys, ["predict", *M, "--init-std", "1e200", "--json"]) == 3
    cfg = tmp_path / "c.toml"
    cfg.write_text('arch = "postln"\nlayers = 3\n')
    assert _run(capsys, ["predict", *M, "--config", str(cfg), "--json"]) == 0


@pytest.mark.parametrize("flag", ["--config", "--spec", "--hf-config"])
def test_hostile_files(tmp_path, flag):
    """Each input file kind given a FIFO, /dev/zero, a directory, a file far beyond any config
    (sparse) and JSON / TOML nested 10^5 deep: one line, exit 2, promptly, in a subprocess
    under a 1 GiB address-space limit."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(3 << 30)
    deep = tmp_path / ("deep.toml" if flag == "--config" else "deep.json")
    deep.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n" if flag == "--config"
                    else "[" * 100_000 + "]" * 100_000)
    empty_dir = tmp_path / "d"
    empty_dir.mkdir()
    for path in (fifo, "/dev/zero", empty_dir, big, deep):
        t0 = time.time()
        p = subprocess.run([sys.executable, "-m", "sigprop", "predict", flag, str(path)], capture_output=True,
                           text=True, timeout=60, preexec_fn=_limit_memory)
        assert p.returncode == 2, (path, p.returncode, p.stderr[-300:])
        assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, (path, p.stderr[-300:])
        assert "Traceback" not in p.stderr
        assert time.time() - t0 < 30
