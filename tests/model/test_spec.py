"""The model specification (sigprop.model.spec): construction, JSON layout, validation with
JSON paths, exact round trips, file loading, and the cost of 100,000-layer models."""

from __future__ import annotations

import copy
import json
import math
import re
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sigprop.errors import DomainError
from sigprop.model.spec import WEIGHTS, Dropout, Model, Sublayers
from sigprop.state import Backward, Forward


def make_model(n=5, seed=0, arch="custom") -> Model:
    """A model with every column different (random), built directly from the classes."""
    rng = np.random.default_rng(seed)

    def sub(kind):
        names = WEIGHTS[kind]
        return Sublayers(kind, rng.random(n) < 0.5, rng.normal(size=n), rng.normal(size=n), rng.random(n),
                         {w: rng.random(n) * 0.1 for w in names}, {w: rng.random(n) * 0.01 for w in names})

    return Model(arch=arch, n_layers=n, d_model=32, n_heads=4, d_head=8, d_ff=128, seq_len=16,
                 activation="gelu", norm="layernorm", causal=True, dropout=Dropout(0.1, 0.2, 0.05),
                 input=Forward(0.5, 2.0, 0.3), grad=Backward(1.5, 0.1), attention=sub("attention"), ffn=sub("ffn"))


# ---------------------------------------------------------------------------------------
# layout and round trip
# ---------------------------------------------------------------------------------------

def test_to_json_layout_matches_the_contract():
    m = make_model(n=3)
    j = m.to_json()
    assert list(j) == ["arch", "n_layers", "d_model", "n_heads", "d_head", "d_ff", "seq_len", "activation",
                       "norm", "causal", "dropout", "input", "grad", "layers"]
    assert j["dropout"] == {"attention": 0.1, "hidden": 0.2, "ffn_inner": 0.05}
    assert j["input"] == {"mean": 0.5, "var": 2.0, "corr": 0.3}
    assert j["grad"] == {"var": 1.5, "corr": 0.1}
    assert j["causal"] is True and j["norm"] == "layernorm" and j["activation"] == "gelu"
    assert len(j["layers"]) == 3
    for l, layer in enumerate(j["layers"]):
        assert list(layer) == ["attention", "ffn"]
        for kind in ("attention", "ffn"):
            s, cols = layer[kind], getattr(m, kind)
            assert list(s) == ["placement", "skip_scale", "branch_scale", "norm_scale", "init"]
            assert s["placement"] == ("post" if cols.post[l] else "pre")
            assert s["skip_scale"] == cols.skip_scale[l] and type(s["skip_scale"]) is float
            assert s["branch_scale"] == cols.branch_scale[l] and s["norm_scale"] == cols.norm_scale[l]
            assert list(s["init"]) == list(WEIGHTS[kind])
            for w in WEIGHTS[kind]:
                assert s["init"][w] == {"std": cols.std[w][l], "bias_std": cols.bias_std[w][l]}
    json.dumps(j, allow_nan=False)  # plain JSON types only


def test_round_trip_is_exact_through_text():
    m = make_model(n=7, seed=3)
    text = json.dumps(m.to_json())
    m2 = Model.from_json(json.loads(text))
    assert m2 == m
    assert json.dumps(m2.to_json()) == text


