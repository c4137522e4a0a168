"""A compact decoder (Llama family, and Gemma 3) whose attention reads and writes only through a `BlockStore`.

RMSNorm, rotary embeddings (HF's rotate-half convention, with "default" and "llama3"
frequency rules), GQA attention with optional q/k/v bias (Qwen2), and a SwiGLU MLP. Module
names follow Hugging Face's (`layers.{i}.self_attn.q_proj`, `mlp.gate_proj`, ...), so a
checkpoint's tensors load by name after dropping the `model.` prefix.

Gemma 3 is the same decoder with five switches, each a `ModelConfig` field read from the checkpoint's config:
`block="sandwich"` (norms before and after both attention and the MLP), `norm_offset=1` (RMSNorm scales by 1 + w,
in float32), `qk_norm` (an RMSNorm over each head's q and k, before the rotation), `hidden_act="gelu_tanh"` (GeGLU)
and `embed_scale` (embeddings times sqrt(dim)); its attention layers are sliding-window or global (`windows`, one
entry per layer: 0 global, w a window of w tokens, a query at i seeing keys j with 0 <= i - j < w), each with its
own rotary base (`rope_theta_local` for the sliding ones).

The model does not own a cache. `forward(tokens, positions, res, attend)` writes each
layer's K/V into the slots of `res` (a `Reservation` from `store.reserve`) and calls
`attend(layer, q, k, v)` for attention (k, v: the chunk's own K/V as computed, before the store's
rounding); the engine decides whether that is chunked prefill, dense decode or routed sparse decode.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.checks import check_int
from ..storage.store import BlockStore, Reservation

ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}   # the gated MLP's


@dataclass
class ModelConfig:
    """The decoder's shape and switches (a family's switches: `families`).

    Invariants, checked at construction (`__post_init__`):
    1. head_dim is resolved: after construction it is the per-head width every module reads (>= 1). Given as 0 it is
       dim // n_heads, which needs n_heads to divide dim; given > 0 it is kept (Gemma 3 270M: dim 640, 4 heads of 256).
    2. A resolved head_dim is a field like the others: `replace(config, n_heads=...)` keeps it (a trained model's
       heads do not change width with a preset); pass head_dim=0 to derive it again.
    3. With rotary positions head_dim is even (rotate-half pairs channel i with i + head_dim / 2).
    4. n_kv_heads >= 1 divides n_heads (GQA).
    """

    vocab_size: int = 4096
    dim: int = 512                  # residual width
    n_layers: int = 4
    n_heads: int = 8                # query heads
    n_kv_heads: int = 2             # kv heads (GQA); n_heads is a multiple of it
    head_dim: int = 0               # per-head width; 0: dim // n_heads, resolved at construction (invariant 1)
    intermediate_size: int = 1408   # SwiGLU hidden width
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None   # None (default rule) or HF's {"rope_type": "llama3", ...}
    attention_bias: bool = False    # q/k/v projection bias (Qwen2)
    tie_embeddings: bool = False    # lm_head shares the embedding matrix
    max_seq_len: int = 131072       # rotary table length
    positions: str = "rope"         # "rope" or "none" (NoPE: no positional signal in attention)
    mixers: tuple = ()              # per layer "attn", "conv" (short causal conv) or "linear"; () = all attn
    conv_kernel: int = 3            # taps of the "conv" mixer
    windows: tuple = ()             # per layer 0 (global attention) or w > 0 (sliding window of w tokens); () = all 0
    rope_theta_local: float = 0.0   # rotary base of the sliding-window layers (0: rope_theta)
    block: str = "prenorm"          # "prenorm" (Llama: x + mix(norm x), x + mlp(norm x)) or "sandwich" (Gemma 3:
                                    #   a norm after the mixer and one after the MLP too, before each residual add)
    norm_offset: float = 0.0        # RMSNorm scales by (norm_offset + weight): Gemma's 1 + w
    qk_norm: bool = False           # an RMSNorm over each head's q and k before the rotation (Gemma 3)
    hidden_act: str = "silu"        # the gated MLP's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0        # token embeddings are multiplied by this (Gemma: sqrt(dim))
    attn_scale: float = 0.0         # q.k scale (0: 1/sqrt(head_dim)); Gemma's query_pre_attn_scalar ** -0.5
    name: str = "custom"

    def __post_init__(self):
        # Only `head_dim` is resolved in place (0 -> dim // n_heads; invariants 1 and 2). `mixers` and `windows` keep
        # what was given (() stands for "every layer"), and the per-layer values are the properties `layer_mixers` and
        # `layer_windows`: a field that held a value derived from n_layers would refuse `replace(config, n_layers=...)`.
        check_int("n_heads", self.n_heads, lo=1)
        check_int("n_kv_heads", self.n_kv_heads, lo=1)
        check_int("head_dim", self.head_dim, lo=0)
        if self.head_dim == 0:
            if self.dim % self.n_heads:
                raise ValueError(f"head_dim=0 derives dim // n_heads, which needs n_heads ({self.n_heads}) to divide "
                                 f"dim ({self.dim}); give head_dim")
            self.head_dim = self.dim // self.n_heads
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"head_dim must be even with rotary positions (rotate-half pairs), got {self.head_dim}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        self.mixers = tuple(self.mixers)
        if self.mixers and len(self.mixers) != self.n_layers or not set(self.mixers) <= {"attn", "conv", "linear"}:
            raise ValueError(f"mixers must list n_layers={self.n_layers} of 'attn', 'conv', 'linear'; got {self.mixers}")
        if self.positions not in ("rope", "none"):
            raise ValueError(f"positions must be 'rope' or 'none', got {self.positions!r}")
        self.windows = tuple(int(w) for w in self.windows)
        if self.windows and (len(self.windows) != self.n_layers or min(self.windows) < 0):
            raise ValueError(f"windows must list n_layers={self.n_layers} entries >= 0 (0: global), got {self.windows}")
        if any(w and m != "attn" for w, m in zip(self.layer_windows, self.layer_mixers)):
            raise ValueError("windows: only attention layers can have a sliding window")
        if self.block not in ("prenorm", "sandwich"):
            raise ValueError(f"block must be 'prenorm' or 'sandwich', got {self.block!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(ACTIVATIONS)}, got {self.hidden_act!r}")

    @property
    def layer_mixers(self) -> tuple[str, ...]:
        """The mixer of each model layer: `mixers`, or every layer "attn" when it is ()."""
        return self.mixers or ("attn",) * self.n_layers

    @property
    def layer_windows(self) -> tuple[int, ...]:
        """The window of each model layer (0: global): `windows`, or every layer 0 when it is ()."""
        return self.windows or (0,) * self.n_layers

    @property
    def attn_layers(self) -> list[int]:
        """Model layers whose K/V live in the block store (in store-layer order)."""
        return [i for i, m in enumerate(self.layer_mixers) if m == "attn"]

    @property
    def store_windows(self) -> tuple[int, ...]:
        """The window of each store layer (0: global), in store-layer order."""
        return tuple(self.layer_windows[i] for i in self.attn_layers)

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"name must be one of {sorted(PRESETS)}, got {name!r}")
        return replace(PRESETS[name], **overrides)

    def as_dict(self) -> dict:
        """The fields with the per-layer lists written out (what a saved config.json holds): `ModelConfig(**d)`
        builds the same model."""
        return {**asdict(self), "mixers": self.layer_mixers, "windows": self.layer_windows}


PRESETS: dict[str, ModelConfig] = {
    # Tests: a few milliseconds a step.
    "tiny": ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=128,
                        max_seq_len=4096, name="tiny"),
    # Timing on a 2-core CPU: ~15M parameters, so long-context attention is visible against the weights.
    "cpu-timing": ModelConfig(vocab_size=4096, dim=512, n_layers=4, n_heads=8, n_kv_heads=2, intermediate_size=1408,
                              max_seq_len=131072, name="cpu-timing"),
    # Recall models (trained by `python -m sparsekv train`): a short causal conv, then attention
    # with no positions (NoPE), as in Zoology's MQAR recipe; the linear baseline swaps attention
    # for causal linear attention at the same width and depth.
    "recall": ModelConfig(vocab_size=1024, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=256,
                          positions="none", mixers=("conv", "attn"), max_seq_len=65536, name="recall"),
    "recall-linear": ModelConfig(vocab_size=1024, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=256,
                                 positions="none", mixers=("conv", "linear"), max_seq_len=65536, name="recall-linear"),
    # Multi-hop: two attention layers (one lookup each), 64-dim heads (2 query heads share 1 kv head).
    "recall-hops": ModelConfig(vocab_size=1024, dim=128, n_layers=3, n_heads=2, n_kv_heads=1, intermediate_size=256,
                               positions="none", mixers=("conv", "attn", "attn"), max_seq_len=65536,
                               name="recall-hops"),
    # The shape of Llama-3.2-1B (for loading and for traffic models; too slow to prefill long prompts here).
    "llama-1b": ModelConfig(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, intermediate_size=8192,
                            rope_theta=500000.0, tie_embeddings=True, name="llama-1b",
                            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def rope_frequencies(cfg: ModelConfig, theta: float | None = None) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] (float32) for base `theta` (default cfg.rope_theta), with HF's llama3 rule
    when configured. Computed in float32 exactly as transformers computes them: an inverse frequency one ulp away
    turns position p's angle by about p ulp, which at 3,000 tokens moves Gemma 3's logits by 3e-4."""
    d = cfg.head_dim
    inv = 1.0 / ((theta or cfg.rope_theta) ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
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
    """x [..., T, heads, D]; cos/sin [T, D]. HF's rotate-half convention."""
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


class RMSNorm(nn.Module):
    """x / rms(x) * w (Llama), or, with `offset`, x / rms(x) * (offset + w) computed in float32 (Gemma's 1 + w)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.ones(dim) if not offset else torch.zeros(dim))

    def forward(self, x):
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (normed * (self.offset + self.weight.float())).to(x.dtype)
        return normed.to(x.dtype) * self.weight


def _add_projections(mod: nn.Module, cfg: ModelConfig) -> None:
    """q/k/v/o projections with HF's names (shared by softmax and linear attention)."""
    D = cfg.head_dim
    mod.q_proj = nn.Linear(cfg.dim, cfg.n_heads * D, bias=cfg.attention_bias)
    mod.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * D, bias=cfg.attention_bias)
    mod.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * D, bias=cfg.attention_bias)
    mod.o_proj = nn.Linear(cfg.n_heads * D, cfg.dim, bias=False)


