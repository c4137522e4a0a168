"""The block pool: physical block ids, their ref counts, and the free queue.

This module knows nothing about tensors. It hands out integer block ids and keeps the
book-keeping that makes sharing safe; `store.py` owns the K/V memory those ids index.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable, Protocol


class StoreFullError(RuntimeError):
    """Raised when an allocation needs more blocks than the pool can give.

    Attributes:
        needed: blocks the rejected call needed.
        free:   blocks that were available (free plus evictable) when it was rejected.
    """

    def __init__(self, needed: int, free: int, what: str = "allocation"):
        self.needed = int(needed)
        self.free = int(free)
        super().__init__(
            f"{what} needs {self.needed} blocks but only {self.free} are free; "
            f"free sequences, enable a prefix-cache eviction policy, or raise num_blocks"
        )


class Evictor(Protocol):
    """What a prefix cache provides so that released blocks stay cached until needed."""

    num_evictable: int

    def is_cached(self, block_id: int) -> bool: ...
    def on_release(self, block_id: int) -> None: ...      # a cached block's ref count reached 0
    def on_acquire(self, block_id: int) -> None: ...      # an evictable block is referenced again
    def evict(self, n: int) -> list[int]: ...             # forget n evictable blocks, return their ids


class BlockPool:
    """Ref counts, a FIFO free queue, and (optionally) an evictor over `num_blocks` block ids.

    Invariants:
    1. Every id is in exactly one state: referenced (ref count > 0), free (ref count 0, in the
       free queue, holding nothing worth keeping), or evictable (ref count 0, cached by the
       evictor). Without an evictor nothing is evictable.
    2. `num_free` counts free plus evictable ids, and `num_free + num_used == num_blocks`.
    3. `allocate(n)` either returns n distinct ids with ref count 1 or raises
       `StoreFullError(needed=n, free=num_free)` and changes nothing. It takes free ids from
       the front of the queue first, then asks the evictor for the rest.
    4. Released ids (ref count reaching 0) go to the evictor if it caches them, else to the
       back of the free queue, in the order given.
    5. Referencing an evictable id (a cache hit) takes it back from the evictor.
    6. Every id whose content dies (it enters the free queue, or the evictor gives it up) is passed
       to each callback in `on_dead`, in order, before it can be handed out again.
    """

    def __init__(self, num_blocks: int):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # OrderedDict as an O(1) queue with remove-from-middle.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.evictor: Evictor | None = None
        self.on_dead: list[Callable[[list[int]], None]] = []    # told of ids whose content died (a cold tier drops them)

    # -- queries ---------------------------------------------------------------------
    @property
    def num_evictable(self) -> int:
        return self.evictor.num_evictable if self.evictor is not None else 0

    @property
    def num_free(self) -> int:
        """Ids an allocation can have: free plus evictable."""
        return len(self._free) + self.num_evictable

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def free_queue(self) -> list[int]:
        """The free (uncached) ids in reuse order, front first. For tests and plots."""
        return list(self._free)

    # -- mutation --------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """n ids with ref count 1: free ones first (queue order), then evicted ones."""
        if n > self.num_free:
            raise StoreFullError(n, self.num_free)
        k = min(n, len(self._free))
        out = [self._free.popitem(last=False)[0] for _ in range(k)]
        if n > k:
            evicted = self.evictor.evict(n - k)
            self._died(evicted)
            out += evicted
        for b in out:
            self.ref_counts[b] = 1
        return out

    def make_free(self, block_ids: Iterable[int]) -> None:
        """Put ids the evictor has just evicted (ref count 0, forgotten) at the back of the free queue."""
        block_ids = list(block_ids)
        for b in block_ids:
            if self.ref_counts[b] != 0 or b in self._free:
                raise RuntimeError(f"block {b} is not an evicted block")
            self._free[b] = None
        self._died(block_ids)

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add a reference to each id, taking it out of the free queue or the evictor."""
        for b in block_ids:
            if self.ref_counts[b] == 0:
                if b in self._free:
                    del self._free[b]
                else:
                    self.evictor.on_acquire(b)
            self.ref_counts[b] += 1

    def decref(self, block_ids: Iterable[int]) -> list[int]:
        """Drop a reference from each id; returns the ids that reached zero."""
        released, died = [], []
        for b in block_ids:
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} released more often than it was referenced")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                if self.evictor is not None and self.evictor.is_cached(b):
                    self.evictor.on_release(b)
                else:
                    self._free[b] = None
                    died.append(b)
                released.append(b)
        self._died(died)
        return released

    def _died(self, block_ids: list[int]) -> None:
        if block_ids:
            for callback in self.on_dead:
                callback(block_ids)