def _drawn_sublayers(data, kind, n, scales, stds) -> Sublayers:
    """Sublayers of ``n`` layers drawn by hypothesis: placements, scale columns from
    ``scales``, std columns from ``stds``."""
    def col(strategy):
        return np.array(data.draw(st.lists(strategy, min_size=n, max_size=n)), dtype=np.float64)

    names = WEIGHTS[kind]
    post = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return Sublayers(kind, post, col(scales), col(scales), col(scales), {w: col(stds) for w in names},
                     {w: col(stds) for w in names})


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.data())
def test_round_trip_property(n, data):
    fl = st.floats(allow_nan=False, allow_infinity=False, width=64)
    nonneg = st.floats(0, 1e300, allow_nan=False)

    def sub(kind):
        return _drawn_sublayers(data, kind, n, fl, nonneg)

    m = Model(arch=data.draw(st.text(max_size=5)), n_layers=n, d_model=data.draw(st.integers(1, 10**6)),
              n_heads=1, d_head=3, d_ff=5, seq_len=2, activation="relu", norm="layernorm", causal=False,
              dropout=Dropout(data.draw(st.floats(0, 0.999))), input=Forward(data.draw(fl), data.draw(st.floats(1e-300, 1e300)),
                                                                            data.draw(st.floats(0, 1))),
              grad=Backward(data.draw(st.floats(1e-300, 1e300)), data.draw(st.floats(-1, 1))), attention=sub("attention"), ffn=sub("ffn"))
    j = json.loads(json.dumps(m.to_json()))
    m2 = Model.from_json(j)
    assert m2 == m
    assert m2.to_json() == m.to_json()


def test_equality_sees_every_column():
    m = make_model()
    assert m == make_model()
    assert m != make_model(seed=1)
    j = m.to_json()
    j["layers"][2]["ffn"]["init"]["out"]["bias_std"] = 0.5
    assert Model.from_json(j) != m
    j = m.to_json()
    j["layers"][4]["attention"]["placement"] = "post" if j["layers"][4]["attention"]["placement"] == "pre" else "pre"
    assert Model.from_json(j) != m


# ---------------------------------------------------------------------------------------
# validation with JSON paths
# ---------------------------------------------------------------------------------------

def _set(path, value):
    def mutate(j):
        obj = j
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return mutate


def _delete(path):
    def mutate(j):
        obj = j
        for k in path[:-1]:
            obj = obj[k]
        del obj[path[-1]]
    return mutate


