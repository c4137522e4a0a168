"""Route the decode attention of a Hugging Face Llama-family model through a sparsekv `Router`.

    import sparsekv, sparsekv.hf
    sparsekv.hf.register(router=sparsekv.Router("minmax", token_budget=2048), block_size=64)
    model = AutoModelForCausalLM.from_pretrained(local_path, attn_implementation="sparsekv")

This measures quality, not speed. The HF KV cache is not paged, so at every decode step the
keys and values of each layer are copied into a temporary `BlockStore` (a block view), routed
and attended there. Prefill (more than one query token) and the first `dense_layers` layers use
SDPA unchanged. With a router that selects every block, the model's outputs equal its own
attention's to float rounding (tested on tiny random Llama configs).
"""
from __future__ import annotations

import math

import torch

from .attention import sparse_attention
from .routing import Router
from .store import BlockStore, StoreConfig

_STATE = {"router": None, "block_size": 64, "dense_layers": 0, "steps": []}


def register(router: Router | None = None, block_size: int = 64, dense_layers: int = 0, name: str = "sparsekv") -> str:
    """Register (or reconfigure) the "sparsekv" attention implementation; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    if router is not None and not isinstance(router, Router):
        raise TypeError(f"router must be a sparsekv.Router or None, got {type(router).__name__}")
    _STATE.update(router=router, block_size=block_size, dense_layers=dense_layers, steps=[])
    AttentionInterface.register(name, sparsekv_attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def steps() -> list[dict]:
    """Per routed decode call: layer, blocks read per kv head, and K/V bytes read."""
    return _STATE["steps"]


def sparsekv_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: query [B, Hq, T, D], key/value [B, H, S, D] -> ([B, T, Hq, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    router = _STATE["router"]
    layer = getattr(module, "layer_idx", 0)
    if query.shape[2] != 1 or router is None or layer < _STATE["dense_layers"]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool and not bool(attention_mask.all()):
        raise NotImplementedError("sparsekv.hf routes unpadded batches only (the attention mask hides keys)")
    B, Hq, _, D = query.shape
    H, S = key.shape[1], key.shape[2]
    bs = _STATE["block_size"]
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
        out, res = sparse_attention(q[b], store, seq, 0, sel.blocks)
        _STATE["steps"].append({"layer": layer, "blocks": sel.num_selected.tolist(), "kv_bytes": res.kv_bytes})
        outs.append(out)
    return torch.stack(outs)[:, None].to(query.dtype), None
