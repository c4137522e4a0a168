"""Query-aware block routing: a scorer, a selector and forced blocks, chosen once.

For one decode query, a router decides which logical blocks each kv head reads:

    1. score   every block per query head, from the store's per-block summaries (or, for
               the oracle, from the keys themselves)         -> logits [H, G, nb]
    2. mass    turn logits into a distribution over blocks per query head: softmax over
               blocks (the oracle's logits are log true mass, so this is exact for it)
    3. gqa     "shared": aggregate the G query heads of a kv head into one distribution
               (agg="sum": mean of the softmaxed masses; agg="max": max, renormalised),
               one selection per kv head, as NSA does. "per_head": one selection per query
               head; the kv head must then read the union of its G selections.
    4. select  forced blocks first (the first `sink_blocks` and last `local_blocks`, which
               always include the partial current block), then by mass with one selector:
                 top_k / token_budget  K blocks in all, forced ones included;
                 top_p                 the smallest set whose mass reaches p;
                 threshold             blocks whose mass is within exp(-threshold) of the best
                                       (a margin of `threshold` in logit units);
               `adaptive_mass` makes top_k adaptive: K is a cap, and selection stops early
               once the selected mass reaches `adaptive_mass` (peaked queries read less).

Shapes: H kv heads, G query heads per kv head, Hq = H * G, nb logical blocks, D head dim.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .attention import _check_decode_args, block_attention_mass
from .checks import check_choice, check_int
from .dispatch import BACKENDS as SCORE_BACKENDS, resolve
from .store import BlockStore, Sequence
from .traffic import INDEX_BYTES, StepTraffic



# -- scorers --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScoreInput:
    """What a scorer sees for one decode step of one layer."""

    q: torch.Tensor          # [H, G, D] float32 query, grouped by kv head
    store: BlockStore
    seq: Sequence
    layer: int
    table: torch.Tensor      # [nb] physical block ids in logical order


class Scorer:
    """Base class: `logits(inp, backend)` -> [H, G or 1, nb] float32 block logits.

    backend is "reference", "torch" or "triton"; scorers without a kernel (repr, oracle and
    the query-blind ones) run their torch path under "triton".

    `query_aware` scorers can drive top_p and threshold; `summary_vectors` is how many
    head_dim vectors per (kv head, block) a scorer reads (for traffic accounting).
    """

    name = ""
    query_aware = True
    summary_vectors = 0

    def logits(self, inp: ScoreInput, backend: str, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def score_bytes(self, store: BlockStore, seq: Sequence) -> int:
        c = store.config
        return seq.num_blocks * c.num_kv_heads * self.summary_vectors * c.head_dim * c.itemsize


def _summary_logits(q: torch.Tensor, summary: torch.Tensor, inp: ScoreInput) -> torch.Tensor:
    """q [H, G, D] against a head-major summary [L, NB, H, D]: q . s for the sequence's blocks, [H, G, nb].

    When the sequence holds at least a quarter of the pool, multiply against the whole
    layer's summaries (one contiguous [NB, D] matrix per kv head, no copy) and keep the
    sequence's columns; otherwise gather its blocks' summaries first. Either way nothing of
    size H x nb x D is formed from the pool beyond what a kernel would read.
    """
    per_head = summary[inp.layer].transpose(0, 1)                          # [H, NB, D] view
    if 4 * inp.table.numel() >= per_head.shape[1]:
        return (q @ per_head.float().transpose(1, 2))[:, :, inp.table]
    return q @ per_head[:, inp.table].float().transpose(1, 2)


def _triton_scores(inp: ScoreInput) -> tuple[torch.Tensor, torch.Tensor]:
    """minmax and mean logits [H, G, nb] from the block-scoring kernel (one pass for both)."""
    from .kernels.block_score import block_scores
    H, G, D = inp.q.shape
    s, L = inp.store, inp.layer
    minmax, mean = block_scores(inp.q.reshape(1, H * G, D), s.kmin[L], s.kmax[L], s.kmean[L],
                                inp.table[None], torch.tensor([inp.table.numel()], device=inp.q.device))
    return minmax.view(H, G, -1), mean.view(H, G, -1)


class MinMaxScorer(Scorer):
    """Quest's upper bound on q.k over the block: sum_i max(q_i min_i, q_i max_i).

    Reads the per-block key summaries kmin and kmax (2 vectors per tile). The fast path is
    two matrix products, q+ @ max + q- @ min, so nothing of size H x nb x D is formed
    beyond the summaries themselves.
    """

    name, summary_vectors = "minmax", 2

    def logits(self, inp, backend, generator):
        q = inp.q
        if backend == "triton":
            return _triton_scores(inp)[0]
        if backend == "reference":   # the definition, elementwise: [H, G, D, nb]
            kmin = inp.store.kmin[inp.layer][inp.table].float().permute(1, 2, 0)
            kmax = inp.store.kmax[inp.layer][inp.table].float().permute(1, 2, 0)
            bound = torch.maximum(q[..., None] * kmin[:, None], q[..., None] * kmax[:, None]).sum(2)
        else:
            bound = (_summary_logits(q.clamp(min=0), inp.store.kmax, inp)
                     + _summary_logits(q.clamp(max=0), inp.store.kmin, inp))
        return bound / math.sqrt(q.shape[-1])


class MeanScorer(Scorer):
    """MoBA's q . mean-key. Reads the per-block kmean summary (1 vector per tile)."""

    name, summary_vectors = "mean", 1

    def logits(self, inp, backend, generator):
        if backend == "triton":
            return _triton_scores(inp)[1]
        if backend == "reference":
            kmean = inp.store.kmean[inp.layer][inp.table].float()             # [nb, H, D]
            return torch.einsum("hgd,nhd->hgn", inp.q, kmean) / math.sqrt(inp.q.shape[-1])
        return _summary_logits(inp.q, inp.store.kmean, inp) / math.sqrt(inp.q.shape[-1])


