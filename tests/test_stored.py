"""suite.stored: the codec is an exact inverse on the data it accepts, a file is read only for its own key, bad
input is refused before anything is written, and every committed file matches its notebook's parameters."""
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from sparsekv.suite import stored
from sparsekv.suite.sweep import notebook_parameters

ROOT = Path(__file__).resolve().parents[1]


def _same(a, b) -> bool:
    """Equal values of equal types, recursively (NaN equals NaN; arrays by dtype, shape and values)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def _random_value(rng, depth=0):
    kind = rng.integers(0, 9 if depth < 3 else 5)
    if kind == 0:
        return [None, True, False][rng.integers(0, 3)]
    if kind == 1:
        return int(rng.integers(-10**12, 10**12))
    if kind == 2:
        return [float(rng.standard_normal()), math.nan, math.inf, -math.inf, 0.1][rng.integers(0, 5)]
    if kind == 3:
        return "".join(rng.choice(list("ab_@ é\"\\"), size=rng.integers(0, 6)))
    if kind == 4:
        return np.float32(rng.standard_normal()).item() if rng.integers(0, 2) else int(np.int64(7))
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.integers(0, 4))]
    if kind == 6:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.integers(0, 4)))
    if kind == 7:       # str keys, a tag as a key, and tuple / int keys
        keys = ["a", "__tuple__", ("passkey", 2048), 3, "b"]
        return {keys[i]: _random_value(rng, depth + 1) for i in rng.permutation(5)[:rng.integers(0, 5)]}
    shape = tuple(int(n) for n in rng.integers(0, 4, size=rng.integers(0, 3)))
    dtype = [np.float64, np.float32, np.int64, np.uint8, np.bool_][rng.integers(0, 5)]
    return np.asarray(rng.standard_normal(shape) * 5).astype(dtype)


@pytest.mark.parametrize("seed", range(40))
def test_decode_inverts_encode_through_json(seed):
    value = _random_value(np.random.default_rng(seed))
    text = json.dumps(stored.encode(value), allow_nan=False)        # plain JSON: no NaN literal, no object
    assert _same(stored.decode(json.loads(text)), value)


def test_numpy_scalars_are_stored_as_python_scalars():
    back = stored.decode(json.loads(json.dumps(stored.encode({"n": np.int64(3), "x": np.float32(0.5)}))))
    assert back == {"n": 3, "x": 0.5} and type(back["n"]) is int and type(back["x"]) is float


@pytest.mark.parametrize("value, where", [
    ({"rows": [1, object()]}, "value['rows'][1]"),
    ([np.array(["a", "b"])], "value[0]"),
    ({"s": {1, 2}}, "value['s']"),
    ((b"bytes",), "value[0]"),
])
def test_encode_refuses_what_is_not_data_naming_where(value, where):
    with pytest.raises(TypeError, match=re.escape(f"stored: {where} must be")):
        stored.encode(value)


@pytest.mark.parametrize("data", [
    {"__tuple__": 3},
    {"__tuple__": [], "extra": 1},
    {"__items__": [[1]]},
    {"__items__": [[[1, 2], 0]]},                 # a list key cannot be hashed
    {"__float__": "1e3"},
    {"__array__": [1, 2], "dtype": "<f8", "shape": [3]},
    {"__array__": ["x"], "dtype": "|O", "shape": [1]},
    {"__array__": [1], "dtype": "<f8", "shape": [-1]},
])
def test_decode_refuses_malformed_tags(data):
    with pytest.raises(ValueError, match="stored: "):
        stored.decode(data)


def test_compute_or_read_computes_once_then_reads(tmp_path):
    calls = []
    key = {"lengths": [1024, 2048], "seed": 0}
    compute = lambda: calls.append(1) or {("passkey", 1024): [0.5, math.nan], "rows": [{"ok": True}]}
    out = io.StringIO()
    first = stored.compute_or_read(tmp_path, "grid", key, compute, stream=out)
    second = stored.compute_or_read(tmp_path, "grid", key, compute, stream=out)
    assert len(calls) == 1 and _same(first, second)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("grid: computed in") and lines[1].startswith("grid: read ")
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [f"grid-{stored.digest(key)}.json"]
    doc = json.loads(files[0].read_text())
    assert doc["key"] == key and doc["format"] == stored.FORMAT and {"written", "commit", "cpu", "seconds"} <= set(doc)
    stored.compute_or_read(tmp_path, "grid", {**key, "seed": 1}, compute, stream=out)    # another key: computed
    assert len(calls) == 2 and len(list(tmp_path.iterdir())) == 2


def test_an_empty_folder_name_computes_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = []
    for _ in range(2):
        assert stored.compute_or_read("", "grid", {"a": 1}, lambda: calls.append(1) or [1], stream=io.StringIO()) == [1]
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_a_file_for_another_key_or_not_this_format_is_refused_not_recomputed(tmp_path):
    key = {"a": 1}
    path = stored.write(stored.path_of(tmp_path, "grid", key), key, [1, 2], 1.0)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "key": {"a": 2}}))
    never = lambda: pytest.fail("a refused file must not be recomputed over")
    with pytest.raises(ValueError, match=r"another key \(differs in \['a'\]\)"):
        stored.compute_or_read(tmp_path, "grid", key, never)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        stored.compute_or_read(tmp_path, "grid", key, never)
    path.write_text(json.dumps({"format": 99, "key": key, "value": 1}))
    with pytest.raises(ValueError, match="not a stored result of format 1"):
        stored.compute_or_read(tmp_path, "grid", key, never)


@pytest.mark.parametrize("key, error, match", [
    ({"lengths": (1, 2)}, TypeError, r"lengths must be JSON-typed.*pass a list"),
    ({"x": math.nan}, TypeError, "finite float"),
    ([1], TypeError, "must be a dict"),
])
def test_a_key_that_is_not_json_is_refused_before_computing(tmp_path, key, error, match):
    with pytest.raises(error, match=match):
        stored.compute_or_read(tmp_path, "grid", key, lambda: pytest.fail("computed"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["", "a/b", "../x", "a b", 3])
def test_names_are_plain_words(tmp_path, name):
    with pytest.raises(ValueError, match="name must be"):
        stored.path_of(tmp_path, name, {})


def test_a_value_that_is_not_data_writes_nothing(tmp_path):
    with pytest.raises(TypeError, match=r"value\['f'\] must be data"):
        stored.compute_or_read(tmp_path, "grid", {"a": 1}, lambda: {"f": print}, stream=io.StringIO())
    assert list(tmp_path.iterdir()) == []


STORED = sorted((ROOT / "results" / "stored").glob("*/*.json"))


@pytest.mark.parametrize("path", STORED, ids=[f"{p.parent.name}/{p.name}" for p in STORED])
def test_every_committed_result_was_computed_for_its_notebooks_current_parameters(path):
    """A course run reads these files instead of computing; a notebook default changed since would otherwise be
    answered by a file computed for the old one. (That case cannot happen silently anyway: the digest in the name
    changes with the key, so the notebook computes. This test keeps the committed files from going stale.)"""
    notebook = ROOT / "notebooks" / f"{path.parent.name}.ipynb"
    assert notebook.exists(), f"{path} belongs to no notebook in notebooks/"
    params = notebook_parameters(notebook)
    doc = json.loads(path.read_text())
    assert path.name == f"{doc['name']}-{stored.digest(doc['key'])}.json"
    stale = {k: (v, params.get(k, "<not a parameter>")) for k, v in doc["key"].items() if params.get(k) != v}
    assert not stale, f"{path.name}: stored for {stale} (stored, notebook): rerun the notebook and commit its files"


def test_fresh_runs_compute_and_smoke_runs_never_read_stored_results():
    """`notebooks run --fresh` sets stored_dir to "" exactly where a notebook has it; a smoke run always does
    (notebooks/smoke.yaml), so `make test` exercises the computing path and never writes results/stored/."""
    from sparsekv.suite import runner
    paths = runner.discover(None, ROOT)
    having = {p.stem for p in paths if "stored_dir" in notebook_parameters(p)}
    assert having >= {"08_real_model", "12_hybrid_long_context", "13_routers"}
    fresh = runner.parameters_for(paths, "run", ROOT, fresh=True)
    assert {s for s, p in fresh.items() if p.get("stored_dir") == ""} == having
    assert all(p == {} for s, p in runner.parameters_for(paths, "run", ROOT).items())
    smoke = runner.parameters_for(paths, "smoke", ROOT)
    assert all(smoke[s].get("stored_dir") == "" for s in having)
