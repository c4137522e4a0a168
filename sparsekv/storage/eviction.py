"""Eviction policies of the prefix cache: how a released cached block ranks for eviction.

A policy turns a cached block's statistics into a key; the cache evicts the smallest key
first (within equal keys, deeper blocks first: a leaf before its parent). Policies are bound
once, when the cache is built, and registered by name:

    lru       least recently used first;
    lfu       fewest hits first, then least recently used;
    position  lowest (hits + protect / (1 + chain position)) first: blocks near the start of a
              prefix and blocks with many hits are protected, so a definition read once at
              prefill is not the first to go.

A new policy is one class with a `name` and a `key`, registered with `register_policy`.
"""
from __future__ import annotations

from typing import Protocol

from ..core import registry


class BlockStats(Protocol):
    """What the cache knows about a cached block (the cache's own metadata satisfies it)."""

    hits: int             # times a lookup reused the block
    last_access: int      # logical clock of the last insert or hit
    position: int         # index of the block in its prefix chain (0 = first)


class EvictionPolicy:
    """Base class: `key(stats)` -> a tuple; smaller keys are evicted first."""

    name = ""

    def __init__(self, protect: float = 4.0):
        self.protect = protect          # used by position-aware policies; others ignore it

    def key(self, m: BlockStats) -> tuple:
        raise NotImplementedError


POLICIES: dict[str, type[EvictionPolicy]] = {}


def register_policy(cls: type[EvictionPolicy]) -> type[EvictionPolicy]:
    """Add a policy class to the registry under `cls.name` (usable as a class decorator)."""
    return registry.add(POLICIES, cls, EvictionPolicy, "eviction policy")


@register_policy
class LRU(EvictionPolicy):
    name = "lru"

    def key(self, m):
        return (m.last_access,)


@register_policy
class LFU(EvictionPolicy):
    name = "lfu"

    def key(self, m):
        return (m.hits, m.last_access)


@register_policy
class PositionAware(EvictionPolicy):
    name = "position"

    def key(self, m):
        return (m.hits + self.protect / (1 + m.position), m.last_access)
