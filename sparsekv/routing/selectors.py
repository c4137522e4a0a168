"""Block selectors: given a block distribution and the forced blocks, which blocks to read.

A selector is bound once per `Router` (from its top_k / token_budget / top_p / threshold /
adaptive_mass arguments, or passed in directly) and called per decode step:

    select(mass [R, nb] float32, forced [nb] bool, block_size) -> bool [R, nb]

Forced blocks (sinks and the local window) are always selected and count toward a budget.
Ties: blocks rank by (forced, mass, block id), so at an exact tie of masses the later block wins, on
every selector and in the fused CPU route (`kernels/cpu/route.cpp`); no order depends on how a sort or
top-k implementation happens to break ties. Selectors are registered by name (`register_selector`); a new
one is one subclass and that call.
"""
from __future__ import annotations

import math

import torch

from ..core import registry


class Selector:
    """Base class. `needs_query_aware`: the selector reads the mass's shape, so a query-blind
    scorer (whose mass carries no information about the query) cannot drive it."""

    name = ""
    needs_query_aware = False

    def select(self, mass: torch.Tensor, forced: torch.Tensor, block_size: int) -> torch.Tensor:
        raise NotImplementedError

    def budget_blocks(self, block_size: int) -> int | None:
        """K in blocks for budgeted selectors, else None."""
        return None


SELECTORS: dict[str, type[Selector]] = {}


def register_selector(cls: type[Selector]) -> type[Selector]:
    return registry.add(SELECTORS, cls, Selector, "selector")


def rank_key(mass: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """[R, nb] int64 keys, distinct within a row, that order blocks as forced first, then by mass, then by
    block id (the later block first): the float32 mass's bits (forced: +inf's) above the block id. A
    non-negative float32 orders as its bit pattern does, so comparing keys is comparing (mass, id) exactly."""
    nb = mass.shape[-1]
    m = torch.where(forced, torch.inf, mass.float()).contiguous()
    return (m.view(torch.int32).long() << 32) | torch.arange(nb)


def ranked_blocks(mass: torch.Tensor, k: int) -> torch.Tensor:
    """The k blocks of highest mass per row, [R, min(k, nb)] logical ids, ties to the later block (`rank_key`):
    what the engine reads ahead from a cold tier (the selection widened by the next-ranked blocks), and what the
    tiering replay predicts with, so the two cannot drift."""
    nb = mass.shape[-1]
    key = rank_key(mass, torch.zeros(nb, dtype=torch.bool))
    return key.topk(min(k, nb), dim=-1).indices


def _ranked(mass: torch.Tensor, forced: torch.Tensor):
    """Forced blocks first, then by mass, then the later block (`rank_key`): the order, the mass in that
    order, the forced flags in that order, and the mass ranked ahead of each."""
    order = rank_key(mass, forced).argsort(dim=-1, descending=True)
    sorted_mass = mass.gather(-1, order)
    return order, sorted_mass, forced[order], sorted_mass.cumsum(-1) - sorted_mass


def _scatter(order: torch.Tensor, take: torch.Tensor) -> torch.Tensor:
    return torch.zeros(order.shape, dtype=torch.bool).scatter_(-1, order, take)


@register_selector
class TopK(Selector):
    """K blocks in all, forced ones included. K is `top_k` blocks, or `token_budget // block_size`."""

    name = "top_k"

    def __init__(self, top_k: int | None = None, token_budget: int | None = None, min_blocks: int = 1):
        self.top_k, self.token_budget, self.min_blocks = top_k, token_budget, min_blocks

    def budget_blocks(self, block_size):
        if self.token_budget is not None:
            return max(1, self.token_budget // block_size, self.min_blocks)
        return self.top_k

    def select(self, mass, forced, block_size):
        R, nb = mass.shape
        key = rank_key(mass, forced)                         # distinct keys: topk has no tie to break
        return torch.zeros(R, nb, dtype=torch.bool).scatter_(
            -1, key.topk(min(self.budget_blocks(block_size), nb), dim=-1).indices, True)


@register_selector
class AdaptiveTopK(TopK):
    """Top-k with K as a cap: stops early once the selected mass reaches `adaptive_mass`."""

    name, needs_query_aware = "adaptive", True

    def __init__(self, adaptive_mass: float, top_k: int | None = None, token_budget: int | None = None,
                 min_blocks: int = 1):
        super().__init__(top_k, token_budget, min_blocks)
        self.adaptive_mass = adaptive_mass

    def select(self, mass, forced, block_size):
        R, nb = mass.shape
        order, _, forced_sorted, before = _ranked(mass, forced)
        take = torch.arange(nb).expand(R, nb) < self.budget_blocks(block_size)
        return _scatter(order, (take & ((before < self.adaptive_mass) | forced_sorted)) | forced_sorted)


@register_selector
class TopP(Selector):
    """The smallest set whose mass reaches p (forced blocks always in)."""

    name, needs_query_aware = "top_p", True

    def __init__(self, top_p: float):
        self.top_p = top_p

    def select(self, mass, forced, block_size):
        R, nb = mass.shape
        order, _, forced_sorted, before = _ranked(mass, forced)
        take = torch.ones(R, nb, dtype=torch.bool) if self.top_p >= 1 else before < self.top_p
        return _scatter(order, take | forced_sorted)


@register_selector
class Threshold(Selector):
    """Blocks whose mass is within exp(-threshold) of the best (a margin in logit units)."""

    name, needs_query_aware = "threshold", True

    def __init__(self, threshold: float):
        self.threshold = threshold

    def select(self, mass, forced, block_size):
        order, sorted_mass, forced_sorted, _ = _ranked(mass, forced)
        take = sorted_mass >= mass.amax(-1, keepdim=True) * math.exp(-self.threshold)
        return _scatter(order, take | forced_sorted)


def make_selector(top_k=None, token_budget=None, top_p=None, threshold=None, adaptive_mass=None,
                  min_blocks: int = 1) -> Selector:
    """The selector a Router's keyword arguments name (validated by the Router beforehand)."""
    if adaptive_mass is not None:
        return AdaptiveTopK(adaptive_mass, top_k, token_budget, min_blocks)
    if top_k is not None or token_budget is not None:
        return TopK(top_k, token_budget, min_blocks)
    if top_p is not None:
        return TopP(top_p)
    return Threshold(threshold)
