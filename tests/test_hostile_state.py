"""Hostile input to three places that hold state (issue 53): notebook parameters (papermill writes them into the
notebook's source), the cold tier's file (anyone who can write `cold_dir` could choose the K/V a model reads), and
prefix-cache namespaces (two tenants must never share blocks).

Each refusal is shown against what the old check accepted: papermill's own translation of a crafted value runs it,
the sweep's top-level type check passes it, CRC-32 accepts a forged record, and `repr` names two tenants alike.
"""
import dataclasses
import json
import os
import shutil
import zlib

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO
from conftest import prefix_run as run

import sparsekv as sk
from sparsekv.analysis.workloads import Request
from sparsekv.serving.trace import ServeRequest
from sparsekv.storage.cold import ColdFile
from sparsekv.storage.prefix_cache import PrefixCache, namespace_bytes
from sparsekv.storage.tiers import COLD
from sparsekv.suite import params as nbparams
from sparsekv.suite import runner
from sparsekv.suite import sweep as sw

TINY = REPO / "tests" / "data" / "sweep_tiny.ipynb"


# -- notebook parameters ---------------------------------------------------------------------------------------------

def payload(marker) -> str:
    """Text that, written by papermill inside `"..."` without escaping, closes the string and creates `marker`."""
    return '"+str(open("' + str(marker) + '", "w").close())+"'


def papermill_source(params: dict) -> str:
    """The parameters cell papermill would inject for `params` (its Python translator, no kernel)."""
    from papermill.translators import PythonTranslator
    return PythonTranslator.codify(params)


@pytest.mark.parametrize("kind", ["binary", "set", "nested tuple"])
def test_papermill_runs_a_crafted_value_it_cannot_translate(tmp_path, kind):
    """The threat, shown without a kernel: the source papermill writes for bytes, a set or a tuple runs the payload."""
    marker = tmp_path / "ran"
    value = {"binary": payload(marker).encode(), "set": {payload(marker)}, "nested tuple": [(payload(marker),)]}[kind]
    exec(papermill_source({"names": value}), {})
    assert marker.exists()                                        # the injected call ran
    with pytest.raises(TypeError, match=r"sweep_tiny: parameter names"):
        nbparams.check({"names": value}, "sweep_tiny")             # the new check refuses the same value


def _yaml_with(tmp_path, kind, marker) -> str:
    """A smoke.yaml whose 02_tiny entry sets `names` to a crafted value, as YAML can write it."""
    if kind == "binary":
        import base64
        value = "!!binary " + base64.b64encode(payload(marker).encode()).decode()
    else:
        value = "!!set {" + json.dumps(payload(marker)) + ": null}"
    return f"defaults: {{log_path: {json.dumps(str(tmp_path / 'log.txt'))}}}\n" \
           f"notebooks:\n  01_tiny: {{a: 2}}\n  02_tiny:\n    names: {value}\n"


def _suite_root(tmp_path, smoke: str):
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    (root / "tests" / "baselines").mkdir(parents=True)
    for stem in ("01_tiny", "02_tiny"):
        shutil.copyfile(TINY, root / "notebooks" / f"{stem}.ipynb")
    (root / "notebooks" / "smoke.yaml").write_text(smoke)
    return root


@pytest.mark.parametrize("kind", ["binary", "set"])
def test_a_crafted_smoke_yaml_is_refused_before_any_notebook_starts(tmp_path, kind):
    import io
    marker = tmp_path / "ran"
    root = _suite_root(tmp_path, _yaml_with(tmp_path, kind, marker))
    raw = yaml.safe_load((root / "notebooks" / "smoke.yaml").read_text())["notebooks"]["02_tiny"]["names"]
    assert isinstance(raw, (bytes, set))                          # what yaml.safe_load hands the runner
    with pytest.raises(TypeError, match=r"02_tiny: parameter names must be JSON-typed"):
        runner.smoke_parameters("02_tiny", root)
    with pytest.raises(TypeError, match=r"02_tiny: parameter names"):
        runner.run_all("smoke", out=tmp_path / "out", root=root, stream=io.StringIO())
    assert not marker.exists()                                    # the payload never ran
    assert not (tmp_path / "log.txt").exists()                    # nor did 01_tiny, which comes first
    assert not (tmp_path / "out").exists()                        # nothing was written