BAD = [
    (_set(["layers", 3, "attention", "init", "q", "std"], -1), "model.layers[3].attention.init.q.std must be >= 0, got -1"),
    (_set(["layers", 0, "ffn", "init", "out", "bias_std"], -0.5), "model.layers[0].ffn.init.out.bias_std must be >= 0, got -0.5"),
    (_set(["layers", 2, "ffn", "init", "in", "std"], "0.02"), "model.layers[2].ffn.init.in.std must be a number"),
    (_set(["layers", 1, "attention", "init", "k", "std"], True), "model.layers[1].attention.init.k.std must be a number"),
    (_set(["layers", 1, "attention", "init", "k", "std"], None), "model.layers[1].attention.init.k.std must be a number"),
    (_set(["layers", 4, "attention", "skip_scale"], float("nan")), "model.layers[4].attention.skip_scale must be finite"),
    (_set(["layers", 4, "ffn", "norm_scale"], float("inf")), "model.layers[4].ffn.norm_scale must be finite"),
    (_set(["layers", 2, "ffn", "placement"], "middle"), "model.layers[2].ffn.placement must be one of 'pre', 'post', 'peri', 'output', got 'middle'"),
    (_set(["layers", 2, "ffn", "placement"], 1), "model.layers[2].ffn.placement must be one of 'pre', 'post', 'peri', 'output', got 1"),
    (_set(["layers", 1, "attention", "init", "x"], {"std": 0.0, "bias_std": 0.0}), "model.layers[1].attention.init: unknown key 'x'"),
    (_delete(["layers", 1, "attention", "init", "o"]), "model.layers[1].attention.init: missing key 'o'"),
    (_set(["layers", 1, "attention", "init", "o", "mean"], 0.0), "model.layers[1].attention.init.o: unknown key 'mean'"),
    (_set(["layers", 1, "attention", "init", "o"], [0.1, 0.0]), "model.layers[1].attention.init.o must be an object"),
    (_set(["layers", 3, "ffn", "gain"], 1.0), "model.layers[3].ffn: unknown key 'gain'"),
    (_delete(["layers", 3, "ffn", "norm_scale"]), "model.layers[3].ffn: missing key 'norm_scale'"),
    (_set(["layers", 3, "cross"], {}), "model.layers[3]: unknown key 'cross'"),
    (_delete(["layers", 0, "ffn"]), "model.layers[0]: missing key 'ffn'"),
    (_set(["layers", 0], []), "model.layers[0] must be an object"),
    (lambda j: j["layers"].pop(), "model.layers has 4 entries, n_layers is 5"),
    (_set(["layers"], {}), "model.layers must be an array"),
    (_set(["n_layers"], 0), "model.n_layers must be a positive integer, got 0"),
    (_set(["d_model"], "1024"), "model.d_model must be an integer"),
    (_set(["d_head"], 8.5), "model.d_head must be an integer"),
    (_set(["n_heads"], True), "model.n_heads must be an integer"),
    (_set(["seq_len"], -3), "model.seq_len must be a positive integer, got -3"),
    (_set(["activation"], "tanh"), "model.activation must be one of 'relu', 'gelu', 'silu', got 'tanh'"),
    (_set(["norm"], "batchnorm"), "model.norm must be one of 'layernorm', 'rmsnorm', got 'batchnorm'"),
    (_set(["causal"], 1), "model.causal must be true or false, got 1"),
    (_set(["arch"], 3), "model.arch must be a string"),
    (_set(["dropout", "hidden"], 1.0), "model.dropout.hidden must lie in [0, 1), got 1"),
    (_set(["dropout", "attention"], -0.1), "model.dropout.attention must lie in [0, 1), got -0.1"),
    (_delete(["dropout", "ffn_inner"]), "model.dropout: missing key 'ffn_inner'"),
    (_set(["input", "corr"], 1.5), "model.input.corr must lie in [0, 1], got 1.5"),
    (_set(["input", "corr"], -0.1), "model.input.corr must lie in [0, 1], got -0.1"),
    (_set(["input", "var"], 0.0), "model.input.var must be > 0, got 0"),
    (_set(["input", "mean"], "0"), "model.input.mean must be a number"),
    (_set(["grad", "var"], -1.0), "model.grad.var must be > 0, got -1"),
    (_set(["grad", "var"], 0.0), "model.grad.var must be > 0, got 0"),
    (_set(["seq_len"], 1), "model.seq_len must be >= 2"),
    (_set(["grad", "corr"], 2), "model.grad.corr must lie in [-1, 1], got 2"),
    (_set(["grad", "mean"], 0.0), "model.grad: unknown key 'mean'"),
    (_set(["extra"], 1), "model: unknown key 'extra'"),
    (_delete(["grad"]), "model: missing key 'grad'"),
]


@pytest.mark.parametrize("mutate, message", BAD)
def test_validation_names_the_json_path(mutate, message):
    j = copy.deepcopy(make_model(n=5).to_json())
    mutate(j)
    with pytest.raises(DomainError) as e:
        Model.from_json(j)
    assert message in str(e.value)


def test_not_an_object():
    with pytest.raises(DomainError, match="model must be an object, got an array"):
        Model.from_json([1, 2])


def test_integral_floats_are_not_integers():
    # as the flags, a --config TOML file and transformers' configs: 32.0 where an integer is required is refused
    j = make_model(n=2).to_json()
    j["d_model"] = 32.0
    with pytest.raises(DomainError, match=r"model\.d_model must be an integer, got a number 32\.0"):
        Model.from_json(j)
    j["d_model"] = np.int64(32)
    assert type(Model.from_json(j).d_model) is int


def test_first_bad_layer_is_reported():
    j = make_model(n=6).to_json()
    j["layers"][4]["ffn"]["init"]["in"]["std"] = -2.0
    j["layers"][5]["ffn"]["init"]["in"]["std"] = -3.0
    with pytest.raises(DomainError, match=r"layers\[4\]\.ffn\.init\.in\.std must be >= 0, got -2"):
        Model.from_json(j)


