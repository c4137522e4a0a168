"""The package's shape: layers that import only downwards, strategies bound through registries,
and a decode step that validates once.

Layers, bottom to top (a module imports only its own layer's siblings in the same subpackage,
and layers strictly below): kernels < core < storage < routing < attention < model
< analysis, recall (siblings that do not import each other: the instruments) < serving
< studies (one module per notebook or benchmark) < suite (the runner, findings, explorers, viz).
"""
import ast
import dataclasses
import pathlib

import pytest
import torch

import sparsekv as sk
from sparsekv.analysis import sweeps, workloads
from sparsekv.analysis.probes import ProbeConfig, needle

PKG = pathlib.Path(sk.__file__).parent
LAYER = {"kernels": 0, "core": 1, "storage": 2, "routing": 3, "attention": 4, "model": 5,
         "analysis": 6, "recall": 6, "serving": 7, "studies": 8, "suite": 9}


def imports_of(path: pathlib.Path):
    """(target subpackage, imported names) for every sparsekv import in a module, relative or absolute."""
    own = path.relative_to(PKG).parts
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:                           # relative: resolve against the module's package
                base = list(own[:-1])[: len(own) - node.level]
                parts = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.startswith("sparsekv"):
                parts = node.module.split(".")[1:]
            else:
                continue
            if not parts:                            # `from . import x` at the top level
                parts = [a.name for a in node.names][:1]
            yield parts[0], [a.name for a in node.names], parts
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("sparsekv."):
                    yield a.name.split(".")[1], [], a.name.split(".")[1:]


MODULES = sorted(p for p in PKG.rglob("*.py") if p.relative_to(PKG).parts[0] in LAYER)


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PKG)) for p in MODULES])
def test_imports_point_down_only(path):
    own = path.relative_to(PKG).parts[0]
    bad = []
    for target, _, _ in imports_of(path):
        if target not in LAYER or target == own:
            continue
        if LAYER[target] >= LAYER[own]:
            bad.append(target)
    assert not bad, f"{path.relative_to(PKG)} ({own}, layer {LAYER[own]}) imports {bad}, which are not below it"


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PKG)) for p in MODULES])
def test_no_private_name_crosses_a_subpackage(path):
    own = path.relative_to(PKG).parts[0]
    bad = [(target, n) for target, names, _ in imports_of(path) for n in names
           if target != own and n.startswith("_")]
    assert not bad, f"{path.relative_to(PKG)} imports private names of other subpackages: {bad}"


def test_every_subpackage_imports_alone():
    import importlib
    for name in LAYER:
        if name != "kernels":
            importlib.import_module(f"sparsekv.{name}")


# -- host synchronisations per layer --------------------------------------------------------------

class SyncCounter:
    """Counts the host reads of tensor values (.item, .tolist, bool/int/float/index of a tensor)."""

    METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self):
        self.count = 0

    def __enter__(self):
        self.saved = {m: getattr(torch.Tensor, m) for m in self.METHODS}
        for m, fn in self.saved.items():
            def wrapped(t, *a, _fn=fn, **k):
                self.count += 1
                return _fn(t, *a, **k)
            setattr(torch.Tensor, m, wrapped)
        return self

    def __exit__(self, *exc):
        for m, fn in self.saved.items():
            setattr(torch.Tensor, m, fn)


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("routed", [True, False], ids=["routed", "dense"])
def test_host_synchronisations_per_layer_step_are_bounded(routed, B):
    """One decode step of B sequences on the tiny model: the step is validated once (plan), and each layer reads
    back only what its algorithm needs, the same for any B (routed: the selection's width, one byte count). The
    only reads that grow with B are the B samplings, once per step."""
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    router = sk.Router("minmax", token_budget=32) if routed else None
    eng = sk.Engine(model, router, block_size=8, num_blocks=256, progress=False)
    seqs = []
    for i in range(B):
        seq = eng.new_sequence()
        eng.prefill(seq, torch.arange(1, 100 + 7 * i))
        seqs.append(seq)
    eng.decode_batch(seqs)                                     # warm caches (block tables, runs)
    with SyncCounter() as c:
        eng.decode_batch(seqs)
    layers = model.config.n_layers
    bound = 2 if routed else 0             # per layer, whatever B is
    assert c.count <= bound * layers + B, f"{c.count} host reads in one {'routed' if routed else 'dense'} step of {B}"


# -- strategies through their registries alone ----------------------------------------------------

