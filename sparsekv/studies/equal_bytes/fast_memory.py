"""The equal-bytes study's third byte axis (issue 55, item 5): what a router over lossless blocks must keep in fast
memory when a cold tier on disk holds the blocks a step does not read, and the stall per decode step that costs.

    run_document(net, doc, methods, hot_shares, ...)   rows for one document: every (question, router, hot share)
    fast_held(m, hot_blocks, tokens, ...)               the bytes held in fast memory, a share of a bf16 dense cache

Per (document, router) a reference engine holds everything in memory; per hot share, an engine of the same store
keeps `hot_blocks` tiles per layer in memory (`StoreConfig.hot_blocks`) over a cold file (`cold_dir`), reading the
router's next ranked blocks ahead (`prefetch`). On a hybrid model (Gemma 3) the cold tier holds the global layers'
tiles only: every step reads a sliding layer's whole window, so its blocks stay in memory. Each question is asked on
both under the headline rule (the question prefilled densely, then the answer teacher-forced through the router), and:

    exact          the answer's log-probabilities equal the in-memory engine's bit for bit: the cold tier returns the
                   bytes written, so accuracy cannot move (an invariant, checked on every row, never assumed)
    fast_held      hot tiles + the router's summaries (summaries never leave memory), as a share of a bf16 dense cache
                   of the document: the cold tier's tiles are held too, on disk
    stall_s        seconds the answer's decode steps waited for the disk (misses and late prefetches, on the caller's
                   thread; `storage.tiers.TierStats`), and the tile accesses by outcome
    step_ms        the median decode step of the answer over the cold tier, and in memory (`in_memory_step_ms`)

Stall is a timing: it depends on the disk, the page cache (the cold file is opened with O_DIRECT where the file
system allows it) and neighbours. It is reported, never gated, and belongs to a full run on a quiet machine.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile

from ...analysis import observe, tasks
from ...core.traffic import cache_bytes
from ...methods import Method
from ...routing.scorers import summaries_for
from .run import _lossless, method_bytes

STATS = ("hits", "prefetch_hits", "late_prefetches", "misses", "staged")


def hot_blocks_for(share: float, tokens: int, block_size: int) -> int:
    """Hot tiles per layer for a `share` of the document's blocks, at least one."""
    if not 0 < share <= 1:
        raise ValueError(f"hot share must be in (0, 1], got {share!r}")
    return max(1, math.ceil(share * math.ceil(tokens / block_size)))


def fast_held(m: Method, hot_blocks: int, tokens: int, store_config, windows=None) -> float:
    """Bytes a router keeps in fast memory over a cold tier, as a share of a bf16 dense cache of `tokens`: what the
    byte model (`run.method_bytes`) says it holds, less the global layers' tiles that are not hot (`hot_blocks` per
    layer, at most the document's). Summaries stay in memory, and so do a hybrid model's sliding layers (`windows`:
    per store layer, 0 global; the cold tier is the global layers' alone, `storage.hybrid`). Without sliding layers
    this is the hot tiles' share plus the summaries'."""
    if m.family != "router" or m.kv_bits:
        raise ValueError(f"fast memory is measured for routers over exact blocks, got {m.name!r}")
    b = method_bytes(m, tokens, store_config, windows)
    sc = store_config
    n_glob = list(windows).count(0) if windows is not None and any(windows) else sc.num_layers
    glob = cache_bytes("dense", layers=n_glob, kv_heads=sc.num_kv_heads, head_dim=sc.head_dim, tokens=tokens,
                       itemsize=2).held
    share = glob / (b["held_bytes"] / b["held"])          # the global layers' K/V, a share of the dense reference
    blocks = math.ceil(tokens / m.block_size)
    return b["held"] - share * (1.0 - min(hot_blocks, blocks) / blocks)


