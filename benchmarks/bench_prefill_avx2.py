"""Prefill attention on a CPU without AVX512-BF16: the float32-FMA kernel (`cpu/prefill_attn_f32.cpp`) against SDPA.

    python -m benchmarks.bench_prefill_avx2                    # this CPU as an AVX2 machine ("alt", below)
    python -m benchmarks.bench_prefill_avx2 --cpu native       # this CPU as it is
    python -m benchmarks.bench_prefill_avx2 --quick            # one short case (tests)

The case is the engine's costliest prefill op: the last chunk of 512 queries of an N-token prompt attending to all N
keys (causal; Gemma's sliding layers also with their 512-token window, over the keys it can see, as the engine
reads them), for the attention shapes of the two models
(their config.json: SmolLM2-135M 9 query heads over 3 kv heads of 64; Gemma 3 270M 4 over 1 of 256). Per case:

    sdpa_float32    torch SDPA over float32 q, k, v (the engine's float32 prefill until 2026-12-07: attn_mask,
                    enable_gqa; since then it takes f32_kernel_float32 on every CPU: "auto_float32")
    sdpa_bfloat16   the same over bfloat16 (prefill="bfloat16" where no extension kernel applies: before this kernel,
                    every CPU without AVX512-BF16)
    f32_kernel_bfloat16  prefill_attn_f32 over the same bfloat16 values (prefill="bfloat16" on such a CPU now)
    f32_kernel_float32   prefill_attn_f32 over float32 values
    bf16_kernel     prefill_attn_bf16 (AVX512-BF16 pair products), only where this build has it

and which of them the engine's "auto" takes for that shape here (`attention.decode.auto_prefill_path`: SDPA where
oneDNN has AMX tiles, "sdpa_amx").

Each is timed with one warm-up call discarded, then the median of --repeats calls, at --threads threads (1 by
default: a per-core rate), and reported as seconds, GFLOP/s (4 T Hq D FLOPs per visible key of each query) and the
ratio to SDPA at the same input dtype, measured in the same run. Every kernel output is also checked against SDPA in
float32 (max |diff| recorded). `--cpu alt` re-runs this script under `suite.cpuconfig.environment("avx2")`: the
extension built for x86-64-v3 (AVX2 + FMA, no AVX-512), ATen's AVX2 kernels and oneDNN and MKL capped at AVX2, so a
machine with AVX-512 measures what an AVX2 machine would run (not its clock or caches: the JSON names the CPU), and
an AVX2-only machine what it runs natively (never the portable build, cpuconfig's "alt" there). This
machine is shared with other developers: numbers move by tens of percent between runs; ratios measured in one run
move less. Results go to benchmarks/results/prefill_avx2.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

# name: (query heads, kv heads, head dim, window of its sliding layers or 0)
SHAPES = {"smollm2-135m": (9, 3, 64, 0), "gemma-3-270m": (4, 1, 256, 512)}
CHUNK = 512                            # the engine's prefill chunk (Engine.prefill)


def _inputs(T: int, N: int, Hq: int, H: int, D: int, seed: int = 0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, Hq, D, generator=g), torch.randn(N, H, D, generator=g), torch.randn(N, H, D, generator=g))


def first_key(T: int, N: int, window: int) -> int:
    """The first key the last T of N tokens can see (the engine reads K/V from there: decode._prefill_start)."""
    return max(0, N - T - window + 1) if window else 0


def _sdpa(q, k, v, window: int, N: int):
    """The engine's SDPA call for the last T of N tokens over keys [N - len(k), N) (decode._prefill_sdpa)."""
    import torch
    import torch.nn.functional as F
    T = q.shape[0]
    i = torch.arange(N - T, N)[:, None]
    j = torch.arange(N - k.shape[0], N)[None, :]
    mask = (j <= i) & ((i - j) < window) if window else j <= i
    out = F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None], v.permute(1, 0, 2)[None],
                                         attn_mask=mask, enable_gqa=True)
    return out[0].permute(1, 0, 2)


def auto_path(Hq: int, H: int, D: int, dtype=None) -> str:
    """What the engine's prefill attention ("auto") runs for a chunk of this shape in `dtype` (bfloat16 by default)
    over a bfloat16 store on this CPU (`attention.decode.auto_prefill_path`)."""
    import torch

    import sparsekv as sk
    from sparsekv.attention import decode
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=16, num_blocks=1,
                                         dtype=torch.bfloat16))
    return decode.auto_prefill_path(torch.zeros(1, Hq, D, dtype=dtype or torch.bfloat16), store)


def visible_keys(T: int, N: int, window: int) -> int:
    """Keys attended, summed over the T queries (the last T of N tokens)."""
    return sum(min(N - T + t + 1, window or N) for t in range(T))


