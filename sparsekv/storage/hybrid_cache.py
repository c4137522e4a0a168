"""A prefix cache over a `HybridStore`: one `PrefixCache` per layer group, and hits valid for every group.

A hit on the first P tokens of a prompt needs the global group's blocks for all of them and each sliding group's
blocks for their last window (the keys the next query, at position P, can see: tokens P - window + 1 .. P - 1), as
vLLM v1's hybrid manager requires. Blocks are named by the same chained SHA-256 in every group (`PrefixCache`), so
one digest chain is looked up in each group's cache.

A sliding group registers each full block before its window releases it (`retain`, which the Engine calls after
every prefill chunk and decode step); a released block then stays cached and evictable in its group's pool until
an allocation needs it, as vLLM v1 keeps a freed block's hash until the block is reused. So a hit can end wherever
the sliding pools still hold that point's window: at the end of an agent's last turn (its next turn extends it),
or at the end of a system prompt that other requests share, while the window there has not yet been evicted.

    cache = HybridPrefixCache(store)          # store: a HybridStore (Engine(..., prefix_cache=True) builds one)
    hit = cache.attach(seq, prompt_ids)       # tokens reused, a multiple of block_size, < len(prompt_ids)

`make_prefix_cache(store)` builds the cache for either kind of store (what the Engine calls).
"""
from __future__ import annotations

from collections import deque

from ..core.window import first_visible
from .hybrid import HybridStore
from .prefix_cache import CacheStats, PrefixCache, _as_int64


