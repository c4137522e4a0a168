"""The block table: which physical blocks each sequence holds, with no tensors at all.

A `BlockTable` is the bookkeeping half of a paged KV cache (vLLM's kv-cache manager): sequences and their
block lists, ref counts (through its `BlockPool`), how full every block is, reservations for new tokens,
fork, attach (a prefix-cache hit) and free. It never touches a tensor, so the serving simulator, the
workload replays and the explorers use it directly; `BlockStore` composes it with the K/V tensors and keeps
them in step through the `Slots` that `reserve` returns.

    table = BlockTable(block_size=16, num_blocks=1024)
    seq = table.new_sequence()
    slots = table.reserve(seq, 40)          # 3 blocks; slots.touched, slots.copy (copy-on-write), slots.start
    child = table.fork(seq)                 # shares every block
    table.free(seq)

Invariants (tests/test_block_table.py checks each):
1. A block's ref count equals the number of live sequences whose list holds it (plus prefix-cache pins);
   a block with ref count 0 is free or evictable (`BlockPool`).
2. `fill[b]` is the number of valid tokens in block b: a sequence's blocks are full except its last.
3. Full blocks are append-only: `reserve` never lists a full block in `touched`.
4. Copy-on-write: `reserve` never writes a block whose ref count exceeds 1; a shared partial last block is
   replaced by a fresh one first, and `Slots.copy` names (source, destination) for the tensors' owner.
5. Rejected calls change nothing: every argument is checked and every block counted against the free pool
   (`StoreFullError`) before any state is touched.
6. `free(seq)` drops one reference from each of its blocks (in logical order); the handle is dead after.
7. `release_before(seq, j)` drops the references of its logical blocks before j and marks them -1 (released):
   a sliding-window layer group's sequences hold only the blocks their window can still reach. A released
   entry is never referenced, forked, freed or written again; a sequence's held blocks are always a suffix.

Hybrid models keep one table per layer group (`storage.hybrid`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ..core.checks import check_int
from .block_pool import BlockPool, StoreFullError


@dataclass
class Sequence:
    """A handle on one sequence: its block list and length. Owned by one `BlockTable` (or the store around it).

    `block_ids` are physical ids in logical order; logical block j holds tokens [j * block_size,
    (j + 1) * block_size). Only the last block can be partial.
    """

    seq_id: int
    num_tokens: int = 0
    _blocks: list[int] = field(default_factory=list, repr=False)
    alive: bool = True
    _cache: dict = field(default_factory=dict, repr=False, compare=False)   # derived from _blocks (the store's)
    released: int = 0          # leading logical blocks a sliding window has released (their ids are -1)

    @property
    def block_ids(self) -> list[int]:
        """Physical ids in logical order (-1 for a block a sliding window has released)."""
        return list(self._blocks)

    @property
    def held(self) -> list[int]:
        """The physical blocks this sequence references (its block ids without the released ones)."""
        return [b for b in self._blocks if b >= 0]

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)


@dataclass(frozen=True)
class Slots:
    """Where `num_tokens` new tokens of `seq` go, from token `start` on: the blocks written (`touched`, in logical
    order, the first being logical block start // block_size), and the copy-on-write the owner of the tensors must
    make before writing (`copy`: (source block, fresh block), or None)."""

    seq: Sequence
    start: int
    num_tokens: int
    touched: tuple[int, ...]
    copy: tuple[int, int] | None = None


class BlockTable:
    """Sequences over a pool of `num_blocks` physical blocks of `block_size` tokens (see the module docstring)."""

    def __init__(self, block_size: int, num_blocks: int):
        check_int("block_size", block_size, lo=1)
        check_int("num_blocks", num_blocks, lo=1)
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.fill = [0] * num_blocks            # valid tokens in each physical block (invariant 2)
        self._seqs: dict[int, Sequence] = {}
        self._ids = itertools.count()

    # -- queries ----------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def sequences(self) -> list[Sequence]:
        """Live sequences, oldest first."""
        return list(self._seqs.values())

    def check_seq(self, seq, name: str = "seq") -> None:
        """Raise TypeError/ValueError unless `seq` is a live sequence of this table."""
        if not isinstance(seq, Sequence):
            raise TypeError(f"{name} must be a Sequence from this store, got {type(seq).__name__}")
        if self._seqs.get(seq.seq_id) is not seq:
            state = "was freed" if not seq.alive else "belongs to another store"
            raise ValueError(f"{name} (id {seq.seq_id}) {state}; expected a live sequence of this store")

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks that reserving `num_tokens` more tokens for `seq` would allocate (copy-on-write included)."""
        new = math.ceil((seq.num_tokens + num_tokens) / self.block_size) - len(seq._blocks)
        return new + int(self._shared_tail(seq))

    # -- sequences --------------------------------------------------------------------------------
    def new_sequence(self) -> Sequence:
        seq = Sequence(next(self._ids))
        self._seqs[seq.seq_id] = seq
        return seq

    def attach(self, seq: Sequence, block_ids: list[int], released: int = 0) -> None:
        """Start an empty `seq` on existing full blocks (a prefix-cache hit), shared by ref count. `released`:
        logical blocks before them that the sequence starts without (a sliding window's, `release_before`)."""
        self.check_seq(seq)
        if seq.num_tokens:
            raise ValueError(f"seq must be empty to attach cached blocks; it holds {seq.num_tokens} tokens")
        check_int("released", released, lo=0)
        for b in block_ids:
            if self.fill[b] != self.block_size:
                raise ValueError(f"block_ids must name full blocks; block {b} holds {self.fill[b]} tokens")
        self.pool.incref(block_ids)
        seq._blocks.extend([-1] * released + list(block_ids))
        seq.released = released
        seq.num_tokens = (released + len(block_ids)) * self.block_size

    def fork(self, seq: Sequence) -> Sequence:
        """A new sequence sharing every block of `seq`; nothing is copied."""
        self.check_seq(seq)
        self.pool.incref(seq.held)
        child = Sequence(next(self._ids), seq.num_tokens, list(seq._blocks), released=seq.released)
        self._seqs[child.seq_id] = child
        return child

    def free(self, seq: Sequence) -> list[int]:
        """Release `seq` (invariant 6); returns the physical blocks whose ref count reached 0."""
        self.check_seq(seq)
        released = self.pool.decref(seq.held)
        seq.alive = False
        del self._seqs[seq.seq_id]
        return released

    def reserve(self, seq: Sequence, num_tokens: int) -> Slots:
        """Claim slots for `num_tokens` new tokens of `seq` (invariants 3-5); returns where they go."""
        self.check_seq(seq)
        check_int("num_tokens", num_tokens, lo=1)
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.pool.num_free:
            raise StoreFullError(needed, self.pool.num_free, what=f"reserving {num_tokens} tokens")
        bs = self.block_size
        copy = None
        if self._shared_tail(seq):                          # copy-on-write: a fresh block for the shared tail
            src = seq._blocks[-1]
            (dst,) = self.pool.allocate(1)
            self.fill[dst] = self.fill[src]
            self.pool.decref([src])
            seq._blocks[-1] = dst
            copy = (src, dst)
        seq._blocks.extend(self.pool.allocate(math.ceil((seq.num_tokens + num_tokens) / bs) - len(seq._blocks)))
        start = seq.num_tokens
        touched = tuple(seq._blocks[start // bs: (start + num_tokens - 1) // bs + 1])
        for j, b in enumerate(touched, start=start // bs):
            self.fill[b] = min(bs, start + num_tokens - j * bs)
        seq.num_tokens += num_tokens
        return Slots(seq, start, num_tokens, touched, copy)

    def release_before(self, seq: Sequence, logical: int) -> list[int]:
        """Drop `seq`'s references to its logical blocks before `logical` (invariant 7); returns the physical blocks
        whose ref count reached 0. The last block is never released (a write goes there)."""
        self.check_seq(seq)
        check_int("logical", logical, lo=0)
        upto = min(logical, len(seq._blocks) - 1)
        if upto <= seq.released:
            return []
        drop = seq._blocks[seq.released:upto]
        seq._blocks[seq.released:upto] = [-1] * len(drop)
        seq.released = upto
        return self.pool.decref(drop)

    # -- internals --------------------------------------------------------------------------------
    def _shared_tail(self, seq: Sequence) -> bool:
        """Whether `seq` ends in a partial block that another holder shares (so it must be copied to grow)."""
        return seq.num_tokens % self.block_size != 0 and self.pool.ref_counts[seq._blocks[-1]] > 1


__all__ = ["BlockTable", "Sequence", "Slots", "StoreFullError"]
