"""The command line: exit codes, stderr discipline and JSON shapes (contract.md)."""

import json
import os
import re
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [
    ["check-component", "nope"],
    ["check-component", "dropout", "-p", "p=1.0"],
    ["check-component", "dropout", "-p", "p=0.1", "--x-corr", "1.5"],
    ["check-component", "linear", "-p", "d_in=-3", "-p", "d_out=4", "-p", "w_std=0.1"],
    ["check-component", "linear", "-p", "d_in=3"],
    ["check-component", "dropout", "-p", "p"],
    ["check-component", "dropout", "-p", "q=3"],
    ["check-component", "dropout", "--sweep", "--grid", "nope"],
    ["check-component", "dropout", "--runs", "0"],
    ["rules", "nope"],
    ["no-such-command"],
])
def test_bad_input_exits_2_without_traceback(args):
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr and r.stderr.strip()


def test_check_component_single_json_passes():
    r = run("check-component", "linear", "-p", "d_in=64", "-p", "d_out=32", "-p", "w_std=0.125",
            "--x-mean", "0.5", "--seed", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["schema"] == "sigprop.component-check/1" and out["seed"] == 3 and out["pass"] is True
    assert out["predicted"]["x_var"] == pytest.approx(64 * 0.125**2 * 1.25)
    assert set(out["measured"]) == {"x_mean", "x_var", "x_corr", "g_var", "g_corr"}


def test_check_component_detects_a_wrong_prediction():
    # the rule is right, so make the check wrong on purpose: ask for a tolerance of zero and no
    # standard-error slack; sampling noise alone must then fail the check (exit 1)
    r = run("check-component", "dropout", "-p", "p=0.5", "--tol", "0", "--tol-corr", "0", "--z", "0", "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["pass"] is False


def test_sweep_json_schema():
    r = run("check-component", "dropout", "--sweep", "--n", "3", "--seed", "5", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["schema"] == "sigprop.component-sweep/1" and out["component"] == "dropout"
    assert out["n_configs"] == 3 and out["seed"] == 5
    for mom in ("x_mean", "x_var", "x_corr", "g_var", "g_corr"):
        assert set(out["percentiles"][mom]) == {"p50", "p90", "p99"}
    assert out["published"]["x_var"]["p99"] == 1.5


def test_rules_lists_every_rule_and_latex():
    r = run("rules")
    assert r.returncode == 0
    from sigprop.rules import REGISTRY

    for name in REGISTRY:
        assert name in r.stdout
    r = run("rules", "dropout", "--latex")
    assert r.returncode == 0 and r"\begin{align*}" in r.stdout and r"\frac" in r.stdout


def test_numeric_paths_never_import_sympy():
    code = ("import sys, sigprop.cli, sigprop.rules as R, sigprop.mc.components as C\n"
            "from sigprop.state import Forward, Backward\n"
            "for n, r in R.REGISTRY.items():\n"
            "    case = C.SWEEPS[n].make_case(C.SWEEPS[n].points()[0]) if n in C.SWEEPS else None\n"
            "    case and r.evaluate(case.x, case.g, **case.rule_params)\n"
            "assert 'sympy' not in sys.modules, 'sympy imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args", [
    ["check", "--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--seed", "-5"],
    ["check", "--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--tol-var", "nan"],
    ["check", "--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "8", "--z", "inf"],
    ["check-component", "dropout", "-p", "p=0.1", "--seed", "-1"],
    ["predict", "--layers", "1000001"],
    ["predict", "--layers", "2", "--seq-len", "99999999999999999999"],
    ["predict", "--layers", "2", "--seq-len", str(2 ** 53 + 1)],
    ["predict", "--layers", "2", "--causal", "--seq-len", str(2 ** 30 + 1)],
    ["solve-init", "--layers", "2", "--tol", "inf", "--json"],
    ["solve-init", "--layers", "2", "--target", "logit-var", "--value", "inf", "--json"],
    ["check", "--layers", "1", "--d-model", "8", "--heads", "2", "--d-ff", "8", "--seq-len", "2", "--trials", "2",
     "--batch", "1", "--input-var", "1e-300"],
    ["check", "--layers", "1", "--d-model", "8", "--heads", "2", "--d-ff", "8", "--seq-len", "2", "--trials", "2",
     "--batch", "1", "--input-var", "1e-29"],
    ["check", "--layers", "1", "--d-model", "8", "--heads", "2", "--d-ff", "8", "--seq-len", "2", "--trials", "2",
     "--batch", "1", "--input-var", "1e-250", "--dtype", "float64"],
    ["predict", "--layers", "2", "--input-var", "1e-300"],
    ["predict", "--arch", "llama", "--layers", "2", "--init-std", "1e-300"],
])
def test_more_bad_input_exits_2_without_traceback(args):
    """Seeds must be >= 0 (NumPy raised a traceback), tolerances finite (a NaN tolerance
    failed every point instead), depth within the cap, the sequence within 2^53 positions
    (beyond, the trace turned to NaN: exit 3) and a causal one within 2^30 (beyond, the
    position grid's sums over every position ran out of memory or time), solver tolerances and
    targets finite (--tol inf wrote "tolerance": Infinity, not JSON), a check within the
    variances its dtype samples (float32 at an input variance of 1e-300: NaN, exit 3; at 1e-29
    the logit variance underflowed; float64 at 1e-250: standard errors 0), a norm's input above
    e^-600 (below, its eps was ignored: input gradient 2.4e39 predicted, 2.5 measured), a token
    embedding whose std's square is positive (1e-300: a division by zero, exit 3)."""
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr and r.stderr.strip()


def test_check_within_the_dtype_range_is_not_refused():
    """The float32 guard's bounds are where sampling fails (checking.VAR_RANGES): a stream of
    variance 1e20, which float32 samples with finite moments, is checked, not refused."""
    r = run("check", "--layers", "1", "--d-model", "8", "--heads", "2", "--d-ff", "8", "--seq-len", "2",
            "--trials", "2", "--batch", "1", "--input-var", "1e20", "--json")
    assert r.returncode in (0, 1), r.stderr[-300:]
    out = json.loads(r.stdout)
    assert out["schema"] == "sigprop.check/1"
    assert "NaN" not in r.stdout and "Infinity" not in r.stdout


def test_float_overflow_outside_predict_is_one_line_exit_3():
    """A subnormal input variance sends the solver's attention search out of float64 (an
    OverflowError in the rule, outside the predictor's own conversion): one line on stderr
    and exit 3, not a traceback."""
    r = run("solve-init", "--input-var", "5e-324", "--json")
    assert r.returncode == 3, (r.returncode, r.stderr[-500:])
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "float64" in r.stderr


@pytest.mark.parametrize("mean", ["1e100", "1e150"])
def test_moments_out_of_range_inside_a_branch_are_a_numerical_failure_not_bad_input(mean):
    """A huge input mean on olmo2's un-normed attention input: the branch's moments leave
    float64.  That was refused as bad input ("x_mean must be finite, got nan", exit 2, after
    NumPy's overflow warning over three lines): one line naming a numerical failure, exit 3."""
    r = run("predict", "--arch", "olmo2", "--layers", "2", "--input-mean", mean, "--json")
    assert r.returncode == 3, (r.returncode, r.stderr[-500:])
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "numerical failure" in r.stderr and "must be finite" not in r.stderr


def test_a_rule_fed_non_finite_moments_inside_the_predictor_is_a_numerical_failure():
    """Rule.fast (the predictor's path) meets an input state an earlier rule made non-finite:
    an OverflowError naming the rule (exit 3 from the CLI); the same state given by a caller
    to Rule.evaluate stays a bad input (DomainError, exit 2)."""
    from sigprop.errors import DomainError
    from sigprop.rules import get
    from sigprop.state import Forward

    x = Forward(float("nan"), float("nan"), float("nan"))
    with pytest.raises(OverflowError, match="the silu rule's input moments are not finite"):
        get("silu").fast(x, None, {})
    with pytest.raises(DomainError, match="must be finite"):
        get("silu").evaluate(x)


def test_console_flushes_everything_before_its_fast_exit():
    """`python -m sigprop` ends with os._exit after flushing (sigprop.cli.console): a large
    trace (several MB, more than any pipe buffer) must arrive whole, with exit code 0; an
    error keeps its exit code and its one line."""
    r = run("predict", "--layers", "3000", "--json", "--d-model", "64", "--heads", "2", "--seq-len", "8")
    assert r.returncode == 0, r.stderr
    tr = json.loads(r.stdout)
    assert len(tr["points"]) == 1 + 2 * 3000 and len(r.stdout) > 2_000_000
    r = run("predict", "--layers", "0")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1


def test_collector_paused_for_predict_only():
    """The process entry (sigprop.__main__) pauses the cyclic garbage collector for start-up;
    main() turns it back on for every command but `predict` (whose passes make no cycles)."""
    code = ("import gc, sys, sigprop.cli as c\n"
            "gc.disable(); sys.argv = ['sigprop', 'rules']\n"
            "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
            "print('GC', gc.isenabled())\n"
            "gc.disable(); sys.argv = ['sigprop', 'predict', '--layers', '2', '--json', '--d-model', '16',"
            " '--heads', '2', '--seq-len', '4']\n"
            "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
            "print('GC', gc.isenabled())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("GC ")] == ["GC True", "GC False"], r.stdout[-300:]


# ---------------------------------------------------------------------------------------
# one error style, -h and --version, renamed options, and the defects of a first run
# ---------------------------------------------------------------------------------------

TINY = ["--d-model", "32", "--heads", "2", "--d-ff", "64", "--seq-len", "8"]


def one_error_line(r, command: str):
    """Bad input: exit 2, nothing on stdout, exactly one line on stderr, in the one style."""
    assert r.returncode == 2, (r.returncode, r.stdout[-300:], r.stderr[-600:])
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"sigprop {command}: error: ".replace("sigprop : ", "sigprop: ")), lines[0]
    return lines[0]


@pytest.mark.parametrize("command,args,words", [
    # click's own usage errors (were boxed, several lines)
    ("predict", ["predict", "--nope"], "no such option: --nope"),
    ("predict", ["predict", "--layers", "abc"], "'abc' is not a valid int"),
    ("predict", ["predict", "--arch", "nope"], "unknown arch 'nope'; known: preln, postln,"),
    ("predict", ["predict", "--init", "nope"], "unknown init 'nope'; known: normal, xavier,"),
    ("predict", ["predict", "--activation", "tanh"], "unknown activation 'tanh'; known: relu, gelu"),
    ("compare", ["compare", "--arch", "preln,nope"], "unknown arch 'nope'"),
    ("", ["no-such-command"], "no such command 'no-such-command'"),
    ("check", ["check", "--trials", "1"], "--trials"),
    ("plot", ["plot", "--dpi", "100000", "-o", "x.png"], "--dpi"),
    ("export latex", ["export", "latex", "--what", "nope"], "--what must be one of"),
    # sigprop's own checks
    ("predict", ["predict", "--layers", "0"], "--layers must be an integer in [1, 1000000], got 0"),
    ("predict", ["predict", "--input-var", "-1"], "--input-var must be > 0"),
    # check-component: sizes beyond any memory (d_in=1e9 was a TypeError, 1e5 x 1e5 a 37 GiB
    # allocation), unknown names, a rule without a component of its own
    ("check-component", ["check-component", "linear", "-p", "d_in=1e9", "-p", "d_out=1e5", "-p", "w_std=0.1"],
     "of memory per weight draw"),
    ("check-component", ["check-component", "attention", "-p", "d=64", "-p", "d_head=16", "-p", "n_heads=4",
                         "-p", "L=1e6", "-p", "q_std=0.1", "-p", "k_std=0.1", "-p", "v_std=0.1", "-p", "o_std=0.1"],
     "of memory per weight draw"),
    ("check-component", ["check-component", "relu", "-p", "L=1e400"], "L must be finite"),
    ("check-component", ["check-component", "relu", "-p", "d=0"], "d must lie in [1, inf]"),
    ("check-component", ["check-component", "relu", "-p", "d=2.5"], "d must be an integer"),
    ("check-component", ["check-component", "softmax-approx"], "without a Monte Carlo component"),
    # renamed options: the old and the new spelling together, or an old one with a bad value
    ("check-component", ["check-component", "dropout", "--runs", "3", "--trials", "4"],
     "--runs is the old spelling of --trials"),
    ("check-component", ["check-component", "dropout", "--x-corr", "1.5"], "--input-corr must lie in [-1, 1]"),
    ("check-component", ["check-component", "dropout", "--input-corr", "1.5"], "--input-corr must lie in [-1, 1]"),
])
def test_bad_input_is_one_plain_line(command, args, words):
    line = one_error_line(run(*args), command)
    assert words in line, line
    assert "╭" not in line and "Usage" not in line


def test_unknown_component_lists_only_components():
    line = one_error_line(run("check-component", "nosuch"), "check-component")
    from sigprop.mc.components import COMPONENTS

    listed = line.split("known: ")[1].split(", ")
    assert sorted(listed) == sorted(COMPONENTS) and "softmax-approx" not in listed


def test_version_and_h_on_the_app_and_every_command():
    from sigprop import __version__
    from sigprop.cli import COMMANDS

    for args in (["--version"], ["predict", "--version"], ["export", "latex", "--version"],
                 ["check-component", "--version"], ["plot", "--version"]):
        r = run(*args)
        assert r.returncode == 0 and r.stdout == f"sigprop {__version__}\n" and r.stderr == "", (args, r.stderr)
    for args in [["-h"], ["export", "latex", "-h"]] + [[c, "-h"] for c in COMMANDS]:
        r = run(*args)
        assert r.returncode == 0 and "Usage: sigprop" in r.stdout and "--version" in r.stdout, (args, r.stderr)
        assert r.stdout == run(*args[:-1], "--help").stdout
    r = run()                                       # bare `sigprop`: the help, exit 0
    assert r.returncode == 0 and "Usage: sigprop" in r.stdout and r.stderr == ""


def test_help_shows_choices_and_defaults():
    r = subprocess.run([sys.executable, "-m", "sigprop", "predict", "-h"], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "COLUMNS": "200"})
    out = r.stdout
    assert ("Architecture preset: preln, postln, dslm, dslm-post, deepnorm, lns, mixln, llama, gpt2, bert, olmo2, "
            "peri (default preln)") in out
    assert "scheme: normal, xavier, torch-default, scaled, dslm, deepnorm" in out
    assert "FFN activation: relu, gelu, silu (a gated --ffn fixes it) (default relu, or the preset's)" in out
    assert "FFN kind: mlp, swiglu, geglu, reglu" in out
    assert "--no-rope" in out and "--no-qk-norm" in out and "--no-final-norm" in out and "--no-bias" in out
    assert "(default 24, or the preset's)" in out          # --layers, predict's own default


def test_old_option_spellings_still_work():
    """check-component's --runs, --x-*/--g-* and --tol are hidden deprecated spellings of
    --trials, --input-*/--grad-* and --tol-var + --tol-grad: the same result, a note each."""
    common = ["check-component", "dropout", "-p", "p=0.2", "--seed", "4", "--json"]
    new = run(*common, "--trials", "3", "--input-mean", "0.5", "--input-var", "2", "--input-corr", "0.1",
              "--grad-var", "3", "--grad-corr", "0.3", "--tol-var", "0.07", "--tol-grad", "0.07")
    old = run(*common, "--runs", "3", "--x-mean", "0.5", "--x-var", "2", "--x-corr", "0.1",
              "--g-var", "3", "--g-corr", "0.3", "--tol", "0.07")
    assert new.returncode == old.returncode == 0, old.stderr
    a, b = json.loads(new.stdout), json.loads(old.stdout)
    a.pop("simulate_s"), b.pop("simulate_s")
    assert a == b and a["trials"] == 3 and a["tolerance"]["grad_rel"] == 0.07
    assert new.stderr == ""
    notes = old.stderr.splitlines()
    assert len(notes) == 7 and all(n.startswith("sigprop check-component: note: --") for n in notes)
    assert "--tol is deprecated; use --tol-var and --tol-grad" in old.stderr


def test_config_keys_are_the_flag_names(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("layers = 2\nheads = 2\nd-model = 32\nseq-len = 8\n")
    a = run("predict", "--config", str(cfg), "--json")
    cfg.write_text("n-layers = 2\nn_heads = 2\nd_model = 32\nseq_len = 8\n")   # the library's names still work
    b = run("predict", "--config", str(cfg), "--json")
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout
    assert json.loads(a.stdout)["model"]["n_layers"] == 2
    cfg.write_text("widht = 3\n")
    line = one_error_line(run("predict", "--config", str(cfg)), "predict")
    assert "known: arch, init, layers, " in line and " d-model, heads," in line and "n-layers" not in line


def test_relu_and_gelu_run_without_parameters():
    for name in ("relu", "gelu"):
        r = run("check-component", name, "--trials", "2", "--batch", "2", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["params"] == {"L": 16, "d": 64} and out["pass"] is True
    r = run("check-component", "relu", "-p", "d=32", "-p", "L=4", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["params"] == {"L": 4, "d": 32}
    r = run("check-component", "linear", "-p", "d_in=1e2", "-p", "d_out=3e1", "-p", "w_std=0.1", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["params"]["d_in"] == 100


def test_sizes_beyond_memory_are_refused_before_anything_is_drawn(monkeypatch):
    from sigprop.errors import DomainError
    from sigprop.mc import component as comp
    from sigprop.mc.components import COMPONENTS
    from sigprop.rules import get

    monkeypatch.setattr(comp, "available_memory", lambda: 16 * 2**30)
    lin = COMPONENTS["linear"]
    with pytest.raises(DomainError, match=r"about 37\.\d GiB of memory per weight draw, more than the 16 GiB available"):
        comp.resolve_params(lin, get("linear"), {"d_in": 100_000, "d_out": 100_000, "w_std": 0.01}, batch=8)
    rule, sim = comp.resolve_params(lin, get("linear"), {"d_in": 1e3, "d_out": 10, "w_std": 0.1}, batch=8)
    assert type(rule["d_in"]) is int and sim == {"L": 16, "d_in": 1000, "d_out": 10, "w_std": 0.1, "b_std": 0.0}


def test_component_verdict_is_the_librarys():
    """judge(): |predicted - measured| <= max(tolerance, z SE), per moment."""
    from types import SimpleNamespace as NS

    from sigprop.mc.component import judge
    from sigprop.state import Backward, Forward

    def meas(var, var_se):
        x = NS(mean=0.0, var=var, corr=0.2, mean_se=0.01, var_se=var_se, corr_se=0.001)
        return NS(x=x, g=NS(var=1.0, corr=0.0, var_se=0.01, corr_se=0.001))

    px, pg = Forward(0.0, 1.0, 0.2), Backward(1.0, 0.0)
    by, ok = judge(px, pg, meas(1.1, 0.001))              # 9% off, tiny SE: x_var fails, alone
    assert not ok and [k for k, v in by.items() if not v] == ["x_var"]
    assert judge(px, pg, meas(1.1, 0.03))[1]               # within 4 SE
    assert judge(px, pg, meas(1.1, 0.001), {"var": 0.1})[1]  # within a 10% tolerance
    assert not judge(px, pg, meas(1.1, 0.03), {"z": 3.0})[1]


def test_degenerate_scales_predict():
    """--branch-scale 1e308: the stream's mean is 0, not inf; --skip-scale 0 --branch-scale 0
    (a stream that vanishes) is bad input in one line, not a LinAlgError (exit 3)."""
    r = run("predict", "--layers", "3", *TINY, "--branch-scale", "1e308", "--json")
    assert r.returncode == 0, r.stderr
    pts = json.loads(r.stdout)["points"]
    assert all(p["forward"]["mean"] == 0 for p in pts) and pts[-1]["forward"]["var"] == "inf"
    r = run("predict", "--layers", "3", *TINY, "--skip-scale", "0", "--branch-scale", "0", "--json")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "vanishes" in r.stderr


def test_predict_header_names_the_assumptions():
    r = run("predict", "--layers", "2", *TINY, "--input-var", "2", "--grad-corr", "0.25", "--dropout", "0.2",
            "--ffn-dropout", "0.05")
    assert r.returncode == 0, r.stderr
    head = r.stdout.split("┏")[0]
    assert "init      normal: weight std 0.02, bias std 0" in head
    assert "dropout   attention 0.2, hidden 0.2, ffn-inner 0.05" in head
    assert "stream entering layer 1: mean 0, var 2, token corr 0.1768" in head
    assert "upstream, at the top: var 1, token corr 0.25" in head


def test_check_table_fits_80_columns():
    env = {**__import__("os").environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "sigprop", "check", "--layers", "2", *TINY, "--trials", "2",
                        "--batch", "2", "--input-var", "1e6", "--grad-var", "1e-5"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    rows = [ln for ln in lines if ln.startswith(("0 in", "1 att", "2 ffn"))]
    assert len(rows) == 3 and all("…" not in ln for ln in rows)    # nothing truncated
    assert all(len(ln.split()) >= 9 for ln in rows)                  # every column on the row's one line


def test_rules_attention_is_readable_in_a_terminal():
    env = {**__import__("os").environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "sigprop", "rules", "attention", "softmax"], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # (two screens at most: 225 lines since the soft cap's and the window's parameters and assumptions)
    assert max(len(ln) for ln in lines) <= 80 and len(lines) < 225, len(lines)
    # attention: outputs too long to format, summarised; its named quantities listed under "where"
    assert re.search(r"gradient variance: [\d,]+ terms written out, too long to print here", r.stdout)
    assert "where (named quantities, each defined once):" in r.stdout
    assert re.search(r"and .*kbar\(n\).*: too\s+long\s+to\s+print", r.stdout.replace("\n", " "))   # rotary cosine sum
    assert re.search(r"forward variance: \d+ lines long \(--latex prints it\)", r.stdout)   # softmax
    assert "E[sum P_i^2 sum P_k^2]" in r.stdout          # assumptions are text, not rich markup


def test_max_depth_probes_sorted():
    r = run("solve-init", "--target", "max-depth", "--max-grad-ratio", "1.3", "--max-layers", "256",
            "--d-model", "64", "--heads", "2", "--seq-len", "8", "--json")
    assert r.returncode == 0, r.stderr
    ns = [e["n_layers"] for e in json.loads(r.stdout)["evaluations"]]
    assert ns == sorted(ns) and len(set(ns)) == len(ns) and any(n & (n - 1) for n in ns)   # bisected


@pytest.mark.parametrize("args,threads", [
    (["predict", "--layers", "2"], "1"),
    (["--version"], None),
    (["solve-init", "--target", "unit-variance"], "1"),
    (["check", "--layers", "2"], None),
    (["measure", "--hf", "x"], None),
])
def test_rule_commands_run_blas_on_one_thread_unless_told(monkeypatch, args, threads):
    """(OpenBLAS's threads made the sampled logit law of `predict --arch llama --init xavier`
    2.2x slower on 2 shared cores, and its last digits depend on their number)"""
    from sigprop.__main__ import blas_threads

    for k in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    blas_threads(args)
    assert os.environ.get("OPENBLAS_NUM_THREADS") == threads and os.environ.get("MKL_NUM_THREADS") == threads
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    blas_threads(args)
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"        # the user's own setting stays
