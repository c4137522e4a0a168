"""Route the decode attention of a Hugging Face Llama-family model through a sparsekv `Router`.

    import sparsekv, sparsekv.recall.hf
    reg = sparsekv.recall.hf.register(router=sparsekv.Router("minmax", token_budget=2048), block_size=64)
    model = AutoModelForCausalLM.from_pretrained(local_path, attn_implementation=reg.name)
    reg.steps                                  # per routed call: layer, blocks read, K/V bytes

The configuration lives in the `Registration` object that `register` returns (one per name),
not in a module global: two registrations under different names route independently.

This measures quality, not speed. The HF KV cache is not paged, so at every decode step the
keys and values of each layer are copied into a temporary `BlockStore` (a block view), routed
and attended there. Prefill (more than one query token) and the first `dense_layers` layers use
SDPA unchanged. With a router that selects every block, the model's outputs equal its own
attention's to float rounding (tested on tiny random Llama configs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..attention.decode import sparse_attention
from ..attention.plan import step_traffic
from ..routing.router import Router
from ..storage.store import BlockStore, StoreConfig


@dataclass
class Registration:
    """One registered attention implementation: its name, its routing, and what it has read."""

    name: str
    router: Router | None                 # None: SDPA everywhere (a dense reference)
    block_size: int = 64                  # tokens per block of the temporary store
    dense_layers: int = 0                 # leading layers left on SDPA
    steps: list = field(default_factory=list)   # per routed call: layer, blocks per kv head, K/V and routing bytes

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        return _attention(self, module, query, key, value, attention_mask, scaling, dropout, **kwargs)


def register(router: Router | None = None, block_size: int = 64, dense_layers: int = 0,
             name: str = "sparsekv") -> Registration:
    """Register (or re-register) an attention implementation under `name`; returns its `Registration`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    if router is not None and not isinstance(router, Router):
        raise TypeError(f"router must be a sparsekv.Router or None, got {type(router).__name__}")
    reg = Registration(name, router, block_size, dense_layers)
    AttentionInterface.register(name, reg)
    AttentionMaskInterface.register(name, sdpa_mask)
    return reg


def _attention(reg: Registration, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: query [B, Hq, T, D], key/value [B, H, S, D] -> ([B, T, Hq, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    router = reg.router
    layer = getattr(module, "layer_idx", 0)
    if query.shape[2] != 1 or router is None or layer < reg.dense_layers:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool and not bool(attention_mask.all()):
        raise NotImplementedError("sparsekv.recall.hf routes unpadded batches only (the attention mask hides keys)")
    B, Hq, _, D = query.shape
    H, S = key.shape[1], key.shape[2]
    bs = reg.block_size
    q = query[:, :, 0]
    if scaling is not None and abs(scaling - 1 / math.sqrt(D)) > 1e-12:
        q = q * (scaling * math.sqrt(D))                       # sparse_attention applies 1/sqrt(D)
    outs = []
    for b in range(B):
        store = BlockStore(StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs,
                                       num_blocks=-(-S // bs), dtype=key.dtype, device=key.device, repr_keys=4))
        seq = store.new_sequence()
        store.append(seq, key[b].transpose(0, 1)[None].contiguous(), value[b].transpose(0, 1)[None].contiguous())
        sel = router.select(q[b], store, seq, 0)
        out, _ = sparse_attention(q[b], store, seq, 0, sel.blocks)
        t = step_traffic(store, seq, Hq, sel.blocks, sel)           # the decode plan's own count
        reg.steps.append({"layer": layer, "blocks": sel.num_selected.tolist(), "kv_bytes": t.kv_bytes,
                          "route_bytes": t.meta_bytes})
        outs.append(out)
    return torch.stack(outs)[:, None].to(query.dtype), None
