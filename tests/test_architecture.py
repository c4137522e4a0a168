"""The package's shape: layers that import only downwards, no import cycles, strategies bound through registries,
configs that compose, and a decode step that validates once.

Layers, bottom to top (a module imports only its own layer's siblings in the same subpackage, and layers strictly
below; each subpackage's docstring states its number):

    the runtime   0 kernels < 1 core < 2 storage < 3 routing < 4 attention < 5 model < 6 serving
    research      7 analysis, recall, methods (the instruments and what a study compares; siblings that do not
                  import each other)
                  < 8 suite (machinery that knows no study: the runner, sweep, checks, regression, explorers, viz)
                  < 9 studies (each study's run, report and findings, as a module or a folder; the findings page)

The runtime never imports the research side, at module level or inside a function.
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
LAYER = {"kernels": 0, "core": 1, "storage": 2, "routing": 3, "attention": 4, "model": 5, "serving": 6,
         "analysis": 7, "recall": 7, "methods": 7, "suite": 8, "studies": 9}
RUNTIME = {name for name, layer in LAYER.items() if layer <= LAYER["serving"]}
RESEARCH = set(LAYER) - RUNTIME


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


KERNELS = pathlib.Path(__import__("sparsekv.kernels").kernels.__file__).parent      # installed as sparsekv.kernels


def _is_module(target: pathlib.Path) -> bool:
    return target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()


def _top_level_names(init: pathlib.Path) -> set[str]:
    """The names a package's __init__ binds at its top level (and the keys of a lazy `_LAZY` table)."""
    if not init.is_file():
        return set()
    out = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets) and isinstance(node.value, ast.Dict):
                out |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return out


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PKG)) for p in MODULES])
def test_every_relative_import_names_a_module_that_is_there(path):
    """`from .x import y` names a module x that exists, and `from . import x` a module x or a name the package's
    __init__ defines, at module level or inside a function: a module moved away leaves no import that fails only
    when its function runs (suite.runner's `from . import findings`, reached only at the end of a full run, did
    when the findings page moved to the studies; the layer test cannot see it, since it stays in one subpackage)."""
    own = path.relative_to(PKG).parts
    package = list(own[:-1])
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        parts = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
        # kernels/ sits beside the package and is installed as sparsekv.kernels
        base = KERNELS.joinpath(*parts[1:]) if parts[:1] == ["kernels"] else PKG.joinpath(*parts)
        if node.module:
            if not _is_module(base):
                missing.append("." * node.level + node.module)
            continue
        defined = _top_level_names(base / "__init__.py")
        for a in node.names:
            if not _is_module(base / a.name) and a.name not in defined:
                missing.append("." * node.level + " import " + a.name)
    assert not missing, f"{path.relative_to(PKG)} imports what is not there: {missing}"


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



def test_the_runtime_never_imports_the_research_side():
    """No module of kernels, core, storage, routing, attention, model or serving imports analysis, recall, studies
    or suite, at module level or inside a function (serving.trace imported analysis.workloads' Trace until the
    trace types moved to serving; analysis.workloads re-exports them)."""
    graph = import_graph()
    arrows = sorted((a, b) for a, targets in graph.items() for b in targets
                    if subpackage(a) in RUNTIME and subpackage(b) in RESEARCH)
    # the research side is there to be imported from
    assert any(subpackage(b) in RUNTIME for a, targets in graph.items() for b in targets if subpackage(a) in RESEARCH)
    # and nothing points the other way
    assert not arrows, f"runtime modules import the research side: {arrows}"
    # the trace types live in serving, and analysis.workloads still names them
    from sparsekv.serving import trace
    assert workloads.Trace is trace.Trace and workloads.Request is trace.Request


@pytest.mark.parametrize("name", sorted(set(LAYER) - {"kernels"}))
def test_each_subpackage_states_its_layer(name):
    """Each subpackage's docstring opens with its layer number, the one this file enforces."""
    doc = ast.get_docstring(ast.parse((PKG / name / "__init__.py").read_text()))
    # "Layer N (...)" as the first words, N from LAYER
    assert doc.startswith(f"Layer {LAYER[name]} "), f"sparsekv.{name}'s docstring opens {doc[:40]!r}"


STUDY_FOLDERS = sorted(p.parent for p in (PKG / "studies").glob("*/__init__.py") if p.parent.name != "findings")


