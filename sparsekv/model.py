"""A compact Llama-family decoder whose attention reads and writes only through a `BlockStore`.

RMSNorm, rotary embeddings (HF's rotate-half convention, with "default" and "llama3"
frequency rules), GQA attention with optional q/k/v bias (Qwen2), and a SwiGLU MLP. Module
names follow Hugging Face's (`layers.{i}.self_attn.q_proj`, `mlp.gate_proj`, ...), so a
checkpoint's tensors load by name after dropping the `model.` prefix.

The model does not own a cache. `forward(tokens, positions, res, attend)` writes each
layer's K/V into the slots of `res` (a `Reservation` from `store.reserve`) and calls
`attend(layer, q)` for attention; the engine decides whether that is chunked prefill,
dense decode or routed sparse decode.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .store import BlockStore, Reservation


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    dim: int = 512                  # residual width
    n_layers: int = 4
    n_heads: int = 8                # query heads
    n_kv_heads: int = 2             # kv heads (GQA); n_heads is a multiple of it
    head_dim: int = 0               # 0: dim // n_heads
    intermediate_size: int = 1408   # SwiGLU hidden width
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None   # None (default rule) or HF's {"rope_type": "llama3", ...}
    attention_bias: bool = False    # q/k/v projection bias (Qwen2)
    tie_embeddings: bool = False    # lm_head shares the embedding matrix
    max_seq_len: int = 131072       # rotary table length
    name: str = "custom"

    def __post_init__(self):
        if self.head_dim == 0:
            self.head_dim = self.dim // self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"name must be one of {sorted(PRESETS)}, got {name!r}")
        return replace(PRESETS[name], **overrides)

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelConfig] = {
    # Tests: a few milliseconds a step.
    "tiny": ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=128,
                        max_seq_len=4096, name="tiny"),
    # Timing on a 2-core CPU: ~15M parameters, so long-context attention is visible against the weights.
    "cpu-timing": ModelConfig(vocab_size=4096, dim=512, n_layers=4, n_heads=8, n_kv_heads=2, intermediate_size=1408,
                              max_seq_len=131072, name="cpu-timing"),
    # The shape of Llama-3.2-1B (for loading and for traffic models; too slow to prefill long prompts here).
    "llama-1b": ModelConfig(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, intermediate_size=8192,
                            rope_theta=500000.0, tie_embeddings=True, name="llama-1b",
                            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] (float32), with HF's llama3 rule when configured."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(medium, smoothed, scaled)
    elif kind != "default":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (default, llama3)")
    return inv.float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, D]. HF's rotate-half convention."""
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        D = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * D, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * D, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * D, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.n_heads * D, cfg.dim, bias=False)

    def forward(self, x, cos, sin, layer: int, store: BlockStore, res: Reservation, attend):
        T, D = x.shape[0], self.cfg.head_dim
        q = apply_rope(self.q_proj(x).view(T, self.cfg.n_heads, D), cos, sin)      # [T, Hq, D]
        k = apply_rope(self.k_proj(x).view(T, self.cfg.n_kv_heads, D), cos, sin)   # [T, H, D]
        v = self.v_proj(x).view(T, self.cfg.n_kv_heads, D)
        store.write(res, layer, k.to(store.config.dtype), v.to(store.config.dtype))
        o = attend(layer, q)                                                       # [T, Hq, D]
        return self.o_proj(o.reshape(T, -1).to(x.dtype))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)


class Model(nn.Module):
    """Random-weight (or loaded) decoder. See the module docstring for the cache contract."""

    def __init__(self, config: ModelConfig, seed: int | None = 0):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = c = config
        if seed is not None:
            torch.manual_seed(seed)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.lm_head = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        for p in self.parameters():                     # small init keeps random logits well scaled
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        self.register_buffer("inv_freq", rope_frequencies(c), persistent=False)
        self.eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]                  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, store: BlockStore, res: Reservation,
                attend: Callable[[int, torch.Tensor], torch.Tensor], last_only: bool = True) -> torch.Tensor:
        """tokens, positions: [T] int64. Returns logits [T, vocab] (or [1, vocab] if last_only), float32."""
        x = self.embed_tokens(tokens)
        cos, sin = self.rotary(positions)
        for i, layer in enumerate(self.layers):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, i, store, res, attend)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if last_only:
            x = x[-1:]
        return self.lm_head(self.norm(x)).float()
