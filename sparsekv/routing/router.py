"""Query-aware block routing: a scorer, a selector and forced blocks, chosen once.

For one decode query, a router decides which logical blocks each kv head reads:

    1. score   every block per query head, from the store's per-block summaries (or, for
               the oracle, from the keys themselves)         -> logits [H, G, nb]
    2. mass    turn logits into a distribution over blocks per query head: softmax over
               blocks (the oracle's logits are log true mass, so this is exact for it)
    3. gqa     "shared": aggregate the G query heads of a kv head into one distribution
               (agg="sum": mean of the softmaxed masses; agg="max": max, renormalised),
               one selection per kv head, as NSA does. "per_head": one selection per query
               head; the kv head must then read the union of its G selections (Quest's unit:
               up to G times the K/V bytes of "shared"). "union": each query head ranks the
               blocks by its own mass, and the kv head takes them in rank order, round robin
               over its heads (rank 0 of head 0, of head 1, ..., then rank 1), until it holds
               K distinct blocks, forced ones first: per-query-head choice at exactly the K/V
               bytes of "shared" (top_k / token_budget only).
    4. select  forced blocks first (the first `sink_blocks` and last `local_blocks`, which
               always include the partial current block), then by mass with one selector:
                 top_k / token_budget  K blocks in all, forced ones included;
                 top_p                 the smallest set whose mass reaches p;
                 threshold             blocks whose mass is within exp(-threshold) of the best
                                       (a margin of `threshold` in logit units);
               `adaptive_mass` makes top_k adaptive: K is a cap, and selection stops early
               once the selected mass reaches `adaptive_mass` (peaked queries read less).

On the CPU, steps 1-4 run as one pass of the C++ route kernel (`kernels/cpu/route.cpp`) when the
configuration is one it computes (`Router.fusable`: a scorer with a `fused_kind`, gqa="shared",
agg="sum", a plain top_k or token_budget); it selects the same blocks as the torch path, except
that at a tie within float32 rounding either block may be taken.

Shapes: H kv heads, G query heads per kv head, Hq = H * G, nb logical blocks, D head dim.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.backend import BACKENDS as SCORE_BACKENDS
from ..core.backend import resolve
from ..core.checks import check_choice, check_int
from ..core.traffic import INDEX_BYTES, StepTraffic
from ..storage.store import BlockStore, Sequence, check_decode_query
from .scorers import ROUTERS, ScoreInput, Scorer, _cpp_summaries, fused_route, make_scorer
from .selectors import Selector, TopK, make_selector, rank_key

GQA_UNITS = ("shared", "per_head", "union")       # how a GQA group's query heads share a selection (step 3)

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
    def route_bytes(self) -> int:
        """Every byte read to route: the scorer's summaries (`Scorer.score_bytes`) plus the block table."""
        return self.traffic.total

    @property
    def num_selected(self) -> torch.Tensor:
        """[H] blocks each kv head reads."""
        return (self.blocks >= 0).sum(1)


@dataclass(frozen=True)
class RouterConfig:
    """Everything a `Router` is built from (see `Router` for the rules between the fields)."""

    scorer: str | Scorer = "minmax"         # a Scorer, or a name `scorers.make_scorer` reads ("hminmax-g64-k4")
    top_k: int | None = None                # K blocks in all, forced ones included
    top_p: float | None = None              # the smallest set whose mass reaches p
    threshold: float | None = None          # blocks within exp(-threshold) of the best (logit units)
    sink_blocks: int = 1                    # first blocks always read (the attention sink)
    local_blocks: int = 1                   # last blocks always read (includes the partial current block)
    gqa: str = "shared"                     # "shared": one selection per kv head; "per_head": per query head,
                                            # read as their union; "union": per query head, capped at K blocks
    token_budget: int | None = None         # K = token_budget // block_size blocks
    adaptive_mass: float | None = None      # with top_k / token_budget: stop once this mass is selected
    agg: str = "sum"                        # how a GQA group's masses combine ("sum": mean, "max")
    seed: int = 0                           # the random scorer's generator
    backend: str = "auto"                   # scoring backend (core.backend)
    selector: object = None                 # a routing.Selector instead of the four selector fields


# Named configurations of the systems the suite compares, at a 2,048-token budget.
PRESETS: dict[str, RouterConfig] = {
    "quest": RouterConfig("minmax", token_budget=2048),                   # Quest: min/max bound per block
    "moba": RouterConfig("mean", token_budget=2048),                      # MoBA: mean-pooled key per block
    "infllm": RouterConfig("repr", token_budget=2048),                    # InfLLM: representative keys
    "streaming": RouterConfig("recency", token_budget=2048),              # StreamingLLM: sinks + window
    "oracle": RouterConfig("oracle", token_budget=2048),                  # the true top blocks
}


