"""Synthetic "lost detail" probes: Q/K/V with planted structure and known ground truth.

Construction (all in logit units, i.e. q.k / sqrt(D)):
  * each kv head h has a needle direction u_h: a unit vector on `channels` random channels
    (sparse, like the outlier channels of real LLM keys);
  * every query head of group h is q = sqrt(D) * u_h + query_noise * noise, so a key
    k = a * u_h scores a logit of about a;
  * background keys are `noise` * N(0, 1) per channel (logits ~ N(0, noise^2));
  * a needle key is strength * u_h + background noise: a logit about `strength` above the
    background's.
Values are N(0, 1), so retrieving the needle changes the output visibly.

Every generator is seeded and returns a `Probe` with the tensors and the needle tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..core.checks import check_int
from ..storage.store import BlockStore, Sequence


@dataclass
class ProbeConfig:
    length: int = 4096          # tokens in the context
    num_kv_heads: int = 2       # kv heads; the needle is planted in each
    gqa: int = 4                # query heads per kv head
    head_dim: int = 128
    strength: float = 16.0      # needle logit above the background (q.k / sqrt(D) units)
    channels: int = 8           # channels the needle direction occupies
    noise: float = 1.0          # std of background key channels
    query_noise: float = 0.1    # per-query-head jitter inside a GQA group
    seed: int = 0

    def __post_init__(self):
        for name in ("length", "num_kv_heads", "gqa", "head_dim", "channels"):
            check_int(name, getattr(self, name), lo=1)
        if self.channels > self.head_dim:
            raise ValueError(f"channels must be <= head_dim={self.head_dim}, got {self.channels}")


@dataclass(frozen=True)
class Probe:
    """Planted K/V and a query. k, v: [length, H, D]; q: [H * gqa, D]; all float32."""

    name: str
    k: torch.Tensor
    v: torch.Tensor
    q: torch.Tensor
    needle_tokens: tuple[int, ...]
    params: dict = field(default_factory=dict)

    def needle_blocks(self, block_size: int) -> list[int]:
        """Logical blocks holding a needle token, ascending."""
        return sorted({t // block_size for t in self.needle_tokens})

    def write(self, store: BlockStore) -> Sequence:
        """A new sequence in `store` holding this probe's K/V in every layer."""
        c = store.config
        if (c.num_kv_heads, c.head_dim) != tuple(self.k.shape[1:]):
            raise ValueError(f"store must have num_kv_heads={self.k.shape[1]} and head_dim={self.k.shape[2]}, "
                             f"got {c.num_kv_heads} and {c.head_dim}")
        seq = store.new_sequence()
        L = c.num_layers
        store.append(seq, self.k.to(c.dtype).expand(L, -1, -1, -1), self.v.to(c.dtype).expand(L, -1, -1, -1))
        return seq


class _Gen:
    """Shared construction: directions, queries, background keys."""

    def __init__(self, cfg: ProbeConfig, n_directions: int = 1):
        self.cfg = cfg
        self.g = torch.Generator().manual_seed(cfg.seed)
        H, D, c = cfg.num_kv_heads, cfg.head_dim, cfg.channels
        if n_directions * c > D:
            raise ValueError(f"{n_directions} needles x channels={c} exceed head_dim={D}")
        self.u = torch.zeros(n_directions, H, D)
        for h in range(H):
            perm = torch.randperm(D, generator=self.g)
            for j in range(n_directions):   # disjoint supports: directions are orthogonal
                ch = perm[j * c:(j + 1) * c]
                signs = torch.randint(0, 2, (c,), generator=self.g) * 2.0 - 1
                self.u[j, h, ch] = signs / math.sqrt(c)
        self.k = cfg.noise * torch.randn(cfg.length, H, D, generator=self.g)
        self.v = torch.randn(cfg.length, H, D, generator=self.g)

    def query(self, direction: torch.Tensor) -> torch.Tensor:
        """[H, D] unit directions -> [H * gqa, D] queries with jitter."""
        cfg = self.cfg
        base = math.sqrt(cfg.head_dim) * direction.repeat_interleave(cfg.gqa, dim=0)
        return base + cfg.query_noise * torch.randn(base.shape, generator=self.g)

    def plant(self, pos: int, direction: torch.Tensor, strength: float) -> None:
        self.k[pos] += strength * direction

    def position(self, depth: float) -> int:
        if not 0 <= depth <= 1:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        return min(self.cfg.length - 1, int(round(depth * (self.cfg.length - 1))))