def measure(args) -> dict:
    import torch

    from sparsekv.core import cpu_paths
    from sparsekv.core.profiling import median_time
    from sparsekv.kernels import cpu_decode
    from sparsekv.suite import cpuconfig
    torch.set_num_threads(args.threads)
    if not cpu_decode.available():
        raise SystemExit(f"the extension is unavailable: {cpu_decode.reason()}")
    bf16_kernel = cpu_decode.bf16_prefill_available()
    cases = []
    for name in args.models:
        Hq, H, D, sliding = SHAPES[name]
        for N in args.lengths:
            for window in sorted({0, sliding} if args.windows else {0}):
                T = min(CHUNK, N)
                k0 = first_key(T, N, window)
                q, k, v = _inputs(T, N - k0, Hq, H, D)                      # keys [k0, N), as the engine reads
                qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
                scale, q0 = 1 / math.sqrt(D), N - T
                flops = 4 * Hq * D * visible_keys(T, N, window)
                runs = {"sdpa_float32": lambda: _sdpa(q, k, v, window, N),
                        "sdpa_bfloat16": lambda: _sdpa(qb, kb, vb, window, N),
                        "f32_kernel_bfloat16": lambda: cpu_decode.prefill_attn_f32(qb, kb, vb, q0, k0, window, scale),
                        "f32_kernel_float32": lambda: cpu_decode.prefill_attn_f32(q, k, v, q0, k0, window, scale)}
                if bf16_kernel:
                    runs["bf16_kernel"] = lambda: cpu_decode.prefill_attn_bf16(qb, kb, vb, q0, k0, window, scale)
                case = {"model": name, "Hq": Hq, "H": H, "D": D, "T": T, "N": N, "window": window, "first_key": k0,
                        "gflop": flops / 1e9}
                ref = _sdpa(qb.float(), kb.float(), vb.float(), window, N)     # the bf16 values, in float32
                for label, fn in runs.items():
                    sec = median_time(fn, repeats=args.repeats, warmup=1)
                    case[f"{label}_s"] = sec
                    case[f"{label}_gflops"] = flops / sec / 1e9
                    if "kernel" in label:
                        base = ref if "bfloat16" in label or label == "bf16_kernel" else _sdpa(q, k, v, window, N)
                        case[f"{label}_max_diff_vs_sdpa_f32"] = float((fn().float() - base).abs().max())
                case["f32_kernel_vs_sdpa_bfloat16"] = case["sdpa_bfloat16_s"] / case["f32_kernel_bfloat16_s"]
                case["f32_kernel_vs_sdpa_float32"] = case["sdpa_float32_s"] / case["f32_kernel_float32_s"]
                if bf16_kernel:
                    case["bf16_kernel_vs_sdpa_bfloat16"] = case["sdpa_bfloat16_s"] / case["bf16_kernel_s"]
                case["auto"] = auto_path(Hq, H, D)
                case["auto_float32"] = auto_path(Hq, H, D, torch.float32)
                cases.append(case)
                print(f"{name:>13s} N={N:>6,} w={window:>3}: SDPA f32 {case['sdpa_float32_s'] * 1e3:8.1f} ms, "
                      f"SDPA bf16 {case['sdpa_bfloat16_s'] * 1e3:8.1f} ms, f32 kernel(bf16) "
                      f"{case['f32_kernel_bfloat16_s'] * 1e3:7.1f} ms ({case['f32_kernel_bfloat16_gflops']:.0f} "
                      f"GFLOP/s, {case['f32_kernel_vs_sdpa_bfloat16']:.1f}x bf16 SDPA, "
                      f"{case['f32_kernel_vs_sdpa_float32']:.1f}x f32 SDPA)"
                      + (f", bf16 kernel {case['bf16_kernel_s'] * 1e3:7.1f} ms "
                         f"({case['bf16_kernel_vs_sdpa_bfloat16']:.1f}x bf16 SDPA)" if bf16_kernel else "")
                      + f"; auto takes {case['auto']}", flush=True)
    return {"date": str(date.today()), "cpu": cpuconfig.cpu_model(), "cpu_config": args.cpu,
            "shared_machine": "yes: other developers' jobs share its 2 cores; medians, ratios from one run",
            "torch": torch.__version__, "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "extension_arch": cpu_decode.arch(), "f32_prefill_vectorized": cpu_decode.f32_prefill_vectorized(),
            "bf16_prefill_kernel": bf16_kernel, "amx_bf16": cpu_paths.amx_bf16(), "threads": torch.get_num_threads(),
            "repeats": args.repeats,
            "warmup": 1, "chunk": CHUNK, "cases": cases}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", choices=("alt", "native"), default="alt",
                    help="alt: as an AVX2 machine (x86-64-v3 extension, ATen/oneDNN/MKL at AVX2); native: as it is")
    ap.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    ap.add_argument("--lengths", nargs="+", type=int, default=[2048, 8192, 32768])
    ap.add_argument("--no-windows", dest="windows", action="store_false", help="causal cases only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="SmolLM2's shape at 700 tokens, 1 repeat")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/prefill_avx2.json")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)    # already under --cpu's environment
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.lengths, args.repeats, args.windows = ["smollm2-135m"], [700], 1, False
    if args.cpu == "alt" and not args.inner:
        # ATen reads ATEN_CPU_CAPABILITY when torch is imported: the measurement runs in a fresh process
        from sparsekv.suite import cpuconfig
        env = {**os.environ, **cpuconfig.environment("avx2", threads=args.threads)}
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None
                                                                                 else sys.argv[1:]), "--inner"],
                              env=env, cwd=ROOT).returncode
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} ({result['cpu']}, {result['cpu_config']}: extension -march={result['extension_arch']}, "
          f"ATen {result['aten_capability']}, {result['threads']} thread(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