class Router:
    """Chooses, per decode step, the blocks each kv head reads (see the module docstring).

    The scorer is a `Scorer` instance (used as given, as a `selector` is) or a name: a registered one, or a
    parametrised one its family reads back ("hminmax-g64-k4"; `scorers.make_scorer`).
    Exactly one selector is set: `top_k`, `token_budget` (converted to
    max(1, token_budget // block_size) blocks), `top_p` or `threshold`, or a `selector` object
    (any registered `Selector`). The forced blocks count toward a top_k budget, which must
    therefore be at least sink_blocks + local_blocks. The scorer and the selector are bound
    once here; `select` runs them per step.
    """

    def __init__(self, scorer: str | Scorer | RouterConfig = "minmax", top_k: int | None = None, top_p: float | None = None,
                 threshold: float | None = None, sink_blocks: int = 1, local_blocks: int = 1,
                 gqa: str = "shared", token_budget: int | None = None, adaptive_mass: float | None = None,
                 agg: str = "sum", seed: int = 0, backend: str = "auto", selector: Selector | None = None):
        if isinstance(scorer, RouterConfig):          # Router(config): the config's fields, nothing else
            given = {k: v for k, v in dict(top_k=top_k, top_p=top_p, threshold=threshold, token_budget=token_budget,
                                           adaptive_mass=adaptive_mass, selector=selector).items() if v is not None}
            if given:
                raise ValueError(f"pass either a RouterConfig or keyword arguments, not both (got {sorted(given)})")
            cfg = scorer
            scorer, top_k, top_p, threshold = cfg.scorer, cfg.top_k, cfg.top_p, cfg.threshold
            sink_blocks, local_blocks, gqa, token_budget = cfg.sink_blocks, cfg.local_blocks, cfg.gqa, cfg.token_budget
            adaptive_mass, agg, seed, backend, selector = cfg.adaptive_mass, cfg.agg, cfg.seed, cfg.backend, cfg.selector
        scorer_ = make_scorer(scorer)                 # TypeError / ValueError naming `scorer`
        if selector is not None and not isinstance(selector, Selector):
            raise TypeError(f"selector must be a routing.Selector, got {type(selector).__name__}")
        check_choice("gqa", gqa, GQA_UNITS)
        check_choice("agg", agg, ("sum", "max"))
        check_choice("backend", backend, SCORE_BACKENDS)
        check_int("sink_blocks", sink_blocks, lo=0)
        check_int("local_blocks", local_blocks, lo=1)
        chosen = [n for n, v in (("top_k", top_k), ("token_budget", token_budget), ("top_p", top_p),
                                 ("threshold", threshold)) if v is not None]
        if len(chosen) + (selector is not None) != 1:
            raise ValueError(f"set exactly one of top_k, token_budget, top_p, threshold, selector; "
                             f"got {chosen + (['selector'] if selector is not None else []) or 'none'}")
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
        self.scorer = scorer_
        self.selector = selector or make_selector(top_k, token_budget, top_p, threshold, adaptive_mass,
                                                  min_blocks=sink_blocks + local_blocks)
        if gqa == "union" and type(self.selector) is not TopK:
            raise ValueError(f"gqa='union' needs top_k or token_budget (a K blocks to fill), got the "
                             f"{self.selector.name!r} selector")
        if self.selector.needs_query_aware and not self.scorer.query_aware:
            raise ValueError(f"scorer {self.scorer.name!r} ignores the query; top_p, threshold and adaptive_mass need "
                             f"one of {[n for n, c in ROUTERS.items() if c.query_aware]}")
        self.top_k, self.top_p, self.threshold = top_k, top_p, threshold
        self.token_budget, self.adaptive_mass = token_budget, adaptive_mass
        self.sink_blocks, self.local_blocks, self.gqa, self.agg = sink_blocks, local_blocks, gqa, agg
        self.backend, self.seed = backend, seed
        self.generator = torch.Generator().manual_seed(seed)
        # One pass of the CPU route kernel can do score + mass + top-k for this configuration.
        self.fusable = (self.scorer.fused_kind is not None and gqa == "shared" and agg == "sum"
                        and type(self.selector) is TopK)
        self.config = RouterConfig(scorer, top_k, top_p, threshold, sink_blocks, local_blocks, gqa, token_budget,
                                   adaptive_mass, agg, seed, backend, selector)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "Router":
        """A router from `PRESETS` ("quest", "moba", "infllm", "streaming", "oracle"), fields overridden."""
        check_choice("name", name, PRESETS)
        from dataclasses import replace
        return cls(replace(PRESETS[name], **overrides))

    def __repr__(self) -> str:
        sel = {k: v for k, v in (("top_k", self.top_k), ("token_budget", self.token_budget), ("top_p", self.top_p),
                                 ("threshold", self.threshold), ("adaptive_mass", self.adaptive_mass)) if v is not None}
        args = ", ".join(f"{k}={v}" for k, v in sel.items())
        return (f"Router({self.scorer.name!r}, {args}, sink_blocks={self.sink_blocks}, "
                f"local_blocks={self.local_blocks}, gqa={self.gqa!r})")

    def budget_blocks(self, block_size: int) -> int | None:
        """K in blocks for top_k/token_budget routers, else None."""
        return self.selector.budget_blocks(block_size)

    # -- public ---------------------------------------------------------------------------
    def select(self, q: torch.Tensor, store: BlockStore, seq: Sequence, layer: int,
               backend: str | None = None) -> Selection:
        """Route one decode query q [Hq, D] of `seq` at `layer` (validated)."""
        check_decode_query(store, q, seq, layer)
        return self.select_planned(q, store, seq, layer, store.block_table(seq), backend)

    def select_planned(self, q: torch.Tensor, store: BlockStore, seq: Sequence, layer: int, table: torch.Tensor,
                       backend: str | None = None) -> Selection:
        """`select` without validation, for a decode plan (`attention.plan`) that checked the step once.

        table: `store.block_table(seq)`, built once per step by the plan.
        """
        backend = resolve(self.backend if backend is None else backend, q)
        c = store.config
        H = c.num_kv_heads
        G = q.shape[0] // H
        inp = ScoreInput(q.float().view(H, G, c.head_dim), store, seq, layer, table)
        traffic = StepTraffic(summary_bytes=self.scorer.score_bytes(store, seq),
                              index_bytes=seq.num_blocks * INDEX_BYTES)
        if self.fusable and backend == "cpp" and _cpp_summaries(inp):
            blocks, mass = fused_route(self.scorer, inp, self.selector.budget_blocks(c.block_size),
                                       self.sink_blocks, self.local_blocks)
            return Selection(blocks, mass, traffic)
        logits = self.scorer.logits(inp, backend, self.generator)
        mass = logits.expand(H, G, -1).softmax(-1)                          # [H, G, nb]
        nb = seq.num_blocks
        forced = self._forced(nb)
        if self.gqa == "shared":
            agg = mass.mean(1) if self.agg == "sum" else mass.amax(1)
            agg = agg / agg.sum(-1, keepdim=True)
            blocks = _to_padded(self.selector.select(agg, forced, c.block_size))
            head_blocks, shown = None, agg
        elif self.gqa == "union":
            blocks = _to_padded(self.selector.select(_round_robin(mass), forced, c.block_size))
            head_blocks, shown = None, mass.mean(1)
        else:
            per = self.selector.select(mass.reshape(H * G, nb), forced, c.block_size)   # [Hq, nb] bool
            head_blocks = _to_padded(per)
            blocks = _to_padded(per.view(H, G, nb).any(1))
            shown = mass.mean(1)
        return Selection(blocks, shown, traffic, head_blocks)

    # -- internals ------------------------------------------------------------------------
    def _forced(self, nb: int) -> torch.Tensor:
        forced = torch.zeros(nb, dtype=torch.bool)
        forced[: self.sink_blocks] = True
        forced[max(0, nb - self.local_blocks):] = True
        return forced