@pytest.fixture
def registered():
    """Registers test strategies and removes them afterwards."""
    from sparsekv.routing.scorers import SCORERS
    from sparsekv.routing.selectors import SELECTORS
    from sparsekv.storage.eviction import POLICIES
    from sparsekv.storage.summaries import SUMMARIES
    added = []
    yield added
    for registry, name in added:
        {"scorer": SCORERS, "selector": SELECTORS, "policy": POLICIES, "summary": SUMMARIES}[registry].pop(name, None)


def test_a_new_scorer_works_end_to_end(registered):
    @sk.register_scorer
    class MaxOnly(sk.Scorer):
        """The max summary alone (q . kmax): a deliberately weaker bound."""
        name, summary_vectors = "maxonly", 1

        def logits(self, inp, backend, generator):
            per_head = inp.store.kmax[inp.layer][inp.table].float().permute(1, 2, 0)     # [H, D, nb]
            return (inp.q @ per_head) / inp.q.shape[-1] ** 0.5
    registered.append(("scorer", "maxonly"))
    probe = needle(ProbeConfig(length=500, num_kv_heads=2, gqa=2, head_dim=16, seed=3), 0.5)
    store, seq = sweeps.probe_store(probe, 16)
    sel = sk.Router("maxonly", token_budget=64).select(probe.q, store, seq, 0)
    out, res = sk.sparse_attention(probe.q, store, seq, 0, sel.blocks)
    assert out.shape == probe.q.shape and res.blocks_read == int((sel.blocks >= 0).sum())
    assert sel.traffic.summary_bytes == seq.num_blocks * 2 * 1 * 16 * 4       # 1 summary vector per tile
    rows = sweeps.sweep(lambda depth: needle(ProbeConfig(length=500, num_kv_heads=2, gqa=2, head_dim=16), depth),
                       [dict(depth=0.3)], {"maxonly": sk.Router("maxonly", token_budget=64)}, block_size=16,
                       progress=False)
    assert rows[0]["router"] == "maxonly" and 0 <= rows[0]["mass_recall"] <= 1


def test_a_new_summary_and_the_scorer_that_reads_it_work_end_to_end(registered):
    @sk.register_summary
    class AbsMax(sk.Summary):
        """Channel-wise max |k| over the block's valid keys."""
        name = "kabsmax"

        def compute(self, tiles, config):
            return torch.where(tiles.valid, tiles.values.abs(), 0.0).amax(2)

    @sk.register_scorer
    class AbsBound(sk.Scorer):
        """|q| . max|k|: a looser upper bound on q.k than Quest's, from one vector per tile."""
        name, reads = "absbound", ("kabsmax",)

        def logits(self, inp, backend, generator):
            per_head = inp.store.summary("kabsmax")[inp.layer][inp.table].float().permute(1, 2, 0)   # [H, D, nb]
            return (inp.q.abs() @ per_head) / inp.q.shape[-1] ** 0.5
    registered += [("summary", "kabsmax"), ("scorer", "absbound")]

    probe = needle(ProbeConfig(length=501, num_kv_heads=2, gqa=2, head_dim=16, seed=5), 0.4)
    cfg = sk.StoreConfig(num_layers=1, num_kv_heads=2, head_dim=16, block_size=16, num_blocks=40,
                         summaries=("kmin", "kmax", "kabsmax"))
    store = sk.BlockStore(cfg)
    seq = probe.write(store)
    child = store.fork(seq)
    store.append(child, torch.randn(1, 3, 2, 16), torch.randn(1, 3, 2, 16))   # copy-on-write of a partial block
    for s in (seq, child):
        k, _ = store.gather(s, 0)
        table = store.block_table(s)
        for j, b in enumerate(table.tolist()):
            rows = k[j * 16:(j + 1) * 16]                                      # valid rows of logical block j
            assert torch.equal(store.summary("kabsmax")[0, b], rows.abs().amax(0))
    assert store.summary_bytes() == 3 * 40 * 2 * 16 * 4
    sel = sk.Router("absbound", token_budget=64).select(probe.q, store, seq, 0)
    out, _ = sk.sparse_attention(probe.q, store, seq, 0, sel.blocks)
    assert torch.isfinite(out).all()
    assert sel.traffic.summary_bytes == seq.num_blocks * 2 * 1 * 16 * 4       # charged one vector per tile
    with pytest.raises(ValueError, match="keeps no 'kmean' summary"):
        sk.Router("mean", token_budget=64).select(probe.q, store, seq, 0)
    with pytest.raises(ValueError, match="summaries must be distinct names"):
        sk.StoreConfig(num_layers=1, num_kv_heads=2, head_dim=16, summaries=("kmin", "nope"))


