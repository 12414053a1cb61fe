"""The Python API (sigprop.api, docs/api.md): the commands' names, defaults, JSON text and
error messages, a cheap `import sigprop`, and the documentation's example run as written."""

import inspect
import json
import os
import re
import subprocess
import sys

import pytest
from tests._cli import cli

import sigprop
from sigprop.api import KEYWORDS, flag
from sigprop.errors import DomainError

from tests._paths import ROOT
TINY = dict(d_model=32, heads=2, d_ff=64, seq_len=8)


@pytest.fixture(autouse=True)
def _no_table_store(monkeypatch):
    """These tests compare the API with the command line: the table store is off, so that
    every run starts from the same state (the store has its own tests)."""
    monkeypatch.setenv("SIGPROP_CACHE_DIR", "off")


#: API function -> the command it mirrors
COMMANDS = {"predict": "predict", "check": "check", "solve_init": "solve-init", "compare": "compare"}
#: command options that only choose how the command prints (no API keyword)
#: (full: predict's and check's text shows every row; the API's results hold every point anyway)
RENDER_ONLY = {"as_json", "symbolic", "latex", "output", "emit", "layout", "full"}   # emit, layout: solve-init --emit torch




def flags(**kw) -> list[str]:
    """The command-line arguments for API keywords (through the API's own name table)."""
    out = []
    for k, v in kw.items():
        if isinstance(v, bool):
            out.append(flag(k) if v else "--no-" + flag(k)[2:])
        else:
            out += [flag(k), str(v)]
    return out


def cli_message(err: str) -> str:
    """The one message of a bad-input exit: the text after 'sigprop COMMAND: error: '."""
    m = re.match(r"sigprop(?: [a-z-]+)*: error: (.*)$", err.strip())
    assert m and len(err.strip().splitlines()) == 1, err
    return m.group(1).strip()


def without_timing(text: str, fn: str) -> str:
    """JSON text with the wall-clock fields (different in every run) blanked: check's
    simulate_s, solve-init's timing object."""
    if fn == "check":
        return re.sub(r'"simulate_s": [0-9.e+-]+', '"simulate_s": 0', text)
    return re.sub(r'"timing": \{[^}]*\}', '"timing": {}', text)


# ---------------------------------------------------------------------------------------
# names and defaults
# ---------------------------------------------------------------------------------------

def test_keywords_are_the_commands_options_with_their_defaults():
    """Every API keyword of a function is an option of its command (same flag, same default,
    same lower bound and choices), and every option of the command that does not only
    choose the printing is a keyword."""
    import typer.main

    from sigprop.cli import load

    app = typer.main.get_command(load())
    for fn, command in COMMANDS.items():
        params = {p.name: p for p in app.commands[command].params
                  # (--version and --plugin belong to the command line: a Python caller imports
                  # its plugins itself, docs/extending.md)
                  if not getattr(p, "hidden", False) and p.name not in ("_version", "_plugin")}
        api = {k for k, kw in KEYWORDS.items() if fn in kw.takes}
        cli_names = set(params) - RENDER_ONLY - ({"every"} if command == "check" else set())
        assert api == cli_names, (fn, api ^ cli_names)
        sig = inspect.signature(getattr(sigprop, fn))
        assert set(sig.parameters) == api - ({"spec"} if fn == "solve_init" else set())
        for k in api:
            p, kw = params[k], KEYWORDS[k]
            assert flag(k) in p.opts, (k, p.opts)
            default = getattr(p.default, "value", p.default)          # typer Enum defaults
            assert kw.default == default, (fn, k, kw.default, default)
            if k != "spec":
                assert sig.parameters[k].default == default
            assert kw.lo == getattr(p.type, "min", None), (fn, k)
            assert kw.choices == (tuple(p.type.choices) if hasattr(p.type, "choices") else None), (fn, k)


def test_model_keywords_are_the_preset_options():
    """The model keywords map onto the options of presets.resolve (the library's names)."""
    from sigprop.model.presets import OPTIONS

    model = [kw.name for k, kw in KEYWORDS.items() if kw.takes == KEYWORDS["layers"].takes
             and k not in ("config", "spec", "hf_config")]
    assert sorted(model) == sorted(OPTIONS)