def _round_robin(mass: torch.Tensor) -> torch.Tensor:
    """gqa="union"'s order as a key a top-k selector ranks by: mass [H, G, nb] -> [H, nb] float32, distinct per row.

    Block b's arrival is min over heads g of rank_g(b) * G + g, where rank_g orders head g's blocks as every
    selector does (by mass, ties to the later block: `rank_key`); the earliest arrivals are the round robin's
    first picks. The key is G * nb - arrival: positive integers, exact in float32 (G * nb < 2^24)."""
    H, G, nb = mass.shape
    order = rank_key(mass.reshape(H * G, nb), torch.zeros(nb, dtype=torch.bool)).argsort(-1, descending=True)
    rank = order.argsort(-1).view(H, G, nb)                                    # rank_g(b), 0 = head g's best
    arrival = (rank * G + torch.arange(G).view(1, G, 1)).amin(1)              # [H, nb]
    return (G * nb - arrival).float()


def _to_padded(mask: torch.Tensor) -> torch.Tensor:
    """bool [R, nb] -> [R, K] int64 ascending ids, -1 padded to the longest row."""
    R, nb = mask.shape
    ids = torch.where(mask, torch.arange(nb), nb).sort(-1).values
    K = int(mask.sum(-1).max())
    ids = ids[:, :K]
    return torch.where(ids == nb, -1, ids)
