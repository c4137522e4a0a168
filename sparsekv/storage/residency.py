"""Where a store's K/V tiles live: all in memory, or a hot tier in memory over a cold tier on disk.

A residency is bound once, by `StoreConfig.cold_dir`, when a `BlockStore` is built; the store never asks
`tiers is None` again. Both answer the same questions about the tiles of one layer:

    writes(layer, res)              -> pieces (blocks, token range, rows): where a reservation's tokens are written
    layer_kv(layer, seqs, blocks)   -> LayerKV: the tiles attention reads, and each sequence's row of each block
    tiles(layer, idx)               -> {name: [n, H, bs, ...]}: tiles of physical blocks idx, read in place or staged
    copy(src, dst)                  copy-on-write of one block in every layer
    runs(seq, rows)                 maximal runs of consecutive rows (what dense decode multiplies in place)
    spill / prefetch / cold_bytes / close

`AllHot`: a tile's row is its block id, every read is in place. `Tiered`: `hot_blocks` rows per layer, found
through `storage.tiers.TierTable`; a read makes its tiles hot first (or stages a set larger than the hot tier in a
scratch copy), and a write of any width goes in pieces of at most `hot_blocks` blocks, each written through to the
cold file when a later piece needs its slots.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from .cold import ColdFile
from .tiers import TierTable


@dataclass(frozen=True)
class LayerKV:
    """One layer's K/V as attention reads them (`BlockStore.layer_kv`).

    k, v       [R, H, bs, D] tiles (head-major in memory: `k.transpose(0, 1)` is contiguous), in the
               store's dtype, or int8 codes when the store is quantized; R is the rows held.
    k_scale,   [R, H, bs] float32 per-token scales of int8 codes (None for float storage).
    v_scale
    tables     per sequence, [nb] int64 on the store device: the row of each logical block, -1 for
               blocks the call does not read (never dereferenced).
    partial    True when `tables` may hold -1 (a tiered read): a kernel that maps every entry must clamp.
    """

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    tables: tuple[torch.Tensor, ...]
    partial: bool = False


def runs_of(table: torch.Tensor) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive values of `table` [n]: (first index, first value, length)."""
    breaks = (torch.nonzero(table[1:] != table[:-1] + 1).flatten() + 1).tolist()
    starts, ends = [0] + breaks, breaks + [len(table)]
    return [(a, int(table[a]), b - a) for a, b in zip(starts, ends)]


class AllHot:
    """Every tile in memory, in the row of its block id."""

    tiered = False
    tiers = None

    def __init__(self, store, tensors: dict[str, torch.Tensor]):
        # A weak proxy: the store owns its residency, and a strong reference back would make every store a
        # reference cycle, its K/V freed only when the cycle collector runs (an engine of 2,048 blocks holds
        # 1.7 GB on SmolLM2; notebook 11's smoke built six and peaked at 10 GB)
        self.store, self.t = weakref.proxy(store), tensors

    def writes(self, layer: int, res):
        yield res.touched, 0, res.num_tokens, res.block

    def _layer(self, layer: int, tables, partial=False) -> LayerKV:
        t = self.t
        return LayerKV(t["k"][layer], t["v"][layer], t["k_scale"][layer] if "k_scale" in t else None,
                       t["v_scale"][layer] if "v_scale" in t else None, tables, partial)

    def layer_kv(self, layer: int, seqs, blocks=None) -> LayerKV:
        return self._layer(layer, tuple(self.store.block_table(s) for s in seqs))

    def tiles(self, layer: int, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: t[layer, idx] for name, t in self.t.items()}

    def copy(self, src: int, dst: int) -> None:
        for t in self.t.values():
            t[:, dst] = t[:, src]

    def runs(self, seq, rows: torch.Tensor) -> list[tuple[int, int, int]]:
        return self.store.physical_runs(seq)

    def spill(self, block_ids) -> int:
        return 0

    def prefetch(self, layer: int, block_ids) -> int:
        return 0

    def cold_bytes(self) -> int:
        return 0

    def close(self) -> None:
        pass