@pytest.mark.parametrize("folder", STUDY_FOLDERS, ids=[p.name for p in STUDY_FOLDERS])
def test_a_study_folder_names_each_of_its_parts(folder):
    """A study is one folder (issue 54): its run, its report and, where it has any, its findings. Its docstring names
    every module in it, so a reader finds each part from the folder's first lines; and the suite below it names no
    study (the layer rule above: suite is layer 8, studies 9)."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    parts = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert "report" in parts, f"studies/{folder.name} has no report module"
    missing = [p for p in parts if f"\n    {p} " not in f"\n{doc}"]
    assert not missing, f"studies/{folder.name}/__init__.py's docstring does not name {missing}"
    assert LAYER["suite"] < LAYER["studies"]


def test_a_new_study_is_one_file(tmp_path):
    """Adding a study (issue 54): tests/toy_study.py holds its run, its report and its findings in one file, on the
    machinery below it. Its imports are a study's (nothing above layer 9, no private name of another subpackage);
    it runs, its metrics are written and gated as a notebook's are, its figure passes the canvas checks, and its
    finding renders through the findings page's loader from that metrics file."""
    import toy_study as ts

    from sparsekv.studies.findings import page
    from sparsekv.suite.report import write_metrics
    tree = ast.parse(pathlib.Path(ts.__file__).read_text())
    used = [(n.module.split(".")[1], [a.name for a in n.names]) for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("sparsekv.")]
    assert used and all(LAYER[sub] <= LAYER["studies"] for sub, _ in used)
    assert not [n for _, names in used for n in names if n.startswith("_")]
    res = ts.run(ts.ToyConfig(docs=4))
    assert {s: v.shape for s, v in res.items()} == {"minmax": (4,), "mean": (4,)}
    m = ts.metrics(res)
    write_metrics(tmp_path / f"{ts.STEM}.metrics.json", ts.STEM, m, ts.checks(res))
    assert ts.figure(res, tmp_path / "toy.png") and (tmp_path / "toy.png").stat().st_size > 0
    (line,) = [f.render(page.load(tmp_path)) for f in ts.FINDINGS]
    assert f"`minmax` keeps {m['recall.minmax']:.2f}" in line and f"`mean` {m['recall.mean']:.2f}" in line



def test_the_window_rule_is_written_once():
    """max(0, i - w + 1), the first key a sliding-window query sees, is `core.window.first_visible`; no other module
    spells it out (it was written eight times, in two forms, before)."""
    import re
    rule = re.compile(r"max\(0,[^)\n]*-\s*(\w+\.)?(w|window)\b")
    spelled = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
               if p.relative_to(PKG).as_posix() != "core/window.py" and rule.search(p.read_text())]
    # the pattern finds the rule where it is written
    assert rule.search((PKG / "core" / "window.py").read_text())
    # and nowhere else
    assert not spelled, f"the window rule is spelled out in {spelled}; call core.window.first_visible"


def test_no_layer_above_storage_asks_which_kind_of_store_it_holds():
    """Outside storage/, no isinstance against a concrete store or prefix-cache class and no hasattr probe on a store
    or a prefix cache: the plan and the fused step use the declared `storage.store.LayerGroups`, and every prefix cache
    has `retain` (there were five isinstance(store, HybridStore) in model/fused.py, hasattr probes in
    attention/plan.py and studies/hybrid.py, and hasattr(self.prefix_cache, "retain") in model/engine.py)."""
    import re
    probe = re.compile(r"isinstance\([\w.]*(store|cache)\w*,\s*\(?\s*(Hybrid\w*|BlockStore|PrefixCache)"
                       r"|hasattr\([\w.]*(store|cache)\w*,")
    found = [f"{p.relative_to(PKG)}: {m.group(0)}" for p in PKG.rglob("*.py") if p.relative_to(PKG).parts[0] != "storage"
             for m in probe.finditer(p.read_text())]
    # the pattern finds such a probe where one is written
    assert probe.search("hybrid = isinstance(self.store, HybridStore)") and probe.search('hasattr(store, "stores")')
    assert probe.search('hasattr(self.prefix_cache, "retain")') and probe.search("isinstance(cache, HybridPrefixCache)")
    # and the package has none
    assert not found, found

# -- the module import graph ----------------------------------------------------------------------

def module_files() -> dict[str, pathlib.Path]:
    """Every module of the package by dotted name (a package by its __init__), kernels/ as sparsekv.kernels."""
    roots = [(PKG, "sparsekv")]
    if not (PKG / "kernels").is_dir() and (PKG.parent / "kernels").is_dir():   # a source checkout
        roots.append((PKG.parent / "kernels", "sparsekv.kernels"))
    out = {}
    for root, prefix in roots:
        for p in root.rglob("*.py"):
            parts = list(p.relative_to(root).with_suffix("").parts)
            out[".".join([prefix, *parts[:-1]] if parts[-1] == "__init__" else [prefix, *parts])] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside a function (every import statement
    in the file). `from a.b import c` points at the module a.b.c when there is one, else at a.b."""
    files = module_files()
    graph = {}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:                       # relative: resolve against the module's package
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                elif node.module and node.module.split(".")[0] == "sparsekv":
                    base = node.module
                else:
                    continue
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.split(".")[0] == "sparsekv"}
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def subpackage(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The modules that import each other, directly or through others: each group of mutually reachable modules."""
    reach = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph.get(m, ())
        reach[start] = seen
    groups = []
    for m in graph:
        if m in reach[m] and not any(m in g for g in groups):
            groups.append({m} | {o for o in reach[m] if m in reach[o]})
    return groups


