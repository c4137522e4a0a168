"""CPU decode benchmark: sparsekv sparse and dense against SDPA and FlexAttention, each over its floor.

    python -m benchmarks.bench_cpu_decode            # full: 16k, 64k, 128k tokens; fp32 and bf16
    python benchmarks/bench_cpu_decode.py --quick    # a fast pass over small contexts

One run measures, on this machine:
  * read bandwidth: median time of summing a 1 GiB tensor, timed inside each case;
  * compute rate: a large square float32 matmul (2048^3), this machine's compute ceiling; the
    decode-shaped product ([H, G, D] x [H, D, N]) MKL reaches is recorded beside it, lower;
  * per case (context, dtype), the same work on both sides of each comparison:
      attention alone       sparsekv `sparse_attn` against `flex` (FlexAttention compiled, with a
                            BlockMask of the same selection handed to it);
      routing + attention   sparsekv `sparse` (the router, then sparse attention) against
                            `flex_routed` (the same router, then a BlockMask built from that
                            selection with BlockMask.from_kv_blocks, then Flex); `routed_speedup_vs_flex`
                            sets sparsekv's routed step against Flex's attention alone;
      dense                 sparsekv `dense` (in place) against torch SDPA, twice: `sdpa` with 32 query heads over
                            8 kv heads (enable_gqa=True), and `sdpa_grouped` in the GQA-free layout [1, H_kv, G, D]
                            (a kv head's G query heads as G query rows: the same maths, equal head counts). The
                            kernel each dispatches to is recorded (`sdpa_kernel`); on torch 2.13's CPU both take
                            the flash kernel (`_scaled_dot_product_flash_attention_for_cpu`), which handles GQA in
                            place, but split the work differently (32 heads x 1 row, or 8 heads x 4 rows).
    sparsekv runs as the Engine runs it: a decode plan (`attention.plan`) checked once, then per layer
    the router (`Router.select_planned`: the fused C++ route pass) and the fused attention kernel.
    `sparse_unfused` is the same step with scoring, softmax and top-k in torch (the route before
    fusion), and `*_torch` the torch path for attention too.
Each variant's floor is the larger of its byte floor (the bytes it must read over the measured
bandwidth: dense all K/V; attention alone the selected K/V; routed variants the selected K/V plus
the summaries scored) and its compute floor (4 * Hq * D flops per key row it attends, plus for
routed variants 2 key rows' worth per block scored, at the measured compute rate); "x floor" is time
over that larger floor, and `bound` says which applies. Times are medians after warm-up. Each
variant (and the bandwidth probe) is timed in a warmed block, and the blocks are cycled twice, so
drift in this shared machine hits them alike.
Cold and warm: this machine's L3 is large (300 MiB here), larger than a 2,048-token selection and its
summaries at 128k tokens (17-34 MiB), so a call repeated on one selection reads it from L3 and can
beat the DRAM byte floor. A decode step reads each layer's selection once. So every timed call takes
the next of `--rotate` (256) decode queries, each with its own selection (Flex gets each selection's
BlockMask, built outside the timing), and each variant starts where the previous one's calls end, so
no two variants read the same selection; at 128k the K/V pool (0.5-1 GiB) does not fit in L3, and what
a call finds in cache is what random selections share. Those are the main numbers. The small variants
are also timed warm (`*_warm_s`: one query repeated), for reference. Results go to
benchmarks/results/cpu_decode.json and figures/cpu_decode.png.
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import sparsekv as sk  # noqa: E402
from sparsekv.attention.plan import plan_decode  # noqa: E402
from sparsekv.core.backend import resolve  # noqa: E402
from sparsekv.core.profiling import median_time  # noqa: E402
from sparsekv.core.traffic import attention_traffic, dense_traffic  # noqa: E402
from sparsekv.studies import precision  # noqa: E402
from sparsekv.suite import cpuconfig  # noqa: E402


def blocked_medians(fns: dict, repeats: int, warmup: int, passes: int = 2) -> dict:
    """Median seconds of each callable, timed in warmed blocks (warm-up, then `repeats` calls),
    the blocks cycled `passes` times so that drift in this shared machine hits every variant.
    (Timing variants call-by-call instead lets a 1 GiB peer evict the small ones' working set
    between calls, which measures interference rather than the variant.)"""
    times = {k: [] for k in fns}
    for _ in range(passes):
        for k, fn in fns.items():
            for _ in range(warmup):
                fn()
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def llc_bytes() -> int:
    """The last-level cache's size in bytes from sysfs (0 if unknown)."""
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (idx / "size").read_text().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
            best = max(best, int(size.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best


def read_bandwidth(repeats: int) -> float:
    """Bytes per second of a large float32 reduction (reads 1 GiB)."""
    x = torch.ones(2**28)
    t = median_time(lambda: x.sum(), repeats, 2)
    return x.numel() * 4 / t


def matmul_rate(H: int, G: int, D: int, repeats: int, N: int = 512) -> float:
    """FLOP/s of the decode-shaped product q [H, G, D] x k^T [H, D, N] in float32, on a K small
    enough (H * N * D * 4 bytes = 2 MiB by default) to stay in cache: what MKL reaches at decode's shape."""
    q, k = torch.randn(H, G, D), torch.randn(H, N, D)
    inner = 50
    t = median_time(lambda: [torch.bmm(q, k.transpose(1, 2)) for _ in range(inner)], repeats, 2) / inner
    return 2 * H * G * D * N / t


def peak_rate(repeats: int, n: int = 2048) -> float:
    """FLOP/s of a large square float32 matmul: this machine's compute ceiling, the roofline's flat part."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n ** 3 / median_time(lambda: a @ b, repeats, 2)


def build_case(n: int, dtype: torch.dtype, H: int, D: int, bs: int, seed: int, summary_dtype=None):
    cfg = sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs,
                         num_blocks=-(-n // bs) + 1, dtype=dtype, repr_keys=0, summary_dtype=summary_dtype)
    store = sk.BlockStore(cfg)
    seq = store.new_sequence()
    g = torch.Generator().manual_seed(seed)
    chunk = 16384
    for i in range(0, n, chunk):       # append in chunks to bound temporary memory
        t = min(chunk, n - i)
        store.append(seq, torch.randn(1, t, H, D, generator=g).to(dtype), torch.randn(1, t, H, D, generator=g).to(dtype))
    return store, seq


def sdpa_kernel(fn) -> str:
    """The ATen kernel SDPA dispatched to for `fn()` (its private `_scaled_dot_product_*` op, as the profiler names
    it): the flash CPU kernel, or the math path (explicit matmuls and softmax) that SDPA falls back to."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    ops = [e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")]
    return ops[0][len("aten::"):] if ops else "unknown"