def _median(xs) -> float:
    xs = sorted(xs)
    return float("nan") if not xs else (xs[len(xs) // 2] + xs[(len(xs) - 1) // 2]) / 2


def _answer(engine, seq, q: tasks.Question, router):
    """Ask `q` under the dense rule, counting tier statistics over the answer's decode steps only (the question's
    dense prefill reads every block by design)."""
    child = engine.fork(seq)
    try:
        if len(q.ids) > 1:
            engine.prefill(child, q.ids[:-1])
        tiers = engine.store.tiers
        before = dataclasses.replace(tiers.stats) if tiers is not None else None
        a = observe.score_answer(engine, child, q.ids[-1], q.answer, router, keep_logprobs=True)
        if tiers is None:
            return a, None
        if tiers.cold is not None:
            tiers.wait_prefetches()
        after = tiers.stats
        delta = {k: getattr(after, k) - getattr(before, k) for k in STATS}
        delta["stall_s"] = after.stall_s - before.stall_s
        return a, delta
    finally:
        engine.finish(child)


def run_document(net, doc: tasks.Document, methods: list[Method], hot_shares, *, prefetch: int = 2,
                 cold_dir: str | None = None, meta: dict | None = None) -> list[dict]:
    """One row per (question, router, hot share) of `doc` (see the module docstring). methods: routers over exact
    blocks under the dense rule; hot_shares: shares of the document's blocks kept hot per layer, each in (0, 1];
    cold_dir: where the cold files go (a private temporary folder when None); meta: columns copied into every row."""
    import sparsekv as sk
    windows = tuple(net.config.store_windows) if any(net.config.store_windows) else None
    for m in methods:
        if not isinstance(m, Method):
            raise TypeError(f"methods must be methods.Method values, got {type(m).__name__}")
        if m.family != "router" or m.kv_bits or m.rule != "dense":
            raise ValueError(f"methods must be routers over exact blocks under the dense rule, got {m.name!r}")
    shares = [float(s) for s in hot_shares]
    for s in shares:
        hot_blocks_for(s, len(doc.ids), 16)                       # validates every share before any work
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
    rows = []
    tokens = len(doc.ids) + 16
    with tempfile.TemporaryDirectory(dir=cold_dir) as d:
        for m in methods:
            lo = _lossless(m, len(doc.ids))
            common = dict(block_size=m.block_size, num_blocks=2 * (tokens // m.block_size + 64), progress=False,
                          summaries=summaries_for((m.scorer,)))
            ref = sk.Engine(net, **common)
            seq = ref.new_sequence()
            ref.prefill(seq, doc.ids)
            want = [_answer(ref, seq, q, lo.router)[0] for q in doc.questions]
            ref.finish(seq)
            sc = ref.store.config
            nbytes = method_bytes(m, tokens, sc, windows)
            for share in shares:
                hot = hot_blocks_for(share, len(doc.ids), m.block_size)
                eng = sk.Engine(net, **common, cold_dir=d, hot_blocks=hot, prefetch=prefetch)
                try:
                    seq = eng.new_sequence()
                    eng.prefill(seq, doc.ids)
                    for i, q in enumerate(doc.questions):
                        a, st = _answer(eng, seq, q, lo.router)
                        rows.append({**(meta or {}), "question": i, "method": m.name, "hot_share": share,
                                     "hot_blocks": hot, "prefetch": prefetch,
                                     "fast_held": fast_held(m, hot, tokens, sc, windows),
                                     "held": nbytes["held"], "read": nbytes["read"],
                                     "correct": bool(a.correct), "exact": bool(a.logprobs.equal(want[i].logprobs)),
                                     "steps": len(q.answer), **st,
                                     "stall_ms_per_step": 1e3 * st["stall_s"] / len(q.answer),
                                     "step_ms": 1e3 * _median(a.step_seconds),
                                     "in_memory_step_ms": 1e3 * _median(want[i].step_seconds)})
                    eng.finish(seq)
                finally:
                    eng.close()
    return rows


def _cpu_name() -> str:
    try:
        return next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    """python -m sparsekv.studies.equal_bytes.fast_memory: rows for a block of study documents, written to
    OUT/fast_memory_{model}_{length}_{task}_{doc0}.csv with the machine and settings beside it (a .json)."""
    import argparse
    import json
    import platform
    import time
    from pathlib import Path

    import pandas as pd
    import torch
    from tqdm.auto import tqdm

    from ... import methods as mt
    from .run import Cell, documents, load
    ap = argparse.ArgumentParser(prog="python -m sparsekv.studies.equal_bytes.fast_memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--task", default="passkey")
    ap.add_argument("--doc0", type=int, default=0)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--scorers", nargs="+", default=["halves", "mean/8"])
    ap.add_argument("--share", type=float, default=0.125, help="the routers' share of the context read per step")
    ap.add_argument("--hot-shares", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1.0])
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--root", default=".", help="the repository root (where data/models is)")
    ap.add_argument("--cold-dir", default=None, help="where the cold files go (default: the system's temporary folder)")
    ap.add_argument("--out", type=Path, default=Path("results/equal_bytes/fast_memory"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cell = Cell(args.model, args.length, args.task, "study", args.doc0, args.docs, args.questions)
    methods = mt.routers(args.scorers, [args.share])
    lm = load(cell.model, cell.length, methods, args.root)
    net = next(iter(lm.engines.values())).model
    rows, t0 = [], time.perf_counter()
    for doc in tqdm(documents(cell, lm.tok), desc="documents"):
        meta = {"model": lm.name, "length": cell.length, "task": cell.task, "doc": doc.seed}
        rows += run_document(net, doc, methods, args.hot_shares, prefetch=args.prefetch, cold_dir=args.cold_dir,
                             meta=meta)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"fast_memory_{args.model}_{args.length}_{args.task}_{args.doc0}"
    pd.DataFrame(rows).to_csv(args.out / f"{stem}.csv", index=False)
    (args.out / f"{stem}.json").write_text(json.dumps({
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpu": _cpu_name() or platform.machine(), "threads": torch.get_num_threads()},
        "seconds": round(time.perf_counter() - t0, 1), "exact": all(r["exact"] for r in rows)}, indent=1))
    print(f"{len(rows)} rows, every answer exact: {all(r['exact'] for r in rows)} -> {args.out / stem}.csv")
    return 0 if all(r["exact"] for r in rows) else 1


__all__ = ["STATS", "hot_blocks_for", "fast_held", "run_document", "main"]


if __name__ == "__main__":
    raise SystemExit(main())