class HybridPrefixCache:
    """One `PrefixCache` per layer group of a `HybridStore`; see the module docstring.

    Invariants (tests/test_hybrid.py):
    1. `attach` returns P and leaves `seq` holding, in the global group, the cached blocks of tokens [0, P), and in
       each sliding group those of [P - window + 1, P), the earlier ones released; P < len(prompt).
    2. A hit never reads a sliding block that does not hold exactly the K/V of its chain's tokens (each group's
       cache keeps `PrefixCache`'s invariants).
    3. A sliding group's cached block may be evicted while the global group still holds its prefix: the hit then
       shortens to where every group still has its window (possibly 0). `pin` holds the global group's blocks of the
       prefix and each sliding group's blocks of its last window, so a pinned prefix always hits in full.
    """

    def __init__(self, store: HybridStore, policy: str = "lru", high_watermark: float | None = None,
                 low_watermark: float | None = None, window: int = 64):
        if not isinstance(store, HybridStore):
            raise TypeError(f"store must be a HybridStore, got {type(store).__name__}")
        self.store = store
        self.caches = [PrefixCache(s, policy=policy, high_watermark=high_watermark, low_watermark=low_watermark,
                                   window=window) for s in store.stores]
        self.main = self.caches[0]
        self.block_size = self.main.block_size
        self.policy = policy
        self.stats = CacheStats(recent=deque(maxlen=window))
        self._pins: dict[str, list[list[int]]] = {}          # name -> per sliding group, the pinned window's blocks

    # -- lookups ----------------------------------------------------------------------------------
    def _windows(self, digests: list[bytes], n: int) -> list[tuple[int, list[int]]] | None:
        """Per sliding group (first logical block, its cached ids) of the window a query at token n * block_size
        sees, or None if some group misses one of those blocks."""
        bs, out = self.block_size, []
        for g, cache in zip(self.store.groups[1:], self.caches[1:]):
            first = first_visible(n * bs, g.window) // bs
            got = [cache._by_digest.get(digests[j]) for j in range(first, n)]
            if None in got:
                return None
            out.append((first, got))
        return out

    def _find(self, token_ids, namespace, max_blocks=None) -> tuple[int, list[int], list[tuple[int, list[int]]]]:
        """(blocks hit n, the global group's ids, per sliding group (released, ids)) of the longest valid hit."""
        ids = _as_int64(token_ids)
        limit = (len(ids) - 1) // self.block_size if max_blocks is None else max_blocks
        digests = self.main.block_digests(ids, namespace, max_blocks=limit)
        main_ids = []
        for d in digests:
            b = self.main._by_digest.get(d)
            if b is None:
                break
            main_ids.append(b)
        for n in range(len(main_ids), 0, -1):
            windows = self._windows(digests, n)
            if windows is not None:
                return n, main_ids[:n], windows
        return 0, [], [(0, []) for _ in self.caches[1:]]

    def peek(self, token_ids, namespace=None) -> int:
        """The tokens `attach` would reuse, without counting a query or touching any block."""
        return self._find(token_ids, namespace)[0] * self.block_size

    def attach(self, seq, token_ids, namespace=None) -> int:
        """Start empty `seq` on the longest hit valid for every group (invariant 1); returns the cached tokens."""
        n, main_ids, windows = self._find(token_ids, namespace)
        self.store.attach(seq, main_ids, [w[1] for w in windows], [w[0] for w in windows])
        for cache, ids in zip(self.caches, [main_ids] + [w[1] for w in windows]):
            now = next(cache._clock)
            for b in ids:
                cache._meta[b].hits += 1
                cache._meta[b].last_access = now
        hit, total = n * self.block_size, len(_as_int64(token_ids))
        self.stats.queries += 1
        self.stats.prompt_tokens += total
        self.stats.hit_tokens += hit
        self.stats.recent.append((hit, total))
        return hit

    # -- registration and upkeep ------------------------------------------------------------------
    def insert(self, seq, token_ids, namespace=None) -> int:
        """Register `seq`'s full blocks in every group that holds them (its whole prefix in the global group, what each
        sliding group still holds); returns the global group's blocks newly cached."""
        added = self.main.insert(seq, token_ids, namespace)
        self.retain(seq, token_ids, namespace)
        return added

    def retain(self, seq, token_ids, namespace=None) -> int:
        """Register `seq`'s full blocks in the sliding groups only, before their windows release them (the Engine calls
        this after each prefill chunk and decode step, before `HybridStore.trim`). Hashes only blocks that became
        full since the last call (`PrefixCache.insert`). Returns the sliding blocks newly cached."""
        return sum(cache.insert(p, token_ids, namespace) for cache, p in zip(self.caches[1:], self.store.parts(seq)[1:]))

    def maintain(self) -> int:
        return sum(c.maintain() for c in self.caches)

    def pin(self, name: str, token_ids, namespace=None) -> int:
        """Hold the cached prefix of `token_ids` in use under `name` (invariant 3): the global group's blocks of its
        longest hit and each sliding group's blocks of that hit's last window. Returns the global blocks pinned."""
        if name in self._pins:
            raise ValueError(f"name {name!r} is already pinned; unpin it first")
        n, _, windows = self._find(token_ids, namespace, max_blocks=len(_as_int64(token_ids)) // self.block_size)
        pinned = self.main.pin(name, _as_int64(token_ids)[:n * self.block_size], namespace)
        ids = [w[1] for w in windows]
        for cache, blocks in zip(self.caches[1:], ids):
            cache.table.pool.incref(blocks)
        self._pins[name] = ids
        return pinned

    def unpin(self, name: str) -> None:
        if name not in self._pins:
            raise ValueError(f"name {name!r} is not pinned; pinned: {sorted(self._pins)}")
        self.main.unpin(name)
        for cache, blocks in zip(self.caches[1:], self._pins.pop(name)):
            cache.table.pool.decref(blocks)

    def spill(self) -> int:
        """The global group's evictable blocks to its cold tier (`PrefixCache.spill`); sliding groups have none."""
        return self.main.spill()

    @property
    def num_cached(self) -> int:
        return self.main.num_cached

    def occupancy(self) -> dict:
        return {"groups": [c.occupancy() for c in self.caches], **self.main.occupancy()}


__all__ = ["HybridPrefixCache"]


def make_prefix_cache(store, **kwargs):
    """The prefix cache for a store: a `PrefixCache` over a `BlockStore` (or a bare `BlockTable`), or a
    `HybridPrefixCache` over a `HybridStore` (whose hits must be valid for every layer group). It lives here, where
    both kinds are visible; `prefix_cache` cannot import this module back (hybrid caches are built of its
    `PrefixCache`)."""
    if isinstance(store, HybridStore):
        return HybridPrefixCache(store, **kwargs)
    return PrefixCache(store, **kwargs)
