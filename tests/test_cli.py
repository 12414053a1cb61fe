"""The command line: exit codes, stderr discipline and JSON shapes (contract.md)."""

import json
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
])
def test_more_bad_input_exits_2_without_traceback(args):
    """Seeds must be >= 0 (NumPy raised a traceback), tolerances finite (a NaN tolerance
    failed every point instead), depth within the cap."""
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr and r.stderr.strip()


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
