"""Sweeps that the routing notebooks share: probes into stores, routers over grids, timings.

Rows are plain dicts (one per grid point and router), so a notebook can pivot, plot and
assert on them without another dependency.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from ..attention.decode import all_blocks, dense_attention, sparse_attention
from ..core.profiling import median_time
from ..core.tables import format_table  # noqa: F401  (notebooks call study.format_table)
from ..routing.mass import block_attention_mass
from ..routing.router import Router
from ..storage.store import BlockStore, Sequence, StoreConfig
from ..storage.summaries import DEFAULT_SUMMARIES
from .metrics import evaluate
from .probes import Probe


def probe_store(probe: Probe, block_size: int, dtype="float32", num_layers: int = 1,
                spare_blocks: int = 2, reads=()) -> tuple[BlockStore, Sequence]:
    """A store just large enough for `probe`, with the probe written into a new sequence. It keeps the default
    summaries and any others named in `reads` (a scorer's `reads`, e.g. ("khalf",))."""
    T, H, D = probe.k.shape
    summaries = DEFAULT_SUMMARIES + tuple(s for s in reads if s not in DEFAULT_SUMMARIES)
    cfg = StoreConfig(num_layers=num_layers, num_kv_heads=H, head_dim=D, block_size=block_size,
                      num_blocks=-(-T // block_size) + spare_blocks, dtype=dtype, summaries=summaries)
    store = BlockStore(cfg)
    return store, probe.write(store)


def sweep(make_probe: Callable[..., Probe], grid: Iterable[dict], routers: dict[str, Router],
          block_size: int | None = None, dtype="float32", desc: str = "sweep", progress: bool = True) -> list[dict]:
    """Evaluate every router at every grid point.

    `make_probe(**point)` builds the probe; a point may carry `block_size` (else the
    argument is used). Returns one row per (point, router): the point's fields, `router`,
    and every `RouteEval` field.
    """
    from tqdm.auto import tqdm
    grid = list(grid)
    rows = []
    for point in tqdm(grid, desc=desc, disable=not progress):
        bs = point.get("block_size", block_size)
        probe = make_probe(**{k: v for k, v in point.items() if k != "block_size"})
        store, seq = probe_store(probe, bs, dtype)
        mass = block_attention_mass(probe.q, store, seq, 0)
        dense, _ = sparse_attention(probe.q, store, seq, 0, all_blocks(store, seq))
        for name, router in routers.items():
            ev = evaluate(router, probe.q, store, seq, 0, needle_blocks=probe.needle_blocks(bs), mass=mass, dense=dense)
            rows.append({**point, "block_size": bs, "router": name, **ev.as_dict(),
                         "summary_overhead": store.summary_bytes() / store.kv_bytes()})
    return rows


@dataclass(frozen=True)
class StepTiming:
    """Median seconds of one decode step's parts (for ratios; absolute times are noise here)."""

    route: float
    attend: float
    dense: float

    @property
    def route_fraction(self) -> float:
        """Routing's share of a routed step (route + sparse attention)."""
        return self.route / (self.route + self.attend)

    @property
    def speedup_vs_dense(self) -> float:
        return self.dense / (self.route + self.attend)


def time_step(router: Router, q: torch.Tensor, store: BlockStore, seq: Sequence, layer: int = 0,
              repeats: int = 7, warmup: int = 2) -> StepTiming:
    """Median wall time of routing, sparse attention over its selection, and dense attention.

    "dense" is the in-place `dense_attention` (one product per run of physical blocks, no gather):
    the fastest exact path the store has, so a routed step's speed-up is measured against the best
    dense baseline, not against the gather path that sparse attention uses.
    """
    blocks = router.select(q, store, seq, layer).blocks

    med = lambda fn: median_time(fn, repeats, warmup)
    return StepTiming(route=med(lambda: router.select(q, store, seq, layer)),
                      attend=med(lambda: sparse_attention(q, store, seq, layer, blocks)),
                      dense=med(lambda: dense_attention(q, store, seq, layer)))


def pivot(rows: list[dict], index: str, columns: str, value: str, where: dict | None = None):
    """(index values, column values, [len(index), len(columns)] float array of mean `value`)."""
    import numpy as np
    rows = [r for r in rows if all(r.get(k) == v for k, v in (where or {}).items())]
    ix = sorted({r[index] for r in rows})
    cx = sorted({r[columns] for r in rows})
    acc = np.zeros((len(ix), len(cx)))
    cnt = np.zeros_like(acc)
    for r in rows:
        i, j = ix.index(r[index]), cx.index(r[columns])
        acc[i, j] += r[value]
        cnt[i, j] += 1
    with np.errstate(invalid="ignore"):
        return ix, cx, acc / cnt


def mean_of(rows: list[dict], value: str, **where) -> float:
    """Mean of `value` over the rows matching `where` (raises if none match)."""
    vals = [r[value] for r in rows if all(r.get(k) == v for k, v in where.items())]
    if not vals:
        raise ValueError(f"no rows match {where}")
    return sum(vals) / len(vals)