def test_docs_name_every_keyword():
    text = (ROOT / "docs" / "api.md").read_text()
    missing = [k for k in KEYWORDS if f"`{k}`" not in text]
    assert not missing, missing


# ---------------------------------------------------------------------------------------
# JSON: the commands' text
# ---------------------------------------------------------------------------------------

# (function, keywords); the command gets the same options as flags.  Each side runs all of them
# in one fresh process, in this order, with the table store off: the prediction's in-process
# tables change its last digits between runs for some models (arch dslm, lns) and a stored
# table can change them too, so only the same sequence of calls from the same start is
# expected to give the same bytes.
JSON_CASES = [
    ("predict", dict(arch="preln", layers=6, d_model=64, heads=2, seq_len=16)),
    ("predict", dict(arch="postln", init="torch-default", layers=5, d_model=48, heads=3, d_ff=96, seq_len=8,
                     dropout=0.0, every=2)),
    ("predict", dict(arch="dslm", layers=4, d_model=64, heads=4, seq_len=8, activation="gelu")),
    ("predict", dict(arch="preln", layers=4, causal=True, activation="gelu", **TINY)),
    ("predict", dict(arch="mixln", layers=8, input_var=2.0, grad_corr=0.1, branch_scale=0.5, **TINY)),
    ("predict", dict(arch="lns", **TINY)),                                # layers: the default (24)
    ("predict", dict(config="CONFIG", layers=4)),
    ("predict", dict(spec="SPEC")),
    ("predict", dict(init_std=1.0, layers=3, **TINY)),                   # the softmax saturates at layer 1
    ("predict", dict(arch="postln", init_std=1.0, layers=4, **TINY)),
    ("check", dict(layers=3, seed=5, trials=2, batch=2, **TINY)),
    ("check", dict(arch="postln", layers=2, seed=1, trials=3, batch=1, dtype="float64", **TINY)),
    ("check", dict(d_model=16, heads=2, seq_len=4, trials=2, batch=1)),   # layers: the default (12)
    # no tolerance at all: sampling noise alone fails it (exit 1, passed False)
    ("check", dict(layers=2, trials=2, batch=1, tol_var=0, tol_grad=0, tol_corr=0, tol_logit=0, z=0, **TINY)),
    # one optimizer step (a StepResult, the sigprop.step/1 object)
    ("check", dict(step="adamw", lr=1e-3, batch_size=2, adam_betas="0.8,0.95", weight_decay=0.1, trials=2, seed=3,
                   layers=2, **TINY)),
    ("compare", dict(arch="preln,postln", layers=3, **TINY)),
    ("compare", dict(arch=["dslm", "preln"], init="normal", layers=3, **TINY)),
    ("compare", dict(layers=2, **TINY)),                                  # arch: the default six
    ("solve_init", dict(target="unit-forward", layers=3, explain=True, **TINY)),
    ("solve_init", dict(target="logit-var", value=2.0, arch="postln", layers=2, **TINY)),
    ("solve_init", dict(target="max-depth", max_grad_ratio=4.0, max_layers=16, **TINY)),
    ("solve_init", dict(target="unit-variance", layers=2, **TINY)),       # feasible, gradient reported
    ("solve_init", dict(target="unit-variance", layers=2, strict=True, **TINY)),   # infeasible (exit 1)
    ("solve_init", dict(**TINY)),                                         # layers: the default (24)
]