# ---------------------------------------------------------------------------------------
# direct construction
# ---------------------------------------------------------------------------------------

def test_sublayers_broadcast_and_are_read_only():
    s = Sublayers("ffn", False, 1.0, np.arange(4.0), 1.0, {"in": 0.02, "out": [0.1, 0.2, 0.3, 0.4]},
                  {"in": 0.0, "out": 0.0})
    assert s.n_layers == 4 and s.post.dtype == bool and s.skip_scale.tolist() == [1.0] * 4
    assert s.std["out"].tolist() == [0.1, 0.2, 0.3, 0.4]
    assert s.placement_of(0) == "pre" and s.placement.dtype == np.int8
    with pytest.raises(ValueError):
        s.std["in"][0] = 1.0
    with pytest.raises(TypeError):
        s.std["x"] = np.zeros(4)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="mlp"), "sublayer kind"),
    (dict(std={"in": 0.02}), "needs exactly the weights in, out"),
    (dict(std={"in": -0.02, "out": 0.1}), "std['in'][0] must be finite and >= 0"),
    (dict(skip_scale=[1.0, 2.0]), "must have shape (3,)"),
    (dict(branch_scale=[1.0, np.nan, 1.0]), "branch_scale[1] must be finite"),
    (dict(placement=[0, 7, 1]), "placement must be given as names"),
    (dict(placement=["pre", "middle", "post"]), "placement must be one of 'pre', 'post', 'peri', 'output', got 'middle'"),
])
def test_sublayers_reject(kwargs, message):
    base = dict(kind="ffn", placement=np.zeros(3, bool), skip_scale=1.0, branch_scale=1.0, norm_scale=1.0,
                std={"in": 0.02, "out": 0.02}, bias_std={"in": 0.0, "out": 0.0})
    base.update(kwargs)
    with pytest.raises(DomainError) as e:
        Sublayers(**base)
    assert message in str(e.value)


def test_model_rejects_inconsistent_parts():
    m = make_model(n=3)
    other = make_model(n=4)
    with pytest.raises(DomainError, match="ffn has 4 layers, the model 3"):
        Model(**{**{k: getattr(m, k) for k in Model.FIELDS}, "ffn": other.ffn})
    with pytest.raises(DomainError, match="attention must be a Sublayers of kind 'attention'"):
        Model(**{**{k: getattr(m, k) for k in Model.FIELDS}, "attention": m.ffn})
    with pytest.raises(DomainError, match="input.corr must lie in"):
        Model(**{**{k: getattr(m, k) for k in Model.FIELDS}, "input": Forward(0.0, 1.0, 2.0)})
    with pytest.raises(DomainError, match="dropout.hidden must lie in"):
        Dropout(0.0, 1.0)


def test_model_is_frozen_and_fans():
    m = make_model()
    with pytest.raises(AttributeError):
        m.n_layers = 3
    assert m.fans("attention", "q") == (32, 32) and m.fans("attention", "o") == (32, 32)
    assert m.fans("ffn", "in") == (32, 128) and m.fans("ffn", "out") == (128, 32)
    with pytest.raises(DomainError):
        m.fans("ffn", "q")


# ---------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------

def test_load_model_object_and_wrapped(tmp_path):
    m = make_model(n=4)
    p = tmp_path / "m.json"
    p.write_text(json.dumps(m.to_json()))
    assert Model.load(p) == m
    q = tmp_path / "trace.json"
    q.write_text(json.dumps({"schema": "sigprop.trace/1", "version": "x", "model": m.to_json(), "points": []}))
    assert Model.load(str(q)) == m


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    ('{"model": {"n_layers": NaN}}', "non-standard JSON constant NaN"),
    ("[]", "model must be an object"),
    ('{"schema": "x", "model": 3}', "model must be an object, got an integer"),
])
def test_load_malformed(tmp_path, text, message):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(DomainError) as e:
        Model.load(p)
    assert message in str(e.value)


