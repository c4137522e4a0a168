"""The paged GQA block store: lossless K/V in physical blocks, with per-block key summaries.

Physical layout, per layer (one contiguous slab per (layer, block, kv head)):

    K, V      : [num_layers, num_blocks, num_kv_heads, block_size, head_dim]   config.dtype
                (stored head-major: `k[l].transpose(0, 1)` is a contiguous
                [num_kv_heads, num_blocks, block_size, head_dim] tensor per layer)
    kmin/kmax : [num_layers, num_blocks, num_kv_heads, head_dim]               config.dtype
    kmean     : [num_layers, num_blocks, num_kv_heads, head_dim]               config.dtype
                (min/max/mean are stored head-major: `kmax[l].transpose(0, 1)` is a
                contiguous [num_kv_heads, num_blocks, head_dim] matrix per layer)
    krepr     : [num_layers, num_blocks, num_kv_heads, repr_keys, head_dim]    config.dtype
    (the summaries are the registry `storage.summaries`; `config.summaries` names those kept)

A selected block of one kv head is therefore a single `block_size * head_dim` run of
memory, which is what a gather or a kernel wants to read. The summaries are what the
routers score against (Quest's min/max bound, MoBA's mean, InfLLM-style representatives);
they are kept exact on every write, including the partial last block.

Writing is two-phase, as a model writes: `reserve(seq, T)` claims slots for T new tokens
(allocating and copying-on-write as needed), then `write(reservation, layer, k, v)` fills
one layer. `append(seq, k, v)` does both for all layers at once.

The store is three parts, each bound once here (`BlockStore.__init__`), never chosen per call:
    table      `storage.block_table.BlockTable`: sequences, blocks, ref counts, copy-on-write bookkeeping (no tensors)
    codec      `storage.codec`: K/V as floats, or int8 codes with per-token scales (`kv_bits`)
    residency  `storage.residency`: every tile in memory, or a hot tier over a cold file (`cold_dir`)
plus the summaries (`storage.summaries`), which stay in memory for every block.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..core.checks import check_choice, check_int, check_tensor
from ..core.workspace import Workspace
from .block_pool import StoreFullError
from .block_table import BlockTable, Sequence, Slots
from .codec import CODECS, SCALE_BYTES, quantize_int8
from .cold import ColdBlockError
from .placement import PLACEMENTS
from .residency import AllHot, LayerKV, Tiered, runs_of
from .summaries import DEFAULT_SUMMARIES, SUMMARIES, LabelChannels, Tiles, cast, make_summary

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _float_dtype(name: str, value) -> torch.dtype:
    """A floating torch.dtype from a dtype or one of the names in _DTYPES (ValueError/TypeError naming `name`)."""
    if isinstance(value, str):
        if value not in _DTYPES:
            raise ValueError(f"{name} must be one of {sorted(_DTYPES)}, got {value!r}")
        value = _DTYPES[value]
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(f"{name} must be a floating torch.dtype, got {value!r}")
    return value


@dataclass
class StoreConfig:
    """The store's layout: the model's geometry (num_layers, num_kv_heads, head_dim: 0 in a template that an
    `Engine` fills from its model) and the cache's choices (block size, pool, dtypes, summaries, a cold tier).

    `dtype` None is "the model's" in an Engine, float32 for a store built alone (`resolved`).
    """

    num_layers: int = 0      # transformer layers whose K/V live in the store (0: from the model)
    num_kv_heads: int = 0    # KV heads (GQA groups); query heads are a multiple of this (0: from the model)
    head_dim: int = 0        # channels per head (0: from the model)
    block_size: int = 64     # tokens per physical block; a power of two (kernels tile by it)
    num_blocks: int = 1024   # physical blocks in the pool, shared by all layers and sequences
    dtype: torch.dtype | str | None = torch.float32   # storage dtype of K, V and the summaries (None: the model's)
    device: torch.device | str = "cpu"
    repr_keys: int = 4       # representative keys kept per block for the `repr` scorer (0: none)
    summaries: tuple[str, ...] = DEFAULT_SUMMARIES   # per-block summaries kept (names in `SUMMARIES`)
    kv_bits: int = 0         # 0: K/V stored in `dtype`; 8 / 4: int8 / int4 codes, one float32 scale per (token, kv head)
    summary_dtype: torch.dtype | str | None = None   # summaries' dtype (None: `dtype`); bf16 halves routing bytes,
                                                     # with min rounded down and max rounded up (bounds stay safe)
    cold_dir: str | os.PathLike | None = None   # a cold tier: K/V tiles beyond the hot ones live in a file here
    hot_blocks: int | None = None    # with cold_dir: K/V slots per layer in memory (None: num_blocks, all can be hot)
    placement: str = "lru"           # which hot tiles are demoted first (`storage.placement`)
    cold_direct: bool = True         # open the cold file with O_DIRECT where the file system allows it
    window_blocks: int | None = None # a hybrid model's sliding-window groups: blocks in each one's pool (None:
                                     #   num_blocks); a sequence holds about window / block_size + 1 of them
    labels: LabelChannels | None = None   # calibrated label channels for the `klabel` summary (Double Sparsity)

    def __post_init__(self):
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            check_int(name, getattr(self, name), lo=0)
        for name in ("block_size", "num_blocks"):
            check_int(name, getattr(self, name), lo=1)
        check_int("repr_keys", self.repr_keys, lo=0)
        if self.kv_bits not in (0, 8, 4) or isinstance(self.kv_bits, bool):
            raise ValueError(f"kv_bits must be 0 (K/V in dtype), 8 or 4 (int8 / int4 codes with per-token scales), "
                             f"got {self.kv_bits!r}")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        self.dtype = None if self.dtype is None else _float_dtype("dtype", self.dtype)
        self.device = torch.device(self.device)
        if self.summary_dtype is not None or self.dtype is not None:
            self.summary_dtype = _float_dtype("summary_dtype", self.dtype if self.summary_dtype is None else self.summary_dtype)
        self.repr_keys = min(self.repr_keys, self.block_size)
        if isinstance(self.summaries, str) or not all(isinstance(n, str) for n in self.summaries):
            raise TypeError(f"summaries must be a tuple of summary names, got {self.summaries!r}")
        self.summaries = tuple(self.summaries)
        if self.cold_dir is None:
            if self.hot_blocks is not None:
                raise ValueError("hot_blocks needs a cold tier: set cold_dir to a directory for the cold file")
        else:
            if not isinstance(self.cold_dir, (str, os.PathLike)):
                raise TypeError(f"cold_dir must be a path (str or os.PathLike), got {type(self.cold_dir).__name__}")
            if not os.path.isdir(self.cold_dir):
                raise ValueError(f"cold_dir must be an existing directory, got {str(self.cold_dir)!r}")
            if not os.access(self.cold_dir, os.W_OK | os.X_OK):
                raise ValueError(f"cold_dir must be writable, and {str(self.cold_dir)!r} is not")
            self.hot_blocks = self.num_blocks if self.hot_blocks is None else self.hot_blocks
            check_int("hot_blocks", self.hot_blocks, lo=1, hi=self.num_blocks)
        if self.window_blocks is not None:
            check_int("window_blocks", self.window_blocks, lo=2)
        check_choice("placement", self.placement, PLACEMENTS)
        unknown = [n for n in self.summaries if n not in SUMMARIES]
        if unknown or len(set(self.summaries)) != len(self.summaries):
            raise ValueError(f"summaries must be distinct names from {sorted(SUMMARIES)}, got {self.summaries!r}")
        if self.labels is not None and not isinstance(self.labels, LabelChannels):
            raise TypeError(f"labels must be a LabelChannels (analysis.calibrate.load_labels), got "
                            f"{type(self.labels).__name__}")
        if "klabel" in self.summaries and self.labels is None:
            raise ValueError("summaries: 'klabel' needs labels=LabelChannels(...) (python -m sparsekv calibrate)")
        if self.labels is not None and self.complete:
            self.labels.check(self.num_layers, self.num_kv_heads, self.head_dim, self.block_size)

    # -- templates ----------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """Whether the geometry is set (a template's is 0 until an Engine fills it from its model)."""
        return min(self.num_layers, self.num_kv_heads, self.head_dim) >= 1

    def for_model(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> "StoreConfig":
        """This layout for a model's geometry: the three sizes replaced, and `dtype` the model's where it is None."""
        from dataclasses import replace
        return replace(self, num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       dtype=dtype if self.dtype is None else self.dtype)

    def resolved(self) -> "StoreConfig":
        """A complete config for a `BlockStore`: ValueError if the geometry is unset; dtype None becomes float32."""
        if not self.complete:
            raise ValueError(f"StoreConfig needs the model's geometry: num_layers, num_kv_heads and head_dim must be "
                             f">= 1, got {self.num_layers}, {self.num_kv_heads}, {self.head_dim} (an Engine fills them "
                             "from its model; a store built alone needs them given)")
        if self.dtype is None:
            from dataclasses import replace
            return replace(self, dtype=torch.float32)
        return self

    # -- derived sizes (bytes) ----------------------------------------------------------
    @property
    def tiered(self) -> bool:
        """True when K/V tiles can live in a cold tier (`cold_dir` set)."""
        return self.cold_dir is not None

    @property
    def kv_rows(self) -> int:
        """Tiles per layer the in-memory K/V tensors hold: `hot_blocks` with a cold tier, else `num_blocks`."""
        return self.hot_blocks if self.tiered else self.num_blocks

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype or torch.float32).element_size()

    @property
    def summary_itemsize(self) -> int:
        return torch.empty((), dtype=self.summary_dtype or torch.float32).element_size()

    @property
    def kv_itemsize(self) -> int:
        """Bytes per stored K or V element in memory (1 for int8 codes, and for int4 codes in their int8 containers)."""
        return 1 if self.kv_bits else self.itemsize

    @property
    def kv_row_bytes(self) -> int:
        """Bytes one token's K (or V) occupies in one kv head as stored: the stored width, scales included (int4:
        packed nibbles, `codec.Int4Codec.row_bytes`)."""
        if self.kv_bits == 4:
            return -(-self.head_dim // 2) + SCALE_BYTES
        return self.head_dim * self.kv_itemsize + (SCALE_BYTES if self.kv_bits == 8 else 0)


@dataclass(frozen=True)
class LayerView:
    """Where one layer of one sequence lives (`BlockStore.view`, `HybridStore.view`): the store holding that layer's
    group, the sequence's handle there, the layer's index in it, and its window (0: global attention)."""

    store: "BlockStore"
    seq: Sequence
    layer: int
    window: int


@dataclass(frozen=True)
class Reservation:
    """Slots claimed for `num_tokens` new tokens of `seq`, starting at token `start`.

    `block` and `offset` ([num_tokens] LongTensors) give each new token's physical block and
    its row inside that block; `touched` lists the physical blocks written, in order.
    """

    seq: Sequence
    start: int
    num_tokens: int
    block: torch.Tensor
    offset: torch.Tensor
    touched: tuple[int, ...]

    @property
    def groups(self) -> tuple["Reservation", ...]:
        """The reservation in each layer group (`LayerGroups.stores` order): this one."""
        return (self,)


@runtime_checkable
class LayerGroups(Protocol):
    """A store as layer groups: what the decode plan and the fused step ask of a store, so that neither tests which
    kind it is. `BlockStore` is one group of global layers; `storage.hybrid.HybridStore` a global group and one
    group per sliding window. Group 0 is the one whose tables and reservations callers see (`main`).

    1. `stores[gi]` is group gi's BlockStore, `group_windows[gi]` its window (0: global).
    2. `parts(seq)[gi]` is `seq`'s handle in group gi; `group_of(layer)` is (gi, the layer's index in stores[gi]).
    3. A reservation of the store (`reserve`) has `groups[gi]`, its slots in group gi.
    4. `trim(seq)` releases what no later query of `seq` can reach (nothing, for global layers).
    """

    stores: list
    group_windows: tuple

    def parts(self, seq: Sequence) -> list[Sequence]: ...

    def group_of(self, layer: int) -> tuple[int, int]: ...

    def view(self, seq: Sequence, layer: int) -> "LayerView": ...

    def trim(self, seq: Sequence) -> int: ...


_LAYER_GROUP_CLASSES: set[type] = set()       # classes whose instances passed `check_layer_groups`


def check_layer_groups(store, name: str = "store") -> None:
    """TypeError unless `store` is a `LayerGroups` (a BlockStore or a HybridStore). The protocol check costs ~10 us
    in Python 3.11 (it walks the protocol's members); it runs once per class, later calls are a set lookup (the
    decode plan asks every step)."""
    cls = type(store)
    if cls not in _LAYER_GROUP_CLASSES:
        if not isinstance(store, LayerGroups):
            raise TypeError(f"{name} must be a BlockStore or a HybridStore, got {cls.__name__}")
        _LAYER_GROUP_CLASSES.add(cls)


class BlockStore:
    """Owns K and V for all layers in physical blocks, shared between sequences.

    Invariants:
    1. A block's ref count equals the number of live sequences whose table holds it; a block
       with ref count 0 is in the pool's free queue (`num_free_blocks + used == num_blocks`).
    2. Storage is lossless: `gather` returns exactly the values written, in `config.dtype`.
    3. `fork(seq)` shares every block of `seq` (ref counts + 1); nothing is copied.
    4. Copy-on-write: a block is written only while its ref count is 1. Appending to a
       sequence whose partial last block is shared first copies that block (all layers and
       summaries) into a fresh block; the other holders keep the original untouched.
    5. Full blocks are append-only: once a block holds `block_size` tokens it is never
       written again, so sharing a full block never needs a copy.
    6. `free(seq)` drops one reference from each block of `seq`; blocks reaching zero return
       to the free queue in logical order (or stay cached, evictable, when a prefix cache
       holds them). The handle is dead afterwards.
    7. Rejected calls change nothing: every argument is checked, and every block that will be
       needed is counted against the free pool, before any state is touched. Running out
       raises `StoreFullError(needed, free)`.
    8. Summaries (those named in `config.summaries`, from the `storage.summaries` registry) of
       every written block equal those computed from its valid tokens, per layer and kv head,
       after every write.
    9. With a cold tier (`config.cold_dir`), each (layer, block) tile is empty, hot or cold, never
       two at once (`storage.tiers`); every read returns exactly what was written, whichever tier
       served it, and a cold tile that fails its checksum raises `ColdBlockError` and is never served.
       Summaries and the block table are always in memory. Block ids are what sequences, the prefix
       cache and routers see; where a tile sits is the store's business (`layer_kv`).
    Invariants 1, 3-7 are the block table's (`storage.block_table`); the store keeps its tensors in step.
    """

    def __init__(self, config: StoreConfig):
        if not isinstance(config, StoreConfig):
            raise TypeError(f"config must be a StoreConfig, got {type(config).__name__}")
        c = self.config = config.resolved()
        self.table = BlockTable(c.block_size, c.num_blocks)
        self.pool = self.table.pool
        self.codec = CODECS[c.kv_bits]()
        # K/V have the documented shape [L, NB, H, bs, D] (NB = hot_blocks with a cold tier) but live
        # head-major in memory ([L, H, NB, bs, D] contiguous): every tile is one contiguous bs x D slab, and a run of
        # consecutive physical blocks of one kv head is one contiguous [n * bs, D] matrix, which
        # dense decode multiplies without copying. int8 adds a scale per (token, kv head), [L, NB, H, bs].
        self._kv = self.codec.allocate(c, c.kv_rows)
        self.k, self.v = self._kv["k"], self._kv["v"]
        self.k_scale, self.v_scale = self._kv.get("k_scale"), self._kv.get("v_scale")
        # Each summary allocates its own storage (`storage.summaries`: [L, NB, H, *extra, D]); summaries
        # are indexed by block id and never leave memory, so routing never waits for the cold tier.
        self._summaries = {n: make_summary(n) for n in c.summaries}
        self._summary_data = {n: s.allocate(c) for n, s in self._summaries.items()}
        # one-token writes of float K/V extend the summaries in place when every one has an exact rule for it
        self._extend = not self.codec.quantized and all(s.incremental for s in self._summaries.values())
        self.residency = (Tiered if c.tiered else AllHot)(self, self._kv)
        self.tiers = self.residency.tiers         # the cold tier's TierTable, or None
        self.workspace = Workspace(c.device)     # scratch for the decode fast path

    # -- sequences (the block table's) ------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.table.num_free_blocks

    @property
    def sequences(self) -> list[Sequence]:
        """Live sequences, oldest first."""
        return self.table.sequences

    @property
    def _fill(self) -> list[int]:
        return self.table.fill

    def new_sequence(self) -> Sequence:
        return self.table.new_sequence()

    def attach(self, seq: Sequence, block_ids: list[int]) -> None:
        """Start an empty `seq` on existing full blocks (a prefix-cache hit), shared by ref count."""
        self.table.attach(seq, block_ids)

    def fork(self, seq: Sequence) -> Sequence:
        """A new sequence sharing every block of `seq` (invariant 3)."""
        return self.table.fork(seq)

    def free(self, seq: Sequence) -> list[int]:
        """Release `seq` (invariant 6); returns the physical blocks that became free."""
        return self.table.free(seq)

    def check_seq(self, seq, name: str = "seq") -> None:
        """Raise TypeError/ValueError unless `seq` is a live sequence of this store."""
        self.table.check_seq(seq, name)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks that reserving `num_tokens` more tokens for `seq` would allocate."""
        return self.table.blocks_needed(seq, num_tokens)

    def block_table(self, seq: Sequence) -> torch.Tensor:
        """Physical block ids of `seq` in logical order, a [num_blocks] LongTensor on the store device.

        Cached per sequence until its blocks change; treat it as read-only.
        """
        self.check_seq(seq)
        key = ("table", len(seq._blocks), seq._blocks[-1] if seq._blocks else -1, seq.released)
        if seq._cache.get("table_key") != key:
            seq._cache.clear()
            seq._cache["table_key"] = key
            seq._cache["table"] = torch.tensor(seq._blocks, dtype=torch.long, device=self.config.device)
        return seq._cache["table"]

    def physical_runs(self, seq: Sequence) -> list[tuple[int, int, int]]:
        """Maximal runs of consecutive physical ids: (first logical block, first physical id, length).

        A freshly allocated sequence is usually one run; fragmentation (frees, forks,
        copy-on-write) splits it. Cached with the block table.
        """
        table = self.block_table(seq)
        if "runs" not in seq._cache:
            seq._cache["runs"] = runs_of(table)
        return seq._cache["runs"]

    # -- the layer-group interface (`LayerGroups`: a store is one group of global layers; see storage.hybrid) -------
    windows = property(lambda self: (0,) * self.config.num_layers, doc="each layer's window (0: global)")
    stores = property(lambda self: [self], doc="the store of each layer group: this one")
    group_windows = (0,)                      # each group's window

    def parts(self, seq: Sequence) -> list[Sequence]:
        """`seq`'s handle in each layer group: itself."""
        return [seq]

    def group_of(self, layer: int) -> tuple[int, int]:
        """(group, the layer's index in its group's store): (0, layer)."""
        return 0, layer

    def view(self, seq: Sequence, layer: int) -> "LayerView":
        """Where `layer` of `seq` lives: this store, `seq` and `layer` themselves, with no window."""
        return LayerView(self, seq, layer, 0)

    def trim(self, seq: Sequence) -> int:
        """Release what no later query of `seq` can attend to: nothing, in a store of global layers."""
        return 0

    def check_room(self, seqs: list[Sequence], num_tokens: int) -> None:
        """StoreFullError unless `num_tokens` more tokens for each of `seqs` fit the pool (changes nothing)."""
        needed = sum(self.table.blocks_needed(s, num_tokens) for s in seqs)
        if needed > self.table.num_free_blocks:
            raise StoreFullError(needed, self.table.num_free_blocks,
                                 what=f"{num_tokens} more token(s) for {len(seqs)} sequence(s)")

    # -- writing ------------------------------------------------------------------------
    def reserve(self, seq: Sequence, num_tokens: int) -> Reservation:
        """Claim slots for `num_tokens` new tokens; fill them with `write`, layer by layer."""
        slots = self.table.reserve(seq, num_tokens)        # checks, allocates and counts (or raises, changing nothing)
        if slots.copy is not None:                         # copy-on-write of the shared partial last block
            src, dst = slots.copy
            self.residency.copy(src, dst)
            for t in self._summary_data.values():
                t[:, dst] = t[:, src]
        return self._layout(slots)

    def write(self, res: Reservation, layer: int, k: torch.Tensor, v: torch.Tensor, check_finite: bool = True) -> None:
        """Write one layer's K/V, each [res.num_tokens, num_kv_heads, head_dim], into reserved slots.

        check_finite: reject NaN/inf before writing (one host read per tensor). The model's decode
        path passes False: its K/V come from its own projections, checked in shape and dtype here,
        and a NaN there is a model fault that its logits show.
        """
        if not isinstance(res, Reservation):
            raise TypeError(f"res must be a Reservation from reserve(), got {type(res).__name__}")
        self.check_seq(res.seq, name="res.seq")
        c = self.config
        check_int("layer", layer, lo=0, hi=c.num_layers - 1)
        shape = (res.num_tokens, c.num_kv_heads, c.head_dim)
        check_tensor("k", k, shape, c.dtype, c.device, finite=check_finite)
        check_tensor("v", v, shape, c.dtype, c.device, finite=check_finite)
        self._write(res, layer, k, v)

    def append(self, seq: Sequence, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append T tokens to every layer at once; k, v: [num_layers, T, num_kv_heads, head_dim]."""
        self.check_seq(seq)
        c = self.config
        shape = (c.num_layers, None, c.num_kv_heads, c.head_dim)
        check_tensor("k", k, shape, c.dtype, c.device, finite=True)
        check_tensor("v", v, (c.num_layers, k.shape[1], c.num_kv_heads, c.head_dim), c.dtype, c.device, finite=True)
        if k.shape[1] == 0:
            raise ValueError("k must hold at least one token (axis 1 is empty)")
        res = self.reserve(seq, k.shape[1])
        for layer in range(c.num_layers):
            self._write(res, layer, k[layer], v[layer])

    # -- reading ------------------------------------------------------------------------
    def gather(self, seq: Sequence, layer: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of tokens [start, num_tokens) of `seq` in one layer, each [num_tokens - start, num_kv_heads,
        head_dim] in `config.dtype` (a copy). `start` must not reach into blocks a sliding window released."""
        self.check_seq(seq)
        c = self.config
        check_int("layer", layer, lo=0, hi=c.num_layers - 1)
        check_int("start", start, lo=seq.released * c.block_size, hi=max(0, seq.num_tokens - 1))
        first = start // c.block_size
        kv = self.layer_kv(layer, [seq])
        rows = kv.tables[0][first:]

        def _one(codes, scale):  # [n, H, bs, D] -> [n * bs, H, D] -> the rows of tokens [start, num_tokens)
            t = self.codec.values(codes[rows], None if scale is None else scale[rows], c.dtype)
            return t.transpose(1, 2).reshape(-1, c.num_kv_heads, c.head_dim)[start - first * c.block_size:
                                                                                seq.num_tokens - first * c.block_size]

        return _one(kv.k, kv.k_scale), _one(kv.v, kv.v_scale)

    @property
    def quantized(self) -> bool:
        """True when K/V are int8 codes with per-token scales (`config.kv_bits == 8`)."""
        return self.codec.quantized

    def tiles(self, which: str, layer: int, idx: torch.Tensor) -> torch.Tensor:
        """K or V tiles of physical blocks `idx` in `layer`, [*idx.shape, H, bs, D] in `config.dtype` (dequantised
        when int8). With a cold tier, hot tiles are read in place and cold ones from the file; nothing moves."""
        if which not in ("k", "v"):
            raise ValueError(f"which must be 'k' or 'v', got {which!r}")
        parts = self.residency.tiles(layer, idx)
        return self.codec.values(parts[which], parts.get(f"{which}_scale"), self.config.dtype)

    def layer_kv(self, layer: int, seqs: list[Sequence], blocks: list[torch.Tensor] | None = None) -> LayerKV:
        """K/V of `layer` as attention reads them, with each sequence's logical blocks mapped to rows.

        blocks: None (every block of every sequence is read) or one selection [H, K] of logical block
        indices per sequence, padded with -1. Without a cold tier this is the store's tensors and block
        tables, unchanged. With one, the tiles read are made hot first (promoted from the cold tier,
        demoting others by the placement policy); a set larger than the hot tier is staged in a scratch
        copy instead. Rows of blocks that are not read are -1 in `tables`.
        """
        return self.residency.layer_kv(layer, seqs, blocks)

    def runs(self, seq: Sequence, rows: torch.Tensor) -> list[tuple[int, int, int]]:
        """Maximal runs of consecutive rows of `seq`'s blocks: (first logical block, first row, length).

        `rows` is a table from `layer_kv`; without a cold tier it is the block table, and the cached
        `physical_runs` are returned.
        """
        return self.residency.runs(seq, rows)

    # -- bytes --------------------------------------------------------------------------
    def kv_bytes(self) -> int:
        """Bytes of the in-memory K and V pools (all layers; with a cold tier, its hot slots only), int8 scales included.
        The cold tier's bytes on disk are `cold_bytes()`."""
        return sum(t.numel() * t.element_size() for t in self._kv.values())

    def sequence_bytes(self, seq: Sequence) -> int:
        """Bytes the store holds for `seq`: its blocks' K/V (and scales) and summaries, all layers.

        Whole blocks: a partial last block holds its full tile. Shared blocks count in full for each
        sequence that holds them; blocks a sliding window released are not held.
        """
        self.check_seq(seq)
        return (seq.num_blocks - seq.released) * sum(self.block_bytes())

    def block_bytes(self) -> tuple[int, int]:
        """(K/V bytes, summary bytes) of one physical block across all layers, as allocated (int8 codes with
        their scales; every summary the store keeps)."""
        per = lambda ts: sum(t[:, 0].numel() * t.element_size() for t in ts)      # axis 1 is the block
        return per(self._kv.values()), per(self._summary_data.values())

    def summary_bytes(self) -> int:
        """Bytes of all per-block summaries the store keeps, reported apart from KV."""
        return sum(t.numel() * t.element_size() for t in self._summary_data.values())

    # -- the cold tier ------------------------------------------------------------------
    def spill(self, block_ids) -> int:
        """Move every layer's hot tiles of `block_ids` to the cold tier (they stay readable, exactly).
        Returns the tiles moved. A no-op (0) without a cold tier."""
        ids = [int(b) for b in block_ids]
        for b in ids:
            check_int("block_ids[i]", b, lo=0, hi=self.config.num_blocks - 1)
        return self.residency.spill(ids)

    def prefetch(self, layer: int, block_ids) -> int:
        """Start background reads of the cold tiles of `block_ids` in `layer` (a prediction of the next
        reads); returns reads started. A no-op (0) without a cold tier."""
        check_int("layer", layer, lo=0, hi=self.config.num_layers - 1)
        return self.residency.prefetch(layer, [int(b) for b in block_ids])

    def cold_bytes(self) -> int:
        """Bytes the cold file occupies on disk (0 without a cold tier)."""
        return self.residency.cold_bytes()

    def close(self) -> None:
        """Delete the cold file and stop its reader thread (idempotent; also done when the store is collected)."""
        self.residency.close()

    def __enter__(self) -> "BlockStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- summaries ----------------------------------------------------------------------
    def summary(self, name: str) -> torch.Tensor:
        """The summary `name` for every (layer, block, kv head): [L, NB, H, *extra, D] in `config.dtype`.

        Read-only for callers; ValueError if this store does not keep it (`StoreConfig.summaries`).
        """
        if name not in self._summary_data:
            raise ValueError(f"this store keeps no {name!r} summary; StoreConfig.summaries is "
                             f"{self.config.summaries!r} (add {name!r} to read it)")
        return self._summary_data[name]

    kmin = property(lambda self: self.summary("kmin"), doc="[L, NB, H, D] channel-wise key minimum per tile.")
    kmax = property(lambda self: self.summary("kmax"), doc="[L, NB, H, D] channel-wise key maximum per tile.")
    kmean = property(lambda self: self.summary("kmean"), doc="[L, NB, H, D] mean key per tile.")
    krepr = property(lambda self: self.summary("krepr"), doc="[L, NB, H, r, D] representative keys per tile.")

    def check_decode_query(self, q, seq, layer: int) -> None:
        """Validate one decode query q [Hq, D] against `seq` at `layer` (Hq a multiple of the kv heads).

        The one check a decode step needs; `attention.plan` runs it once per step, and every
        public entry point that reads the cache for a query runs it before touching anything.
        """
        c = self.config
        self.check_seq(seq)
        check_int("layer", layer, lo=0, hi=c.num_layers - 1)
        check_tensor("q", q, (None, c.head_dim), device=c.device, finite=True)
        if not q.dtype.is_floating_point:
            raise TypeError(f"q must be a floating tensor, got {q.dtype}")
        if q.shape[0] % c.num_kv_heads:
            raise ValueError(f"q must have a multiple of num_kv_heads={c.num_kv_heads} heads, got {q.shape[0]}")
        if seq.num_tokens == 0:
            raise ValueError("seq holds no tokens; append K/V before attending")

    # -- internals ----------------------------------------------------------------------
    def _layout(self, slots: Slots) -> Reservation:
        """Each new token's physical block and row in it, as tensors on the store device."""
        bs = self.config.block_size
        pos = torch.arange(slots.start, slots.start + slots.num_tokens)
        table = torch.tensor(slots.seq._blocks, dtype=torch.long)
        block, offset = table[pos // bs], pos % bs
        dev = self.config.device
        return Reservation(slots.seq, slots.start, slots.num_tokens, block.to(dev), offset.to(dev), slots.touched)

    def _write(self, res: Reservation, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for blocks, lo, hi, rows in self.residency.writes(layer, res):
            self.codec.write(self._kv, layer, rows, res.offset[lo:hi], k[lo:hi], v[lo:hi])
            if hi - lo == 1 and self._extend:
                self._extend_summaries(layer, int(blocks[0]), k[lo])
            else:
                self._refresh_summaries(layer, list(blocks))

    def _extend_summaries(self, layer: int, block: int, row: torch.Tensor) -> None:
        """The summaries of `block` after one row [H, D] (as stored) was appended to it: each summary's exact
        incremental rule (`Summary.extend`), equal to recomputing them from the block's rows (invariant 8)."""
        first = self.table.fill[block] == 1
        dtype = self.config.summary_dtype
        for name, summary in self._summaries.items():
            data = self._summary_data[name]
            data[layer, block] = cast(summary.extend(data[layer, block], row.float(), first), dtype, summary.rounding)

    def _refresh_summaries(self, layer: int, blocks: list[int]) -> None:
        """Recompute the summaries of `blocks` in `layer` from their valid rows (invariant 8)."""
        if not self._summaries:
            return
        c = self.config
        idx = torch.tensor(blocks, dtype=torch.long, device=c.device)
        fill = torch.tensor([self.table.fill[b] for b in blocks], device=c.device)
        tiles = Tiles.of(self.tiles("k", layer, idx).float(), fill, layer)   # values [n, H, bs, D]
        for name, summary in self._summaries.items():
            self._summary_data[name][layer, idx] = cast(summary.compute(tiles, c), c.summary_dtype, summary.rounding)


__all__ = ["StoreConfig", "BlockStore", "Sequence", "Reservation", "LayerKV", "LayerView", "StoreFullError",
           "ColdBlockError", "quantize_int8"]


def check_decode_query(store, q, seq, layer: int) -> None:
    """The decode-query check every public entry point runs: `store` a BlockStore, then
    `BlockStore.check_decode_query` (q [Hq, D] against `seq` at `layer`)."""
    if not isinstance(store, BlockStore):
        raise TypeError(f"store must be a BlockStore, got {type(store).__name__}")
    store.check_decode_query(q, seq, layer)