class Tiered(AllHot):
    """`hot_blocks` rows per layer in memory, the rest in a checksummed cold file (`storage.tiers`)."""

    tiered = True

    def __init__(self, store, tensors: dict[str, torch.Tensor]):
        super().__init__(store, tensors)
        c = store.config
        if c.device.type != "cpu":
            raise ValueError(f"a cold tier needs a CPU store for now (device={c.device}); set cold_dir=None")
        record = sum(t[0, 0].numel() * t.element_size() for t in tensors.values())
        cold = ColdFile(c.cold_dir, c.num_layers, c.num_blocks, record, direct=c.cold_direct)
        self.tiers = TierTable(tensors, c.num_blocks, c.hot_blocks, cold, c.placement)
        store.pool.on_dead.append(self.tiers.reset)

    def writes(self, layer: int, res):
        """In pieces of at most `hot_blocks` touched blocks: each piece's tiles are made hot and marked dirty; a
        later piece's `acquire` may demote them, which writes them through to the cold file, checksummed."""
        bs, h = self.store.config.block_size, self.store.config.hot_blocks
        first = res.start // bs                                      # logical index of res.touched[0]
        for i in range(0, len(res.touched), h):
            blocks = res.touched[i:i + h]
            lo = max(res.start, (first + i) * bs) - res.start          # this piece's tokens [lo, hi) of the write
            hi = min(res.start + res.num_tokens, (first + i + len(blocks)) * bs) - res.start
            self.tiers.acquire(layer, blocks, unique=True)
            self.tiers.dirty(layer, blocks)
            yield blocks, lo, hi, self.tiers.slot_of[layer][res.block[lo:hi].cpu()].to(res.block.device)

    def layer_kv(self, layer: int, seqs, blocks=None) -> LayerKV:
        """The tiles read are made hot first (promoted from the cold tier, demoting others by the placement
        policy); a set larger than the hot tier is staged in a scratch copy instead. Rows of blocks that are not
        read are -1."""
        store = self.store
        tables = [store.block_table(s).cpu() for s in seqs]
        if blocks is None:
            needed = torch.cat(tables)
        else:
            needed = torch.cat([t[b[b >= 0].cpu()] for t, b in zip(tables, blocks)])
        ids = torch.unique(needed)
        dev = store.config.device
        if self.tiers.acquire(layer, ids.numpy(), unique=True):
            return self._layer(layer, tuple(self.tiers.slot_of[layer][t].to(dev) for t in tables), partial=True)
        parts = self.tiers.stage(layer, ids.numpy())                       # [n, H, ...] in ids order
        lookup = torch.full((store.config.num_blocks,), -1, dtype=torch.long)
        lookup[ids] = torch.arange(len(ids))
        head_major = {n: t.transpose(0, 1).contiguous().transpose(0, 1) for n, t in parts.items()}
        return LayerKV(head_major["k"], head_major["v"], head_major.get("k_scale"), head_major.get("v_scale"),
                       tuple(lookup[t].to(dev) for t in tables), partial=True)

    def tiles(self, layer: int, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Hot tiles are read in place and cold ones from the file; nothing moves between tiers."""
        ids = idx.reshape(-1).cpu()
        slots = self.tiers.slot_of[layer, ids]
        if bool((slots >= 0).all()):
            parts = {name: t[layer, slots] for name, t in self.t.items()}
        else:
            parts = self.tiers.stage(layer, ids.numpy())
        return {name: p.view(*idx.shape, *p.shape[1:]) for name, p in parts.items()}

    def copy(self, src: int, dst: int) -> None:
        for layer in range(self.store.config.num_layers):          # a hot slot for dst, src read where it is
            self.tiers.acquire(layer, [dst])
            self.tiers.copy_tile(layer, src, dst)
            self.tiers.dirty(layer, [dst])

    def runs(self, seq, rows: torch.Tensor) -> list[tuple[int, int, int]]:
        return runs_of(rows)

    def spill(self, block_ids) -> int:
        return sum(self.tiers.demote(layer, block_ids) for layer in range(self.store.config.num_layers))

    def prefetch(self, layer: int, block_ids) -> int:
        return self.tiers.prefetch(layer, block_ids)

    def cold_bytes(self) -> int:
        return self.tiers.cold.file_bytes()

    def close(self) -> None:
        self.tiers.cold.close()


__all__ = ["AllHot", "Tiered", "LayerKV"]
