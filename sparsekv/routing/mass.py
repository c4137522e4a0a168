"""The true attention mass of each block: what the oracle ranks by and what recall is measured against.

It lives in the routing layer because the `oracle` scorer needs it, and routing never imports
attention; analysis (`metrics`, `study`) and the public API re-export it.
"""
from __future__ import annotations

import math

import torch

from ..storage.store import BlockStore, Sequence, check_decode_query


def block_attention_mass(q: torch.Tensor, store: BlockStore, seq: Sequence, layer: int) -> torch.Tensor:
    """True softmax attention mass of each logical block, per query head: [Hq, num_blocks] float32.

    Computed densely over every token (rows sum to 1). It is what the `oracle` scorer ranks
    by and what attention-mass recall is measured against. Reads all of K: an analysis tool,
    not a decode path.
    """
    check_decode_query(store, q, seq, layer)
    c = store.config
    H, D, bs, N = c.num_kv_heads, c.head_dim, c.block_size, seq.num_tokens
    G = q.shape[0] // H
    k, _ = store.gather(seq, layer)                                       # [N, H, D]
    s = q.float().view(H, G, D) @ k.float().permute(1, 2, 0) / math.sqrt(D)   # [H, G, N]
    p = s.softmax(-1)
    pad = seq.num_blocks * bs - N
    p = torch.nn.functional.pad(p, (0, pad)).view(H, G, seq.num_blocks, bs).sum(-1)
    return p.reshape(H * G, seq.num_blocks)