class ReprScorer(Scorer):
    """InfLLM-style: max of q.k over the block's representative keys.

    Reads the store's `krepr` summary: per block and kv head, the `repr_keys` keys farthest
    (L2) from the block mean, chosen at write time (r vectors per tile).
    """

    name = "repr"

    def score_bytes(self, store, seq):
        c = store.config
        return seq.num_blocks * c.num_kv_heads * c.repr_keys * c.head_dim * c.itemsize

    def logits(self, inp, backend, generator):
        c = inp.store.config
        if c.repr_keys == 0:
            raise ValueError("scorer 'repr' needs StoreConfig.repr_keys >= 1, got 0")
        r = inp.store.krepr[inp.layer][inp.table].float()                  # [nb, H, r, D]
        nb, H = r.shape[:2]
        keys = r.permute(1, 0, 2, 3).reshape(H, nb * c.repr_keys, c.head_dim)
        s = (inp.q @ keys.transpose(1, 2)).view(H, inp.q.shape[1], nb, c.repr_keys)
        return s.amax(-1) / math.sqrt(c.head_dim)


class OracleScorer(Scorer):
    """The true softmax attention mass of each block, computed densely from the keys.

    Logits are log(mass), so the block softmax reproduces the mass exactly. It reads all of
    K and is the upper bound every other scorer is compared with.
    """

    name = "oracle"

    def score_bytes(self, store, seq):
        c = store.config
        return seq.num_tokens * c.num_kv_heads * c.head_dim * c.itemsize

    def logits(self, inp, backend, generator):
        H, G, D = inp.q.shape
        mass = block_attention_mass(inp.q.reshape(H * G, D), inp.store, inp.seq, inp.layer)
        return mass.view(H, G, -1).log()


class RecencyScorer(Scorer):
    """Query-blind (StreamingLLM-style with the sinks): later blocks score higher. Reads nothing."""

    name, query_aware = "recency", False

    def logits(self, inp, backend, generator):
        nb = inp.table.numel()
        return torch.arange(nb, dtype=torch.float32).expand(inp.q.shape[0], 1, nb)


class RandomScorer(Scorer):
    """Query-blind: uniform random scores per kv head, from the router's seeded generator."""

    name, query_aware = "random", False

    def logits(self, inp, backend, generator):
        return torch.rand(inp.q.shape[0], 1, inp.table.numel(), generator=generator)