@dataclass
class StepContext:
    """What a mixer's store-backed `step` sees besides its input (one forward of one sequence)."""

    cos: torch.Tensor                 # [T, D] rotary tables of the chunk's positions
    sin: torch.Tensor
    store: BlockStore | None = None
    res: Reservation | None = None    # the chunk's reserved slots
    attend: Callable | None = None    # attend(store layer, q, k, v) -> [T, Hq, D]; k, v the chunk's own [T, H, D]
    store_layer: int = -1             # this attention layer's index in the store


class Mixer(nn.Module):
    """A token mixer behind one interface, registered in `MIXERS` by `kind`:

        initial_state(dtype)   per-sequence recurrent state (None for attention: the store holds it)
        step(h, state, ctx)    -> (y, new state): the store-backed forward of a chunk h [T, dim]
        batch(h, cos, sin)     -> y: the cache-free forward of h [B, T, dim], for training
    """

    kind = ""

    def initial_state(self, dtype: torch.dtype):
        return None


class Attention(Mixer):
    kind = "attn"

    def __init__(self, cfg: ModelConfig, window: int = 0):
        super().__init__()
        self.cfg, self.window = cfg, window
        _add_projections(self, cfg)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, cfg.norm_offset)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, cfg.norm_offset)
        # the kernels scale q.k by 1/sqrt(D); another scale (Gemma's query_pre_attn_scalar) is folded into q
        D = cfg.head_dim
        self.q_gain = cfg.attn_scale * math.sqrt(D) if cfg.attn_scale and abs(cfg.attn_scale * math.sqrt(D) - 1) > 1e-12 else None
        self.qkv_proj = None        # q, k and v in one projection (the gguf weights mode fuses them: `model.quant`)
        self._sizes = (cfg.n_heads * D, cfg.n_kv_heads * D, cfg.n_kv_heads * D)

    def qkv(self, x, cos, sin):
        """x [..., T, dim] -> q [..., T, Hq, D], k and v [..., T, H, D], rotary applied to q and k (after their norms)."""
        c, D = self.cfg, self.cfg.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split(self._sizes, -1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k = q.unflatten(-1, (c.n_heads, D)), k.unflatten(-1, (c.n_kv_heads, D))
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.q_gain is not None:
            q = q * self.q_gain
        return q, k, v.unflatten(-1, (c.n_kv_heads, D))

    def step(self, x, state, ctx: StepContext):
        T = x.shape[0]
        q, k, v = self.qkv(x, ctx.cos, ctx.sin)                                   # [T, Hq, D], [T, H, D]
        dt = ctx.store.config.dtype
        # Decode (T == 1) skips the finiteness read-back: the K/V are this model's own projections.
        ctx.store.write(ctx.res, ctx.store_layer, k.to(dt), v.to(dt), check_finite=T > 1)
        o = ctx.attend(ctx.store_layer, q, k, v)                                  # [T, Hq, D]
        return self.o_proj(o.reshape(T, -1).to(x.dtype)), state

    def batch(self, x, cos, sin):
        B, T = x.shape[:2]
        q, k, v = self.qkv(x, cos, sin)                                           # [B, T, heads, D]
        if self.window:                                                           # 0 <= i - j < window
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            mask = (j <= i) & (i - j < self.window)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               attn_mask=mask, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """down(act(gate x) * up x): SwiGLU with silu, GeGLU with tanh GELU (the activation bound once)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_up_proj = None    # gate and up in one projection (the gguf weights mode fuses them: `model.quant`)

    def forward(self, x):
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, -1)
            return self.down_proj(self.act(gate) * up)
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class ShortConv(Mixer):
    """A short causal convolution mixer: out_proj(conv_k(in_proj(h))), depthwise over time.

    conv_k: y_t = sum_j w_j * u_{t-j} + b over the last `kernel` inputs. The projections let the
    shifted copy of a token land in its own subspace, apart from the residual stream; without
    them "the previous token was k" and "this token is k" share channels, which slows recall
    training (measured). The conv starts as a previous-token shift (the induction prior).
    Decode state: the last kernel - 1 projected inputs ([kernel - 1, dim]), zeros at the start.
    """

    kind = "conv"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.kernel = cfg.conv_kernel
        self.in_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.conv = nn.Conv1d(cfg.dim, cfg.dim, cfg.conv_kernel, groups=cfg.dim)
        self.out_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        with torch.no_grad():
            w = 0.02 * torch.randn_like(self.conv.weight)
            w[:, 0, -2] += 1.0           # taps are [.., u_{t-1}, u_t]: start as a shift by one
            self.conv.weight.copy_(w)
            self.conv.bias.zero_()

    def initial_state(self, dtype):
        return torch.zeros(self.kernel - 1, self.cfg.dim, dtype=dtype)

    def step(self, x, state, ctx):
        return self.forward_state(x, state)

    def batch(self, x, cos=None, sin=None):
        return self.forward_batch(x)

    def forward_batch(self, x):                                # x [B, T, dim]
        u = self.in_proj(x).transpose(1, 2)
        y = F.conv1d(F.pad(u, (self.kernel - 1, 0)), self.conv.weight, self.conv.bias, groups=u.shape[1])
        return self.out_proj(y.transpose(1, 2))

    def forward_state(self, x, state):                          # x [T, dim]; state [kernel - 1, dim]
        full = torch.cat([state, self.in_proj(x)])             # [kernel - 1 + T, dim]
        y = F.conv1d(full.T[None], self.conv.weight, self.conv.bias, groups=full.shape[-1])[0].T
        return self.out_proj(y), full[-(self.kernel - 1):].clone()


class LinearAttention(Mixer):
    """Causal linear attention (phi = elu + 1): a fixed-size state instead of a growing cache.

    y_t = phi(q_t) S_t / (phi(q_t) . z_t), with S_t = sum_{s<=t} phi(k_s) v_s^T and z_t = sum phi(k_s).
    Decode state per query head (the kv heads' phi(k) and v are repeated over each GQA group first,
    so the group's heads share k and v but keep their own running sums): S [Hq, D, D] and z [Hq, D].
    Same projections as `Attention`.
    """

    kind = "linear"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        _add_projections(self, cfg)

    def initial_state(self, dtype):
        c = self.cfg
        return (torch.zeros(c.n_heads, c.head_dim, c.head_dim, dtype=dtype),
                torch.zeros(c.n_heads, c.head_dim, dtype=dtype))

    def step(self, x, state, ctx):
        return self.forward_state(x, state)

    def batch(self, x, cos=None, sin=None):
        return self.forward_batch(x)

    def _qkv(self, x):                                         # x [..., T, dim]
        c, D = self.cfg, self.cfg.head_dim
        G = c.n_heads // c.n_kv_heads
        q = F.elu(self.q_proj(x).unflatten(-1, (c.n_heads, D))) + 1
        k = F.elu(self.k_proj(x).unflatten(-1, (c.n_kv_heads, D))) + 1
        v = self.v_proj(x).unflatten(-1, (c.n_kv_heads, D))
        return q, k.repeat_interleave(G, -2), v.repeat_interleave(G, -2)

    def forward_batch(self, x):                                # quadratic causal form, [B, T, dim]
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x))    # [B, H, T, D]
        a = (q @ k.transpose(-1, -2)).tril()                   # [B, H, T, T]
        y = (a @ v) / a.sum(-1, keepdim=True).clamp_min(1e-6)
        return self.o_proj(y.transpose(1, 2).flatten(-2))

    def forward_state(self, x, state):                          # x [T, dim]; state (S, z)
        q, k, v = self._qkv(x)                                 # [T, Hq, D]
        S, z = state
        ys = []
        for t in range(x.shape[0]):                            # recurrent form
            S = S + k[t, :, :, None] * v[t, :, None, :]
            z = z + k[t]
            ys.append((q[t, :, None, :] @ S)[:, 0] / (q[t] * z).sum(-1, keepdim=True).clamp_min(1e-6))
        return self.o_proj(torch.stack(ys).flatten(-2)), (S, z)


MIXERS: dict[str, type[Mixer]] = {cls.kind: cls for cls in (Attention, ShortConv, LinearAttention)}


class DecoderLayer(nn.Module):
    """One block, its mixer and its norm layout bound here, once:

        prenorm    h = x + mix(input_layernorm x);  out = h + mlp(post_attention_layernorm h)          (Llama)
        sandwich   h = x + post_attention_layernorm(mix(input_layernorm x));
                   out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm h))             (Gemma 3)

    The mixer comes from `MIXERS` (its attribute keeps HF's name for attention, `self_attn`, so checkpoints load by
    name; HF's names also give `post_attention_layernorm` its two meanings above)."""

    ATTR = {"attn": "self_attn", "conv": "conv", "linear": "linear_attn"}

    def __init__(self, cfg: ModelConfig, mixer: str = "attn", window: int = 0):
        super().__init__()
        self.mixer, self.window, self.sandwich = mixer, window, cfg.block == "sandwich"
        norm = lambda: RMSNorm(cfg.dim, cfg.norm_eps, cfg.norm_offset)
        self.input_layernorm = norm()
        setattr(self, self.ATTR.get(mixer, mixer), MIXERS[mixer](cfg, window) if mixer == "attn" else MIXERS[mixer](cfg))
        self.post_attention_layernorm = norm()
        self.mlp = MLP(cfg)
        if self.sandwich:
            self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    @property
    def mix(self) -> Mixer:
        return getattr(self, self.ATTR.get(self.mixer, self.mixer))

    def residual(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The block's output from its input x and its mixer's output y (of input_layernorm x)."""
        if self.sandwich:
            h = x + self.post_attention_layernorm(y)
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        h = x + y
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    """Random-weight (or loaded) decoder. See the module docstring for the cache contract.

    prefill_dtype: the dtype a prefill chunk's attention runs in (the Engine casts its queries, and with them the
    keys and values it reads, to it); float32 but in the gguf weights mode's bfloat16 prefill (`quant.set_prefill`).
    """

    prefill_dtype = torch.float32

    def __init__(self, config: ModelConfig, seed: int | None = 0):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = c = config
        if seed is not None:
            torch.manual_seed(seed)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(DecoderLayer(c, m, w) for m, w in zip(c.layer_mixers, c.layer_windows))
        self.store_layer = {layer: j for j, layer in enumerate(c.attn_layers)}   # model layer -> store layer
        self.norm = RMSNorm(c.dim, c.norm_eps, c.norm_offset)
        self.lm_head = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # Init: torch's defaults (Linear ~ U(+-1/sqrt(fan_in)), Embedding ~ N(0, 1)). A GPT-style
        # N(0, 0.02) makes q.k nearly zero at this width, so attention starts uniform, query/key
        # gradients nearly cancel, and recall training sits on its plateau (measured: q/k gradients
        # 100x smaller than v/o).
        self.register_buffer("inv_freq", rope_frequencies(c), persistent=False)
        self.local_rope = bool(c.rope_theta_local) and any(c.layer_windows)  # the sliding layers' own rotary base
        self.register_buffer("inv_freq_local", rope_frequencies(c, c.rope_theta_local or c.rope_theta),
                             persistent=False)
        self.eval()

    def reset_buffers(self) -> None:
        """Recompute the buffers no checkpoint holds (the rotary frequencies), in place: after `to_empty`, a model
        built on the meta device (`checkpoint.load_model`) has storage but no values there."""
        c = self.config
        self.inv_freq = rope_frequencies(c).to(self.inv_freq.device)
        self.inv_freq_local = rope_frequencies(c, c.rope_theta_local or c.rope_theta).to(self.inv_freq.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype          # the final norm is a float module in every weights mode

    def rotary(self, positions: torch.Tensor, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, D] of `positions` [T]; `local`: the sliding-window layers' base."""
        if self.config.positions == "none":                                        # NoPE: rotation by 0
            shape = (positions.shape[0], self.config.head_dim)
            return torch.ones(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype)
        inv = self.inv_freq_local if local and self.local_rope else self.inv_freq
        freqs = positions.float()[:, None] * inv[None, :]                            # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _rotaries(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, its (cos, sin) of `positions` (each base computed once)."""
        glob = self.rotary(positions)
        loc = self.rotary(positions, local=True) if self.local_rope else glob
        return [loc if layer.window else glob for layer in self.layers]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        if self.config.embed_scale != 1.0:
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        return x

    def initial_state(self) -> dict:
        """Recurrent state of the non-attention mixers for a new sequence (conv taps, linear S/z)."""
        return {i: st for i, layer in enumerate(self.layers)
                if (st := layer.mix.initial_state(self.dtype)) is not None}

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, store: BlockStore, res: Reservation,
                attend: Callable[..., torch.Tensor], last_only: bool = True,
                state: dict | None = None, head: bool = True) -> torch.Tensor | None:
        """tokens, positions: [T] int64. Returns logits [T, vocab] (or [1, vocab] if last_only), float32; None
        when `head` is False (the K/V and mixer state are written as always, the output head is skipped).

        Attention layers write K/V to store layer `store_layer[i]` and call attend(store layer, q, k, v);
        conv and linear layers read and update `state` (from `initial_state`) in place.
        """
        x = self.embed(tokens)
        rot = self._rotaries(positions)
        ctx = StepContext(*rot[0], store, res, attend)
        for i, layer in enumerate(self.layers):
            ctx.store_layer = self.store_layer.get(i, -1)
            ctx.cos, ctx.sin = rot[i]
            y, new = layer.mix.step(layer.input_layernorm(x), state.get(i) if state else None, ctx)
            if new is not None:
                state[i] = new
            x = layer.residual(x, y)
        if not head:
            return None
        if last_only:
            x = x[-1:]
        return self.lm_head(self.norm(x)).float()

    @torch.inference_mode()
    def forward_decode_batch(self, tokens: torch.Tensor, positions: torch.Tensor, store: BlockStore,
                             reservations: list[Reservation],
                             attend: Callable[..., torch.Tensor], head: bool = True) -> torch.Tensor | None:
        """One decode token for each of B sequences in one pass: tokens, positions [B] int64 (row b is sequence b's
        next token at its own position), `reservations[b]` its slot. Returns logits [B, vocab] float32, or None
        when `head` is False (every layer's K/V written as always, the output head skipped: on Gemma 3 270M its
        262,144 x 640 matrix is most of a decode step's multiply-adds).

        The projections and MLPs run once over the B rows (their weights are read once per step); each attention
        layer writes row b's K/V through reservations[b] and calls attend(store layer, q [B, Hq, D], k, v [B, H, D])
        -> [B, Hq, D].
        All-attention models only (conv and linear mixers keep per-sequence state: decode those one at a time).
        """
        if any(kind != "attn" for kind in self.config.layer_mixers):
            raise ValueError(f"batched decode needs an all-attention model; this one's mixers are {self.config.layer_mixers}")
        B = tokens.shape[0]
        if positions.shape != (B,) or len(reservations) != B:
            raise ValueError(f"tokens, positions and reservations must each have B={B} entries, got "
                             f"{tuple(positions.shape)} and {len(reservations)}")
        x = self.embed(tokens)                                                       # [B, dim]
        rot = self._rotaries(positions)                                              # [B, D]: one position per row
        dt = store.config.dtype
        for i, layer in enumerate(self.layers):
            mix, sl = layer.mix, self.store_layer[i]
            q, k, v = mix.qkv(layer.input_layernorm(x), *rot[i])                     # [B, Hq, D], [B, H, D]
            for b, res in enumerate(reservations):
                store.write(res, sl, k[b:b + 1].to(dt), v[b:b + 1].to(dt), check_finite=False)
            o = attend(sl, q, k, v)                                                  # [B, Hq, D]
            x = layer.residual(x, mix.o_proj(o.reshape(B, -1).to(x.dtype)))
        return self.lm_head(self.norm(x)).float() if head else None

    def train_forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Batched full-sequence forward without a cache, for training: tokens [B, T] -> logits [B, T, vocab].

        Same weights and maths as the store-backed `forward` (tests check they agree).
        """
        B, T = tokens.shape
        x = self.embed(tokens)
        rot = self._rotaries(torch.arange(T))
        for layer, (cos, sin) in zip(self.layers, rot):
            x = layer.residual(x, layer.mix.batch(layer.input_layernorm(x), cos, sin))
        return self.lm_head(self.norm(x))
