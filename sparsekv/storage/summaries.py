"""Per-block key summaries, in a registry: what a router scores against instead of the keys.

A summary is a small, exact function of one tile (one block of one kv head in one layer) that
the store keeps up to date on every write. Each one says three things, and nothing else in the
package re-derives them:

1. `vectors(config)`: how many head_dim vectors it keeps per tile (its bytes per tile are
   `vectors * head_dim * itemsize`, which is what the byte model charges a scorer that reads it);
2. `allocate(config)`: its storage, documented shape [L, NB, H, *extra, D] in `config.dtype`
   (`extra` is () for one vector per tile, (r,) for r vectors);
3. `compute(tiles, config)`: its value for a batch of freshly written tiles, from their valid rows only.

Built in: `kmin`, `kmax` (Quest's bound), `kmean` (MoBA), `khalf` (the mean of each half block), `krepr` (InfLLM-style
representative keys) and `klabel` (Double Sparsity's label cache: a few calibrated channels of every key,
`LabelChannels`). A new summary is one subclass and `register_summary`; a store built
with `StoreConfig(summaries=(..., "name"))` then keeps it exact, copies it on copy-on-write and
counts its bytes, and a scorer that lists it in `reads` is charged for it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import registry


@dataclass(frozen=True)
class Tiles:
    """Freshly written tiles, as every summary sees them.

    values : [n, H, bs, D] float32, the tiles' rows (rows past `fill` are stale and must be ignored)
    fill   : [n] long, valid rows per tile (1..bs; the partial last block of a sequence has fewer)
    valid  : [n, H, bs, 1] bool, True on the valid rows
    mean   : [n, H, D] float32, the mean of the valid rows (shared: several summaries need it)
    layer  : the store layer the tiles belong to (a per-layer calibration, `klabel`, needs it)
    """

    values: torch.Tensor
    fill: torch.Tensor
    valid: torch.Tensor
    mean: torch.Tensor
    layer: int = 0

    @classmethod
    def of(cls, values: torch.Tensor, fill: torch.Tensor, layer: int = 0) -> "Tiles":
        bs = values.shape[2]
        valid = (torch.arange(bs, device=values.device)[None, :] < fill[:, None])[:, None, :, None]
        mean = torch.where(valid, values, 0.0).sum(2) / fill[:, None, None]
        return cls(values, fill, valid, mean, layer)


class Summary:
    """Base class. Subclasses set `name` and implement `compute`; multi-vector ones override `vectors`.

    `rounding` is how a value is stored when `config.summary_dtype` is narrower than float32: "nearest", or
    "up"/"down" for a bound that must stay conservative (a max rounded up, a min rounded down), so that a
    bound computed from half-precision summaries never underestimates the float32 one.
    """

    name = ""
    rounding = "nearest"
    incremental = False          # `extend` is exact: one appended row updates the summary as a recompute would

    def extend(self, old: torch.Tensor, row: torch.Tensor, first: bool) -> torch.Tensor:
        """The summary [H, D] float32 of a tile after appending `row` [H, D] float32 (as stored) to it; `old` is
        its summary before (stale when `first`: the row is the tile's only valid one). Only where `incremental`."""
        raise NotImplementedError

    def vectors(self, config) -> int:
        """head_dim vectors kept per tile."""
        return 1

    def extra_shape(self, config) -> tuple[int, ...]:
        """Axes between the kv head and head_dim: () for one vector per tile."""
        return ()

    def allocate(self, config) -> torch.Tensor:
        """Zeroed storage with the documented shape [L, NB, H, *extra, D].

        One-vector summaries live head-major in memory ([L, H, NB, D] contiguous, returned as a
        transposed view), so a scorer multiplies a query head by one contiguous [NB, D] matrix.
        """
        c = config
        extra = self.extra_shape(c)
        kw = dict(dtype=c.summary_dtype, device=c.device)
        if not extra:
            return torch.zeros(c.num_layers, c.num_kv_heads, c.num_blocks, c.head_dim, **kw).transpose(1, 2)
        return torch.zeros(c.num_layers, c.num_blocks, c.num_kv_heads, *extra, c.head_dim, **kw)

    def bytes_per_tile(self, config) -> int:
        return self.vectors(config) * config.head_dim * config.summary_itemsize

    def compute(self, tiles: Tiles, config) -> torch.Tensor:
        """[n, H, *extra, D] float32 summary of each tile, from its valid rows only."""
        raise NotImplementedError


class KeyMin(Summary):
    """Channel-wise minimum of the block's keys (half of Quest's bound)."""

    name, rounding, incremental = "kmin", "down", True

    def compute(self, tiles, config):
        return torch.where(tiles.valid, tiles.values, torch.inf).amin(2)

    def extend(self, old, row, first):
        # exact: a stored min is the min of its rows rounded down, and rounding down is monotone, so
        # round_down(min(rows, row)) = min(round_down(min(rows)), round_down(row)) = min(old, round_down(row))
        return row if first else torch.minimum(old.float(), row)


class KeyMax(Summary):
    """Channel-wise maximum of the block's keys (the other half of Quest's bound)."""

    name, rounding, incremental = "kmax", "up", True

    def compute(self, tiles, config):
        return torch.where(tiles.valid, tiles.values, -torch.inf).amax(2)

    def extend(self, old, row, first):
        return row if first else torch.maximum(old.float(), row)      # exact, as KeyMin's


class KeyMean(Summary):
    """Mean key of the block (MoBA's gate)."""

    name = "kmean"

    def compute(self, tiles, config):
        return tiles.mean


def half_rows(block_size: int, device=None) -> torch.Tensor:
    """[bs] bool: True on the rows of a block's second half, [ceil(bs / 2), bs) (an odd block's first half is the
    longer one; a one-row block has an empty second half)."""
    return torch.arange(block_size, device=device) >= (block_size + 1) // 2


class KeyHalves(Summary):
    """The mean key of each half of the block (rows [0, ceil(bs/2)) and [ceil(bs/2), bs)): 2 vectors per tile,
    Quest's min/max bytes, MoBA's gate at half the block size. A second half with no valid row yet (that of a
    sequence's partial last block, or of any one-row block) repeats the first half's mean, so a max over the two
    halves is the first half's score there, as if the empty half were masked.

    Stored half-major ([L, 2, H, NB, D] contiguous, returned as a [L, NB, H, 2, D] view), so each half of one
    layer and kv head is one contiguous [NB, D] matrix, as a one-vector summary is: the fused CPU route reads
    both in place (`Scorer.route_operands`)."""

    name = "khalf"

    def vectors(self, config):
        return 2

    def extra_shape(self, config):
        return (2,)

    def allocate(self, config):
        c = config
        return torch.zeros(c.num_layers, 2, c.num_kv_heads, c.num_blocks, c.head_dim, dtype=c.summary_dtype,
                           device=c.device).permute(0, 3, 2, 1, 4)

    def compute(self, tiles, config):
        second = half_rows(tiles.values.shape[2], tiles.values.device)[None, None, :, None]     # [1, 1, bs, 1]
        means = []
        for part in (~second, second):
            rows = tiles.valid & part                                                          # [n, H, bs, 1]
            total = torch.where(rows, tiles.values, 0.0).sum(2)                                # [n, H, D]
            means.append(total / rows.sum(2).clamp(min=1))
        empty = ~(tiles.valid & second).any(2)                                                 # [n, H, 1]
        return torch.stack([means[0], torch.where(empty, means[0], means[1])], 2)              # [n, H, 2, D]


class KeyRepr(Summary):
    """`config.repr_keys` representative keys: those farthest (L2) from the block mean, i.e. the keys
    the mean represents worst. A partial block with fewer valid keys than r repeats its row 0."""

    name = "krepr"

    def vectors(self, config):
        return config.repr_keys

    def extra_shape(self, config):
        return (config.repr_keys,)

    def compute(self, tiles, config):
        n, H, bs, D = tiles.values.shape
        r = config.repr_keys
        dist = (tiles.values - tiles.mean[:, :, None]).norm(dim=-1)          # [n, H, bs]
        dist = torch.where(tiles.valid[..., 0], dist, -torch.inf)
        top = dist.topk(r, dim=-1).indices                                   # [n, H, r]
        rank = torch.arange(r, device=top.device)
        top = torch.where(rank[None, None, :] < tiles.fill[:, None, None], top, 0)
        return torch.gather(tiles.values, 2, top[..., None].expand(-1, -1, -1, D))


@dataclass(frozen=True)
class LabelChannels:
    """Calibrated label channels (Double Sparsity): for each store layer and kv head, the `r` key channels whose
    partial q.k stands in for the whole. channels[l][h] is a tuple of r distinct ids in [0, head_dim), sorted.
    Written by `python -m sparsekv calibrate` (`analysis.calibrate`), from text held out of every evaluation."""

    channels: tuple
    source: str = ""            # what it was calibrated on (recorded with the file)

    def __post_init__(self):
        ch = tuple(tuple(tuple(int(c) for c in head) for head in layer) for layer in self.channels)
        if not ch or not ch[0] or not ch[0][0]:
            raise ValueError("channels must be [layers][kv heads][r] channel ids with r >= 1")
        r = len(ch[0][0])
        for layer in ch:
            if len(layer) != len(ch[0]) or any(len(h) != r or len(set(h)) != r or min(h) < 0 for h in layer):
                raise ValueError(f"channels must hold the same number of kv heads per layer and {r} distinct "
                                 "non-negative channel ids per head")
        object.__setattr__(self, "channels", tuple(tuple(tuple(sorted(h)) for h in layer) for layer in ch))

    @property
    def r(self) -> int:
        return len(self.channels[0][0])

    @property
    def num_layers(self) -> int:
        return len(self.channels)

    @property
    def num_kv_heads(self) -> int:
        return len(self.channels[0])

    def check(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int) -> None:
        """ValueError unless these labels fit a store of this geometry (and pack into whole head_dim vectors)."""
        if (self.num_layers, self.num_kv_heads) != (num_layers, num_kv_heads):
            raise ValueError(f"labels are for {self.num_layers} layers x {self.num_kv_heads} kv heads; the store has "
                             f"{num_layers} x {num_kv_heads}")
        if max(max(h) for layer in self.channels for h in layer) >= head_dim:
            raise ValueError(f"labels name channels >= head_dim={head_dim}")
        if (block_size * self.r) % head_dim:
            raise ValueError(f"labels: block_size * r = {block_size} * {self.r} must be a multiple of head_dim="
                             f"{head_dim} (the label cache is packed into whole head_dim vectors)")

    def subset(self, layers) -> "LabelChannels":
        """The labels of these store layers, in order (a hybrid store's global group)."""
        return LabelChannels(tuple(self.channels[i] for i in layers), self.source)

    def index(self, device=None) -> torch.Tensor:
        """[L, H, r] long tensor of the channel ids."""
        return torch.tensor(self.channels, dtype=torch.long, device=device)


class KeyLabels(Summary):
    """Double Sparsity's label cache: the calibrated channels (`StoreConfig.labels`) of every key of the block, packed
    as [bs * r / D] head_dim vectors per tile (row t's channels at [t * r, (t + 1) * r)); rows past the block's fill
    are 0 and a scorer must mask them. At r = 2 * D / bs it holds exactly Quest's min/max bytes."""

    name = "klabel"

    def vectors(self, config) -> int:
        if config.labels is None:
            raise ValueError("summary 'klabel' needs StoreConfig.labels (from `python -m sparsekv calibrate`)")
        return config.block_size * config.labels.r // config.head_dim

    def extra_shape(self, config):
        return (self.vectors(config),)

    def compute(self, tiles, config):
        n, H, bs, D = tiles.values.shape
        ch = config.labels.index(tiles.values.device)[tiles.layer]                     # [H, r]
        picked = torch.gather(tiles.values, 3, ch[None, :, None, :].expand(n, H, bs, -1))   # [n, H, bs, r]
        picked = torch.where(tiles.valid, picked, 0.0)
        return picked.reshape(n, H, self.vectors(config), D)


def cast(x: torch.Tensor, dtype: torch.dtype, rounding: str) -> torch.Tensor:
    """x (float32) stored in `dtype`, rounded to nearest, or directed "up"/"down" (each element moves at most
    one step of `dtype` past its nearest value, so x <= result for "up" and result <= x for "down")."""
    y = x.to(dtype)
    if rounding == "nearest" or dtype == x.dtype:
        return y
    inf = torch.full_like(y, torch.inf if rounding == "up" else -torch.inf)
    wrong = y.float() < x if rounding == "up" else y.float() > x
    return torch.where(wrong, torch.nextafter(y, inf), y)


SUMMARIES: dict[str, type[Summary]] = {}


def register_summary(cls: type[Summary]) -> type[Summary]:
    """Add a summary class to the registry under `cls.name` (a store may then keep it)."""
    return registry.add(SUMMARIES, cls, Summary, "summary")


for _cls in (KeyMin, KeyMax, KeyMean, KeyHalves, KeyRepr, KeyLabels):
    register_summary(_cls)

DEFAULT_SUMMARIES = ("kmin", "kmax", "kmean", "krepr")


def make_summary(name: str) -> Summary:
    """The registered summary `name` (ValueError naming the choices otherwise)."""
    if name not in SUMMARIES:
        raise ValueError(f"summary must be one of {sorted(SUMMARIES)}, got {name!r}")
    return SUMMARIES[name]()


def summary_vectors(names, config) -> int:
    """head_dim vectors per tile that reading the summaries `names` costs (the byte model's input)."""
    return sum(make_summary(n).vectors(config) for n in names)