def needle(cfg: ProbeConfig, depth: float, distractor_sim: float = 0.0, distractor_blocks: int = 0,
           block_size: int = 64) -> Probe:
    """One needle at `depth` (0 = first token, 1 = last), optionally with distractor blocks.

    Distractors: `distractor_blocks` whole blocks (spread evenly, avoiding the needle's)
    whose every key is distractor_sim * strength * u + noise: near-duplicates of the needle,
    each weaker, but many. Their block mean beats the needle block's mean once
    distractor_sim > 1 / block_size, so a mean-pooled summary is fooled, while the min/max
    bound still sees the needle's stronger channel values while distractor_sim is well below 1.
    """
    if not 0 <= distractor_sim < 1:
        raise ValueError(f"distractor_sim must be in [0, 1), got {distractor_sim}")
    gen = _Gen(cfg)
    pos = gen.position(depth)
    gen.plant(pos, gen.u[0], cfg.strength)
    nb = -(-cfg.length // block_size)
    placed = []
    if distractor_blocks:
        cands = [b for b in torch.linspace(0, nb - 1, distractor_blocks + 2).round().long().tolist()[1:-1]
                 if b != pos // block_size]
        for b in cands:
            lo, hi = b * block_size, min((b + 1) * block_size, cfg.length)
            gen.k[lo:hi] += distractor_sim * cfg.strength * gen.u[0]
            placed.append(b)
    return Probe("needle", gen.k, gen.v, gen.query(gen.u[0]), (pos,),
                 dict(depth=depth, distractor_sim=distractor_sim, distractor_blocks=placed))


def multi_needle(cfg: ProbeConfig, depths: list[float]) -> Probe:
    """Several needles with orthogonal directions; the query points at all of them at once.

    Each needle's key is strength * sqrt(n) * u_j, so each scores `strength` against the
    combined query (which has 1 / sqrt(n) of its norm along each u_j). All must be retrieved.
    """
    n = len(depths)
    gen = _Gen(cfg, n_directions=n)
    positions = []
    for j, d in enumerate(depths):
        pos = gen.position(d)
        gen.plant(pos, gen.u[j], cfg.strength * math.sqrt(n))
        positions.append(pos)
    direction = gen.u.sum(0) / math.sqrt(n)
    return Probe("multi_needle", gen.k, gen.v, gen.query(direction), tuple(positions), dict(depths=list(depths)))


def boundary_needle(cfg: ProbeConfig, block_size: int, boundary: int | None = None, span: int = 4) -> Probe:
    """A needle of `span` consecutive keys straddling the start of block `boundary`.

    Half the span ends block `boundary - 1`, half starts block `boundary`: both must be read
    to recover the needle's full mass.
    """
    nb = cfg.length // block_size
    boundary = nb // 2 if boundary is None else boundary
    if not 1 <= boundary < nb:
        raise ValueError(f"boundary must be in [1, {nb}), got {boundary}")
    gen = _Gen(cfg)
    start = boundary * block_size - span // 2
    positions = tuple(range(start, start + span))
    for p in positions:
        gen.plant(p, gen.u[0], cfg.strength)
    return Probe("boundary_needle", gen.k, gen.v, gen.query(gen.u[0]), positions, dict(boundary=boundary, span=span))


def washout(cfg: ProbeConfig, depth: float, block_size: int) -> Probe:
    """One strong key inside a block of opposite keys, so the block mean cancels along u.

    The other keys of the needle's block get -strength / (n - 1) * u, making the block mean
    zero along u: `mean` sees nothing, while the `minmax` bound still sees the strong key.
    """
    gen = _Gen(cfg)
    pos = gen.position(depth)
    b = pos // block_size
    lo, hi = b * block_size, min((b + 1) * block_size, cfg.length)
    if hi - lo < 2:
        raise ValueError("washout needs the needle's block to hold at least 2 tokens")
    others = [t for t in range(lo, hi) if t != pos]
    gen.k[others] -= cfg.strength / len(others) * gen.u[0]
    gen.plant(pos, gen.u[0], cfg.strength)
    return Probe("washout", gen.k, gen.v, gen.query(gen.u[0]), (pos,), dict(depth=depth))
