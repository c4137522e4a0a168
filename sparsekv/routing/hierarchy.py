"""Hierarchical routing: coarse bounds over groups of blocks prune first, fine bounds are read only inside the
groups that survive, so a step's summary reads stop growing at the fine level's rate.

Quest's bound (`minmax`) reads 2 summary vectors for every block of the context at every step, so at long context
the summaries, not the K/V budget, dominate a routed step (notebook 04). Here the blocks of a sequence are grouped
`group` at a time in logical order. A complete group's coarse summary is the channel-wise min of its blocks' kmin
and max of their kmax: Quest's bound over the group's keys, never below any of its blocks' bounds. Per step and kv
head:

    1. score every complete group's coarse bound                     (2 vectors per group)
    2. keep the `keep` groups of largest coarse mass (the query heads' softmaxed masses averaged, as a router's
       gqa="shared" does; ties broken by group id)
    3. score the fine bound of every block in the kept groups and in the trailing, incomplete group
                                                                     (2 vectors per block refined)
    4. every other block takes its group's coarse logit minus log(group): its group's estimated mass spread
       evenly, so the router's softmax still sees every group, and never reads those blocks' fine summaries.

The router then softmaxes and selects as for any scorer. With group = 1 the coarse bound is the fine one and this
is `minmax` exactly; with keep at least the number of groups, every block is refined and it is `minmax` again.

Coarse summaries are built from the fine ones once, when a group completes, and kept per sequence and layer
(`GroupIndex`); a full block's keys never change while a sequence holds it (the store appends, and copy-on-write
moves a shared block to a new id), so a cached group stays exact as long as its physical ids do, which is checked
on every step. Building a group reads its blocks' fine summaries once in the group's lifetime (2 vectors per block,
amortised over group * block_size decode steps); `score_bytes` charges the per-step reads of steps 1 and 3.
"""
from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..core.checks import check_int
from ..core.traffic import hierarchical_vectors
from .scorer_base import Scorer


class GroupIndex:
    """Coarse min/max summaries of one sequence's complete groups at one layer.

    ids  [ng * group] int64  the physical blocks the groups were built from, in logical order
    lo   [H, ng, D]          channel-wise min of those blocks' kmin, per kv head (the store's summary dtype)
    hi   [H, ng, D]          channel-wise max of their kmax
    """

    def __init__(self, seq, group: int, H: int, D: int, dtype, device):
        self.seq = weakref.ref(seq)
        self.group = group
        self.ids = torch.empty(0, dtype=torch.long, device=device)
        self.lo = torch.empty(H, 0, D, dtype=dtype, device=device)
        self.hi = torch.empty(H, 0, D, dtype=dtype, device=device)
        self.built_blocks = 0          # fine tiles read to build groups, per kv head (for the byte check)

    @property
    def num_groups(self) -> int:
        return self.lo.shape[1]

    def update(self, kmin: torch.Tensor, kmax: torch.Tensor, table: torch.Tensor, full_blocks: int) -> None:
        """Bring the index up to the complete groups of `table`'s first `full_blocks` blocks (a group is complete
        when all its blocks are full: a partial block's summary still changes). kmin/kmax [NB, H, D] are the
        layer's fine summaries.

        Groups whose physical ids changed since they were built (a fork's copy-on-write, a reused sequence) are
        rebuilt from the first changed one; new complete groups are appended.
        """
        g = self.group
        ng = full_blocks // g
        have = min(self.num_groups, ng)
        if have:
            same = self.ids[: have * g] == table[: have * g]
            if not bool(same.all()):
                have = int(torch.nonzero(~same)[0]) // g
        if have < self.num_groups:
            self.ids, self.lo, self.hi = self.ids[: have * g], self.lo[:, :have], self.hi[:, :have]
        if ng > have:
            new = table[have * g: ng * g]
            H, D = self.lo.shape[0], self.lo.shape[2]
            lo = kmin[new].view(ng - have, g, H, D).amin(1).transpose(0, 1)        # [H, new groups, D]
            hi = kmax[new].view(ng - have, g, H, D).amax(1).transpose(0, 1)
            self.ids = torch.cat([self.ids, new])
            self.lo = torch.cat([self.lo, lo], 1)
            self.hi = torch.cat([self.hi, hi], 1)
            self.built_blocks += new.numel()


