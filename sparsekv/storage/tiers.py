"""Two tiers for the store's K/V tiles: `hot_blocks` slots per layer in memory, the rest in a cold file.

The unit is a tile pair: the K and V of one physical block in one layer, all kv heads (plus its
int8 scales). Each (layer, block) is in exactly one state:

    EMPTY   no content (a fresh block, or one whose content died: freed, or evicted by the prefix cache)
    HOT     in hot slot `slot_of[layer, block]` of the store's K/V tensors
    COLD    in the cold file (`storage.cold`), served only after its checksum passes

Summaries stay in memory for every block, so routing never touches the cold tier; only the
tiles a step reads must be hot. `acquire(layer, ids)` makes them hot: free slots first, then
slots freed by demoting the tiles the placement policy ranks first (`storage.placement`), never
one the same call needs. A demoted tile whose disk record is still *clean* (unchanged since it
was last written or read back; full blocks are append-only) is demoted without a write. A set
larger than the hot tier cannot be made hot at once; `stage(layer, ids)` then assembles it in a
scratch tensor instead (hot tiles copied, cold tiles read), leaving the tiers as they were.

Prefetch: `prefetch(layer, ids)` starts background reads of cold tiles; `acquire` takes a
finished read without waiting (a prefetch hit), or waits for one in flight (a late prefetch,
whose wait is the remaining stall), or reads synchronously (a miss).
"""
from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from .cold import ColdBlockError, ColdFile
from .placement import PLACEMENTS

EMPTY, HOT, COLD = 0, 1, 2


@dataclass
class TierStats:
    """Tile accesses by outcome, and tier traffic. A tile access is one (layer, block) a call needed."""

    hits: int = 0              # already hot
    prefetch_hits: int = 0     # cold, read ahead, ready when needed (no wait)
    late_prefetches: int = 0   # cold, read ahead, still in flight when needed (waited `stall_s`)
    misses: int = 0            # cold, read synchronously when needed
    fresh: int = 0             # empty: a slot for new content, nothing to read
    staged: int = 0            # tiles served from a scratch copy (a set larger than the hot tier)
    promotions: int = 0
    demotions: int = 0
    demote_writes: int = 0     # demotions that wrote their record (the others were clean)
    prefetch_wasted: int = 0   # reads started by a prefetch whose tile was not needed before the next one
    stall_s: float = 0.0       # waiting for cold reads on the caller's thread (misses and late prefetches)

    @property
    def reads(self) -> int:
        """Accesses to existing content (fresh slots excluded)."""
        return self.hits + self.prefetch_hits + self.late_prefetches + self.misses

    @property
    def hit_rate(self) -> float:
        """Share of content accesses served without waiting for the disk (hot or prefetched in time)."""
        return (self.hits + self.prefetch_hits) / self.reads if self.reads else float("nan")

    def as_dict(self) -> dict:
        return {**self.__dict__, "reads": self.reads, "hit_rate": self.hit_rate}