def test_the_cycle_finder_finds_a_cycle():
    # a <-> b is one group; c, which only imports a, is in none
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]
    # a longer ring is one group too
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [{"a", "b", "c"}]
    # a chain has none
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_package_has_no_import_cycles():
    """No module imports itself through others, even lazily (a function-level import is a cycle waiting for the
    function's first call at import time). There were two: suite.runner <-> suite.sweep (run_notebook moved to
    suite.notebook) and storage.prefix_cache <-> storage.hybrid_cache (make_prefix_cache moved to hybrid_cache)."""
    graph = import_graph()
    # the graph is the package's: modules of every subpackage, and the imports between them
    assert {subpackage(m) for m in graph} >= set(LAYER)
    assert sum(map(len, graph.values())) > 200
    # and no group of modules imports itself
    assert cycles(graph) == []


def test_every_public_name_resolves():
    """`__all__` is the lazy table's keys, and each resolves to the object its module defines (PEP 562)."""
    import importlib
    # the public names are exactly the table's
    assert sk.__all__ == list(sk._LAZY)
    for name in sk.__all__:
        module = importlib.import_module(sk._LAZY[name], "sparsekv")
        expected = module if sk._LAZY[name].endswith("." + name) else getattr(module, name)
        # each name is its module's object (or the module itself, for metrics and probes)
        assert getattr(sk, name) is expected, name

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


# Each preset's per-layer lists as they were before configs kept derived values out of their fields.
PRESET_LAYERS = {"tiny": (("attn",) * 2, (0,) * 2), "cpu-timing": (("attn",) * 4, (0,) * 4),
                 "recall": (("conv", "attn"), (0, 0)), "recall-linear": (("conv", "linear"), (0, 0)),
                 "recall-hops": (("conv", "attn", "attn"), (0, 0, 0)), "llama-1b": (("attn",) * 16, (0,) * 16)}


@pytest.mark.parametrize("name", sorted(PRESET_LAYERS))
def test_a_preset_resized_equals_the_config_built_at_that_size(name):
    """`from_name(name, n_layers=n)` (a `dataclasses.replace` of the preset) composes: the fields hold what was
    given, never values derived from n_layers, so a resized preset is the config built directly at that size."""
    from sparsekv.model.model import PRESETS
    preset, n = PRESETS[name], PRESETS[name].n_layers + 1
    grown = {"mixers": preset.mixers + ("attn",)} if preset.mixers else {}      # an explicit list grows with it
    resized = sk.ModelConfig.from_name(name, n_layers=n, **grown)
    given = {f.name: getattr(preset, f.name) for f in dataclasses.fields(sk.ModelConfig)}
    built = sk.ModelConfig(**{**given, "n_layers": n, **grown})
    # the resized preset is the config built at that size, field for field and in every derived value
    assert resized == built
    for derived in ("layer_mixers", "layer_windows", "attn_layers", "store_windows", "head_dim"):
        assert getattr(resized, derived) == getattr(built, derived)
    # every layer is resized: the preset's mixers plus one attention layer, all global
    mixers, windows = PRESET_LAYERS[name]
    assert resized.layer_mixers == mixers + ("attn",) and resized.layer_windows == windows + (0,)
    # and resizing back gives the preset again
    assert dataclasses.replace(resized, n_layers=preset.n_layers, **({"mixers": mixers} if grown else {})) == preset


@pytest.mark.parametrize("name", sorted(PRESET_LAYERS))
def test_an_unresized_preset_keeps_its_layers_and_its_saved_form(name):
    """The per-layer lists of each preset are those it had when they were stored in the fields, and `as_dict`
    (what `recall.train` saves as config.json) still writes them out in full."""
    c = sk.ModelConfig.from_name(name)
    mixers, windows = PRESET_LAYERS[name]
    # the per-layer mixers and windows, and the store layers they give
    assert c.layer_mixers == mixers and c.layer_windows == windows
    assert c.attn_layers == [i for i, m in enumerate(mixers) if m == "attn"]
    assert c.store_windows == (0,) * len(c.attn_layers)
    # the saved form lists every layer, and loads back to the same model
    d = c.as_dict()
    assert d["mixers"] == mixers and d["windows"] == windows
    again = sk.ModelConfig(**d)
    assert (again.layer_mixers, again.layer_windows, again.head_dim) == (mixers, windows, c.head_dim)


def test_a_saved_recall_config_loads_unchanged():
    """A committed config.json (written by `as_dict` when the fields held the per-layer lists) loads to a config
    whose `as_dict` gives the file's values back."""
    import json
    saved = json.loads((PKG.parent / "data" / "models" / "mqar" / "config.json").read_text())
    # every saved key comes back with its saved value
    again = json.loads(json.dumps(sk.ModelConfig(**saved).as_dict()))
    assert {k: again[k] for k in saved} == saved


def test_a_model_of_a_resized_preset_decodes():
    """The tiny preset at three layers builds and decodes (one more store layer than the preset)."""
    model = sk.Model(sk.ModelConfig.from_name("tiny", n_layers=3))
    eng = sk.Engine(model, block_size=8, num_blocks=32, progress=False)
    seq = eng.new_sequence()
    eng.prefill(seq, torch.arange(1, 20))
    # three layers, each in the store, and a token decoded over them
    assert len(model.layers) == 3 and eng.store.config.num_layers == 3
    assert len(eng.decode(seq, 1)) == 1


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
