"""sparsekv: lossless paged GQA KV blocks, with query-aware block-sparse routing on top.

Storage (the `BlockStore`) and compute routing (the `Router`) are decoupled: blocks stay
exact and shareable, and each decode step reads only the blocks its router selects.
Importing this package has no side effects and needs no GPU.
"""
from .attention import (AttentionResult, all_blocks, batch_attention, block_attention_mass, dense_attention, prefill_attention,
                        sparse_attention)
from .block_pool import BlockPool, StoreFullError
from .store import BlockStore, Reservation, Sequence, StoreConfig
from .routing import ROUTERS, Router, Selection
from .model import Model, ModelConfig
from .checkpoint import load_model, load_tokenizer
from .engine import Engine, RequestStats
from .prefix_cache import PrefixCache, PrefixMatch
from .traffic import StepTraffic
from . import metrics, probes

__all__ = [
    "StoreConfig", "BlockStore", "Sequence", "Reservation", "StoreFullError", "BlockPool",
    "dense_attention", "sparse_attention", "batch_attention", "prefill_attention", "all_blocks", "AttentionResult",
    "block_attention_mass", "StepTraffic", "Router", "Selection", "ROUTERS", "metrics", "probes",
    "Model", "ModelConfig", "load_model", "load_tokenizer", "Engine", "RequestStats", "PrefixCache", "PrefixMatch",
]
