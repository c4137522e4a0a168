"""sparsekv: lossless paged GQA KV blocks, with query-aware block-sparse routing on top.

Storage (the `BlockStore`) and compute routing (the `Router`) are decoupled: blocks stay
exact and shareable, and each decode step reads only the blocks its router selects.
Importing this package has no side effects and needs no GPU.

The data path reads one way, each layer importing only those below it:

    core -> storage -> routing -> attention -> model -> analysis, recall -> serving -> studies -> suite
    (kernels/ is installed as sparsekv.kernels, below attention and routing)
analysis/ holds instruments (metrics, probes, prompts, observation, statistics, corpus, workloads, peers, sweeps);
studies/ holds one module per notebook, built from them.

Every public name keeps its place at the top level (sparsekv.BlockStore, sparsekv.Router, ...).
"""
from .analysis import metrics, probes
from .attention.decode import (
                               AttentionResult,
                               all_blocks,
                               batch_attention,
                               dense_attention,
                               prefill_attention,
                               sparse_attention,
)
from .core.traffic import StepTraffic
from .model.checkpoint import load_model, load_tokenizer
from .model.engine import Engine, EngineConfig, RequestStats
from .model.model import Model, ModelConfig
from .routing.hierarchy import hierarchical
from .routing.mass import block_attention_mass
from .routing.router import ROUTERS, Router, RouterConfig, Selection
from .routing.scorers import SCORERS, Scorer, register_scorer
from .routing.selectors import SELECTORS, Selector, register_selector
from .storage.block_pool import BlockPool, StoreFullError
from .storage.block_table import BlockTable
from .storage.cold import ColdBlockError
from .storage.eviction import EvictionPolicy, register_policy
from .storage.placement import PLACEMENTS, PlacementPolicy, register_placement
from .storage.prefix_cache import PrefixCache, PrefixMatch
from .storage.store import BlockStore, Reservation, Sequence, StoreConfig
from .storage.summaries import SUMMARIES, Summary, register_summary

__all__ = [
    "StoreConfig", "BlockStore", "BlockTable", "Sequence", "Reservation", "StoreFullError", "BlockPool", "ColdBlockError",
    "PLACEMENTS", "PlacementPolicy", "register_placement",
    "dense_attention", "sparse_attention", "batch_attention", "prefill_attention", "all_blocks", "AttentionResult",
    "block_attention_mass", "hierarchical", "StepTraffic", "Router", "RouterConfig", "Selection", "ROUTERS", "SCORERS", "Scorer",
    "register_scorer", "SELECTORS", "Selector", "register_selector", "EvictionPolicy", "register_policy",
    "SUMMARIES", "Summary", "register_summary",
    "metrics", "probes", "Model", "ModelConfig", "load_model", "load_tokenizer", "Engine", "EngineConfig",
    "RequestStats", "PrefixCache", "PrefixMatch",
]
