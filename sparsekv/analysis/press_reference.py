"""Float64 references for what a kvpress press keeps, and which prefill positions a compressed cache holds.

The peers (`analysis.peers`) run kvpress itself; this module is the plain reference a test or a diagnosis checks
them against, written from the algorithm, not from kvpress's code (nothing here imports kvpress).

SnapKV (Li et al. 2024; kvpress's `SnapKVPress`), for one layer of a prefill of T tokens, window w, kernel k:

    h                                           # (T, d_model) the layer's attention input (after its norm)
    q = RoPE(h[T-w:] W_q, positions T-w..T-1)   # (H, w, D)  the window's queries
    K = RoPE(h W_k, positions 0..T-1)           # (KV, T, D) every key, each repeated over its GQA group of H / KV
    a = softmax(q K^T / sqrt(D), causal)        # (H, w, T)
    s = mean over the window of a[..., :T-w]    # (H, T-w)   the window itself is not scored
    s = avg_pool1d(s, k, padding k // 2, stride 1)   # smoothing (SnapKV's default pooling is the average)
    s = mean over each GQA group                # (KV, T-w)
    s = s ++ (w copies of max(s) + 1)           # (KV, T)    the window always stays
    kept = topk(s, int(T * (1 - ratio)))        # per kv head

A question-aware prefill (the document and the question together) puts the question's tokens in the window.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _rope64(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x (..., T, D) rotated at `positions` (T,), rotate-half layout (Llama's), in float64."""
    dim = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)       # (D/2,)
    ang = positions.to(torch.float64)[:, None] * inv[None]                            # (T, D/2)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()      # (T, D)
    half = dim // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def rope_theta(config) -> float:
    """The base of a model's plain RoPE; a scaled or per-layer-type RoPE (Gemma 3's) is refused."""
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default" or "rope_theta" not in params:
        raise ValueError(f"the reference knows plain RoPE only, got rope_parameters {params!r}")
    return float(params["rope_theta"])


@torch.no_grad()
def snapkv_scores(attn, hidden: torch.Tensor, config, window: int = 64, kernel: int = 5) -> torch.Tensor:
    """SnapKV's scores (KV, T) float64 for one Llama-like attention layer (`q_proj`, `k_proj`, no QK norm), from its
    input `hidden` (1, T, d_model) of a prefill at positions 0..T-1; the window's w positions score above all others.
    `kept = scores.topk(n_kept).indices` is what SnapKV keeps (see the module docstring)."""
    if hidden.dim() != 3 or hidden.shape[0] != 1:
        raise ValueError(f"hidden must be (1, T, d_model), got {tuple(hidden.shape)}")
    T = hidden.shape[1]
    if T <= window:
        raise ValueError(f"the prefill ({T} tokens) must be longer than the window ({window})")
    H, KV, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    theta, h, pos = rope_theta(config), hidden[0].to(torch.float64), torch.arange(T)
    q = (h[-window:] @ attn.q_proj.weight.to(torch.float64).T).view(window, H, D).transpose(0, 1)   # (H, w, D)
    k = (h @ attn.k_proj.weight.to(torch.float64).T).view(T, KV, D).transpose(0, 1)                 # (KV, T, D)
    q, k = _rope64(q, pos[-window:], theta), _rope64(k, pos, theta)
    logits = q @ k.repeat_interleave(H // KV, 0).transpose(1, 2) / math.sqrt(D)                     # (H, w, T)
    future = torch.ones(window, T, dtype=torch.bool).triu(T - window + 1)        # query i sits at T - w + i
    a = logits.masked_fill(future, float("-inf")).softmax(-1)[..., :T - window]                     # (H, w, T-w)
    s = F.avg_pool1d(a.mean(1)[None], kernel, padding=kernel // 2, stride=1)[0]                    # (H, T-w)
    s = s.view(KV, H // KV, T - window).mean(1)                                                     # (KV, T-w)
    return F.pad(s, (0, window), value=s.max().item() + 1)


def kept_mask(dense, cache) -> torch.Tensor:
    """(layers, kv heads, T) bool: which prefill positions of `dense` (a DynamicCache of T tokens) each layer and kv
    head of `cache` still holds, found by the key rows themselves (a press gathers rows, it never changes them).
    Raises if `cache` holds a key row `dense` does not (it was not compressed from `dense`)."""
    if len(dense.layers) != len(cache.layers):
        raise ValueError(f"the caches have {len(dense.layers)} and {len(cache.layers)} layers")
    L, (B, KV, T, _) = len(dense.layers), dense.layers[0].keys.shape
    if B != 1:
        raise ValueError(f"one sequence only, got a batch of {B}")
    out = torch.zeros(L, KV, T, dtype=torch.bool)
    for i, (dl, cl) in enumerate(zip(dense.layers, cache.layers)):
        for j in range(KV):
            where = {row.numpy().tobytes(): p for p, row in enumerate(dl.keys[0, j])}
            for row in cl.keys[0, j]:
                p = where.get(row.numpy().tobytes())
                if p is None:
                    raise ValueError(f"layer {i} head {j} holds a key row the dense cache does not")
                out[i, j, p] = True
    return out


__all__ = ["snapkv_scores", "kept_mask", "rope_theta"]
