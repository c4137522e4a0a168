"""Placement policies of the hot tier: which hot tiles are demoted to the cold tier first.

When a layer needs more hot slots than are free, the store demotes hot tiles that the current
operation does not need. A policy ranks the candidates; the smallest keys go first:

    lru    least recently used first: a tile is used when the router selects it, when attention
           or a prefill reads it, and when a write fills it. Quest-style selections repeat from
           step to step (notebook 04's raster), so what was not routed lately is the best guess
           for what will not be routed next.
    fifo   first installed, first demoted, whatever was used since (the baseline LRU must beat).

Promotion needs no policy: what the router selects (and what a prefetch predicts) is promoted.
A new policy is one class with a `name` and `order`, registered with `register_placement`, and is
bound once when the store is built (`StoreConfig.placement`).
"""
from __future__ import annotations

import numpy as np

from ..core import registry


class PlacementPolicy:
    """Base class: `order(last_use, installed)` -> candidate order, first demoted first.

    last_use, installed: [n] int64 logical clocks of the candidate hot tiles (their last use, and
    when each was promoted or written into its slot). Returns a permutation of range(n).
    """

    name = ""

    def order(self, last_use: np.ndarray, installed: np.ndarray) -> np.ndarray:
        raise NotImplementedError


PLACEMENTS: dict[str, type[PlacementPolicy]] = {}


def register_placement(cls: type[PlacementPolicy]) -> type[PlacementPolicy]:
    """Add a placement policy class under `cls.name` (usable as a class decorator)."""
    return registry.add(PLACEMENTS, cls, PlacementPolicy, "placement policy")


@register_placement
class LeastRecentlyUsed(PlacementPolicy):
    name = "lru"

    def order(self, last_use, installed):
        return np.lexsort((installed, last_use))          # by last use, ties by age


@register_placement
class FirstInFirstOut(PlacementPolicy):
    name = "fifo"

    def order(self, last_use, installed):
        return np.argsort(installed, kind="stable")