def route_gap(fused, ref) -> float | None:
    """None if two selections hold the same blocks; else the largest relative shortfall, over kv heads, of the
    mass `fused` covers against what `ref` covers, both under ref's block distribution (0 for an exact tie)."""
    if torch.equal(fused.blocks, ref.blocks):
        return None
    m = ref.mass
    cover = lambda b: torch.where(b >= 0, m.gather(1, b.clamp(min=0)), 0.0).sum(1)
    return float(((cover(ref.blocks) - cover(fused.blocks)) / cover(ref.blocks)).max().clamp(min=0))


def rotating(fn, count: int, start: int = 0):
    """A no-argument callable that calls fn(start), fn(start + 1), ... (mod count) in turn."""
    turn = itertools.cycle([(start + i) % count for i in range(count)])
    return lambda: fn(next(turn))


def run_case(n, dtype, args, bw, rate, flex_fn):
    H, G, D, bs = args.kv_heads, args.q_heads // args.kv_heads, args.head_dim, args.block_size
    store, seq = build_case(n, dtype, H, D, bs, seed=n)
    R = args.rotate
    qs = [torch.randn(H * G, D).to(dtype) for _ in range(R)]      # R decode queries, each with its own selection
    q = qs[0]
    router = sk.Router("minmax", token_budget=args.budget)
    unfused = sk.Router("minmax", token_budget=args.budget, backend="torch")     # score, softmax, top-k in torch
    # sparsekv runs as the Engine runs it: a decode plan checked once per step, then per layer
    # route + attention without re-validation (`attention.plan`).
    plan = plan_decode(store, seq, H * G)
    torch_plan = plan_decode(store, seq, H * G, backend="torch")
    sels = [plan.route(router, 0, qi).blocks for qi in qs]
    sel = plan.route(router, 0, q)
    itemsize = store.config.itemsize
    res = {"context": n, "dtype": str(dtype).replace("torch.", ""), "plan_backend": plan.backend, "rotate": R}

    # Peers read contiguous [1, H, N, D] tensors (their native layout), built outside the timing.
    k4 = store.gather(seq, 0)[0].permute(1, 0, 2).unsqueeze(0).contiguous()
    v4 = store.gather(seq, 0)[1].permute(1, 0, 2).unsqueeze(0).contiguous()
    q4s = [qi.view(1, H * G, 1, D) for qi in qs]
    q4 = q4s[0]
    sdpa_at = lambda i: torch.nn.functional.scaled_dot_product_attention(q4s[i], k4, v4, enable_gqa=True)
    # The GQA-free layout: a kv head's G query heads as G query rows, [1, H, G, D] against [1, H, N, D]. The same
    # maths with equal head counts: no enable_gqa, one (head, query block) work item per kv head, K/V read once each.
    qgs = [qi.view(1, H, G, D) for qi in qs]
    sdpa_grouped_at = lambda i: torch.nn.functional.scaled_dot_product_attention(qgs[i], k4, v4)
    # Each timed variant is f(i) over query i: its cold form turns through the R queries (`rotating`), its
    # warm form repeats query 0.
    at = {"sparse": lambda i: plan.sparse(0, qs[i], plan.route(router, 0, qs[i]).blocks)[0],
          "sparse_attn": lambda i: plan.sparse(0, qs[i], sels[i])[0],
          "dense": lambda i: plan.dense(0, qs[i]), "sdpa": sdpa_at, "sdpa_grouped": sdpa_grouped_at,
          "sparse_unfused": lambda i: plan.sparse(0, qs[i], plan.route(unfused, 0, qs[i]).blocks)[0]}
    backend = resolve("auto", q)
    res["backend"] = backend
    if dtype == torch.float32:    # routing over bf16 summaries (min rounded down, max up): half the routing bytes
        store16, seq16 = build_case(n, dtype, H, D, bs, seed=n, summary_dtype=torch.bfloat16)
        plan16 = plan_decode(store16, seq16, H * G)
        sel16 = plan16.route(router, 0, q)
        p32, p16 = precision.picked_tiles(sel.blocks), precision.picked_tiles(sel16.blocks)
        res["bf16_summary_overlap"] = len(p32 & p16) / len(p32)
        res["bf16_summary_bytes_ratio"] = sel16.traffic.summary_bytes / sel.traffic.summary_bytes
        res["sparse_b16sum_route_bytes"] = sel16.traffic.total
        at["sparse_b16sum"] = lambda i: plan16.sparse(0, qs[i], plan16.route(router, 0, qs[i]).blocks)[0]
    if backend == "cpp":          # the torch path too, in the same run: the fused kernels' before and after
        at.update({"sparse_torch": lambda i: torch_plan.sparse(0, qs[i], torch_plan.route(unfused, 0, qs[i]).blocks)[0],
                   "sparse_attn_torch": lambda i: torch_plan.sparse(0, qs[i], sels[i])[0],
                   "dense_torch": lambda i: torch_plan.dense(0, qs[i])})

    # Correctness in the same run: dense == SDPA, sparse == Flex over the same selection.
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    dense_out = sk.dense_attention(q, store, seq, 0).float()
    res["dense_vs_sdpa_maxerr"] = max(float((dense_out - sdpa_at(0)[0, :, 0].float()).abs().max()),
                                      float((dense_out - sdpa_grouped_at(0)[0].reshape(H * G, D).float()).abs().max()))
    res["sdpa_kernel"], res["sdpa_grouped_kernel"] = sdpa_kernel(lambda: sdpa_at(0)), sdpa_kernel(lambda: sdpa_grouped_at(0))
    if flex_fn is not None:
        from torch.nn.attention.flex_attention import BlockMask, create_block_mask
        nb = seq.num_blocks
        kp = torch.nn.functional.pad(k4, (0, 0, 0, nb * bs - n))
        vp = torch.nn.functional.pad(v4, (0, 0, 0, nb * bs - n))

        def block_mask(blocks):     # Flex's mask for a selection, from a mask_mod (built outside the timing)
            chosen = sk.metrics.selected_mask(blocks, nb)                     # [H, nb] bool
            return create_block_mask(lambda b, h, q_idx, kv_idx: chosen[h // G, kv_idx // bs] & (kv_idx < n),
                                     1, H * G, 1, nb * bs, device="cpu", BLOCK_SIZE=(1, bs))

        t0 = time.perf_counter()
        masks = [block_mask(b) for b in sels]
        res["flex_mask_s"] = (time.perf_counter() - t0) / R
        t0 = time.perf_counter()
        flex_out = flex_fn(q4, kp, vp, block_mask=masks[0], enable_gqa=True)
        res["flex_first_call_s"] = time.perf_counter() - t0                  # includes compilation
        at["flex"] = lambda i: flex_fn(q4s[i], kp, vp, block_mask=masks[i], enable_gqa=True)

        def flex_routed(i):         # the same routing, then Flex's native block-sparse input
            blocks = plan.route(router, 0, qs[i]).blocks                      # [H, K], -1 padded
            per_q = blocks.repeat_interleave(G, 0)                            # [Hq, K]
            num = (per_q >= 0).sum(-1).to(torch.int32).view(1, H * G, 1)
            idx = torch.zeros(1, H * G, 1, nb, dtype=torch.int32)             # Flex wants a column per kv block
            idx[0, :, 0, :per_q.shape[1]] = per_q.clamp_min(0)
            # No "full" blocks (the mask decides every tile); passed as empty because Inductor's CPU template
            # for Flex (torch 2.13) fails to compile without them.
            none_full = torch.zeros_like(num), torch.zeros_like(idx)
            mask = BlockMask.from_kv_blocks(num, idx, *none_full, BLOCK_SIZE=(1, bs), mask_mod=lambda b, h, qi, ki: ki < n,
                                            seq_lengths=(1, nb * bs), compute_q_blocks=False)   # forward only
            return flex_fn(q4s[i], kp, vp, block_mask=mask, enable_gqa=True)

        routed_out = flex_routed(0)
        res["sparse_vs_flex_routed_maxerr"] = float((at["sparse"](0).float() - routed_out[0, :, 0].float()).abs().max())
        at["flex_routed"] = flex_routed
        sparse_out = sk.sparse_attention(q, store, seq, 0, sel.blocks)[0].float()
        res["sparse_vs_flex_maxerr"] = float((sparse_out - flex_out[0, :, 0].float()).abs().max())
        last = R - 1                # and the last rotating selection, against its own mask
        res["sparse_vs_flex_maxerr"] = max(res["sparse_vs_flex_maxerr"], float(
            (at["sparse_attn"](last).float() - at["flex"](last)[0, :, 0].float()).abs().max()))
        ok_flex = res["sparse_vs_flex_maxerr"] < tol and res["sparse_vs_flex_routed_maxerr"] < tol
    else:
        ok_flex = True
    # The fused route against the torch router on every query: the same blocks, or (at a near-tie, where float32
    # rounding of the two summation orders decides) blocks covering the same routed mass up to rounding.
    agree = [route_gap(plan.route(router, 0, qi), plan.route(unfused, 0, qi)) for qi in qs]
    res["fused_route_equal_share"] = sum(g is None for g in agree) / R
    res["fused_route_mass_gap"] = max((g for g in agree if g is not None), default=0.0)
    res["correct"] = bool(res["dense_vs_sdpa_maxerr"] < tol and ok_flex and res["fused_route_mass_gap"] < 1e-5)
    x = torch.ones(2**28)                                                     # bandwidth, measured per case
    # Each variant starts its turn where the previous one's timed calls end, so no two variants read the same
    # selection (with R >= variants x calls per variant), and a call finds only what other selections share.
    per_variant = 2 * (args.warmup + args.repeats)
    variants = {k: rotating(f, R, j * per_variant) for j, (k, f) in enumerate(at.items())}
    res["rotation_reuse"] = len(at) * per_variant > R                       # True: some selections are read twice
    variants["bandwidth"] = lambda: x.sum()
    med = blocked_medians(variants, args.repeats, args.warmup)                # turning through R queries: the main numbers
    bw = x.numel() * 4 / med.pop("bandwidth")
    res["read_bandwidth_Bps"] = bw
    for k, v in med.items():
        res[f"{k}_s"] = v
    small = {k: (lambda f=at[k]: f(0)) for k in ("sparse", "sparse_attn", "flex", "flex_routed") if k in at}
    for k, v in blocked_medians(small, args.repeats, args.warmup).items():   # warm: repeated on the same selection
        res[f"{k}_warm_s"] = v

    attn = attention_traffic(sel.blocks, n, bs, D, itemsize, H * G)
    dense = dense_traffic(n, H, bs, D, itemsize, H * G)
    routed_bytes, attn_bytes = attn.total + sel.traffic.total, attn.total
    rows_read = int((sel.blocks >= 0).sum()) * bs // H                       # key rows per kv head (upper bound)
    # Routing's compute: Quest's bound is two products per summary element and query head (q+ max + q- min),
    # i.e. the work of 2 key rows per block, charged to the routed variants' compute floor.
    route_rows = 2 * seq.num_blocks
    res["sparse_bytes"], res["attn_bytes"], res["dense_bytes"] = routed_bytes, attn_bytes, dense.total
    routed = (routed_bytes, rows_read + route_rows)
    work = {"sparse": routed, "sparse_attn": (attn_bytes, rows_read), "flex": (attn_bytes, rows_read),
            "flex_routed": routed, "dense": (dense.total, n), "sdpa": (dense.total, n), "sdpa_grouped": (dense.total, n),
            "sparse_torch": routed, "sparse_attn_torch": (attn_bytes, rows_read), "sparse_unfused": routed,
            "dense_torch": (dense.total, n),
            "sparse_b16sum": (attn_bytes + res.get("sparse_b16sum_route_bytes", 0), rows_read + route_rows)}
    for v, (nbytes, rows) in work.items():
        if f"{v}_s" in res:
            byte_floor, compute_floor = nbytes / bw, 4 * H * G * D * rows / rate
            res[f"{v}_floor_s"] = max(byte_floor, compute_floor)
            res[f"{v}_bound"] = "bytes" if byte_floor >= compute_floor else "compute"
            res[f"{v}_over_floor"] = res[f"{v}_s"] / res[f"{v}_floor_s"]
            if f"{v}_warm_s" in res:
                res[f"{v}_warm_over_floor"] = res[f"{v}_warm_s"] / res[f"{v}_floor_s"]
    res["sparse_speedup_vs_sdpa"] = res["sdpa_s"] / res["sparse_s"]
    res["dense_speedup_vs_sdpa"] = res["sdpa_s"] / res["dense_s"]
    res["dense_speedup_vs_sdpa_grouped"] = res["sdpa_grouped_s"] / res["dense_s"]   # SDPA at its best layout
    for v in ("sparse", "sparse_attn", "dense"):
        if f"{v}_torch_s" in res:
            res[f"{v}_speedup_vs_torch_path"] = res[f"{v}_torch_s"] / res[f"{v}_s"]
    res["fused_route_speedup"] = res["sparse_unfused_s"] / res["sparse_s"]          # same attention, routing differs
    if "flex_s" in res:
        res["attn_speedup_vs_flex"] = res["flex_s"] / res["sparse_attn_s"]              # attention vs attention
        res["routed_speedup_vs_flex_routed"] = res["flex_routed_s"] / res["sparse_s"]  # routing + attention, both
        res["routed_speedup_vs_flex"] = res["flex_s"] / res["sparse_s"]                # routed step vs Flex's attention alone
        res["attn_speedup_vs_flex_warm"] = res["flex_warm_s"] / res["sparse_attn_warm_s"]
        res["routed_speedup_vs_flex_routed_warm"] = res["flex_routed_warm_s"] / res["sparse_warm_s"]
    return res


def print_table(rows):
    cols = [("context", "{:>8}"), ("dtype", "{:>9}"), ("sparse_over_floor", "{:>8.2f}"), ("sparse_attn_over_floor", "{:>8.2f}"),
            ("dense_over_floor", "{:>8.2f}"), ("sdpa_over_floor", "{:>8.2f}"), ("sdpa_grouped_over_floor", "{:>8.2f}"),
            ("flex_over_floor", "{:>8.2f}"),
            ("attn_speedup_vs_flex", "{:>9.2f}"), ("routed_speedup_vs_flex_routed", "{:>9.2f}"),
            ("routed_speedup_vs_flex", "{:>9.2f}"), ("dense_speedup_vs_sdpa", "{:>9.2f}"),
            ("fused_route_speedup", "{:>9.2f}"), ("correct", "{:>7}")]
    heads = ["context", "dtype", "routed/fl", "attn/fl", "dense/fl", "sdpa/fl", "sdpa-g/fl", "flex/fl", "attn/flex", "rt/flex-rt",
             "rt/flex", "dn vs sdpa", "fused rt", "ok"]
    print("  ".join(f"{h:>9}" for h in heads))
    for r in rows:
        print("  ".join(f"{fmt.format(r[c]) if c in r else '-':>9}" for c, fmt in cols))


def plot(results, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sparsekv.suite import viz
    rows = results["cases"]
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7.2 * len(dtypes), 4.2), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        rs = [r for r in rows if r["dtype"] == dt]
        x = [r["context"] for r in rs]
        for v, style, color in (("sparse", "o-", viz.COLORS[0]), ("sparse_attn", "o--", viz.COLORS[4]),
                                ("flex", "s--", viz.COLORS[2]), ("flex_routed", "s-.", viz.COLORS[3]),
                                ("dense", "D-", viz.COLORS[5]), ("sdpa", "^--", viz.COLORS[1]),
                                ("sdpa_grouped", "v:", viz.COLORS[7])):
            if all(f"{v}_s" in r for r in rs):
                ax.plot(x, [r[f"{v}_s"] * 1e3 for r in rs], style, color=color, label=v)
                ax.plot(x, [r[f"{v}_floor_s"] * 1e3 for r in rs], color=color, alpha=0.5, lw=1, ls=(0, (1, 3)))
        ax.set(xscale="log", yscale="log", xlabel="context tokens", ylabel="ms per layer step (dotted: its floor)",
               title=f"CPU decode, {dt}, budget {results['config']['budget']} tokens")
        viz.log_ticks(ax, "x", sorted(set(x))); viz.log_axis_plain(ax, "y")
    viz.legend_outside(axes[0][-1])

    from benchmarks.repeats import span_text

    def span(num, den):     # num's time over den's, over every case (never the best one)
        return span_text([r[f"{num}_s"] / r[f"{den}_s"] for r in rows], digits=1)
    sdpa = "sdpa_grouped" if all("sdpa_grouped_s" in r for r in rows) else "sdpa"
    found = [f"sparsekv dense at {span(sdpa, 'dense')} the speed of SDPA"
             + (" in its faster (GQA-free) layout" if sdpa == "sdpa_grouped" else "")]
    if all("flex_routed_s" in r for r in rows):
        found.append(f"routed at {span('flex_routed', 'sparse')} the speed of Flex with the same selection")
    fig.suptitle("; ".join(found) + f" ({results.get('cpu', 'an unrecorded CPU')}, {results['threads']} threads)",
                 fontsize=10)
    viz.save(fig, path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[16384, 65536, 131072])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rotate", type=int, default=256, help="decode queries (each with its own selection) timed calls turn through")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes ~20 s a shape)")
    ap.add_argument("--quick", action="store_true", help="contexts 4k and 16k, 3 repeats")
    ap.add_argument("--run-kind", default="full run", help="recorded in the JSON (e.g. 'short verification run')")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cpu_decode.json")
    ap.add_argument("--figure", type=Path, default=ROOT / "figures" / "cpu_decode.png")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts, args.repeats = [4096, 16384], 3
    torch.manual_seed(0)
    bw = read_bandwidth(args.repeats)
    G = args.q_heads // args.kv_heads
    decode_rate = matmul_rate(args.kv_heads, G, args.head_dim, args.repeats)
    rate = max(peak_rate(args.repeats), decode_rate)
    print(f"read bandwidth {bw / 1e9:.1f} GB/s; peak matmul {rate / 1e9:.1f} GFLOP/s (decode-shaped "
          f"{decode_rate / 1e9:.1f}); "
          f"threads {torch.get_num_threads()}", flush=True)
    llc = llc_bytes()
    print(f"last-level cache {llc / 2**20:.0f} MiB; timed calls turn through {args.rotate} queries, each with its own "
          "selection (cold), and the small variants are also timed repeating one (warm)", flush=True)
    flex_fn = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import flex_attention
        flex_fn = torch.compile(flex_attention)
    rows = []
    for dt in args.dtypes:
        for n in args.contexts:
            r = run_case(n, getattr(torch, dt), args, bw, rate, flex_fn)
            rows.append(r)
            print(f"  {dt} {n}: routed {r['sparse_over_floor']:.2f}x floor ({r['sparse_bound']}), attention alone "
                  f"{r['sparse_attn_over_floor']:.2f}x, dense {r['dense_over_floor']:.2f}x ({r['dense_bound']}), "
                  f"sdpa {r['sdpa_over_floor']:.2f}x ({r['sdpa_kernel']}), grouped {r['sdpa_grouped_over_floor']:.2f}x "
                  f"({r['sdpa_grouped_kernel']})", flush=True)
    results = {
        "benchmark": "cpu_decode", "run_kind": args.run_kind, "date": date.today().isoformat(),
        "machine": platform.processor() or platform.machine(), "cpu": cpuconfig.cpu_model(),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "read_bandwidth_Bps": bw, "matmul_flops": rate, "decode_matmul_flops": decode_rate, "llc_bytes": llc, "rotate": args.rotate,
        "config": {k: getattr(args, k) for k in ("q_heads", "kv_heads", "head_dim", "block_size", "budget", "repeats", "warmup")},
        "cases": rows,
    }
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    plot(results, args.figure)
    print(f"wrote {args.out} and {args.figure}")
    if not all(r["correct"] for r in rows):
        print("ERROR: a variant disagreed with its peer beyond tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