ROUTERS: dict[str, type[Scorer]] = {
    cls.name: cls for cls in (MinMaxScorer, MeanScorer, ReprScorer, OracleScorer, RecencyScorer, RandomScorer)
}


# -- the selection ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Selection:
    """A router's choice for one decode step of one layer.

    blocks       [H, K] int64 logical block ids per kv head, ascending, padded with -1:
                 what `sparse_attention` reads (for gqa="per_head", the union over the group).
    mass         [H, nb] float32 the per-kv-head block distribution the selector ranked by
                 (for gqa="per_head", the group's mean).
    head_blocks  [Hq, K'] int64, only for gqa="per_head": each query head's own selection.
    traffic      bytes read to route: summaries plus one table entry per block.
    """

    blocks: torch.Tensor
    mass: torch.Tensor
    traffic: StepTraffic
    head_blocks: torch.Tensor | None = None

    @property
    def score_bytes(self) -> int:
        return self.traffic.total

    @property
    def num_selected(self) -> torch.Tensor:
        """[H] blocks each kv head reads."""
        return (self.blocks >= 0).sum(1)


class Router:
    """Chooses, per decode step, the blocks each kv head reads (see the module docstring).

    Exactly one selector is set: `top_k`, `token_budget` (converted to
    max(1, token_budget // block_size) blocks), `top_p` or `threshold`. The forced blocks
    count toward a top_k budget, which must therefore be at least sink_blocks + local_blocks.
    """

    def __init__(self, scorer: str = "minmax", top_k: int | None = None, top_p: float | None = None,
                 threshold: float | None = None, sink_blocks: int = 1, local_blocks: int = 1,
                 gqa: str = "shared", token_budget: int | None = None, adaptive_mass: float | None = None,
                 agg: str = "sum", seed: int = 0, backend: str = "auto"):
        check_choice("scorer", scorer, ROUTERS)
        check_choice("gqa", gqa, ("shared", "per_head"))
        check_choice("agg", agg, ("sum", "max"))
        check_choice("backend", backend, SCORE_BACKENDS)
        check_int("sink_blocks", sink_blocks, lo=0)
        check_int("local_blocks", local_blocks, lo=1)
        chosen = [n for n, v in (("top_k", top_k), ("token_budget", token_budget), ("top_p", top_p),
                                 ("threshold", threshold)) if v is not None]
        if len(chosen) != 1:
            raise ValueError(f"set exactly one of top_k, token_budget, top_p, threshold; got {chosen or 'none'}")
        if top_k is not None:
            check_int("top_k", top_k, lo=sink_blocks + local_blocks)
        if token_budget is not None:
            check_int("token_budget", token_budget, lo=1)
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if threshold is not None and not threshold >= 0:
            raise ValueError(f"threshold must be a margin >= 0 (logit units), got {threshold}")
        if adaptive_mass is not None:
            if top_k is None and token_budget is None:
                raise ValueError("adaptive_mass needs top_k or token_budget (it caps K and stops early)")
            if not 0 < adaptive_mass <= 1:
                raise ValueError(f"adaptive_mass must be in (0, 1], got {adaptive_mass}")
        self.scorer = ROUTERS[scorer]()
        if (top_p is not None or threshold is not None or adaptive_mass is not None) and not self.scorer.query_aware:
            raise ValueError(f"scorer {scorer!r} ignores the query; top_p, threshold and adaptive_mass need "
                             f"one of {[n for n, c in ROUTERS.items() if c.query_aware]}")
        self.top_k, self.top_p, self.threshold = top_k, top_p, threshold
        self.token_budget, self.adaptive_mass = token_budget, adaptive_mass
        self.sink_blocks, self.local_blocks, self.gqa, self.agg = sink_blocks, local_blocks, gqa, agg
        self.backend, self.seed = backend, seed
        self.generator = torch.Generator().manual_seed(seed)

    def __repr__(self) -> str:
        sel = {k: v for k, v in (("top_k", self.top_k), ("token_budget", self.token_budget), ("top_p", self.top_p),
                                 ("threshold", self.threshold), ("adaptive_mass", self.adaptive_mass)) if v is not None}
        args = ", ".join(f"{k}={v}" for k, v in sel.items())
        return (f"Router({self.scorer.name!r}, {args}, sink_blocks={self.sink_blocks}, "
                f"local_blocks={self.local_blocks}, gqa={self.gqa!r})")

    def budget_blocks(self, block_size: int) -> int | None:
        """K in blocks for top_k/token_budget routers, else None."""
        if self.token_budget is not None:
            return max(1, self.token_budget // block_size, self.sink_blocks + self.local_blocks)
        return self.top_k

    # -- public ---------------------------------------------------------------------------
    def select(self, q: torch.Tensor, store: BlockStore, seq: Sequence, layer: int,
               backend: str | None = None) -> Selection:
        """Route one decode query q [Hq, D] of `seq` at `layer`."""
        _check_decode_args(q, store, seq, layer)
        backend = resolve(self.backend if backend is None else backend, q)
        c = store.config
        H = c.num_kv_heads
        G = q.shape[0] // H
        inp = ScoreInput(q.float().view(H, G, c.head_dim), store, seq, layer, store.block_table(seq))
        logits = self.scorer.logits(inp, backend, self.generator)
        mass = logits.expand(H, G, -1).softmax(-1)                          # [H, G, nb]
        nb = seq.num_blocks
        forced = self._forced(nb)
        if self.gqa == "shared":
            agg = mass.mean(1) if self.agg == "sum" else mass.amax(1)
            agg = agg / agg.sum(-1, keepdim=True)
            blocks = _to_padded(self._select(agg, forced, c.block_size))
            head_blocks, shown = None, agg
        else:
            per = self._select(mass.reshape(H * G, nb), forced, c.block_size)   # [Hq, nb] bool
            head_blocks = _to_padded(per)
            blocks = _to_padded(per.view(H, G, nb).any(1))
            shown = mass.mean(1)
        traffic = StepTraffic(summary_bytes=self.scorer.score_bytes(store, seq), index_bytes=nb * INDEX_BYTES)
        return Selection(blocks, shown, traffic, head_blocks)

    # -- internals ------------------------------------------------------------------------
    def _forced(self, nb: int) -> torch.Tensor:
        forced = torch.zeros(nb, dtype=torch.bool)
        forced[: self.sink_blocks] = True
        forced[max(0, nb - self.local_blocks):] = True
        return forced

    def _select(self, mass: torch.Tensor, forced: torch.Tensor, block_size: int) -> torch.Tensor:
        """mass [R, nb] -> bool [R, nb]: forced blocks, then the selector over the rest."""
        R, nb = mass.shape
        K = self.budget_blocks(block_size)
        if K is not None and self.adaptive_mass is None:
            # Plain top-k: forced blocks rank first; topk instead of a full sort.
            key = torch.where(forced, torch.inf, mass)
            out = torch.zeros(R, nb, dtype=torch.bool)
            return out.scatter_(-1, key.topk(min(K, nb), dim=-1).indices, True)
        # Rank forced blocks first, then by mass (ties broken by recency for stability).
        key = torch.where(forced, torch.inf, mass) + torch.arange(nb) * 1e-12
        order = key.argsort(dim=-1, descending=True)
        sorted_mass = mass.gather(-1, order)
        forced_sorted = forced[order]                                      # [R, nb]
        before = sorted_mass.cumsum(-1) - sorted_mass                      # mass ranked ahead
        if K is not None:
            take = torch.arange(nb).expand(R, nb) < K
            if self.adaptive_mass is not None:
                take = take & ((before < self.adaptive_mass) | forced_sorted)
        elif self.top_p is not None:
            take = torch.ones(R, nb, dtype=torch.bool) if self.top_p >= 1 else before < self.top_p
        else:
            take = sorted_mass >= mass.amax(-1, keepdim=True) * math.exp(-self.threshold)
        take = take | forced_sorted
        out = torch.zeros(R, nb, dtype=torch.bool)
        out.scatter_(-1, order, take)
        return out


def _to_padded(mask: torch.Tensor) -> torch.Tensor:
    """bool [R, nb] -> [R, K] int64 ascending ids, -1 padded to the longest row."""
    R, nb = mask.shape
    ids = torch.where(mask, torch.arange(nb), nb).sort(-1).values
    K = int(mask.sum(-1).max())
    ids = ids[:, :K]
    return torch.where(ids == nb, -1, ids)
