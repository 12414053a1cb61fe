"""Input files (sigprop.files): only regular files, bounded in size and nesting, every failure
one line and exit 2 on the command line, a SigpropError through the Python API."""

import json
import os
import subprocess
import sys

import pytest

import sigprop
from sigprop import files
from sigprop.errors import DomainError, SigpropError

from tests._cli import cli

M = ["--layers", "4", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "16"]
DEEP = 100_000
FILE_FLAGS = ("--spec", "--hf-config", "--config")


def run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, text=True,
                          timeout=timeout)


def one_line_exit_2(code, out, err):
    assert code == 2, (code, err)
    assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# -- json_depth ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '{"a": "[[[[\\"[[["}', '["\\\\", [[]]]', '"]]]"', '[{"k": "{"}, ["", ""]]', '["\u00e9[", {}]', "3", "[]",
    '{"a": [1, {"b": [[], {"c": "}}}]]"}]}]}', '["\\\\\\"[", [["\\u005b"]]]', '[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]',
])
def test_json_depth_is_the_parsers_depth(text):
    def depth(v):
        if isinstance(v, list):
            return 1 + max(map(depth, v), default=0)
        if isinstance(v, dict):
            return 1 + max(map(depth, v.values()), default=0)
        return 0

    assert files.json_depth(text.encode()) == depth(json.loads(text))


def test_json_depth_chunks_carry_the_level_and_the_string_state():
    # a string opened in one chunk and closed in the next, brackets inside it and after it
    pad = " " * ((1 << 24) - 3)
    text = '[["' + pad + '[[[[", [[]]]]'
    assert files.json_depth(text.encode()) == 4


# -- refusals before reading -------------------------------------------------------------------

@pytest.mark.parametrize("flag", FILE_FLAGS)
def test_a_character_device_is_refused_unread(capsys, flag):
    code, out, err = cli(capsys, "predict", *([] if flag != "--config" else M), flag, "/dev/zero")
    one_line_exit_2(code, out, err)
    assert "not a regular file (a character device)" in err and "/dev/zero" in err


@pytest.mark.parametrize("flag", FILE_FLAGS)
def test_a_fifo_is_refused_without_blocking(tmp_path, flag):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    r = run("predict", *([] if flag != "--config" else M), flag, str(fifo), timeout=60)
    one_line_exit_2(r.returncode, r.stdout, r.stderr)
    assert "not a regular file (a FIFO)" in r.stderr


def test_model_files_read_through_the_same_reader(tmp_path):
    # Model.load is what --spec, --init-from and the API's spec read
    from sigprop.model.spec import Model

    fifo = tmp_path / "solution.json"
    os.mkfifo(fifo)
    with pytest.raises(DomainError, match="not a regular file"):
        Model.load(fifo)


@pytest.mark.parametrize("flag, size, limit", [
    ("--hf-config", files.MAX_CONFIG_BYTES + 1, "16 MiB"),
    ("--config", files.MAX_CONFIG_BYTES + 1, "16 MiB"),
    ("--spec", files.MAX_MODEL_BYTES + 1, "2 GiB"),
])
def test_a_file_beyond_its_limit_is_refused_unread(capsys, tmp_path, flag, size, limit):
    p = tmp_path / "big"
    with open(p, "wb") as f:
        f.truncate(size)                          # sparse: no disk, and never read
    code, out, err = cli(capsys, "predict", *([] if flag != "--config" else M), flag, str(p))
    one_line_exit_2(code, out, err)
    assert f"more than the {limit} read" in err


def test_limits_are_far_above_real_files(tmp_path):
    # a 1000-layer trace is well under 1 MB: the model-file limit holds the 1,000,000-layer limit's
    from sigprop.model.spec import MAX_LAYERS

    r = run("predict", *M[2:], "--layers", "1000", "--json")
    assert r.returncode == 0, r.stderr
    per_layer = len(r.stdout.encode()) / 1000
    assert per_layer * MAX_LAYERS < files.MAX_MODEL_BYTES / 2


# -- nesting -------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ("--spec", "--hf-config"))
def test_deep_json_is_refused_before_parsing(capsys, tmp_path, flag):
    p = tmp_path / "deep.json"
    p.write_text("[" * DEEP + "]" * DEEP)
    code, out, err = cli(capsys, "predict", flag, str(p))
    one_line_exit_2(code, out, err)
    assert f"nests arrays/objects {DEEP} deep, more than the {files.MAX_DEPTH} read" in err


def test_deep_toml_is_refused(capsys, tmp_path):
    p = tmp_path / "deep.toml"
    p.write_text("layers = " + "[" * DEEP + "]" * DEEP + "\n")
    code, out, err = cli(capsys, "predict", *M, "--config", str(p))
    one_line_exit_2(code, out, err)
    assert "too deeply for the TOML parser" in err


@pytest.mark.parametrize("keyword, suffix, text", [
    ("spec", ".json", "[" * DEEP + "]" * DEEP),
    ("hf_config", ".json", "[" * DEEP + "]" * DEEP),
    ("config", ".toml", "a = " + "[" * DEEP + "]" * DEEP + "\n"),
    ("config", ".toml", "layers = " + "9" * 5000 + "\n"),
])
def test_the_api_raises_sigprop_errors(tmp_path, keyword, suffix, text):
    p = tmp_path / ("f" + suffix)
    p.write_text(text)
    with pytest.raises(SigpropError):
        sigprop.predict(**{keyword: p})
    with pytest.raises(SigpropError):
        sigprop.predict(**{keyword: str(p)})


def test_a_toml_integer_beyond_python_digits_is_one_line(capsys, tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("layers = " + "9" * 5000 + "\n")
    code, out, err = cli(capsys, "predict", *M[2:], "--config", str(p))
    one_line_exit_2(code, out, err)
    assert "c.toml" in err and "4300 digits" in err and "set_int_max_str_digits" not in err


@pytest.mark.parametrize("keyword", ("spec", "hf_config", "config"))
@pytest.mark.parametrize("value", ([1, 2], 3, 2.5, True, b"x.json"))
def test_api_file_arguments_of_the_wrong_type(keyword, value):
    with pytest.raises(DomainError, match=f"{keyword} must be"):
        sigprop.predict(**{keyword: value})
    with pytest.raises(DomainError, match=f"{keyword} must be"):
        sigprop.build_model(**{keyword: value})


def test_readers_refuse_non_paths():
    from sigprop.interop.hf import read_config
    from sigprop.model.config import load_config
    from sigprop.model.spec import Model

    for fn in (read_config, load_config, Model.load):
        with pytest.raises(DomainError, match="must be a file path"):
            fn([1, 2])
