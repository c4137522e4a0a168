"""GPU decode benchmark: the paged Triton kernels against SDPA and FlexAttention, as fractions of
the device's measured copy bandwidth.

    python -m benchmarks.bench_decode --contexts 32768 131072 524288 --batch 1 8

Needs CUDA and triton. In one run it measures:
  * copy bandwidth: a device-to-device copy of a 4 GiB tensor (bytes read + written per second);
  * per case (context, batch), bf16 storage, 32 query and 8 kv heads, head dim 128, block 64,
    a 2,048-token budget:
      sparse        minmax routing (the block-scoring kernel) + the paged split-K kernel
      sparse_attn   the paged kernel alone, on the same selection
      dense         the paged kernel with every block selected
      sdpa          torch SDPA dense decode (enable_gqa) on contiguous K/V
      flex          FlexAttention (compiled) with a BlockMask of the same selection
    each timed with triton.testing.do_bench (median), with achieved GB/s on the bytes that
    variant must read (traffic.py's model) and that rate as a fraction of copy bandwidth.
Correctness is checked in the same run (kernel vs torch fast path, dense vs SDPA).
Writes benchmarks/results/gpu_decode_<gpu>_<date>.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sparsekv as sk  # noqa: E402
from sparsekv.attention.decode import IMPLEMENTATIONS  # noqa: E402

_batch_triton = IMPLEMENTATIONS["triton"]["batch"]    # the kernel path, unchecked (checks are outside the timing)
from sparsekv.core.traffic import attention_traffic, dense_traffic  # noqa: E402


def copy_bandwidth(do_bench) -> float:
    x = torch.empty(2**30, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x))
    return 2 * x.numel() * 4 / (ms / 1e3)


def build(n, batch, args):
    H, D, bs = args.kv_heads, args.head_dim, args.block_size
    nb = -(-n // bs)
    cfg = sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=batch * nb + 1,
                         dtype=torch.bfloat16, device="cuda", repr_keys=0)
    store = sk.BlockStore(cfg)
    g = torch.Generator(device="cuda").manual_seed(n + batch)
    seqs = []
    for _ in range(batch):
        s = store.new_sequence()
        for i in range(0, n, 65536):
            t = min(65536, n - i)
            store.append(s, torch.randn(1, t, H, D, device="cuda", generator=g, dtype=torch.bfloat16),
                         torch.randn(1, t, H, D, device="cuda", generator=g, dtype=torch.bfloat16))
        seqs.append(s)
    return store, seqs


def run_case(n, batch, args, bw, do_bench, flex_fn):
    H, G, D, bs = args.kv_heads, args.q_heads // args.kv_heads, args.head_dim, args.block_size
    store, seqs = build(n, batch, args)
    q = torch.randn(batch, H * G, D, device="cuda", dtype=torch.bfloat16)
    router = sk.Router("minmax", token_budget=args.budget, backend="triton")
    sels = [router.select(q[b], store, s, 0).blocks for b, s in enumerate(seqs)]
    row = {"context": n, "batch": batch}

    def sparse():
        blocks = [router.select(q[b], store, s, 0).blocks for b, s in enumerate(seqs)]
        return _batch_triton(q, store, seqs, 0, blocks)

    row["sparse_ms"] = do_bench(sparse)
    row["sparse_attn_ms"] = do_bench(lambda: _batch_triton(q, store, seqs, 0, sels))
    row["dense_ms"] = do_bench(lambda: _batch_triton(q, store, seqs, 0, None))
    k4 = torch.stack([store.gather(s, 0)[0].permute(1, 0, 2) for s in seqs])      # [B, H, N, D]
    v4 = torch.stack([store.gather(s, 0)[1].permute(1, 0, 2) for s in seqs])
    q4 = q[:, :, None, :]
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)
    row["sdpa_ms"] = do_bench(sdpa)
    # correctness in the same run
    out_k, _ = _batch_triton(q, store, seqs, 0, sels)
    out_t, _ = sk.batch_attention(q, store, seqs, 0, sels, backend="torch")
    row["kernel_vs_torch_maxerr"] = float((out_k.float() - out_t.float()).abs().max())
    out_d, _ = _batch_triton(q, store, seqs, 0, None)
    row["dense_vs_sdpa_maxerr"] = float((out_d.float() - sdpa()[:, :, 0].float()).abs().max())
    if flex_fn is not None:
        from torch.nn.attention.flex_attention import create_block_mask
        nbk = seqs[0].num_blocks
        chosen = torch.stack([sk.metrics.selected_mask(s.cpu(), nbk) for s in sels]).cuda()   # [B, H, nb]
        mask_mod = lambda b, h, qi, kv: chosen[b, h // G, kv // bs] & (kv < n)
        bm = create_block_mask(mask_mod, batch, H * G, 1, nbk * bs, device="cuda", BLOCK_SIZE=(1, bs))
        pad = nbk * bs - n
        kp = torch.nn.functional.pad(k4, (0, 0, 0, pad))
        vp = torch.nn.functional.pad(v4, (0, 0, 0, pad))
        row["flex_ms"] = do_bench(lambda: flex_fn(q4, kp, vp, block_mask=bm, enable_gqa=True))
    itemsize = 2
    attn = sum(attention_traffic(s.cpu(), n, bs, D, itemsize, H * G).total for s in sels)
    route = batch * seqs[0].num_blocks * H * 2 * D * itemsize
    dense = batch * dense_traffic(n, H, bs, D, itemsize, H * G).total
    for v, nbytes in (("sparse", attn + route), ("sparse_attn", attn), ("dense", dense), ("sdpa", dense), ("flex", attn)):
        if f"{v}_ms" in row:
            row[f"{v}_GBps"] = nbytes / (row[f"{v}_ms"] / 1e3) / 1e9
            row[f"{v}_frac_copy_bw"] = nbytes / (row[f"{v}_ms"] / 1e3) / bw
    row["sparse_speedup_vs_sdpa"] = row["sdpa_ms"] / row["sparse_ms"]
    if "flex_ms" in row:
        row["sparse_attn_speedup_vs_flex"] = row["flex_ms"] / row["sparse_attn_ms"]
    return row                         # its tensors go with this frame; the caller empties the CUDA cache


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 524288])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode needs a CUDA device; on a CPU run benchmarks/bench_cpu_decode.py")
        return 2
    from triton.testing import do_bench
    gpu = torch.cuda.get_device_name()
    bw = copy_bandwidth(do_bench)
    print(f"{gpu}: copy bandwidth {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    flex_fn = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import flex_attention
        flex_fn = torch.compile(flex_attention)
    rows = []
    for n in args.contexts:
        for b in args.batch:
            r = run_case(n, b, args, bw, do_bench, flex_fn)
            torch.cuda.empty_cache()                 # the case's store and copies are gone with its frame
            rows.append(r)
            print(f"ctx {n:7d} batch {b}: sparse {r['sparse_ms']:.3f} ms ({100 * r['sparse_frac_copy_bw']:.0f}% of copy bw), "
                  f"dense {r['dense_ms']:.3f} ms ({100 * r['dense_frac_copy_bw']:.0f}%), sdpa {r['sdpa_ms']:.3f} ms, "
                  f"flex {r.get('flex_ms', float('nan')):.3f} ms; sparse {r['sparse_speedup_vs_sdpa']:.1f}x vs sdpa; "
                  f"errs {r['kernel_vs_torch_maxerr']:.1e}/{r['dense_vs_sdpa_maxerr']:.1e}", flush=True)
    res = {"benchmark": "gpu_decode", "gpu": gpu, "date": date.today().isoformat(), "torch": torch.__version__,
           "copy_bandwidth_Bps": bw, "config": vars(args) | {"out": None}, "cases": rows}
    out = args.out or ROOT / "benchmarks" / "results" / f"gpu_decode_{gpu.replace(' ', '_')}_{date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
