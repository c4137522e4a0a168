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
"""
from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field

import torch

from .block_pool import BlockPool, StoreFullError
from .cold import ColdBlockError, ColdFile
from .placement import PLACEMENTS
from .summaries import DEFAULT_SUMMARIES, SUMMARIES, Tiles, cast, make_summary
from .tiers import TierTable
from ..core.checks import check_choice, check_int, check_tensor
from ..core.workspace import Workspace

SCALE_BYTES = 4        # one float32 scale per (token, kv head) and tensor when kv_bits == 8
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
    num_layers: int          # transformer layers whose K/V live in the store
    num_kv_heads: int        # KV heads (GQA groups); query heads are a multiple of this
    head_dim: int            # channels per head
    block_size: int = 64     # tokens per physical block; a power of two (kernels tile by it)
    num_blocks: int = 1024   # physical blocks in the pool, shared by all layers and sequences
    dtype: torch.dtype | str = torch.float32   # storage dtype of K, V and the summaries
    device: torch.device | str = "cpu"
    repr_keys: int = 4       # representative keys kept per block for the `repr` scorer (0: none)
    summaries: tuple[str, ...] = DEFAULT_SUMMARIES   # per-block summaries kept (names in `SUMMARIES`)
    kv_bits: int = 0         # 0: K/V stored in `dtype`; 8: int8 codes, one float32 scale per (token, kv head)
    summary_dtype: torch.dtype | str | None = None   # summaries' dtype (None: `dtype`); bf16 halves routing bytes,
                                                     # with min rounded down and max rounded up (bounds stay safe)
    cold_dir: str | os.PathLike | None = None   # a cold tier: K/V tiles beyond the hot ones live in a file here
    hot_blocks: int | None = None    # with cold_dir: K/V slots per layer in memory (None: num_blocks, all can be hot)
    placement: str = "lru"           # which hot tiles are demoted first (`storage.placement`)
    cold_direct: bool = True         # open the cold file with O_DIRECT where the file system allows it

    def __post_init__(self):
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size", "num_blocks"):
            check_int(name, getattr(self, name), lo=1)
        check_int("repr_keys", self.repr_keys, lo=0)
        if self.kv_bits not in (0, 8) or isinstance(self.kv_bits, bool):
            raise ValueError(f"kv_bits must be 0 (K/V in dtype) or 8 (int8 with per-token scales), got {self.kv_bits!r}")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        self.dtype = _float_dtype("dtype", self.dtype)
        self.device = torch.device(self.device)
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
        check_choice("placement", self.placement, PLACEMENTS)
        unknown = [n for n in self.summaries if n not in SUMMARIES]
        if unknown or len(set(self.summaries)) != len(self.summaries):
            raise ValueError(f"summaries must be distinct names from {sorted(SUMMARIES)}, got {self.summaries!r}")

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
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def summary_itemsize(self) -> int:
        return torch.empty((), dtype=self.summary_dtype).element_size()

    @property
    def kv_itemsize(self) -> int:
        """Bytes per stored K or V element (1 for int8 codes)."""
        return 1 if self.kv_bits == 8 else self.itemsize

    @property
    def tile_bytes(self) -> int:
        """Bytes of one K (or V) tile: one block of one kv head in one layer, with its scales when int8."""
        return self.block_size * (self.head_dim * self.kv_itemsize + (SCALE_BYTES if self.kv_bits == 8 else 0))

    @property
    def summary_bytes_per_tile(self) -> int:
        """Bytes of the min, max and mean summaries of one tile (what minmax+mean read)."""
        return sum(make_summary(n).bytes_per_tile(self) for n in ("kmin", "kmax", "kmean"))


@dataclass(frozen=True)
class LayerKV:
    """One layer's K/V as attention reads them (`BlockStore.layer_kv`).

    k, v       [R, H, bs, D] tiles (head-major in memory: `k.transpose(0, 1)` is contiguous), in the
               store's dtype, or int8 codes when the store is quantized; R is the rows held.
    k_scale,   [R, H, bs] float32 per-token scales of int8 codes (None for float storage).
    v_scale
    tables     per sequence, [nb] int64 on the store device: the row of each logical block, -1 for
               blocks the call does not read (never dereferenced).
    """

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    tables: tuple[torch.Tensor, ...]


@dataclass
class Sequence:
    """A handle on one sequence: its block table and length. Owned by one `BlockStore`.

    `block_ids` are physical ids in logical order; logical block j holds tokens
    [j * block_size, (j + 1) * block_size). Only the last block can be partial.
    """

    seq_id: int
    num_tokens: int = 0
    _blocks: list[int] = field(default_factory=list, repr=False)
    alive: bool = True
    _cache: dict = field(default_factory=dict, repr=False, compare=False)   # derived from _blocks

    @property
    def block_ids(self) -> list[int]:
        return list(self._blocks)

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)


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
    """

    def __init__(self, config: StoreConfig):
        if not isinstance(config, StoreConfig):
            raise TypeError(f"config must be a StoreConfig, got {type(config).__name__}")
        c = self.config = config
        # K/V have the documented shape [L, NB, H, bs, D] (NB = hot_blocks with a cold tier) but live
        # head-major in memory ([L, H, NB, bs, D] contiguous): every tile is one contiguous bs x D slab, and a run of
        # consecutive physical blocks of one kv head is one contiguous [n * bs, D] matrix, which
        # dense decode multiplies without copying.
        R = c.kv_rows                           # in-memory tiles per layer: hot slots with a cold tier

        def tiles():
            dtype = torch.int8 if c.kv_bits == 8 else c.dtype
            return torch.zeros(c.num_layers, c.num_kv_heads, R, c.block_size, c.head_dim,
                               dtype=dtype, device=c.device).transpose(1, 2)

        self.k, self.v = tiles(), tiles()
        # int8 K/V: a symmetric scale per (token, kv head), [L, R, H, bs] float32 (head-major like K/V);
        # the value of a stored element is code * scale. None for float storage.
        self.k_scale = self.v_scale = None
        if c.kv_bits == 8:
            def scales():
                return torch.zeros(c.num_layers, c.num_kv_heads, R, c.block_size,
                                   dtype=torch.float32, device=c.device).transpose(1, 2)
            self.k_scale, self.v_scale = scales(), scales()
        # Each summary allocates its own storage (`storage.summaries`: [L, NB, H, *extra, D]); summaries
        # are indexed by block id and never leave memory, so routing never waits for the cold tier.
        self._summaries = {n: make_summary(n) for n in c.summaries}
        self._summary_data = {n: s.allocate(c) for n, s in self._summaries.items()}
        self.pool = BlockPool(c.num_blocks)
        self._fill = [0] * c.num_blocks          # valid tokens in each physical block
        self._seqs: dict[int, Sequence] = {}
        self._ids = itertools.count()
        # The cold tier (`storage.tiers`): K/V rows are hot slots, found through `tiers.slot_of`.
        self.tiers: TierTable | None = None
        if c.tiered:
            if c.device.type != "cpu":
                raise ValueError(f"a cold tier needs a CPU store for now (device={c.device}); set cold_dir=None")
            tensors = {"k": self.k, "v": self.v}
            if self.quantized:
                tensors.update(k_scale=self.k_scale, v_scale=self.v_scale)
            record = sum(t[0, 0].numel() * t.element_size() for t in tensors.values())
            cold = ColdFile(c.cold_dir, c.num_layers, c.num_blocks, record, direct=c.cold_direct)
            self.tiers = TierTable(tensors, c.num_blocks, c.hot_blocks, cold, c.placement)
            self.pool.on_dead.append(self.tiers.reset)
        self.workspace = Workspace(c.device)     # scratch for the decode fast path

    # -- sequences ----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def sequences(self) -> list[Sequence]:
        """Live sequences, oldest first."""
        return list(self._seqs.values())

    def new_sequence(self) -> Sequence:
        seq = Sequence(next(self._ids))
        self._seqs[seq.seq_id] = seq
        return seq

    def attach(self, seq: Sequence, block_ids: list[int]) -> None:
        """Start an empty `seq` on existing full blocks (a prefix-cache hit), shared by ref count."""
        self.check_seq(seq)
        if seq.num_tokens:
            raise ValueError(f"seq must be empty to attach cached blocks; it holds {seq.num_tokens} tokens")
        for b in block_ids:
            if self._fill[b] != self.config.block_size:
                raise ValueError(f"block_ids must name full blocks; block {b} holds {self._fill[b]} tokens")
        self.pool.incref(block_ids)
        seq._blocks.extend(block_ids)
        seq.num_tokens = len(block_ids) * self.config.block_size

    def fork(self, seq: Sequence) -> Sequence:
        """A new sequence sharing every block of `seq` (invariant 3)."""
        self.check_seq(seq)
        self.pool.incref(seq._blocks)
        child = Sequence(next(self._ids), seq.num_tokens, list(seq._blocks))
        self._seqs[child.seq_id] = child
        return child

    def free(self, seq: Sequence) -> list[int]:
        """Release `seq` (invariant 6); returns the physical blocks that became free."""
        self.check_seq(seq)
        freed = self.pool.decref(seq._blocks)   # content stays: a prefix cache may still hit it
        seq.alive = False
        del self._seqs[seq.seq_id]
        return freed

    def block_table(self, seq: Sequence) -> torch.Tensor:
        """Physical block ids of `seq` in logical order, a [num_blocks] LongTensor on the store device.

        Cached per sequence until its blocks change; treat it as read-only.
        """
        self.check_seq(seq)
        key = ("table", len(seq._blocks), seq._blocks[-1] if seq._blocks else -1)
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
            seq._cache["runs"] = _runs(table)
        return seq._cache["runs"]

    # -- writing ------------------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks that reserving `num_tokens` more tokens for `seq` would allocate."""
        bs = self.config.block_size
        new = math.ceil((seq.num_tokens + num_tokens) / bs) - len(seq._blocks)
        cow = seq.num_tokens % bs != 0 and self.pool.ref_counts[seq._blocks[-1]] > 1
        return new + int(cow)

    def reserve(self, seq: Sequence, num_tokens: int, layout: bool = True) -> Reservation:
        """Claim slots for `num_tokens` new tokens; fill them with `write`, layer by layer.

        layout=False claims the same slots but skips the per-token block and offset tensors: for stores used
        only to account for blocks (the serving simulator's); such a reservation cannot be written.
        """
        self.check_seq(seq)
        check_int("num_tokens", num_tokens, lo=1)
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.pool.num_free:
            raise StoreFullError(needed, self.pool.num_free, what=f"reserving {num_tokens} tokens")
        bs = self.config.block_size
        if seq.num_tokens % bs and self.pool.ref_counts[seq._blocks[-1]] > 1:
            seq._blocks[-1] = self._copy_on_write(seq._blocks[-1])
        seq._blocks.extend(self.pool.allocate(math.ceil((seq.num_tokens + num_tokens) / bs) - len(seq._blocks)))
        start = seq.num_tokens
        touched = tuple(seq._blocks[start // bs: (start + num_tokens - 1) // bs + 1])
        for j, b in enumerate(touched, start=start // bs):
            self._fill[b] = min(bs, start + num_tokens - j * bs)
        seq.num_tokens += num_tokens
        if not layout:
            return Reservation(seq, start, num_tokens, None, None, touched)
        pos = torch.arange(start, start + num_tokens)
        table = torch.tensor(seq._blocks, dtype=torch.long)
        block, offset = table[pos // bs], pos % bs
        dev = self.config.device
        return Reservation(seq, start, num_tokens, block.to(dev), offset.to(dev), touched)

    def write(self, res: Reservation, layer: int, k: torch.Tensor, v: torch.Tensor, check_finite: bool = True) -> None:
        """Write one layer's K/V, each [res.num_tokens, num_kv_heads, head_dim], into reserved slots.

        check_finite: reject NaN/inf before writing (one host read per tensor). The model's decode
        path passes False: its K/V come from its own projections, checked in shape and dtype here,
        and a NaN there is a model fault that its logits show.
        """
        if not isinstance(res, Reservation):
            raise TypeError(f"res must be a Reservation from reserve(), got {type(res).__name__}")
        if res.block is None:
            raise ValueError("res was reserved with layout=False (accounting only) and cannot be written")
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
    def gather(self, seq: Sequence, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All K and V of `seq` in one layer, each [num_tokens, num_kv_heads, head_dim] in `config.dtype` (a copy)."""
        self.check_seq(seq)
        c = self.config
        check_int("layer", layer, lo=0, hi=c.num_layers - 1)
        kv = self.layer_kv(layer, [seq])
        rows = kv.tables[0]

        def _one(codes, scale):  # [n, H, bs, D] -> [n * bs, H, D] -> first num_tokens rows
            t = codes[rows]
            if scale is not None:
                t = (t.float() * scale[rows][..., None]).to(c.dtype)
            return t.transpose(1, 2).reshape(-1, c.num_kv_heads, c.head_dim)[: seq.num_tokens]

        return _one(kv.k, kv.k_scale), _one(kv.v, kv.v_scale)

    @property
    def quantized(self) -> bool:
        """True when K/V are int8 codes with per-token scales (`config.kv_bits == 8`)."""
        return self.k_scale is not None

    def tiles(self, which: str, layer: int, idx: torch.Tensor) -> torch.Tensor:
        """K or V tiles of physical blocks `idx` in `layer`, [n, H, bs, D] in `config.dtype` (dequantised when int8).

        With a cold tier, hot tiles are read in place and cold ones from the file; nothing moves between tiers.
        """
        if which not in ("k", "v"):
            raise ValueError(f"which must be 'k' or 'v', got {which!r}")
        if self.tiers is None:
            codes = (self.k if which == "k" else self.v)[layer, idx]
            scale = None if not self.quantized else (self.k_scale if which == "k" else self.v_scale)[layer, idx]
        else:
            ids = idx.reshape(-1).cpu()
            slots = self.tiers.slot_of[layer, ids]
            if bool((slots >= 0).all()):
                codes = (self.k if which == "k" else self.v)[layer, slots]
                scale = None if not self.quantized else (self.k_scale if which == "k" else self.v_scale)[layer, slots]
            else:
                parts = self.tiers.stage(layer, ids.numpy())
                codes, scale = parts[which], parts.get(f"{which}_scale")
            codes = codes.view(*idx.shape, *codes.shape[1:])
            scale = None if scale is None else scale.view(*idx.shape, *scale.shape[1:])
        if scale is None:
            return codes
        return (codes.float() * scale[..., None]).to(self.config.dtype)

    def layer_kv(self, layer: int, seqs: list[Sequence], blocks: list[torch.Tensor] | None = None) -> "LayerKV":
        """K/V of `layer` as attention reads them, with each sequence's logical blocks mapped to rows.

        blocks: None (every block of every sequence is read) or one selection [H, K] of logical block
        indices per sequence, padded with -1. Without a cold tier this is the store's tensors and block
        tables, unchanged. With one, the tiles read are made hot first (promoted from the cold tier,
        demoting others by the placement policy); a set larger than the hot tier is staged in a scratch
        copy instead. Rows of blocks that are not read are -1 in `tables`.
        """
        if self.tiers is None:
            return LayerKV(self.k[layer], self.v[layer],
                           None if self.k_scale is None else self.k_scale[layer],
                           None if self.v_scale is None else self.v_scale[layer],
                           tuple(self.block_table(s) for s in seqs))
        tables = [self.block_table(s).cpu() for s in seqs]
        if blocks is None:
            needed = torch.cat(tables)
        else:
            needed = torch.cat([t[b[b >= 0].cpu()] for t, b in zip(tables, blocks)])
        ids = torch.unique(needed)
        dev = self.config.device
        if self.tiers.acquire(layer, ids.numpy(), unique=True):
            rows = [self.tiers.slot_of[layer][t] for t in tables]          # -1 where a tile is not hot
            return LayerKV(self.k[layer], self.v[layer],
                           None if self.k_scale is None else self.k_scale[layer],
                           None if self.v_scale is None else self.v_scale[layer],
                           tuple(r.to(dev) for r in rows))
        parts = self.tiers.stage(layer, ids.numpy())                       # [n, H, ...] in ids order
        lookup = torch.full((self.config.num_blocks,), -1, dtype=torch.long)
        lookup[ids] = torch.arange(len(ids))
        head_major = {n: t.transpose(0, 1).contiguous().transpose(0, 1) for n, t in parts.items()}
        return LayerKV(head_major["k"], head_major["v"], head_major.get("k_scale"), head_major.get("v_scale"),
                       tuple(lookup[t].to(dev) for t in tables))

    def runs(self, seq: Sequence, rows: torch.Tensor) -> list[tuple[int, int, int]]:
        """Maximal runs of consecutive rows of `seq`'s blocks: (first logical block, first row, length).

        `rows` is a table from `layer_kv`; without a cold tier it is the block table, and the cached
        `physical_runs` are returned.
        """
        if self.tiers is None:
            return self.physical_runs(seq)
        return _runs(rows)

    # -- bytes --------------------------------------------------------------------------
    def kv_bytes(self) -> int:
        """Bytes of the in-memory K and V pools (all layers; with a cold tier, its hot slots only), int8 scales included.
        The cold tier's bytes on disk are `cold_bytes()`."""
        scales = 0 if not self.quantized else (self.k_scale.numel() + self.v_scale.numel()) * SCALE_BYTES
        return (self.k.numel() + self.v.numel()) * self.k.element_size() + scales

    def sequence_bytes(self, seq: Sequence) -> int:
        """Bytes the store holds for `seq`: its blocks' K/V (and scales) and summaries, all layers.

        Whole blocks: a partial last block holds its full tile. Shared blocks count in full for each
        sequence that holds them.
        """
        self.check_seq(seq)
        held = (self.k, self.v, *self._summary_data.values(), *((self.k_scale, self.v_scale) if self.quantized else ()))
        # per tensor: the bytes of one physical block across all layers (axis 1 is the block), as allocated
        return seq.num_blocks * sum(t[:, 0].numel() * t.element_size() for t in held)

    def summary_bytes(self) -> int:
        """Bytes of all per-block summaries the store keeps, reported apart from KV."""
        return sum(t.numel() * t.element_size() for t in self._summary_data.values())

    # -- the cold tier ------------------------------------------------------------------
    def spill(self, block_ids) -> int:
        """Move every layer's hot tiles of `block_ids` to the cold tier (they stay readable, exactly).
        Returns the tiles moved. A no-op (0) without a cold tier."""
        if self.tiers is None:
            return 0
        ids = [int(b) for b in block_ids]
        for b in ids:
            check_int("block_ids[i]", b, lo=0, hi=self.config.num_blocks - 1)
        return sum(self.tiers.demote(layer, ids) for layer in range(self.config.num_layers))

    def prefetch(self, layer: int, block_ids) -> int:
        """Start background reads of the cold tiles of `block_ids` in `layer` (a prediction of the next
        reads); returns reads started. A no-op (0) without a cold tier."""
        if self.tiers is None:
            return 0
        check_int("layer", layer, lo=0, hi=self.config.num_layers - 1)
        return self.tiers.prefetch(layer, [int(b) for b in block_ids])

    def cold_bytes(self) -> int:
        """Bytes the cold file occupies on disk (0 without a cold tier)."""
        return 0 if self.tiers is None else self.tiers.cold.file_bytes()

    def close(self) -> None:
        """Delete the cold file and stop its reader thread (idempotent; also done when the store is collected)."""
        if self.tiers is not None:
            self.tiers.cold.close()

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

    def check_seq(self, seq, name: str = "seq") -> None:
        """Raise TypeError/ValueError unless `seq` is a live sequence of this store."""
        if not isinstance(seq, Sequence):
            raise TypeError(f"{name} must be a Sequence from this store, got {type(seq).__name__}")
        if self._seqs.get(seq.seq_id) is not seq:
            state = "was freed" if not seq.alive else "belongs to another store"
            raise ValueError(f"{name} (id {seq.seq_id}) {state}; expected a live sequence of this store")

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

    def _copy_on_write(self, src: int) -> int:
        (dst,) = self.pool.allocate(1)
        kv = (self.k, self.v, *([self.k_scale, self.v_scale] if self.quantized else []))
        if self.tiers is None:
            for t in kv:
                t[:, dst] = t[:, src]
        else:                                           # per layer: a hot slot for dst, src read where it is
            for layer in range(self.config.num_layers):
                self.tiers.acquire(layer, [dst])
                self.tiers.copy_tile(layer, src, dst)
                self.tiers.dirty(layer, [dst])
        for t in self._summary_data.values():
            t[:, dst] = t[:, src]
        self._fill[dst] = self._fill[src]
        self.pool.decref([src])
        return dst

    def _write(self, res: Reservation, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.tiers is None:
            self._write_rows(layer, res.block, res.offset, k, v)
            self._refresh_summaries(layer, list(res.touched))
            return
        # With a cold tier, in pieces of at most `hot_blocks` touched blocks (a write may be any width): each
        # piece's tiles are made hot, written and marked dirty; a later piece's `acquire` may demote them,
        # which writes them through to the cold file, checksummed like any demotion.
        bs, h = self.config.block_size, self.config.hot_blocks
        first = res.start // bs                                      # logical index of res.touched[0]
        for i in range(0, len(res.touched), h):
            blocks = res.touched[i:i + h]
            lo = max(res.start, (first + i) * bs) - res.start          # this piece's tokens [lo, hi) of the write
            hi = min(res.start + res.num_tokens, (first + i + len(blocks)) * bs) - res.start
            self.tiers.acquire(layer, blocks, unique=True)
            self.tiers.dirty(layer, blocks)
            rows = self.tiers.slot_of[layer][res.block[lo:hi].cpu()].to(res.block.device)
            self._write_rows(layer, rows, res.offset[lo:hi], k[lo:hi], v[lo:hi])
            self._refresh_summaries(layer, list(blocks))

    def _write_rows(self, layer: int, rows: torch.Tensor, offset: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """K/V of T tokens [T, H, D] into in-memory rows `rows` [T] at offsets `offset` [T] of `layer`."""
        # Advanced indices separated by a slice: the indexed view is [T, H, D].
        if self.quantized:
            for codes, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
                q, scale = quantize_int8(x)
                codes[layer][rows, :, offset] = q
                scales[layer][rows, :, offset] = scale
        else:
            self.k[layer][rows, :, offset] = k
            self.v[layer][rows, :, offset] = v

    def _refresh_summaries(self, layer: int, blocks: list[int]) -> None:
        """Recompute the summaries of `blocks` in `layer` from their valid rows (invariant 8)."""
        if not self._summaries:
            return
        c = self.config
        idx = torch.tensor(blocks, dtype=torch.long, device=c.device)
        fill = torch.tensor([self._fill[b] for b in blocks], device=c.device)
        tiles = Tiles.of(self.tiles("k", layer, idx).float(), fill)          # values [n, H, bs, D]
        for name, summary in self._summaries.items():
            self._summary_data[name][layer, idx] = cast(summary.compute(tiles, c), c.summary_dtype, summary.rounding)


def _runs(table: torch.Tensor) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive values of `table` [n]: (first index, first value, length)."""
    breaks = (torch.nonzero(table[1:] != table[:-1] + 1).flatten() + 1).tolist()
    starts, ends = [0] + breaks, breaks + [len(table)]
    return [(a, int(table[a]), b - a) for a, b in zip(starts, ends)]


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per (token, kv head): x [T, H, D] float -> (codes [T, H, D] int8, scale [T, H] float32).

    scale = max|x| / 127 over D (1 where a row is all zero), codes = round(x / scale) in [-127, 127];
    |code * scale - x| <= scale / 2 elementwise.
    """
    xf = x.float()
    scale = xf.abs().amax(-1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(xf / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return codes, scale


__all__ = ["StoreConfig", "BlockStore", "Sequence", "Reservation", "LayerKV", "StoreFullError", "ColdBlockError"]


def check_decode_query(store, q, seq, layer: int) -> None:
    """The decode-query check every public entry point runs: `store` a BlockStore, then
    `BlockStore.check_decode_query` (q [Hq, D] against `seq` at `layer`)."""
    if not isinstance(store, BlockStore):
        raise TypeError(f"store must be a BlockStore, got {type(store).__name__}")
    store.check_decode_query(q, seq, layer)
