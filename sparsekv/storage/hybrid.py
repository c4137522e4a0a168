"""A store for models whose attention layers differ in their window: global layers and sliding-window layers.

Gemma 3 has 18 attention layers, 15 of them sliding (a query at position i sees keys j with 0 <= i - j < 512) and
3 global. A global layer needs every block of a sequence; a sliding layer needs only the blocks its window can still
reach, so its memory stays bounded by the window whatever the context. A `HybridStore` keeps one `BlockStore` per
*layer group* (the layers that share a window): each group has its own pool, block tables and tensors, and a sliding
group releases a sequence's blocks as its window moves past them (`BlockTable.release_before`).

Design, and whose it follows:
  * One pool per group, each sized for its own need (SGLang's SWA memory pool keeps full-attention and sliding-window
    K/V apart the same way), rather than vLLM v1's single pool of equal-sized pages shared by every group: here a
    sliding group's pool is `StoreConfig.window_blocks` blocks, far smaller than the global one, and the global
    group's code (routing, summaries, the C++ kernels, a cold tier) needs no change.
  * One block table per group per sequence (vLLM v1's hybrid KV cache manager: a table per KV-cache group), so a
    sequence handle is the global group's `Sequence`, and the store keeps its sliding groups' handles beside it.
  * A prefix hit must be valid for every group (vLLM v1's rule): the global group's blocks for the whole prefix and
    each sliding group's blocks for the prefix's last window (`storage.prefix_cache.HybridPrefixCache`).
  * Summaries are kept for the global group only: only global layers are routed.
  * A cold tier (`StoreConfig.cold_dir`, `hot_blocks`) is the global group's alone: its tiles are the ones a router
    skips, while a sliding group's few blocks are all read at every step, so they stay in memory (`tiers`,
    `prefetch` and `spill` are the global group's).

Layer-keyed calls (`write`, `gather`, `view`, `prefetch`) go to the layer's group with the layer's index there;
sequence calls (`new_sequence`, `fork`, `free`, `reserve`, `trim`) go to every group.

Invariants (tests/test_hybrid.py):
1. Each group's pool keeps the `BlockStore` invariants, separately.
2. After `trim(seq)`, each sliding group holds at most ceil(window / block_size) + 1 blocks of `seq`: exactly those
   that the next query (at position seq.num_tokens) can attend to, and the block the next token goes into.
3. Every read of a layer returns exactly what was written for the positions its window can see.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..core.checks import check_int
from ..core.window import first_visible
from .block_pool import StoreFullError
from .block_table import Sequence
from .store import BlockStore, LayerView, StoreConfig


@dataclass(frozen=True)
class LayerGroup:
    """Store layers that share a window: `window` 0 is global attention; `layers` their indices in the full model."""

    window: int
    layers: tuple[int, ...]


def layer_groups(windows: tuple[int, ...]) -> list[LayerGroup]:
    """Group store layers by window, the global group (window 0) first, then sliding ones by window."""
    order = sorted(set(windows), key=lambda w: (w != 0, w))
    return [LayerGroup(w, tuple(i for i, x in enumerate(windows) if x == w)) for w in order]


@dataclass(frozen=True)
class HybridReservation:
    """A reservation in every group: the global group's (what callers see of it) and each sliding group's."""

    main: object
    parts: tuple

    @property
    def groups(self) -> tuple:
        """The reservation in each layer group (`HybridStore.stores` order): the global group's, then the others'."""
        return (self.main, *self.parts)

    @property
    def start(self) -> int:
        return self.main.start

    @property
    def num_tokens(self) -> int:
        return self.main.num_tokens

    @property
    def seq(self) -> Sequence:
        return self.main.seq


class HybridStore:
    """One `BlockStore` per layer group (see the module docstring). `config` is the whole model's layout (every store
    layer); `windows[l]` is store layer l's window (0: global). There must be global layers: the global group's
    sequences are the handles everyone sees."""

    def __init__(self, config: StoreConfig, windows: tuple[int, ...]):
        if not isinstance(config, StoreConfig):
            raise TypeError(f"config must be a StoreConfig, got {type(config).__name__}")
        c = self.config = config.resolved()
        if len(windows) != c.num_layers:
            raise ValueError(f"windows must list num_layers={c.num_layers} windows, got {len(windows)}")
        self.windows = tuple(int(w) for w in windows)
        self.groups = layer_groups(self.windows)
        if self.groups[0].window != 0:
            raise ValueError("windows: a hybrid store needs at least one global layer (window 0)")
        self.stores: list[BlockStore] = []
        for g in self.groups:
            sub = replace(c, num_layers=len(g.layers), labels=None if c.labels is None else c.labels.subset(g.layers))
            if g.window:                        # sliding: its own small pool, no routing summaries, no cold tier
                sub = replace(sub, num_blocks=c.window_blocks or c.num_blocks, summaries=(), labels=None,
                              cold_dir=None, hot_blocks=None)
            try:
                self.stores.append(BlockStore(sub))
            except BaseException:
                self.close()                    # a group's cold file already made is not left behind
                raise
        self._where = {layer: (gi, j) for gi, g in enumerate(self.groups) for j, layer in enumerate(g.layers)}
        self.group_windows = tuple(g.window for g in self.groups)
        self.main = self.stores[0]
        self._parts: dict[int, list[Sequence]] = {}           # main seq id -> its handles in the sliding groups

    # -- what callers of a BlockStore read --------------------------------------------------------
    pool = property(lambda self: self.main.pool)
    table = property(lambda self: self.main.table)
    workspace = property(lambda self: self.main.workspace)
    quantized = property(lambda self: self.main.quantized)
    tiers = property(lambda self: self.main.tiers)      # the global group's cold tier, or None
    num_free_blocks = property(lambda self: self.main.num_free_blocks)
    sequences = property(lambda self: self.main.sequences)

    def check_seq(self, seq, name: str = "seq") -> None:
        self.main.check_seq(seq, name)

    def block_table(self, seq: Sequence) -> torch.Tensor:
        return self.main.block_table(seq)

    def parts(self, seq: Sequence) -> list[Sequence]:
        """`seq`'s handle in every group, the global group's (itself) first."""
        self.check_seq(seq)
        return [seq] + self._parts[seq.seq_id]

    def group_of(self, layer: int) -> tuple[int, int]:
        """(group index, the layer's index in its group's store) of store layer `layer`."""
        check_int("layer", layer, lo=0, hi=self.config.num_layers - 1)
        return self._where[layer]

    def view(self, seq: Sequence, layer: int) -> LayerView:
        gi, j = self.group_of(layer)
        return LayerView(self.stores[gi], self.parts(seq)[gi], j, self.groups[gi].window)

    # -- sequences --------------------------------------------------------------------------------
    def new_sequence(self) -> Sequence:
        seq = self.main.new_sequence()
        self._parts[seq.seq_id] = [s.new_sequence() for s in self.stores[1:]]
        return seq

    def fork(self, seq: Sequence) -> Sequence:
        parts = self.parts(seq)
        child = self.main.fork(seq)
        self._parts[child.seq_id] = [s.fork(p) for s, p in zip(self.stores[1:], parts[1:])]
        return child

    def free(self, seq: Sequence) -> list[int]:
        parts = self.parts(seq)
        for s, p in zip(self.stores[1:], parts[1:]):
            s.free(p)
        del self._parts[seq.seq_id]
        return self.main.free(seq)

    def attach(self, seq: Sequence, block_ids: list[int], window_blocks: list[list[int]], released: list[int]) -> None:
        """Start empty `seq` on cached blocks: the global group's `block_ids`, and in each sliding group the blocks of
        the prefix's last window (`window_blocks[g]`) after `released[g]` blocks it starts without."""
        parts = self.parts(seq)
        self.main.attach(seq, block_ids)
        for s, p, ids, r in zip(self.stores[1:], parts[1:], window_blocks, released):
            s.table.attach(p, ids, released=r)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks the global group would allocate (what a scheduler's admission counts against `num_free_blocks`)."""
        return self.main.blocks_needed(seq, num_tokens)

    def check_room(self, seqs: list[Sequence], num_tokens: int) -> None:
        """StoreFullError unless `num_tokens` more tokens for each of `seqs` fit every group (changes nothing)."""
        for gi, s in enumerate(self.stores):
            s.check_room([self.parts(q)[gi] for q in seqs], num_tokens)

    def reserve(self, seq: Sequence, num_tokens: int) -> HybridReservation:
        """Slots for `num_tokens` new tokens in every group. In a sliding group, the blocks no query of these tokens
        can reach (all of them before token start - window + 1) are released first."""
        parts = self.parts(seq)
        self.check_room([seq], num_tokens)
        start = seq.num_tokens
        for g, s, p in zip(self.groups[1:], self.stores[1:], parts[1:]):
            s.table.release_before(p, first_visible(start, g.window) // s.config.block_size)
        return HybridReservation(self.main.reserve(seq, num_tokens),
                                 tuple(s.reserve(p, num_tokens) for s, p in zip(self.stores[1:], parts[1:])))

    def trim(self, seq: Sequence) -> int:
        """Release every sliding group's blocks that no later query of `seq` can reach (invariant 2); returns them."""
        parts, n = self.parts(seq), 0
        for g, s, p in zip(self.groups[1:], self.stores[1:], parts[1:]):
            n += len(s.table.release_before(p, first_visible(seq.num_tokens, g.window) // s.config.block_size))
        return n

    def held_blocks(self, seq: Sequence) -> list[int]:
        """Blocks `seq` holds in each group (the global group first)."""
        return [len(p.held) for p in self.parts(seq)]

    # -- layer-keyed ------------------------------------------------------------------------------
    def write(self, res: HybridReservation, layer: int, k: torch.Tensor, v: torch.Tensor, check_finite: bool = True):
        gi, j = self.group_of(layer)
        self.stores[gi].write(res.main if gi == 0 else res.parts[gi - 1], j, k, v, check_finite)

    def append(self, seq: Sequence, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append T tokens to every layer at once; k, v: [num_layers, T, num_kv_heads, head_dim]."""
        res = self.reserve(seq, k.shape[1])
        for layer in range(self.config.num_layers):
            self.write(res, layer, k[layer], v[layer])

    def gather(self, seq: Sequence, layer: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        v = self.view(seq, layer)
        return v.store.gather(v.seq, v.layer, start)

    def prefetch(self, layer: int, block_ids) -> int:
        """Read `block_ids` of store layer `layer` ahead from the cold tier (a global layer's; a sliding layer has no
        cold tier: 0)."""
        gi, j = self.group_of(layer)
        return self.main.prefetch(j, block_ids) if gi == 0 else 0

    def spill(self, block_ids) -> int:
        """Move the global group's hot tiles of `block_ids` to its cold tier (`BlockStore.spill`)."""
        return self.main.spill(block_ids)

    def cold_bytes(self) -> int:
        return self.main.cold_bytes()

    # -- bytes ------------------------------------------------------------------------------------
    def kv_bytes(self) -> int:
        return sum(s.kv_bytes() for s in self.stores)

    def summary_bytes(self) -> int:
        return sum(s.summary_bytes() for s in self.stores)

    def sequence_bytes(self, seq: Sequence) -> int:
        """What every group holds for `seq`: the global group's blocks, and each sliding group's held ones."""
        return sum(s.sequence_bytes(p) for s, p in zip(self.stores, self.parts(seq)))

    def close(self) -> None:
        for s in self.stores:
            s.close()


def make_store(config: StoreConfig, windows: tuple[int, ...] | None = None):
    """The store for layers with these windows: a `BlockStore` when every layer is global, else a `HybridStore`."""
    if windows is None or not any(windows):
        return BlockStore(config)
    return HybridStore(config, windows)


__all__ = ["HybridStore", "HybridReservation", "LayerGroup", "layer_groups", "make_store", "StoreFullError"]
