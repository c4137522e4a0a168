"""What a block selection costs: lost attention mass, missed blocks, output error, bytes.

Every function takes a selection `blocks` [H, K] (logical ids, -1 padded) as produced by
`Router.select(...).blocks`; query heads h map to kv head h // G.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..attention.decode import all_blocks, sparse_attention
from ..attention.plan import step_traffic
from ..routing.mass import block_attention_mass
from ..storage.store import BlockStore, Sequence


def selected_mask(blocks: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[H, K] padded ids -> [H, num_blocks] bool."""
    mask = torch.zeros(blocks.shape[0], num_blocks + 1, dtype=torch.bool)
    mask.scatter_(1, torch.where(blocks < 0, num_blocks, blocks), True)
    return mask[:, :num_blocks]


def attention_mass_recall(mass: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Fraction of each query head's true attention mass inside its kv head's selection.

    mass: [Hq, nb] true block mass (rows sum to 1), from `block_attention_mass`. Returns [Hq].
    """
    Hq, nb = mass.shape
    G = Hq // blocks.shape[0]
    sel = selected_mask(blocks, nb).repeat_interleave(G, dim=0)
    return (mass * sel).sum(-1)


def oracle_top_k(mass: torch.Tensor, k: int, num_kv_heads: int) -> torch.Tensor:
    """The k blocks of highest group-mean true mass per kv head: [H, k]."""
    Hq, nb = mass.shape
    group = mass.view(num_kv_heads, Hq // num_kv_heads, nb).mean(1)
    return group.topk(min(k, nb), dim=-1).indices


def block_recall(blocks: torch.Tensor, reference: torch.Tensor) -> float:
    """Fraction of the reference blocks ([H, k], e.g. the oracle's top-k) that `blocks` selects."""
    nb = int(max(blocks.max(), reference.max())) + 1
    sel = selected_mask(blocks, nb)
    ref = selected_mask(reference, nb)
    return float((sel & ref).sum() / ref.sum())


def needle_recall(blocks: torch.Tensor, needle_blocks: list[int] | torch.Tensor) -> float:
    """Fraction of (kv head, needle block) pairs selected; 1.0 means every head read every needle."""
    needles = torch.as_tensor(needle_blocks, dtype=torch.long)
    nb = int(max(int(blocks.max()), int(needles.max()))) + 1
    sel = selected_mask(blocks, nb)
    return float(sel[:, needles].float().mean())


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over all heads (Frobenius), computed in float64."""
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


@dataclass(frozen=True)
class RouteEval:
    """One router on one decode step, measured against dense."""

    mass_recall: float        # mean over query heads of attention mass inside the selection
    min_mass_recall: float    # the worst query head
    block_recall: float       # fraction of the oracle's top-K blocks selected (same K per head)
    needle_recall: float      # fraction of needle blocks selected (nan if no needles given)
    rel_error: float          # ||sparse - dense|| / ||dense||
    blocks_read: float        # mean selected blocks per kv head
    kv_bytes: int             # K/V bytes the attention read
    route_bytes: int          # everything read that is not K/V: summaries and indices (StepTraffic.meta_bytes)
    dense_kv_bytes: int       # K/V bytes dense decode reads

    @property
    def bytes_ratio(self) -> float:
        """(KV + routing bytes) over dense KV bytes: the fraction of dense traffic paid."""
        return (self.kv_bytes + self.route_bytes) / self.dense_kv_bytes

    def as_dict(self) -> dict:
        return {**asdict(self), "bytes_ratio": self.bytes_ratio}


def evaluate(router, q: torch.Tensor, store: BlockStore, seq: Sequence, layer: int,
             needle_blocks=None, mass: torch.Tensor | None = None, dense: torch.Tensor | None = None) -> RouteEval:
    """Route q, attend over the selection, and measure it against dense and the oracle.

    `mass` ([Hq, nb]) and `dense` ([Hq, D]) may be passed in when evaluating many routers on
    the same query, to compute them once.
    """
    c = store.config
    sel = router.select(q, store, seq, layer)
    out, res = sparse_attention(q, store, seq, layer, sel.blocks)
    if mass is None:
        mass = block_attention_mass(q, store, seq, layer)
    if dense is None:
        dense, _ = sparse_attention(q, store, seq, layer, all_blocks(store, seq))
    recall = attention_mass_recall(mass, sel.blocks)
    k = int(sel.num_selected.max())
    routed = step_traffic(store, seq, q.shape[0], sel.blocks, sel)           # the decode plan's own count
    dense_bytes = step_traffic(store, seq, q.shape[0])
    return RouteEval(
        mass_recall=float(recall.mean()), min_mass_recall=float(recall.min()),
        block_recall=block_recall(sel.blocks, oracle_top_k(mass, k, c.num_kv_heads)),
        needle_recall=needle_recall(sel.blocks, needle_blocks) if needle_blocks is not None else float("nan"),
        rel_error=relative_error(out, dense), blocks_read=float(sel.num_selected.float().mean()),
        kv_bytes=routed.kv_bytes, route_bytes=routed.meta_bytes, dense_kv_bytes=dense_bytes.kv_bytes,
    )