class TierTable:
    """Where each (layer, block) tile lives, and the moves between the tiers.

    Invariants (checked by `check()`):
    1. Each (layer, block) is in exactly one of EMPTY, HOT, COLD: never both hot and cold.
    2. `slot_of[l, b] = s` iff `block_of[l, s] = b`; every other slot is in the layer's free list.
    3. A COLD tile's record in the file is the tile's content (its CRC was taken when it was written).
    4. At most `hot_blocks` tiles per layer are hot.
    5. `stage` and rejected calls leave states, slots and the file unchanged.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], num_blocks: int, hot_blocks: int, cold: ColdFile,
                 placement: str):
        self.tensors = tensors                  # name -> [L, hot, ...] hot storage (k, v, and int8 scales)
        self.num_layers = next(iter(tensors.values())).shape[0]
        self.num_blocks, self.hot_blocks, self.cold = num_blocks, hot_blocks, cold
        self.policy = PLACEMENTS[placement]()   # bound once
        L = self.num_layers
        self.state = np.zeros((L, num_blocks), dtype=np.int8)
        self.clean = np.zeros((L, num_blocks), dtype=bool)       # the disk record equals the content
        self.slot_of = torch.full((L, num_blocks), -1, dtype=torch.long)
        self._slots = self.slot_of.numpy()      # the same memory, for numpy indexing on the host
        self.block_of = np.full((L, hot_blocks), -1, dtype=np.int64)
        self.last_use = np.zeros((L, hot_blocks), dtype=np.int64)
        self.installed = np.zeros((L, hot_blocks), dtype=np.int64)
        self.free_slots = [list(range(hot_blocks - 1, -1, -1)) for _ in range(L)]   # pop() gives slot 0 first
        self.pending: dict[tuple[int, int], Future] = {}
        self.clock = 0
        self.stats = TierStats()
        shapes = [(n, t.shape[2:], t.dtype) for n, t in tensors.items()]
        self._layout = []                        # (name, byte offset, shape, dtype) of each part of a record
        off = 0
        for name, shape, dtype in shapes:
            nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
            self._layout.append((name, off, nbytes, tuple(shape), dtype))
            off += nbytes
        self.record_bytes = off

    # -- queries --------------------------------------------------------------------------
    def num_hot(self, layer: int | None = None) -> int:
        rows = self.state if layer is None else self.state[layer]
        return int((rows == HOT).sum())

    def num_cold(self) -> int:
        return int((self.state == COLD).sum())

    # -- moves ----------------------------------------------------------------------------
    def acquire(self, layer: int, ids, unique: bool = False) -> bool:
        """Make tiles `ids` (block ids) of `layer` hot; False (nothing changed) if they exceed the tier.

        unique: the caller guarantees `ids` holds no repeats (skips a sort). Raises ColdBlockError
        (nothing installed for that tile) if a cold record fails its check.
        """
        ids = np.asarray(ids, dtype=np.int64) if unique else np.unique(np.asarray(ids, dtype=np.int64))
        if len(ids) > self.hot_blocks:
            return False
        self.clock += 1
        st = self.state[layer, ids]
        is_hot = st == HOT
        n_hot = int(is_hot.sum())
        self.stats.hits += n_hot
        if n_hot < len(ids):
            missing = ids[~is_hot]
            self._make_room(layer, len(missing), keep=ids)
            for b in missing.tolist():
                payload = self._fetch(layer, b) if self.state[layer, b] == COLD else None   # may raise: no slot taken
                slot = self.free_slots[layer].pop()
                if payload is not None:
                    self._unpack(layer, slot, payload)
                    self.stats.promotions += 1
                else:                        # zeroed, as the untiered store's fresh blocks are
                    for t in self.tensors.values():
                        t[layer, slot] = 0
                    self.stats.fresh += 1
                self.state[layer, b] = HOT
                self._slots[layer, b] = slot
                self.block_of[layer, slot] = b
                self.installed[layer, slot] = self.clock
        self.last_use[layer, self._slots[layer, ids]] = self.clock
        return True

    def stage(self, layer: int, ids) -> dict[str, torch.Tensor]:
        """Tiles `ids` of `layer` in a scratch copy: name -> [n, ...] in `ids` order. Tiers unchanged."""
        ids = np.asarray(ids, dtype=np.int64)
        out = {name: torch.empty((len(ids), *t.shape[2:]), dtype=t.dtype) for name, t in self.tensors.items()}
        for i, b in enumerate(ids.tolist()):
            s = self.state[layer, b]
            if s == HOT:
                slot = int(self._slots[layer, b])
                for name, t in self.tensors.items():
                    out[name][i] = t[layer, slot]
            elif s == COLD:
                parts = self._split(self._fetch(layer, b))
                for name in out:
                    out[name][i] = parts[name]
            else:
                for name in out:
                    out[name][i] = 0
        self.stats.staged += len(ids)
        return out

    def demote(self, layer: int, ids) -> int:
        """Move hot tiles `ids` of `layer` to the cold tier (a spill); others are skipped. Returns tiles moved."""
        moved = 0
        for b in np.asarray(ids, dtype=np.int64).tolist():
            if self.state[layer, b] == HOT:
                self._demote(layer, int(self._slots[layer, b]))
                moved += 1
        return moved

    def dirty(self, layer: int, ids) -> None:
        """Tiles `ids` of `layer` were just written: their disk records are stale."""
        self.clean[layer, np.asarray(ids, dtype=np.int64)] = False

    def reset(self, ids) -> None:
        """The content of blocks `ids` died (freed or evicted): every layer's tile becomes EMPTY."""
        ids = np.asarray(list(ids), dtype=np.int64)
        if not len(ids):
            return
        for layer in range(self.num_layers):
            for b in ids[self.state[layer, ids] == HOT].tolist():
                slot = int(self._slots[layer, b])
                self.block_of[layer, slot] = -1
                self.free_slots[layer].append(slot)
            for b in ids.tolist():
                fut = self.pending.pop((layer, b), None)
                if fut is not None:
                    fut.cancel()
        self.state[:, ids] = EMPTY
        self.clean[:, ids] = False
        self._slots[:, ids] = -1

    def prefetch(self, layer: int, ids) -> int:
        """Start background reads of the cold tiles among `ids`; returns reads started.

        Reads of this layer started earlier and not among `ids` are dropped (a wrong prediction: its
        bytes were read for nothing, counted in `stats.prefetch_wasted`), so at most one prediction per
        layer holds memory.
        """
        want = set(np.asarray(ids, dtype=np.int64).tolist())
        for key in [k for k in self.pending if k[0] == layer and k[1] not in want]:
            self.pending.pop(key).cancel()
            self.stats.prefetch_wasted += 1
        started = 0
        for b in sorted(want):
            if self.state[layer, b] == COLD and (layer, b) not in self.pending:
                self.pending[(layer, b)] = self.cold.submit(layer, b)
                started += 1
        return started

    def wait_prefetches(self) -> None:
        """Block until every read in flight has finished (for tests and clean timing)."""
        for fut in list(self.pending.values()):
            try:
                fut.result()
            except Exception:       # a failed read is raised when its tile is needed, not here
                pass

    def copy_tile(self, layer: int, src: int, dst: int) -> None:
        """Copy tile `src` of `layer` into the hot slot of `dst` (hot by `acquire`); src may be cold."""
        d = int(self._slots[layer, dst])
        if self.state[layer, src] == HOT:
            s = int(self._slots[layer, src])
            for t in self.tensors.values():
                t[layer, d] = t[layer, s]
        elif self.state[layer, src] == COLD:
            self._unpack(layer, d, self._fetch(layer, src))

    def reset_stats(self) -> None:
        """Zero the tier's and the cold file's counters (to measure one phase, e.g. decode after prefill)."""
        self.stats = TierStats()
        self.cold.reset_stats()

    def check(self) -> None:
        """Assert invariants 1, 2 and 4 (for tests); raises AssertionError with the first violation."""
        for layer in range(self.num_layers):
            hot = np.nonzero(self.state[layer] == HOT)[0]
            assert len(hot) <= self.hot_blocks, f"layer {layer}: {len(hot)} hot tiles > hot_blocks"
            slots = self.slot_of[layer].numpy()
            assert (slots[hot] >= 0).all(), f"layer {layer}: a hot tile without a slot"
            assert (slots[self.state[layer] != HOT] == -1).all(), f"layer {layer}: a slot held by a tile that is not hot"
            assert (self.block_of[layer, slots[hot]] == hot).all(), f"layer {layer}: slot_of and block_of disagree"
            used = set(slots[hot].tolist())
            free = set(self.free_slots[layer])
            assert not used & free and len(used) + len(free) == self.hot_blocks == len(used) + len(self.free_slots[layer]), \
                f"layer {layer}: slots lost or double-booked (a slot free and used, or on the free list twice)"

    # -- internals ------------------------------------------------------------------------
    def _make_room(self, layer: int, n: int, keep: np.ndarray) -> None:
        short = n - len(self.free_slots[layer])
        if short <= 0:
            return
        occupied = np.nonzero(self.block_of[layer] >= 0)[0]
        cand = occupied[~np.isin(self.block_of[layer, occupied], keep)]
        order = self.policy.order(self.last_use[layer, cand], self.installed[layer, cand])
        for slot in cand[order[:short]].tolist():
            self._demote(layer, slot)

    def _demote(self, layer: int, slot: int) -> None:
        b = int(self.block_of[layer, slot])
        if not self.clean[layer, b]:
            self.cold.write(layer, b, self._pack(layer, slot))
            self.clean[layer, b] = True
            self.stats.demote_writes += 1
        self.state[layer, b] = COLD
        self._slots[layer, b] = -1
        self.block_of[layer, slot] = -1
        self.free_slots[layer].append(slot)
        self.stats.demotions += 1

    def _fetch(self, layer: int, b: int) -> torch.Tensor:
        """The record of a cold tile: from a prefetch if one is in flight, else read now (stall counted)."""
        fut = self.pending.pop((layer, b), None)
        t0 = time.perf_counter()
        if fut is not None:
            if fut.done():
                self.stats.prefetch_hits += 1
            else:
                self.stats.late_prefetches += 1
            payload = fut.result()           # re-raises the reader's ColdBlockError
        else:
            self.stats.misses += 1
            payload = self.cold.read(layer, b)
        self.stats.stall_s += time.perf_counter() - t0
        return payload

    def _pack(self, layer: int, slot: int) -> torch.Tensor:
        parts = [self.tensors[name][layer, slot].contiguous().view(torch.uint8).reshape(-1)
                 for name, *_ in self._layout]
        return torch.cat(parts)

    def _split(self, payload: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: payload[off:off + n].view(dtype).view(shape) for name, off, n, shape, dtype in self._layout}

    def _unpack(self, layer: int, slot: int, payload: torch.Tensor) -> None:
        for name, part in self._split(payload).items():
            self.tensors[name][layer, slot] = part


__all__ = ["TierTable", "TierStats", "ColdBlockError", "EMPTY", "HOT", "COLD"]
