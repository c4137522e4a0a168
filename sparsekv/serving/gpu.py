"""A roofline cost model for GPU-scale questions the CPU cannot answer (simulated, and labelled so).

Decode is bandwidth-bound: a step reads the weights once and each sequence's K/V (all of it dense, the
routed tokens when routed). Prefill is compute-bound: 2 FLOPs per parameter per token, plus attention's
4 * layers * query heads * head dim FLOPs per (query, key) pair. The device figures are the vendor's
published peaks, scaled by stated efficiencies (`bw_eff`, `flop_eff`); nothing here was measured on a GPU.

    cost = roofline_cost(model.config, H200)          # a CostModel for SimExecutor
    max_batch(model.config, H200, context=131072)      # sequences whose K/V fit beside the weights
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model.model import ModelConfig
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


def param_count(cfg: ModelConfig) -> int:
    """Weights of a Llama-family decoder: embeddings (and an untied head), attention and SwiGLU MLP per layer."""
    D, Hq, H = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    attn = cfg.dim * Hq * D * 2 + cfg.dim * H * D * 2
    mlp = 3 * cfg.dim * cfg.intermediate_size
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim
    return cfg.vocab_size * cfg.dim + head + cfg.n_layers * (attn + mlp + 2 * cfg.dim) + cfg.dim


def kv_bytes_per_token(cfg: ModelConfig, kv_bytes: int = 2) -> int:
    return 2 * len(cfg.attn_layers) * cfg.n_kv_heads * cfg.head_dim * kv_bytes


def roofline_cost(cfg: ModelConfig, dev: Device = H200, weight_bytes: int = 2, kv_bytes: int = 2,
                  bw_eff: float = 0.8, flop_eff: float = 0.6, step_overhead_s: float = 20e-6) -> CostModel:
    """A `CostModel` from the roofline: decode = overhead + (weights + K/V read) / bandwidth, prefill = FLOPs / peak."""
    bw, fl = dev.bandwidth * bw_eff, dev.flops * flop_eff
    P = param_count(cfg)
    attn_pair = 4 * len(cfg.attn_layers) * cfg.n_heads * cfg.head_dim
    return CostModel(p=(step_overhead_s, 2 * P / fl, attn_pair / fl),
                     d=(step_overhead_s + P * weight_bytes / bw, 0.0, kv_bytes_per_token(cfg, kv_bytes) / bw),
                     source=f"roofline on {dev.name} ({bw_eff:.0%} of bandwidth, {flop_eff:.0%} of FLOPs): {dev.source}")


def max_batch(cfg: ModelConfig, dev: Device, context: int, hot_fraction: float = 1.0, weight_bytes: int = 2,
              kv_bytes: int = 2) -> int:
    """Sequences of `context` tokens whose K/V fit in HBM beside the weights, when a `hot_fraction` of each
    sequence's K/V must be in HBM (1: all of it; a routed store with a cold tier keeps only what it reads hot)."""
    free = dev.hbm_bytes - param_count(cfg) * weight_bytes
    per = max(1.0, context * hot_fraction) * kv_bytes_per_token(cfg, kv_bytes)
    return int(free // per)
