"""What routing costs per layer and step on this CPU: every router of notebook 13 and the hierarchical ones, against
the fused `minmax` route (`kernels/cpu/route.cpp`), in the same run, on the same store and queries.

    python -m benchmarks.bench_router_cost [--contexts 8192 32768 131072] [--calls 64] [--out ...router_cost.json]

Store: SmolLM2-135M's attention geometry (3 kv heads, 9 query heads, head dim 64), blocks of 16, float32, random
keys; the `labels` cache holds r = 2 D / block = 8 random channels per kv head (Quest's bytes per block; the
channels' choice does not change the time), and `halves` its two half-block means per tile. Each router routes `--calls` fresh random queries, one `Router.select`
each (scores, softmax, GQA aggregation, top-k), after 8 warm-up calls; reported: the median microseconds per call,
its ratio to the fused `minmax` route's, and the summary bytes the byte model charges per call. A slower router pays
for itself once the K/V reads its better selection saves exceed its extra time: at these sizes a step's K/V reads
at a 256-token budget are 2 * 256 * 3 * 64 * 4 = 393 KB per layer.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import date
from pathlib import Path

import torch

import sparsekv as sk
from sparsekv.storage.summaries import DEFAULT_SUMMARIES, LabelChannels

ROOT = Path(__file__).resolve().parents[1]
H, G, D, BS = 3, 3, 64, 16


def routers(budget: int) -> dict[str, sk.Router]:
    return {"minmax (fused)": sk.Router("minmax", token_budget=budget),
            "minmax (torch)": sk.Router("minmax", token_budget=budget, backend="torch"),
            "mean (fused)": sk.Router("mean", token_budget=budget),
            "halves (fused)": sk.Router("halves", token_budget=budget),
            "halves (torch)": sk.Router("halves", token_budget=budget, backend="torch"),
            "labels": sk.Router("labels", token_budget=budget),
            "hminmax": sk.Router("hminmax", token_budget=budget),
            "hminmax-g64-k4": sk.Router(sk.hierarchical(64, 4), token_budget=budget),
            "oracle": sk.Router("oracle", token_budget=budget)}


def store_of(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = 2 * D // BS
    labels = LabelChannels(((tuple(tuple(torch.randperm(D, generator=g)[:r].tolist()) for _ in range(H))),), "random")
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=BS,
                                         num_blocks=n // BS + 2, summaries=DEFAULT_SUMMARIES + ("klabel", "khalf"),
                                         labels=labels))
    seq = store.new_sequence()
    for start in range(0, n, 8192):
        m = min(8192, n - start)
        store.append(seq, torch.randn(1, m, H, D, generator=g), torch.randn(1, m, H, D, generator=g))
    return store, seq


def time_router(router, store, seq, queries, warm: int = 8) -> float:
    for q in queries[:warm]:
        router.select(q, store, seq, 0)
    ts = []
    for q in queries[warm:]:
        t0 = time.perf_counter()
        router.select(q, store, seq, 0)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "router_cost.json")
    args = ap.parse_args(argv)
    from sparsekv.suite import threads
    torch.set_num_threads(args.threads or threads.choose())
    g = torch.Generator().manual_seed(1)
    cases = []
    for n in args.contexts:
        store, seq = store_of(n)
        queries = [torch.randn(H * G, D, generator=g) * 2 for _ in range(8 + args.calls)]
        rs = routers(args.budget)
        row = {"context": n, "blocks": seq.num_blocks}
        for name, r in rs.items():
            row[f"{name}.us"] = 1e6 * time_router(r, store, seq, queries)
            row[f"{name}.summary_bytes"] = r.select(queries[0], store, seq, 0).traffic.summary_bytes
        for scorer, key in (("minmax", "fused_equals_torch"), ("halves", "halves_fused_equals_torch")):
            same = [torch.equal(rs[f"{scorer} (fused)"].select(q, store, seq, 0).blocks,
                                rs[f"{scorer} (torch)"].select(q, store, seq, 0).blocks) for q in queries]
            row[key] = sum(same) / len(same)                        # the same blocks (a near-tie may differ)
        base = row["minmax (fused).us"]
        for name in rs:
            row[f"{name}.over_fused_minmax"] = row[f"{name}.us"] / base
        print(f"{n:>8,} tokens: " + ", ".join(f"{k} {row[f'{k}.us']:.0f} us ({row[f'{k}.over_fused_minmax']:.1f}x)"
                                              for k in rs), flush=True)
        cases.append(row)
    res = {"date": date.today().isoformat(), "threads": torch.get_num_threads(), "budget": args.budget,
           "calls": args.calls, "geometry": {"kv_heads": H, "q_per_kv": G, "head_dim": D, "block_size": BS},
           "cpu": os.uname().machine, "routers": list(routers(args.budget)), "cases": cases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