def test_a_new_selector_works_end_to_end(registered):
    @sk.register_selector
    class Forced(sk.Selector):
        """Only the forced blocks (the sink and the local window)."""
        name = "forced_only"

        def select(self, mass, forced, block_size):
            return forced.expand_as(mass).clone()
    registered.append(("selector", "forced_only"))
    probe = needle(ProbeConfig(length=300, num_kv_heads=2, gqa=2, head_dim=16), 0.5)
    store, seq = sweeps.probe_store(probe, 16)
    sel = sk.Router("minmax", selector=Forced()).select(probe.q, store, seq, 0)
    assert sel.blocks.tolist() == [[0, seq.num_blocks - 1]] * 2
    out, _ = sk.sparse_attention(probe.q, store, seq, 0, sel.blocks)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="exactly one of"):
        sk.Router("minmax", token_budget=64, selector=Forced())


def test_a_new_eviction_policy_works_end_to_end(registered):
    @sk.register_policy
    class DeepestFirst(sk.EvictionPolicy):
        """Evict the blocks furthest down their chains first, regardless of use."""
        name = "deepest_first"

        def key(self, m):
            return (-m.position, m.last_access)
    registered.append(("policy", "deepest_first"))
    trace = workloads.multi_project_qa(projects=4, requests=20, snapshot=256, system=64)
    tight = workloads.simulate(trace, block_size=16, num_blocks=60, policy="deepest_first")
    roomy = workloads.simulate(trace, block_size=16, num_blocks=4096, policy="deepest_first")
    assert tight.evictions > 0 and roomy.evictions == 0
    assert 0 < tight.hit_rate <= roomy.hit_rate
    with pytest.raises(ValueError, match="policy must be one of"):
        sk.PrefixCache(sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=2, block_size=4,
                                                    num_blocks=8)), policy="no_such_policy")


def test_engine_and_router_take_configs_and_keywords_alike():
    """EngineConfig holds a StoreConfig (composed, not copied); the Engine takes both configs' fields as
    keywords, and the store it builds is that StoreConfig with the model's geometry filled in."""
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    cfg = sk.EngineConfig(store=sk.StoreConfig(block_size=8, num_blocks=32, dtype=None), progress=False)
    a = sk.Engine(model, config=cfg)
    b = sk.Engine(model, block_size=8, num_blocks=32, progress=False)
    assert a.config == b.config == sk.EngineConfig.of(block_size=8, num_blocks=32, progress=False)
    c = model.config
    assert a.store.config == cfg.store.for_model(len(c.attn_layers), c.n_kv_heads, c.head_dim, model.dtype)
    assert sk.Engine(model, kv_dtype=torch.bfloat16).store.config.dtype == torch.bfloat16     # the old keyword
    assert sk.Engine(model, summary_dtype="bf16").store.config.summary_dtype == torch.bfloat16  # any store field
    eng_fields = {f.name for f in dataclasses.fields(sk.EngineConfig)}
    assert not eng_fields & {f.name for f in dataclasses.fields(sk.StoreConfig)}              # nothing re-declared
    assert not {"chunk_size", "dense_layers", "progress", "record_selections"} & set(vars(a))  # no shadowing copies
    with pytest.raises(ValueError, match="needs the model's geometry"):
        sk.BlockStore(sk.StoreConfig(block_size=8))
    with pytest.raises(ValueError, match="either config or keyword"):
        sk.Engine(model, config=sk.EngineConfig(), block_size=8)
    with pytest.raises(TypeError, match="unknown argument"):
        sk.Engine(model, blok_size=8)
    r = sk.Router(sk.RouterConfig("mean", token_budget=128))
    assert r.config == sk.Router("mean", token_budget=128).config
    assert sk.Router.from_preset("quest").config.scorer == "minmax"


@pytest.mark.parametrize("n,budget,bs", [(1000, 128, 16), (4096, 512, 64), (777, 64, 32)])
def test_the_byte_model_equals_a_real_routed_step(n, budget, bs):
    """`routed_traffic` (the formula the notebooks plot) equals what a Router's selection and sparse
    attention report for the same step, on an odd context with a partial last block."""
    from sparsekv.core.traffic import routed_traffic
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=2, head_dim=16, block_size=bs,
                                         num_blocks=-(-n // bs) + 1))
    seq = store.new_sequence()
    g = torch.Generator().manual_seed(n)
    store.append(seq, torch.randn(1, n, 2, 16, generator=g), torch.randn(1, n, 2, 16, generator=g))
    q = torch.randn(6, 16, generator=g)
    sel = sk.Router("minmax", token_budget=budget).select(q, store, seq, 0)
    _, res = sk.sparse_attention(q, store, seq, 0, sel.blocks)
    measured = res.traffic + sel.traffic
    model = routed_traffic(n, budget, 2, bs, 16, 4, 6, summary_vectors=2)
    assert measured == model