def test_load_reports_file_and_path(tmp_path):
    j = make_model(n=4).to_json()
    j["layers"][3]["attention"]["init"]["q"]["std"] = -1
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"model": j}))
    with pytest.raises(DomainError, match=r"spec\.json: model\.layers\[3\]\.attention\.init\.q\.std must be >= 0, got -1"):
        Model.load(p)


def test_load_unreadable(tmp_path):
    with pytest.raises(DomainError, match="cannot read model file"):
        Model.load(tmp_path / "missing.json")
    with pytest.raises(DomainError, match="cannot read model file"):
        Model.load(tmp_path)
    p = tmp_path / "latin1.json"
    p.write_bytes(b'{"arch": "\xe9"}')
    with pytest.raises(DomainError, match="not UTF-8"):
        Model.load(p)


# ---------------------------------------------------------------------------------------
# size
# ---------------------------------------------------------------------------------------

def test_hundred_thousand_layers_round_trip():
    n = 100_000
    rng = np.random.default_rng(0)
    cols = {kind: Sublayers(kind, rng.random(n) < 0.5, 1.0, rng.random(n), 1 / np.sqrt(np.arange(1, n + 1)),
                            {w: rng.random(n) for w in WEIGHTS[kind]}, {w: 0.0 for w in WEIGHTS[kind]})
            for kind in WEIGHTS}
    t0 = time.perf_counter()
    m = Model(arch="x", n_layers=n, d_model=8, n_heads=2, d_head=4, d_ff=32, seq_len=4, activation="relu",
              norm="layernorm", causal=False, dropout=Dropout(), input=Forward(0.0, 1.0, 0.2),
              grad=Backward(1.0, 0.0), **cols)
    assert time.perf_counter() - t0 < 0.5
    j = m.to_json()
    assert len(j["layers"]) == n and math.isclose(j["layers"][-1]["ffn"]["norm_scale"], 1 / math.sqrt(n))
    assert Model.from_json(j) == m


def test_numpy_scalars_in_a_python_object_are_accepted():
    m = make_model(n=2)
    j = m.to_json()
    j["d_model"] = np.int64(32)
    j["layers"][1]["ffn"]["init"]["in"]["std"] = np.float64(j["layers"][1]["ffn"]["init"]["in"]["std"])
    assert Model.from_json(j) == m
    j["layers"][1]["ffn"]["init"]["in"]["std"] = np.bool_(True)
    with pytest.raises(DomainError, match=r"layers\[1\]\.ffn\.init\.in\.std must be a number"):
        Model.from_json(j)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.data())
def test_layer_runs_group_exactly_the_identical_layer_objects(n, data):
    """Model.layer_runs (used to serialise each run of identical layers once): inside a run
    every layer's JSON text equals the first's, and consecutive runs differ.  Values come
    from a small set (so runs occur) that includes 0.0 and -0.0 (equal floats, different
    JSON text)."""
    vals = st.sampled_from([0.0, -0.0, 1.0, 0.5])
    nonneg = st.sampled_from([0.0, 0.02, 0.5])

    def sub(kind):
        return _drawn_sublayers(data, kind, n, vals, nonneg)

    m = Model(arch="x", n_layers=n, d_model=8, n_heads=1, d_head=8, d_ff=16, seq_len=2, activation="relu",
              norm="layernorm", causal=False, dropout=Dropout(0.0), input=Forward(0.0, 1.0, 0.0),
              grad=Backward(1.0, 0.0), attention=sub("attention"), ffn=sub("ffn"))
    texts = [json.dumps(layer) for layer in m.to_json()["layers"]]
    runs = m.layer_runs()
    assert runs[0] == 0 and runs[-1] == n and all(a < b for a, b in zip(runs, runs[1:]))
    for start, end in zip(runs[:-1], runs[1:]):
        assert all(texts[i] == texts[start] for i in range(start, end))
        assert json.dumps(m.layers_json([start])[0]) == texts[start]
        if end < n:
            assert texts[end] != texts[start]


