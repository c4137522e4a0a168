"""The block pool: physical block ids, their ref counts, and the free queue.

This module knows nothing about tensors. It hands out integer block ids and keeps the
book-keeping that makes sharing safe; `store.py` owns the K/V memory those ids index.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable


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


class BlockPool:
    """Ref counts and a FIFO free queue over `num_blocks` physical block ids.

    Invariants:
    1. Every id in [0, num_blocks) is either referenced (ref count > 0) or in the free
       queue (ref count == 0), never both and never neither.
    2. `num_free + num_used == num_blocks` at all times.
    3. `allocate(n)` either returns n distinct ids with ref count 1, taken from the front of
       the free queue in order, or raises `StoreFullError` and changes nothing.
    4. Freed ids (ref count reaching 0) are appended to the back of the queue in the order
       given, so the least recently freed block is reused first.
    5. `on_reuse(block_id)`, if set, is called for each id just before it leaves the free
       queue for reuse: a prefix cache uses it to forget the content that id held.
    """

    def __init__(self, num_blocks: int):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # OrderedDict as an O(1) queue with remove-from-middle (a cache hit on a free block).
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.on_reuse: Callable[[int], None] | None = None

    # -- queries ---------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_queue(self) -> list[int]:
        """The free ids in reuse order (front first). For tests and plots."""
        return list(self._free)

    def is_free(self, block_id: int) -> bool:
        return block_id in self._free

    # -- mutation --------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take n ids from the front of the free queue, each with ref count 1."""
        if n > len(self._free):
            raise StoreFullError(n, len(self._free))
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            if self.on_reuse is not None:
                self.on_reuse(block_id)
            self.ref_counts[block_id] = 1
            out.append(block_id)
        return out

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add a reference to each id; an id sitting in the free queue is taken out of it."""
        for b in block_ids:
            if self.ref_counts[b] == 0:
                del self._free[b]
            self.ref_counts[b] += 1

    def decref(self, block_ids: Iterable[int]) -> list[int]:
        """Drop a reference from each id; returns the ids that reached zero (now free)."""
        freed = []
        for b in block_ids:
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} released more often than it was referenced")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self._free[b] = None
                freed.append(b)
        return freed