def _bound(q: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Quest's bound q+ . hi + q- . lo for q [H, G, D] against lo/hi [H, n, D]: [H, G, n] (not yet / sqrt(D))."""
    return q.clamp(min=0) @ hi.to(q.dtype).transpose(1, 2) + q.clamp(max=0) @ lo.to(q.dtype).transpose(1, 2)


@dataclass(unsafe_hash=True)
class HierarchicalMinMaxScorer(Scorer):
    """Two-level Quest (see the module docstring): coarse min/max bounds over `group` blocks, fine ones inside the
    `keep` groups of largest coarse mass and the trailing group. Reads kmin and kmax (coarse, then fine).

    group  blocks per coarse group (1: the coarse bound is the fine one, i.e. `minmax`)
    keep   coarse groups refined per step and kv head, besides the trailing incomplete group

    1. `name` spells the parameters: "hminmax" at the defaults (16, 8), else "hminmax-g{group}-k{keep}", the name in
       every metric; `from_name(name)` reads it back to an equal scorer (equality and hash are over (group, keep)).
    2. group and keep are fixed once built (the name and the cached groups derive from them).
    3. The cache of coarse summaries (`GroupIndex` per store, sequence and layer) lives with the instance, so two
       routers given one instance share it; that is safe, as an index is rebuilt whenever its sequence's physical
       ids change. A router built from a name builds its own instance.
    """

    name, reads = "hminmax", ("kmin", "kmax")
    NAME: ClassVar = re.compile(r"hminmax-g([1-9][0-9]*)-k([1-9][0-9]*)")
    MAX_INDEXES: ClassVar = 4096        # cached (sequence, layer) indexes; the oldest are dropped beyond this

    group: int = 16
    keep: int = 8
    _index: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    last_read_tiles: int = field(default=0, init=False, repr=False, compare=False)   # fine + coarse tiles the last
                                                                                      # `logits` call read, per kv head

    def __post_init__(self):
        check_int("group", self.group, lo=1)
        check_int("keep", self.keep, lo=1)
        if (self.group, self.keep) != (16, 8):                     # the defaults keep the family's bare name
            self.name = f"hminmax-g{self.group}-k{self.keep}"

    @classmethod
    def from_name(cls, name: str) -> "HierarchicalMinMaxScorer | None":
        m = cls.NAME.fullmatch(name)
        return cls(int(m[1]), int(m[2])) if m else None

    def index(self, inp) -> GroupIndex:
        """The sequence's GroupIndex at this layer, brought up to date with its table."""
        s, c = inp.store, inp.store.config
        key = (id(s), id(inp.seq), inp.layer)
        ix = self._index.get(key)
        if ix is None or ix.seq() is not inp.seq:
            if len(self._index) >= self.MAX_INDEXES:
                self._index.pop(next(iter(self._index)))
            ix = self._index[key] = GroupIndex(inp.seq, self.group, c.num_kv_heads, c.head_dim, c.summary_dtype,
                                               c.device)
        ix.update(s.kmin[inp.layer], s.kmax[inp.layer], inp.table, inp.seq.num_tokens // c.block_size)
        return ix

    def score_bytes(self, store, seq) -> int:
        """Summary bytes of one step over `seq` (core.traffic.hierarchical_vectors per kv head)."""
        c = store.config
        vectors = hierarchical_vectors(seq.num_tokens, c.block_size, self.group, self.keep)
        return vectors * c.num_kv_heads * c.head_dim * c.summary_itemsize

    def logits(self, inp, backend, generator):
        q = inp.q.double() if backend == "reference" else inp.q
        H, G, D = q.shape
        nb, g = inp.table.numel(), self.group
        ix = self.index(inp)
        ng = ix.num_groups
        lo_f = inp.store.kmin[inp.layer].transpose(0, 1)                    # [H, NB, D] views
        hi_f = inp.store.kmax[inp.layer].transpose(0, 1)
        if backend == "reference":                                          # the definition, from the fine bounds
            blocks = inp.table[: ng * g]                                    # the complete groups' full blocks
            coarse = _bound(q, lo_f[:, blocks].double().view(H, ng, g, D).amin(2),
                            hi_f[:, blocks].double().view(H, ng, g, D).amax(2)).double()
        else:
            coarse = _bound(q, ix.lo, ix.hi)                                 # [H, G, ng]
        coarse = coarse / math.sqrt(D)
        keep = min(self.keep, ng) if g > 1 else 0                           # at g = 1 the coarse bound is the fine one
        mass = coarse.softmax(-1).mean(1)                                   # [H, ng]
        order = torch.argsort(-mass, dim=-1, stable=True)                  # ties: the lower group id first
        kept = order[:, :keep].sort(-1).values                             # [H, keep]
        out = (coarse - math.log(g)).repeat_interleave(g, dim=-1)          # [H, G, ng * g]
        tail = torch.arange(ng * g, nb, device=q.device)
        refine = torch.cat([(kept[..., None] * g + torch.arange(g, device=q.device)).reshape(H, -1),
                            tail.expand(H, -1)], 1)                         # [H, m] logical blocks
        phys = inp.table[refine]                                            # [H, m]
        take = lambda s: s.gather(1, phys[..., None].expand(-1, -1, D))
        lo, hi = take(lo_f), take(hi_f)
        if backend == "reference":
            lo, hi = lo.double(), hi.double()
        fine = _bound(q, lo, hi) / math.sqrt(D)                             # [H, G, m]
        out = torch.cat([out.to(fine.dtype), torch.zeros(H, G, nb - ng * g, dtype=fine.dtype, device=q.device)], -1)
        out.scatter_(2, refine[:, None, :].expand(-1, G, -1), fine)
        self.last_read_tiles = ng + refine.shape[1]
        return out.float()


def hierarchical(group: int, keep: int) -> HierarchicalMinMaxScorer:
    """A hierarchical minmax scorer with these (group, keep) (`Router(hierarchical(64, 4), token_budget=...)`); its
    `name`, "hminmax-g64-k4" ("hminmax" at (16, 8)), names it too: `Router("hminmax-g64-k4", ...)` routes the same."""
    return HierarchicalMinMaxScorer(group, keep)


__all__ = ["GroupIndex", "HierarchicalMinMaxScorer", "hierarchical"]