RUNNER = r"""
import contextlib, io, json, sys
cases, side = json.loads(sys.argv[1]), sys.argv[2]
import sigprop
from sigprop.cli import main
results = []
for fn, command, kw, argv in cases:
    out, err = io.StringIO(), io.StringIO()
    if side == "cli":
        sys.argv = ["sigprop", command, *argv, "--json"]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    else:
        r = getattr(sigprop, fn)(**kw)
        out.write(r.to_json() + "\n")
        code = getattr(r, "exit_code", 0)
        extra = {"steps": r.steps is not None} if fn == "solve_init" else {}
        if fn == "check" and "step" in kw:
            extra = {"seed": r.seed, "summary": r.summary}
        elif fn == "check":
            extra = {"seed": r.seed, "passed": r.passed, "errors": r.errors, "failures": r.failures}
        if fn == "predict":
            extra = {"summary": r.summary, "n_points": len(r.points)}
        err.write(json.dumps(extra))
    results.append([code, out.getvalue(), err.getvalue()])
sys.stdout = sys.__stdout__
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def json_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("api-json")
    cfg = d / "m.toml"
    cfg.write_text('arch = "postln"\nlayers = 3\nd-model = 32\nheads = 2\nseq-len = 8\n')
    spec = d / "model.json"
    spec.write_text(json.dumps({"model": sigprop.build_model(arch="mixln", layers=4, **TINY).to_json()}))
    paths = {"CONFIG": str(cfg), "SPEC": str(spec)}
    cases = []
    for fn, kw in JSON_CASES:
        kw = {k: paths.get(v, v) if isinstance(v, str) else v for k, v in kw.items()}
        argv = flags(**{k: ",".join(v) if isinstance(v, list) else v for k, v in kw.items()})
        cases.append([fn, COMMANDS[fn], kw, argv])
    env = {**os.environ, "SIGPROP_CACHE_DIR": "off"}
    procs = {side: subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(cases), side], env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for side in ("cli", "api")}
    runs = {}
    for side, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        runs[side] = json.loads(out.strip().splitlines()[-1])
    return runs


@pytest.mark.parametrize("i", range(len(JSON_CASES)), ids=[f"{f}-{i}" for i, (f, _) in enumerate(JSON_CASES)])
def test_json_is_the_commands_stdout(json_runs, i):
    fn, kw = JSON_CASES[i]
    (code, out, err), (api_code, api_out, extra) = json_runs["cli"][i], json_runs["api"][i]
    extra = json.loads(extra)
    assert code in (0, 1), err
    assert code == api_code
    if fn in ("predict", "compare"):
        assert api_out == out                           # byte for byte
    else:
        assert without_timing(api_out, fn) == without_timing(out, fn) != out
    obj = json.loads(out)
    if fn == "predict":
        assert extra["summary"] == obj["summary"]
        sat = obj["summary"]["saturation_layer"]
        assert extra["n_points"] == 1 + 2 * (obj["model"]["n_layers"] if sat is None else sat - 1)
        assert (sat is not None) == ("init_std" in kw)
    if fn == "check" and "step" in kw:
        assert obj["schema"] == "sigprop.step/1" and code == 0
        assert extra["seed"] == kw["seed"] == obj["seed"] and extra["summary"] == obj["summary"]
        assert obj["step"]["adam_betas"] == [0.8, 0.95] and obj["step"]["weight_decay"] == 0.1
    elif fn == "check":
        assert extra["seed"] == kw.get("seed", 0) == obj["seed"]
        assert extra["passed"] == obj["pass"] == (code == 0)
        assert extra["errors"] == obj["errors"] and extra["failures"] == obj["failures"]
        if "z" in kw:
            assert not extra["passed"] and extra["failures"]
    if fn == "solve_init":
        assert extra["steps"] == kw.get("explain", False) == ("steps" in obj)
        assert obj["feasible"] == (code == 0)
        assert obj["feasible"] == (not kw.get("strict", False))
        if kw.get("target", "unit-variance") != "max-depth":
            assert obj["model"]["n_layers"] == kw.get("layers", 24)
    if fn == "compare":
        assert len(obj["rows"]) == (len(kw["arch"]) if isinstance(kw.get("arch"), list)
                                    else len(kw["arch"].split(",")) if "arch" in kw else 6)


def test_spec_forms_and_builders(tmp_path):
    kw = dict(arch="postln", layers=3, **TINY)
    model = sigprop.build_model(**kw)
    assert model.n_layers == 3 and sigprop.build_model(**TINY).n_layers == 24
    cfg = tmp_path / "m.toml"
    cfg.write_text('arch = "postln"\nlayers = 3\nd-model = 32\nheads = 2\nd-ff = 64\nseq-len = 8\n')
    assert sigprop.build_model(config=cfg) == model
    assert sigprop.build_model(config={"arch": "postln", "layers": 5, "d-model": 32, "heads": 2, "d_ff": 64,
                                       "seq-len": 8},
                               layers=3) == model                      # keywords override the config
    p = sigprop.predict(model)
    f = tmp_path / "trace.json"
    f.write_text(p.to_json())
    for s in (f, str(f), json.loads(p.to_json()), model.to_json(), model, p):
        assert sigprop.load_spec(s) == model
        assert sigprop.build_model(s) == model == sigprop.build_model(spec=s)
    assert [m.arch for m in sigprop.build_models(arch=["dslm", "preln"], layers=2, **TINY)] == ["dslm", "preln"]
    assert sigprop.build_models(spec=model) == [model]


def test_check_repeats_with_its_seed():
    kw = dict(layers=2, seed=3, trials=2, batch=1, **TINY)
    a, b = sigprop.check(**kw), sigprop.check(**kw)
    assert a.measured == b.measured and a.seed == 3
    assert sigprop.check(**{**kw, "seed": 4}).measured != a.measured


def test_solved_model_feeds_predict(tmp_path):
    s = sigprop.solve_init(target="unit-forward", layers=3, **TINY)
    assert s.feasible and s.model is not None and s.exit_code == 0
    f = tmp_path / "solved.json"
    f.write_text(s.to_json())
    for q in (sigprop.predict(s), sigprop.predict(spec=s.model), sigprop.predict(f)):
        assert q.model == s.model
        # the same numbers as the prediction solve_init verified (up to the in-process
        # tables' last digits, see JSON_CASES)
        for a, b in zip(q.points, s.prediction.points):
            assert (a.layer, a.sublayer) == (b.layer, b.sublayer)
            assert a.var == pytest.approx(b.var, rel=1e-6) and a.gvar == pytest.approx(b.gvar, rel=1e-6)
        assert all(abs(x.var - 1) < 0.01 for x in q.points)                # the target: unit forward variance


# ---------------------------------------------------------------------------------------
# bad input: SigpropError with the command's message
# ---------------------------------------------------------------------------------------

BAD = [
    ("predict", dict(layers=0)),
    ("predict", dict(arch="foo")),
    ("predict", dict(layers=2, d_model=100, heads=3)),
    ("predict", dict(layers=2, dropout=1.5)),
    ("predict", dict(layers=2, input_corr=1.5)),
    ("predict", dict(arch="dslm", layers=2, beta_k=5.0)),
    ("predict", dict(layers=2, every=0)),
    ("predict", dict(spec="/nonexistent/model.json")),
    ("predict", dict(spec="/nonexistent/model.json", layers=2, d_model=8)),
    ("predict", dict(config="/nonexistent/m.toml")),
    ("predict", dict(trials=3)),
    ("check", dict(trials=1)),
    ("check", dict(trails=2)),
    ("check", dict(seed=-1)),
    ("check", dict(dtype="float16")),
    ("check", dict(tol_var=-1.0)),
    ("check", dict(init_std=1.0, layers=2, **TINY)),                    # the softmax saturates: nothing to compare
    ("predict", dict(step="adam", lr=1e-3)),                          # no analytic prediction of the step
    ("compare", dict(step="sgd", lr=0.1)),
    ("predict", dict(lr=1e-3)),
    ("check", dict(step="adam")),
    ("check", dict(step="adam", lr=1e-3, batch=2)),
    ("check", dict(step="adam", lr=1e-3, tol_var=0.2)),
    ("check", dict(step="sgd", lr=1.0, adam_eps=1e-6)),
    ("compare", dict(arch="preln,foo")),
    ("compare", dict(arch="preln,preln")),
    ("solve_init", dict(target="unit-forward", strict=True)),
    ("solve_init", dict(target="max-depth", max_grad_ratio=4.0, strict=True)),
    ("solve_init", dict(target="x")),
    ("solve_init", dict(target="unit-forward", layers=2, init="normal")),
    ("solve_init", dict(target="unit-forward", layers=2, spec="m.json")),
    ("solve_init", dict(target="max-depth", max_layers=0)),
    ("solve_init", dict(target="logit-var", layers=2)),
]


@pytest.mark.parametrize("fn,kw", BAD, ids=[f"{f}-{'-'.join(k)}" for f, k in BAD])
def test_bad_input_raises_the_commands_message(capsys, fn, kw):
    code, out, err = cli(capsys, COMMANDS[fn], *flags(**kw))
    assert code == 2 and out == "", (code, err)
    with pytest.raises(sigprop.SigpropError) as e:
        getattr(sigprop, fn)(**kw)
    assert str(e.value) == cli_message(err)


def test_error_classes():
    from sigprop.errors import DomainError, SigpropError

    assert sigprop.SigpropError is SigpropError
    with pytest.raises(DomainError):
        sigprop.predict(layers=0)
    with pytest.raises(TypeError):                             # an unknown keyword, as in Python
        sigprop.predict(layer=2)
    with pytest.raises(DomainError, match="is not a valid integer"):
        sigprop.check(trials=2.5)
    with pytest.raises(DomainError, match="spec must be"):
        sigprop.load_spec(3)


# ---------------------------------------------------------------------------------------
# import cost and names
# ---------------------------------------------------------------------------------------

def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_import_sigprop_is_cheap():
    out = _run("import sys, sigprop\n"
               "sigprop.__version__, sigprop.SigpropError, sigprop.errors.SigpropError\n"
               "print(sorted(m for m in ('sympy', 'typer', 'rich', 'numpy', 'sigprop.api', 'sigprop.mc')"
               " if m in sys.modules))\n")
    assert out.strip() == "[]"
    out = _run("import sys\n"
               "from sigprop import predict, check, solve_init, compare, build_model, load_spec, Prediction\n"
               "print(sorted(m for m in ('sympy', 'typer', 'rich', 'numpy', 'sigprop.mc') if m in sys.modules))\n")
    assert out.strip() == "[]"


def test_predict_and_compare_import_neither_sympy_nor_the_cli():
    out = _run("import sys, sigprop\n"
               "sigprop.predict(layers=2, d_model=16, heads=2, seq_len=4)\n"
               "sigprop.compare(arch='preln,dslm', layers=2, d_model=16, heads=2, seq_len=4).to_json()\n"
               "print(sorted(m for m in ('sympy', 'typer', 'rich', 'sigprop.cli', 'sigprop.mc') if m in sys.modules))\n")
    assert out.strip() == "[]"


def test_the_command_line_does_not_import_the_api():
    out = _run("import sys\n"
               "sys.argv = ['sigprop', 'predict', '--layers', '2', '--d-model', '16', '--heads', '2', '--seq-len', '4',"
               " '--json']\n"
               "from sigprop.cli import main\n"
               "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
               "print('API', 'sigprop.api' in sys.modules)\n")
    assert out.strip().splitlines()[-1] == "API False"


def test_compare_stays_the_function_when_its_module_is_imported():
    out = _run("import sigprop.compare\n"
               "from sigprop.compare import Row, to_json\n"
               "import sigprop, sigprop.api\n"
               "assert sigprop.compare is sigprop.api.compare, sigprop.compare\n"
               "assert sys_mod.modules['sigprop.compare'].Row is Row\n".replace("sys_mod", "__import__('sys')")
               + "print('ok')\n")
    assert out.strip() == "ok"


# ---------------------------------------------------------------------------------------
# the documentation's example
# ---------------------------------------------------------------------------------------

def test_docs_api_examples_run(capsys):
    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4
    ns: dict = {}
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), ns)
    out = capsys.readouterr().out
    assert ns["p"].summary["forward_law"] == "linear"              # Pre-LN: the stream grows linearly
    assert ns["r"].seed == 7 and "seed 7" in out
    assert ns["sol"].feasible and ns["q"].summary["forward_law"] == "constant"
    assert [row.arch for row in ns["c"]] == ["preln", "postln", "dslm"]
    assert "bad input: --layers must be" in out


@pytest.mark.parametrize("keyword", ["layers", "d_model", "heads", "seq_len"])
def test_an_integral_float_is_not_an_integer_option(keyword):
    # as the flags (--layers 4.0: not a valid integer) and a --config file refuse it
    opts = dict(layers=2, d_model=32, heads=2, d_ff=64, seq_len=8)
    opts[keyword] = float(opts[keyword])
    with pytest.raises(DomainError, match="must be an integer, got"):
        sigprop.predict(**opts)
    with pytest.raises(DomainError, match="must be an integer, got"):
        sigprop.predict(config={k.replace("_", "-"): v for k, v in opts.items()})


@pytest.mark.parametrize("keyword", ["trials", "batch", "seed"])
def test_an_integral_float_is_not_an_integer_count(keyword):
    with pytest.raises(DomainError, match="is not a valid integer"):
        sigprop.check(layers=2, d_model=32, heads=2, d_ff=64, seq_len=8, **{keyword: 4.0})
