"""A roofline cost model for GPU-scale questions the CPU cannot answer (simulated, and labelled so).

Decode is bandwidth-bound: a step reads the weights once and, for each sequence, what its cache must read,
as the one byte model counts it (`core.traffic.cache_bytes`): every K/V row when dense; when routed, the
routed rows *and every block's routing summaries* (a router scores every block, every step, so those
summaries stay in HBM and are read in full). Prefill is compute-bound: 2 FLOPs per parameter per token,
plus attention's 4 * layers * query heads * head dim FLOPs per (query, key) pair. The device figures are
the vendor's published peaks, scaled by stated efficiencies (`bw_eff`, `flop_eff`); nothing here was
measured on a GPU.

    cost = roofline_cost(model.config, H200)                        # a CostModel for SimExecutor (dense decode)
    decode_step_s(model.config, H200, batch=64, context=1 << 20, budget=2048)   # one routed step, summaries in
    max_batch(model.config, H200, context=131072)                   # sequences whose dense cache fits
    max_batch(model.config, H200, context=131072, budget=2048, tiered=True)   # routed, a cold tier for the rest
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.traffic import CacheBytes, cache_bytes, hybrid_cache_bytes
from ..model.model import ModelConfig
from ..routing.scorers import SCORERS
from .executors import CostModel


@dataclass(frozen=True)
class Device:
    name: str
    hbm_bytes: float           # memory for weights and K/V
    bandwidth: float           # bytes/s, peak
    flops: float               # FLOP/s, dense BF16 peak
    source: str


H200 = Device("H200 SXM", 141e9, 4.8e12, 989.5e12,
              "NVIDIA H200 SXM datasheet (published): 141 GB HBM3e, 4.8 TB/s, 989.5 TFLOP/s dense BF16")


@dataclass(frozen=True)
class CacheLayout:
    """How a projected sequence's cache is laid out: bf16 K/V in blocks, and the router that reads it.

    The store keeps the summaries its router reads (a deployment keeps only those): `scorer`'s vectors per
    (block, kv head) are held for every block, and a routed step reads all of them. A dense step reads none.
    """

    block_size: int = 16                        # tokens per block
    kv_itemsize: int = 2                        # bf16 K/V
    summary_itemsize: int = 2                   # bf16 summaries
    scorer: str = "minmax"                      # the router's scorer (SCORERS): kmin + kmax, 2 vectors per tile
    keep_all: bool = False                      # a hybrid model's sliding layers keep every block (a cache without a
                                                #   hybrid allocator); False: only what their window reaches

    def summary_vectors(self, head_dim: int) -> int:
        """head_dim vectors the scorer reads (and the store holds) per (block, kv head)."""
        from ..storage.store import StoreConfig  # a config to ask the summaries registry; no tensors
        return SCORERS[self.scorer]().vectors(StoreConfig(num_layers=1, num_kv_heads=1, head_dim=head_dim,
                                                          block_size=self.block_size, num_blocks=1))


def param_count(cfg: ModelConfig) -> int:
    """Weights of a Llama-family or Gemma 3 decoder: embeddings (and an untied head), attention and a gated MLP per
    layer, and the norms (two per layer, or four with Gemma's sandwich norms, plus its q and k norms)."""
    D, Hq, H = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    attn = cfg.dim * Hq * D * 2 + cfg.dim * H * D * 2
    mlp = 3 * cfg.dim * cfg.intermediate_size
    norms = (4 if cfg.block == "sandwich" else 2) * cfg.dim + (2 * D if cfg.qk_norm else 0)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim
    return cfg.vocab_size * cfg.dim + head + cfg.n_layers * (attn + mlp + norms) + cfg.dim


def kv_bytes_per_token(cfg: ModelConfig, kv_bytes: int = 2) -> int:
    return 2 * len(cfg.attn_layers) * cfg.n_kv_heads * cfg.head_dim * kv_bytes


def sequence_cache(cfg: ModelConfig, context: int, budget: int | None = None,
                   layout: CacheLayout = CacheLayout()) -> CacheBytes:
    """One sequence's cache at `context` tokens: bytes held (K/V and summaries) and bytes one decode step reads
    (all K/V when `budget` is None; else the routed rows plus the scorer's summaries of every block)."""
    vectors = layout.summary_vectors(cfg.head_dim)
    common = dict(kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, tokens=context, itemsize=layout.kv_itemsize,
                  block_size=layout.block_size, budget=budget, summaries_held=vectors,
                  summaries_read=0 if budget is None else vectors, summary_itemsize=layout.summary_itemsize)
    if any(cfg.store_windows):       # a hybrid model: only global layers hold everything and are routed
        return hybrid_cache_bytes(cfg.store_windows, keep_all=layout.keep_all, **common)
    return cache_bytes("lossless", layers=len(cfg.attn_layers), **common)


def summary_bytes(cfg: ModelConfig, context: int, layout: CacheLayout = CacheLayout()) -> int:
    """The summaries of a sequence of `context` tokens: what the store holds of them, and a routed step reads."""
    global_layers = sum(1 for w in cfg.store_windows if w == 0)
    return global_layers * cfg.n_kv_heads * -(-context // layout.block_size) * layout.summary_vectors(cfg.head_dim) \
        * cfg.head_dim * layout.summary_itemsize


def decode_step_s(cfg: ModelConfig, dev: Device, batch: int, context: int, budget: int | None = None,
                  layout: CacheLayout = CacheLayout(), weight_bytes: int = 2, bw_eff: float = 0.8,
                  step_overhead_s: float = 20e-6) -> float:
    """One decode step of `batch` sequences of `context` tokens: overhead + (weights + each sequence's read) / bw."""
    read = sequence_cache(cfg, context, budget, layout).read
    return step_overhead_s + (param_count(cfg) * weight_bytes + batch * read) / (dev.bandwidth * bw_eff)


def roofline_cost(cfg: ModelConfig, dev: Device = H200, weight_bytes: int = 2, kv_bytes: int = 2,
                  bw_eff: float = 0.8, flop_eff: float = 0.6, step_overhead_s: float = 20e-6) -> CostModel:
    """A `CostModel` from the roofline for the scheduler's simulator: decode = overhead + (weights + K/V read) /
    bandwidth, prefill = FLOPs / peak. Its decode is dense-only (a linear cost in the tokens read): routed
    steps at scale are projected by `decode_step_s`, which also charges the summaries."""
    bw, fl = dev.bandwidth * bw_eff, dev.flops * flop_eff
    P = param_count(cfg)
    attn_pair = 4 * len(cfg.attn_layers) * cfg.n_heads * cfg.head_dim
    return CostModel(p=(step_overhead_s, 2 * P / fl, attn_pair / fl),
                     d=(step_overhead_s + P * weight_bytes / bw, 0.0, kv_bytes_per_token(cfg, kv_bytes) / bw),
                     source=f"roofline on {dev.name} ({bw_eff:.0%} of bandwidth, {flop_eff:.0%} of FLOPs): {dev.source}")


def max_batch(cfg: ModelConfig, dev: Device, context: int, budget: int | None = None, tiered: bool = False,
              layout: CacheLayout = CacheLayout(), weight_bytes: int = 2) -> int:
    """Sequences of `context` tokens whose caches fit in HBM beside the weights.

    Without a cold tier each sequence holds its whole cache (K/V and summaries). With `tiered` (a routed store
    whose cold tier keeps the blocks a step does not read) it holds in HBM the K/V of the blocks one routed step
    reads (the budget's blocks plus the local one) and the summaries of *every* block, which routing reads each
    step.
    """
    free = dev.hbm_bytes - param_count(cfg) * weight_bytes
    held = sequence_cache(cfg, context, None, layout).held
    if tiered:
        if budget is None:
            raise ValueError("tiered needs a routing budget: a dense step reads every block, so all of it is hot")
        hot_tokens = min(context, max(2, budget // layout.block_size) * layout.block_size)
        hot = sequence_cache(cfg, hot_tokens, None, layout).held - summary_bytes(cfg, hot_tokens, layout)
        held = hot + summary_bytes(cfg, context, layout)
    return int(free // held)