def test_run_notebook_refuses_a_crafted_value_before_writing_anything(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(TypeError, match=r"sweep_tiny: parameter names\[0\] must be JSON-typed .* got tuple"):
        runner.run_notebook(TINY, tmp_path / "out", tmp_path / "fig", {"names": [(payload(marker),)]})
    assert not marker.exists()                                    # the payload never ran
    assert not (tmp_path / "out").exists() and not (tmp_path / "fig").exists()   # no folder made


def test_a_crafted_grid_is_refused_before_any_cell_starts(tmp_path):
    marker = tmp_path / "ran"
    value = [(payload(marker),)]                                  # a list (the default's type) holding a tuple
    defaults = sw.notebook_parameters(TINY)
    assert sw._type_ok(defaults["names"], value)                  # the old check, top-level type only, passed it
    grid = sw.Grid(cells=({"names": value},))                     # built directly: from_dict never saw it
    with pytest.raises(TypeError, match=r"cell 0 \(sweep_tiny\): parameter names\[0\] must be JSON-typed"):
        sw.validate(grid, TINY)
    with pytest.raises(TypeError, match=r"parameter names\[0\]"):
        sw.sweep(TINY, grid, tmp_path / "sweep", workers=1, progress=False)
    assert not marker.exists() and not (tmp_path / "sweep").exists()       # nothing ran, nothing written
    with pytest.raises(TypeError, match=r"grid cell 0: parameter names\[0\]"):
        sw.Grid.from_dict({"params": {"names": [value]}})         # refused where cells are built, too


@pytest.mark.parametrize("kind", ["binary", "set"])
def test_a_grid_file_with_yaml_tags_is_refused_with_the_parameter_named(tmp_path, kind):
    marker = tmp_path / "ran"
    spec = _yaml_with(tmp_path, kind, marker).split("02_tiny:\n")[1].strip()       # "names: !!..."
    (tmp_path / "grid.yaml").write_text(f"base:\n  {spec}\nparams:\n  a: [1, 2]\n")
    with pytest.raises(TypeError, match=r"grid cell 0: parameter names must be JSON-typed"):
        sw.Grid.load(tmp_path / "grid.yaml")


@pytest.mark.parametrize("value,words", [
    (float("nan"), r"p must be a finite float"),
    ([1.0, float("inf")], r"p\[1\] must be a finite float"),
    ({"k": [(1, 2)]}, r"p\['k'\]\[0\] must be JSON-typed .* got tuple of 2 items \(pass a list\)"),
    ({1.5: 2}, r"p must have str keys, got the float key 1.5"),
    ({1: "a", "1": "b"}, r"p has the key '1' twice"),
    (type("S", (str,), {})("x"), r"p must be JSON-typed .* got S"),   # a str subclass could format itself
    (np.int64(3), r"p must be JSON-typed .* got int64"),
    (b"x", r"p must be JSON-typed .* got bytes b'x'"),
    (frozenset(), r"p must be JSON-typed .* got frozenset"),
])
def test_a_value_that_is_not_json_is_refused_with_its_path(value, words):
    with pytest.raises(TypeError, match=words):
        nbparams.check({"p": value}, "nb")


def test_names_must_be_identifiers_and_nesting_is_bounded():
    with pytest.raises(ValueError, match=r"nb: parameter name 'x = 1\\nimport os' is not a Python identifier"):
        nbparams.check({"x = 1\nimport os": 1}, "nb")            # papermill writes a name as is
    with pytest.raises(ValueError, match="not a Python identifier"):
        nbparams.check({"class": 1}, "nb")
    with pytest.raises(TypeError, match="parameter names must be str"):
        nbparams.check({3: 1}, "nb")
    loop = []
    loop.append(loop)
    with pytest.raises(TypeError, match=f"nested deeper than {nbparams.MAX_DEPTH}"):
        nbparams.check({"p": loop}, "nb")                         # a list that holds itself ends, refused


def test_json_values_pass_as_a_plain_copy_with_int_keys_as_strings():
    given = {"a": 1, "b": 0.5, "c": None, "d": True, "e": "x\"y", "f": [1, [2.0, {"g": "h"}]], "n": {2048: 20}}
    got = nbparams.check(given, "nb")
    assert got == {**given, "n": {"2048": 20}}                    # an int key is written as papermill and JSON write it
    assert given["n"] == {2048: 20}                               # the input is not changed
    assert got["f"] is not given["f"]                             # a copy, not the caller's lists


def test_every_committed_smoke_entry_and_grid_still_passes():
    for path in runner.discover(root=REPO):
        runner.smoke_parameters(path.stem, REPO)                 # raises on a value that is not JSON
    for grid in sorted((REPO / "sweeps").glob("*.yaml")):
        notebook = next((REPO / "notebooks").glob(grid.stem[:2] + "_*.ipynb"))
        sw.validate(sw.Grid.load(grid), notebook)


# -- the cold tier ---------------------------------------------------------------------------------------------------

def crc_preserving(data: bytes, target: int, pos: int) -> bytes:
    """`data` with the 4 bytes at `pos` changed so that its CRC-32 is `target`.

    CRC-32 is affine over GF(2): crc(x ^ d) = crc(x) ^ crc(d) ^ crc(0...0). So a change d confined to 4 bytes
    that moves the CRC by `crc(data) ^ target` is a solution of 32 linear equations in its 32 bits."""
    n, zero = len(data), zlib.crc32(bytes(len(data)))
    rows = {}                                                     # leading bit -> (column combination, bits used)
    for bit in range(32):
        d = bytearray(n)
        d[pos + bit // 8] = 1 << (bit % 8)
        v, m = zlib.crc32(bytes(d)) ^ zero, 1 << bit
        while v:
            top = v.bit_length() - 1
            if top not in rows:
                rows[top] = (v, m)
                break
            v, m = v ^ rows[top][0], m ^ rows[top][1]
    v, m = zlib.crc32(data) ^ target, 0
    while v:
        top = v.bit_length() - 1
        v, m = v ^ rows[top][0], m ^ rows[top][1]
    out = bytearray(data)
    for bit in range(32):
        if m >> bit & 1:
            out[pos + bit // 8] ^= 1 << (bit % 8)
    assert zlib.crc32(bytes(out)) == target
    return bytes(out)


def record(cold, layer, block) -> bytes:
    with open(cold.path, "rb") as f:
        f.seek(cold.offset(layer, block))
        return f.read(cold.record_bytes)


def overwrite(cold, layer, block, data: bytes) -> None:
    with open(cold.path, "r+b") as f:                             # what anyone who can write cold_dir can do
        f.seek(cold.offset(layer, block))
        f.write(data)


def test_a_crc_preserving_forgery_of_a_bf16_key_tile_is_refused(tmp_path):
    """The proved attack: SmolLM2's 12,288-byte bf16 K tile (3 kv heads x 32 tokens x 64 dims) replaced by +inf keys,
    4 bytes of the V tile adjusted so the record keeps its CRC-32."""
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=3, head_dim=64, block_size=32, num_blocks=8,
                                         dtype=torch.bfloat16, cold_dir=tmp_path, hot_blocks=1))
    g = torch.Generator().manual_seed(0)
    K, V = (torch.randn(1, 96, 3, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    seq = store.new_sequence()
    store.append(seq, K, V)                                       # 3 blocks, 1 hot: 2 cold
    t = store.tiers
    victim = next(b for b in seq.block_ids if t.state[0, b] == COLD)
    original = record(t.cold, 0, victim)
    tile = 3 * 32 * 64 * 2
    assert tile == 12288
    inf_keys = torch.full((tile // 2,), float("inf"), dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
    forged = crc_preserving(inf_keys + original[tile:], zlib.crc32(original), tile)
    assert zlib.crc32(forged) == zlib.crc32(original)             # CRC-32 alone would have served it
    overwrite(t.cold, 0, victim, forged)
    logical = seq.block_ids.index(victim)
    with pytest.raises(sk.ColdBlockError, match=f"cold block {victim} \\(layer 0\\)") as info:
        store.layer_kv(0, [seq], [torch.tensor([[logical]] * 3)])
    assert info.value.layer == 0 and info.value.block == victim and "checksum mismatch" in info.value.reason
    assert t.state[0, victim] == COLD                             # refused: the tile stays cold, nothing installed
    with pytest.raises(sk.ColdBlockError):
        store.gather(seq, 0)                                      # a staged read checks too
    with pytest.raises(sk.ColdBlockError):
        t.cold.submit(0, victim).result()                         # and the background reader
    t.check()
    store.close()


@pytest.fixture
def cold(tmp_path):
    c = ColdFile(tmp_path, 1, 4, 12288)
    yield c
    c.close()


def tile(seed, n=12288) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_an_older_generation_of_the_slot_is_refused(cold):
    cold.write(0, 1, tile(1))
    old = record(cold, 0, 1)                                      # generation 1
    cold.write(0, 1, tile(2))
    assert cold.expected(0, 1)[0] == 2                            # invariant 2: the slot's second write
    now = record(cold, 0, 1)
    replayed = crc_preserving(old, zlib.crc32(now), 100)          # generation 1's bytes, 4 adjusted
    assert zlib.crc32(replayed) == zlib.crc32(now)                # CRC-32 alone would have served it
    for bad in (old, replayed):
        overwrite(cold, 0, 1, bad)
        with pytest.raises(sk.ColdBlockError, match="cold block 1 \\(layer 0\\).*checksum mismatch"):
            cold.read(0, 1)
        with pytest.raises(sk.ColdBlockError, match="checksum mismatch"):
            cold.submit(0, 1).result()                            # the async path verifies too
    overwrite(cold, 0, 1, now)
    assert torch.equal(cold.read(0, 1), tile(2))                  # the current record still reads back
    assert torch.equal(cold.submit(0, 1).result(), tile(2))


def test_another_slot_s_record_is_refused(cold):
    cold.write(0, 1, tile(1))
    cold.write(0, 2, tile(2))
    mine, theirs = record(cold, 0, 1), record(cold, 0, 2)
    moved = crc_preserving(theirs, zlib.crc32(mine), 0)           # slot 2's record, made to carry slot 1's CRC
    assert zlib.crc32(moved) == zlib.crc32(mine)                  # CRC-32 alone would have served it
    for bad in (theirs, moved):
        overwrite(cold, 0, 1, bad)
        with pytest.raises(sk.ColdBlockError, match="cold block 1 \\(layer 0\\)"):
            cold.read(0, 1)
        with pytest.raises(sk.ColdBlockError):
            cold.submit(0, 1).result()
    assert torch.equal(cold.read(0, 2), tile(2))                  # slot 2 itself is untouched


def test_a_slot_never_written_is_refused(cold):
    with pytest.raises(sk.ColdBlockError, match="never written"):
        cold.read(0, 3)


def test_the_tag_is_keyed_per_store(tmp_path):
    a, b = ColdFile(tmp_path, 1, 4, 4096), ColdFile(tmp_path, 1, 4, 4096)
    a.write(0, 0, tile(5, 4096))
    b.write(0, 0, tile(5, 4096))
    assert a.expected(0, 0)[1] != b.expected(0, 0)[1]             # same slot, bytes and generation; another key
    a.close(), b.close()


def test_the_cold_file_is_mkstemp_s_and_a_symlink_at_its_path_is_never_followed(tmp_path, monkeypatch):
    """A racer in a shared cold_dir swaps a symlink in at the new file's path right after mkstemp: the store writes
    mkstemp's own file (invariant 4), never the symlink's target, and close() leaves what is not its own alone."""
    import tempfile
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    real = tempfile.mkstemp

    def racing_mkstemp(*args, **kw):
        fd, name = real(*args, **kw)
        os.unlink(name)
        os.symlink(victim, name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", racing_mkstemp)
    c = ColdFile(tmp_path, 1, 4, 4096)
    c.write(0, 2, tile(7, 4096))
    assert victim.read_text() == "precious"                       # never truncated, never written
    assert torch.equal(c.read(0, 2), tile(7, 4096))               # the records live in mkstemp's (unlinked) file
    c.close()
    assert victim.read_text() == "precious" and os.path.islink(c.path)    # the racer's link is not ours to delete


def test_o_direct_is_kept_where_the_file_system_allows_it_and_dropped_where_not(tmp_path, monkeypatch):
    import fcntl
    c = ColdFile(tmp_path, 1, 4, 4096)
    if c.io_mode == "O_DIRECT":                                   # set on mkstemp's descriptor, not by reopening
        assert fcntl.fcntl(c.fd, fcntl.F_GETFL) & os.O_DIRECT
    c.close()
    if not hasattr(os, "O_DIRECT"):
        return
    real = fcntl.fcntl

    def refuse_direct(fd, cmd, arg=0):
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(22, "Invalid argument")                 # a file system without O_DIRECT
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refuse_direct)
    c = ColdFile(tmp_path, 1, 4, 4096)
    assert c.io_mode == "page cache (dropped by fadvise)" and not real(c.fd, fcntl.F_GETFL) & os.O_DIRECT
    c.write(0, 0, tile(3, 4096))
    assert torch.equal(c.read(0, 0), tile(3, 4096))
    c.close()


# -- prefix-cache namespaces -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Tenant:
    name: str
    salt: bytes = dataclasses.field(repr=False)                   # kept out of logs: and so out of repr


def test_two_tenants_that_differ_only_in_a_repr_false_field_are_refused(sc):
    store, cache = sc
    a, b = Tenant("acme", b"salt-1"), Tenant("acme", b"salt-2")
    assert a != b and repr(a) == repr(b)                          # the old root hashed repr: one root for both
    toks = list(range(10, 23))
    seq = store.new_sequence()
    before = (cache.stats.queries, cache.num_cached, dict(cache._chains), store.pool.ref_counts.copy())
    for call in (lambda: cache.match(toks, a), lambda: cache.peek(toks, a), lambda: cache.attach(seq, toks, a),
                 lambda: cache.explain(toks, b), lambda: cache.pin("p", toks, b), lambda: PrefixCache.root(a)):
        with pytest.raises(TypeError, match="namespace must be None, str, bytes or int.*Tenant"):
            call()
    store.append(seq, torch.ones(1, 13, 1, 4), torch.ones(1, 13, 1, 4))
    with pytest.raises(TypeError, match="namespace"):
        cache.insert(seq, toks, a)
    assert (cache.stats.queries, cache.num_cached, dict(cache._chains)) == before[:3]     # refused calls change nothing
    assert seq.block_ids and not cache._pins
    with pytest.raises(TypeError, match="namespace"):
        ServeRequest(0, "r", 0.0, torch.arange(8), 2, namespace=a)   # a request is refused when it is made
    with pytest.raises(TypeError, match="namespace"):
        Request("r", torch.arange(8), namespace=b)


def test_str_bytes_and_int_namespaces_are_kept_apart(sc):
    store, cache = sc
    toks = list(range(10, 23))
    run(store, cache, toks, ns="a")
    assert cache.match(toks, "a").num_tokens == 12                # the same namespace hits
    for other in (b"a", 97, None, "A", ""):
        assert cache.match(toks, other).num_tokens == 0           # str "a" is not bytes b"a", nor 97, nor the default
    keys = [None, "", b"", 0, "none", b"none", "str|", b"str|", 1, -1, 256, "a", b"a", "\udcff", "é", "é".encode()]
    assert len({namespace_bytes(k) for k in keys}) == len(keys)   # type, length and bytes: no two alike


@pytest.mark.parametrize("bad", [True, np.int64(1), 1.0, ("a",), bytearray(b"a"), type("S", (str,), {})("a")])
def test_only_exact_none_str_bytes_and_int_name_a_namespace(bad):
    with pytest.raises(TypeError, match="namespace must be None, str, bytes or int"):
        namespace_bytes(bad)


def test_notebook_11_s_int_namespaces_still_work():
    r = ServeRequest(3, "r", 0.0, torch.arange(8), 2)
    assert dataclasses.replace(r, namespace=r.rid).namespace == 3     # each request its own namespace (notebook 11)


def test_the_engine_and_the_hybrid_cache_refuse_a_bad_namespace_and_keep_their_state():
    from sparsekv.storage.hybrid import HybridStore
    from sparsekv.storage.hybrid_cache import HybridPrefixCache
    store = HybridStore(sk.StoreConfig(num_layers=2, num_kv_heads=1, head_dim=4, block_size=4, num_blocks=64),
                        (0, 8))
    cache = HybridPrefixCache(store)
    seq = store.new_sequence()
    for call in (lambda: cache.attach(seq, list(range(20)), Tenant("t", b"s")),
                 lambda: cache.peek(list(range(20)), Tenant("t", b"s")),
                 lambda: cache.pin("p", list(range(20)), Tenant("t", b"s"))):
        with pytest.raises(TypeError, match="namespace"):
            call()
    assert cache.stats.queries == 0 and seq.num_tokens == 0 and not cache._pins
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    engine = sk.Engine(model, block_size=8, num_blocks=32, prefix_cache=True)
    s = engine.new_sequence()
    with pytest.raises(TypeError, match="namespace"):
        engine.prefill(s, list(range(4, 30)), namespace=Tenant("t", b"s"))
    assert s.num_tokens == 0 and engine._state(s).namespace is None and not engine._state(s).tokens
    engine.prefill(s, list(range(4, 30)), namespace=b"tenant-salt")       # bytes: accepted
    assert engine._state(s).namespace == b"tenant-salt"
    engine.close()


# -- the benchmark ---------------------------------------------------------------------------------------------------

def test_the_cold_auth_benchmark_runs(tmp_path):
    from benchmarks import bench_cold_auth
    out = tmp_path / "a.json"
    assert bench_cold_auth.main(["--sizes", "4096", "--sample-bytes", "4096", "--repeats", "1", "--warmup", "0",
                                 "--cold-dir", str(tmp_path), "--out", str(out)]) == 0
    case = json.loads(out.read_text())["cases"][0]
    assert case["record_bytes"] == 4096 and case["crc32_us"] > 0 and case["blake2b_keyed_us"] > 0
