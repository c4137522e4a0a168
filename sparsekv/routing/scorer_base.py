"""The scorer interface: what a scorer sees for one decode step (`ScoreInput`) and the base class every scorer
derives from (`Scorer`). The built-in scorers and their registry are in `scorers`; the hierarchical ones in
`hierarchy`. Both import this module, so the registry can list every built-in scorer in one place without a cycle.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.traffic import summary_traffic
from ..storage.store import BlockStore, Sequence
from ..storage.summaries import summary_vectors


@dataclass(frozen=True)
class ScoreInput:
    """What a scorer sees for one decode step of one layer."""

    q: torch.Tensor          # [H, G, D] float32 query, grouped by kv head
    store: BlockStore
    seq: Sequence
    layer: int
    table: torch.Tensor      # [nb] physical block ids in logical order


class Scorer:
    """Base class: `logits(inp, backend)` -> [H, G or 1, nb] float32 block logits.

    backend is "reference", "torch" or "triton"; scorers without a kernel (repr, oracle and
    the query-blind ones) run their torch path under "triton".

    `query_aware` scorers can drive top_p and threshold. `reads` names the per-block summaries
    (`storage.summaries`) a scorer reads; the byte model charges it their vectors per tile
    (`vectors`). A scorer reading something else sets `summary_vectors` or overrides `score_bytes`.

    `name` is what a scorer is registered and reported under. The class's `name` is its registry key; a scorer with
    parameters (a dataclass, e.g. `hierarchy.HierarchicalMinMaxScorer`) gives each instance the name its parameters
    spell ("hminmax-g64-k4": the name in every metric), and `from_name` reads such a name back.
    """

    name = ""
    query_aware = True
    reads: tuple[str, ...] = ()
    summary_vectors = 0
    fused_kind: int | None = None     # the CPU route kernel's kind for this scorer (route_topk), if it has one
    needs_calibration = False         # True: the store must hold a calibration (StoreConfig.labels)

    @classmethod
    def family(cls) -> str:
        """The registered scorer this one is a variant of (the name it is drawn and grouped under): the most general
        subclass of `Scorer` it derives from ("hminmax" for every `HierarchicalMinMaxScorer`, whatever its name)."""
        mro = cls.__mro__
        return mro[mro.index(Scorer) - 1].name

    @classmethod
    def from_name(cls, name: str) -> "Scorer | None":
        """The scorer of this class that a parametrised `name` spells ("hminmax-g64-k4"), or None when it spells none.
        A scorer without parameters has no such names (the registry's key is its only name)."""
        return None

    def route_operands(self, store: BlockStore, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused CPU route's two summaries at `layer`, each a contiguous [H, NB, D] view (a scorer reading one
        summary passes it twice): only for a scorer with a `fused_kind`."""
        first, *rest = self.reads
        a = store.summary(first)[layer].transpose(0, 1)
        return a, (store.summary(rest[0])[layer].transpose(0, 1) if rest else a)

    def vectors(self, config) -> int:
        """head_dim vectors this scorer reads per (kv head, block) under `config` (a StoreConfig)."""
        return summary_vectors(self.reads, config) if self.reads else self.summary_vectors

    def logits(self, inp: ScoreInput, backend: str, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def score_bytes(self, store: BlockStore, seq: Sequence) -> int:
        """Summary bytes this scorer reads for `seq` (the byte model: `core.traffic`)."""
        c = store.config
        tiles = seq.num_blocks * c.num_kv_heads
        return summary_traffic(tiles, self.vectors(c), c.head_dim, c.summary_itemsize).summary_bytes
