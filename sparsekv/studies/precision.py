"""Routing over half-precision summaries: what it changes in the selection, on probes and on real keys.

`StoreConfig(summary_dtype="bf16")` halves the bytes a scorer reads. min is rounded down and max up
(`storage.summaries.cast`), so Quest's bound never shrinks; what can change is the order of blocks
whose bounds differ by less than the rounding. This module measures that on the same keys and the
same queries, one store with float32 summaries and one with bf16:

    compare(q, store32, seq32, store16, seq16, layer, routers) -> rows

For each router (same config on both stores), one row per call: `overlap`, the share of the blocks
the float32 summaries select that the bf16 summaries also select (1.0: the same selection), and
`mass32` / `mass16`, the true attention mass each selection covers (mean over query heads), so a
changed selection can be judged by what it costs. `observe_real` collects such rows from a model's
decode steps on real text; `probe_rows` from the synthetic needle probes (`analysis.probes`).
"""
from __future__ import annotations

import torch

from ..analysis.metrics import attention_mass_recall
from ..analysis.observe import observe_decode
from ..analysis.probes import ProbeConfig, needle
from ..routing.mass import block_attention_mass
from ..routing.router import Router
from ..storage.store import BlockStore, Sequence, StoreConfig


def picked_tiles(blocks: torch.Tensor) -> set[tuple[int, int]]:
    """The (kv head, block) pairs a selection [H, K] (-1 padded) reads."""
    return {(h, j) for h, row in enumerate(blocks.tolist()) for j in row if j >= 0}


def compare(q: torch.Tensor, store32: BlockStore, seq32: Sequence, store16: BlockStore, seq16: Sequence, layer: int,
            routers: dict[str, Router]) -> list[dict]:
    """One row per router: overlap of the bf16-summary selection with the float32 one, and the true
    mass each covers. q [Hq, D]; the two stores hold the same K/V for their sequences at `layer`."""
    mass = block_attention_mass(q.float(), store32, seq32, layer)                          # [Hq, nb]
    rows = []
    for name, r in routers.items():
        a, b = r.select(q, store32, seq32, layer), r.select(q, store16, seq16, layer)
        p32 = picked_tiles(a.blocks)
        rows.append({"router": name, "layer": layer, "overlap": len(p32 & picked_tiles(b.blocks)) / len(p32),
                     "mass32": float(attention_mass_recall(mass, a.blocks).mean()),
                     "mass16": float(attention_mass_recall(mass, b.blocks).mean()),
                     "bytes_ratio": b.traffic.summary_bytes / a.traffic.summary_bytes})
    return rows


def twin(config: StoreConfig, summary_dtype: str = "bf16") -> BlockStore:
    """An empty store like `config` with one layer and `summary_dtype` summaries."""
    from dataclasses import replace
    return BlockStore(replace(config, num_layers=1, summary_dtype=summary_dtype, cold_dir=None, hot_blocks=None))


def observe_real(engine, seq: Sequence, tokens: list[int], routers: dict[str, Router]) -> list[dict]:
    """Dense decode of `tokens` on a fork of `seq`; at every step and layer, the layer's K/V are copied
    into a float32-summary and a bf16-summary store and `compare` runs on the step's real query."""
    c = engine.store.config
    rows = []

    def observe(child: Sequence, step: int, layer: int, q: torch.Tensor) -> None:
        K, V = engine.store.gather(child, layer)                                            # [n, H, D]
        pair = []
        for dtype in ("fp32", "bf16"):
            s = twin(c, dtype)
            sq = s.new_sequence()
            s.append(sq, K[None].to(c.dtype), V[None].to(c.dtype))
            pair += [s, sq]
        for row in compare(q, *pair, 0, routers):
            rows.append({**row, "layer": layer, "step": step})

    observe_decode(engine, seq, tokens, observe)
    return rows


def probe_rows(lengths, strengths, depths, block_size: int, routers: dict[str, Router], seed: int = 0,
               **probe_kw) -> list[dict]:
    """`compare` on needle probes (float32 K/V): one row per (length, strength, depth, router), plus
    whether each precision's selection holds the needle's blocks for every kv head (`needle32`, `needle16`)."""
    rows = []
    for n in lengths:
        for s in strengths:
            for d in depths:
                p = needle(ProbeConfig(length=n, strength=s, seed=seed, **probe_kw), d)
                H, D = p.k.shape[1:]
                cfg = StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=block_size,
                                  num_blocks=-(-n // block_size) + 1, repr_keys=0)
                pair = []
                for dtype in ("fp32", "bf16"):
                    st = twin(cfg, dtype)
                    pair += [st, p.write(st)]
                target = set(p.needle_blocks(block_size))
                for row in compare(p.q, *pair, 0, routers):
                    r = routers[row["router"]]
                    hit = [all(target <= set(row_ids) for row_ids in r.select(p.q, st, sq, 0).blocks.tolist())
                           for st, sq in (pair[:2], pair[2:])]
                    rows.append({**row, "length": n, "strength": s, "depth": d, "needle32": hit[0],
                                 "needle16": hit[1]})
    return rows