def test_model_classes_copy_and_pickle():
    """The frozen classes restore their fields through __setstate__ (their __setattr__
    refuses); a model is not picklable (its columns are read-only mapping proxies), as before."""
    import copy
    import pickle

    m = make_model(n=3)
    assert copy.copy(m) == m and copy.copy(m.attention) == m.attention
    d = Dropout(0.1, 0.2)
    assert pickle.loads(pickle.dumps(d)) == d and copy.deepcopy(d) == d and hash(copy.copy(d)) == hash(d)
    assert repr(d) == "Dropout(attention=0.1, hidden=0.2, ffn_inner=0.0)"


# -- the modern blocks' fields -----------------------------------------------------------

def _modern(**changes):
    obj = make_model(n=3).to_json()
    obj = json.loads(obj) if isinstance(obj, str) else obj
    obj.update(changes)
    return obj


def test_modern_fields_round_trip_and_default_to_absent():
    plain = make_model(n=3)
    assert "block" not in plain.to_json() and plain.features() == []
    obj = _modern(norm="rmsnorm", norm_eps=1e-6, n_kv_heads=1, rope={"base": 500000.0}, qk_norm="rmsnorm",
                  final_norm=True, activation="silu")
    for layer in obj["layers"]:
        layer["attention"]["placement"] = "peri"
        layer["ffn"]["placement"] = "output"
    m = Model.from_json(obj)
    assert m.rope == 500000.0 and m.n_kv_heads == 1 and m.final_norm and m.norm_eps == 1e-6
    assert m.features() == ["norm rmsnorm", "activation silu", "placement output", "placement peri",
                            "n_kv_heads", "rope", "qk_norm", "final_norm"]
    assert Model.from_json(m.to_json()) == m and m.to_json()["rope"] == {"base": 500000.0}
    assert m.fans("attention", "k") == (m.d_model, m.d_head)


def test_glu_ffn_weights():
    obj = _modern(ffn_kind="glu")
    with pytest.raises(DomainError, match=r"model.layers\[0\].ffn.init: unknown key 'in'"):
        Model.from_json(obj)
    for layer in obj["layers"]:
        layer["ffn"]["init"] = {w: {"std": 0.02, "bias_std": 0.0} for w in ("gate", "up", "down")}
    m = Model.from_json(obj)
    assert m.ffn.names == ("gate", "up", "down") and m.features() == ["ffn_kind glu"]


@pytest.mark.parametrize("changes, message", [
    (dict(n_kv_heads=3), "n_kv_heads 3 must divide n_heads"),
    (dict(rope={"base": 0.5}), "rope.base must be > 1"),
    (dict(rope={"theta": 1e4}), "unknown key 'theta'"),
    (dict(qk_norm="batchnorm"), "qk_norm must be one of"),
    (dict(block="interleaved"), "block must be one of 'sequential', 'parallel'"),
    (dict(final_norm=1), "final_norm must be true or false"),
    (dict(norm_eps=-1), "norm_eps must be >= 0"),
    (dict(block="parallel", layers="post"), "parallel block needs every sublayer of every layer 'pre'"),
])
def test_modern_fields_rejected(changes, message):
    place = changes.pop("layers", None)
    obj = _modern(**changes)
    if place:
        for layer in obj["layers"]:
            layer["ffn"]["placement"] = place
    with pytest.raises(DomainError, match=re.escape(message)):
        Model.from_json(obj)


def test_require_names_what_a_consumer_lacks():
    from sigprop.model.spec import require

    m = Model.from_json(_modern(norm="rmsnorm", final_norm=True))
    require(m, {"norm rmsnorm", "final_norm"}, "x")
    with pytest.raises(DomainError, match=r"solve-init does not implement final_norm \(yet\)"):
        require(m, {"norm rmsnorm"}, "solve-init")
