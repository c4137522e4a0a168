"""A decode plan: one step of one sequence, validated and laid out once (FlashInfer's plan/run split).

    plan = plan_decode(store, seq, num_q_heads)   # once per step, after the step's K/V slot is reserved
    sel = plan.route(router, layer, q)            # per layer: the router, without re-validation
    out, res = plan.sparse(layer, q, sel.blocks)  # per layer: sparse attention over a router's selection
    out = plan.dense(layer, q)                    # per layer: dense attention, in place

`plan_decode` checks the store, the sequence and the query-head count once, and builds the
block table, the physical runs and the dense byte count once. Per layer nothing is re-checked:
q [Hq, D] has the model's shape, and a selection from `Router` is sorted, unique and in range
by construction. The host reads left per layer are those the algorithm needs (the selection's
width, and its size for the byte count). Use the checked entry points (`dense_attention`,
`sparse_attention`, `Router.select`) for anything else.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.checks import check_int
from ..core.traffic import INDEX_BYTES, StepTraffic, attention_traffic, dense_traffic
from ..routing.router import Router, Selection
from ..storage.store import BlockStore, Sequence
from ..core.backend import cpp_available
from .decode import IMPLEMENTATIONS, AttentionResult


@dataclass
class DecodePlan:
    """One decode step of `seq`: what every layer shares.

    Invariants:
    1. Built after the step's token is reserved, so `num_tokens` includes it, and valid until the
       sequence next changes (the next step builds a new plan).
    2. `table` and `runs` are the store's cached block table and physical runs of `seq`.
    """

    store: BlockStore
    seq: Sequence
    num_q_heads: int
    num_tokens: int
    table: torch.Tensor                   # [nb] physical block ids in logical order
    dense_bytes: StepTraffic              # what one dense layer reads this step (byte model)
    backend: str = "torch"                # "cpp" (the fused CPU kernel) or "torch", chosen once per step

    def dense(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Exact attention over every cached token, in place: [Hq, D]."""
        return IMPLEMENTATIONS[self.backend]["dense"](q, self.store, self.seq, layer)[0]

    def route(self, router: Router, layer: int, q: torch.Tensor) -> Selection:
        return router.select_planned(q, self.store, self.seq, layer, self.table)

    def sparse(self, layer: int, q: torch.Tensor, blocks: torch.Tensor) -> tuple[torch.Tensor, AttentionResult]:
        """Attention over a router's selection `blocks` [H, K]: output [Hq, D] and what it read."""
        out, lse = IMPLEMENTATIONS[self.backend]["sparse"](q, self.store, self.seq, layer, blocks)
        c = self.store.config
        traffic = attention_traffic(blocks, self.num_tokens, c.block_size, c.head_dim, c.itemsize, self.num_q_heads)
        picked = traffic.index_bytes // (2 * INDEX_BYTES)               # tiles read (counted once, above)
        return out, AttentionResult(lse, picked, traffic)


def plan_decode(store: BlockStore, seq: Sequence, num_q_heads: int, backend: str = "auto") -> DecodePlan:
    """Validate one decode step of `seq` and lay it out (see the module docstring)."""
    if not isinstance(store, BlockStore):
        raise TypeError(f"store must be a BlockStore, got {type(store).__name__}")
    store.check_seq(seq)
    c = store.config
    check_int("num_q_heads", num_q_heads, lo=c.num_kv_heads)
    if num_q_heads % c.num_kv_heads:
        raise ValueError(f"num_q_heads must be a multiple of num_kv_heads={c.num_kv_heads}, got {num_q_heads}")
    if seq.num_tokens == 0:
        raise ValueError("seq holds no tokens; reserve the step's slot before planning it")
    if backend not in ("auto", "torch", "cpp"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'cpp' for a decode plan, got {backend!r}")
    if backend == "auto":
        backend = "cpp" if c.device.type == "cpu" and not store.quantized and cpp_available() else "torch"
    store.physical_runs(seq)                 # built once here, cached for every layer's dense path
    return DecodePlan(store, seq, num_q_heads, seq.num_tokens, store.block_table(seq),
                      dense_traffic(seq.num_tokens, c.num_kv_heads, c.block_size, c.head_dim, c.itemsize, num_q_heads),
                      backend)
