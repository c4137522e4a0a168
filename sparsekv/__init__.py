"""sparsekv: lossless paged GQA KV blocks, with query-aware block-sparse routing on top.

Storage (the `BlockStore`) and compute routing (the `Router`) are decoupled: blocks stay
exact and shareable, and each decode step reads only the blocks its router selects.
Importing this package has no side effects, needs no GPU and imports no submodule until a name is used.

The data path reads one way, each layer importing only those below it:

    the runtime:  kernels -> core -> storage -> routing -> attention -> model -> serving
    research:     analysis, recall, methods -> suite -> studies
    (kernels/ is installed as sparsekv.kernels; the runtime never imports the research side)
analysis/ holds instruments (metrics, probes, prompts, observation, statistics, corpus, workloads, peers, sweeps);
suite/ the machinery that knows no study (runner, sweep, checks, explorers, figures' style); studies/ each study's
run, report and findings, built from them.

Every public name keeps its place at the top level (sparsekv.BlockStore, sparsekv.Router, ...).
"""

# Each public name -> the module that defines it, imported on first use (PEP 562): `import sparsekv`
# alone imports nothing heavy (not even torch), so light tools (the suite's report, the sweep's command line) start fast.
_LAZY = {
    "metrics": ".analysis.metrics", "probes": ".analysis.probes", "AttentionResult": ".attention.decode",
    "all_blocks": ".attention.decode", "batch_attention": ".attention.decode",
    "dense_attention": ".attention.decode", "prefill_attention": ".attention.decode",
    "sparse_attention": ".attention.decode", "StepTraffic": ".core.traffic", "load_model": ".model.checkpoint",
    "load_tokenizer": ".model.checkpoint", "Engine": ".model.engine", "EngineConfig": ".model.engine",
    "RequestStats": ".model.engine", "Model": ".model.model", "ModelConfig": ".model.model",
    "hierarchical": ".routing.hierarchy", "block_attention_mass": ".routing.mass", "ROUTERS": ".routing.router",
    "Router": ".routing.router", "RouterConfig": ".routing.router", "Selection": ".routing.router",
    "SCORERS": ".routing.scorers", "Scorer": ".routing.scorers", "register_scorer": ".routing.scorers",
    "SELECTORS": ".routing.selectors", "Selector": ".routing.selectors", "register_selector": ".routing.selectors",
    "BlockPool": ".storage.block_pool", "StoreFullError": ".storage.block_pool",
    "BlockTable": ".storage.block_table", "ColdBlockError": ".storage.cold", "EvictionPolicy": ".storage.eviction",
    "register_policy": ".storage.eviction", "PLACEMENTS": ".storage.placement",
    "PlacementPolicy": ".storage.placement", "register_placement": ".storage.placement",
    "PrefixCache": ".storage.prefix_cache", "PrefixMatch": ".storage.prefix_cache", "BlockStore": ".storage.store",
    "Reservation": ".storage.store", "Sequence": ".storage.store", "StoreConfig": ".storage.store",
    "SUMMARIES": ".storage.summaries", "Summary": ".storage.summaries", "register_summary": ".storage.summaries",
}
__all__ = [*_LAZY]          # every public name, in one place: the table above


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparsekv' has no attribute {name!r}")
    import importlib
    mod = importlib.import_module(module, __name__)
    value = mod if module.endswith("." + name) else getattr(mod, name)        # a submodule, or a name in one
    globals()[name] = value              # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
