"""CPU-gated paths: code whose bits depend on an optional CPU feature, and a record of the ones this process took.

A smoke baseline must hold on any x86-64 CPU, Intel or AMD, with or without AVX-512 or bfloat16 dot products, at
any thread count (tests/baselines/tolerances.yaml). The paths whose results differ between CPUs fall in three kinds,
each held to that rule its own way:

1. Same bits as the fallback: the extension's SIMD paths (AVX-512, AVX2 + FMA, portable loops; `kernels/cpu/simd.h`
   fixes the reduction order), its int8 dot products (VNNI or plain integer loops) and its float32 prefill kernel,
   which every float32 chunk takes (`attention.decode._prefill_kernel`). tests/test_cpu_kernel.py compares a build
   for another -march with this one, bit for bit.
2. Float32 rounding only: ATen's vectorised kernels, MKL's and oneDNN's float32 GEMMs, chosen by ISA and thread
   count. A baseline holds a tolerance derived from the spread measured between `suite.cpuconfig`'s two
   configurations when it was recorded (`suite.regression`).
3. Other arithmetic: the paths in `GATED`, bfloat16 products whose rounding and accumulation order depend on the
   CPU (AMX tiles, AVX512-BF16 pair products, ATen's float32 emulation, or the float32 prefill kernel that a bf16
   chunk takes where AVX512-BF16 is missing). These are kept out of smoke baselines:
   a process that takes one records it here (`take`), a notebook's metrics JSON lists what its kernel took
   (`suite.report.write_metrics`: "cpu_paths"), and tests/test_notebooks.py requires every smoke run to list none.
   The fast path is then tested on its own against float64 (tests/test_prefill_kernel.py).
"""
from __future__ import annotations

import functools
import os

GATED = {
    "bf16_prefill_kernel": "kernels/cpu/prefill_attn.cpp, built only for AVX512-BF16 (SDPA elsewhere, and where "
                           "oneDNN has AMX: `amx_bf16`)",
    # its bits are the same on every CPU, but a bf16 chunk takes it only where the kernel above is missing
    "bf16_prefill_f32_kernel": "kernels/cpu/prefill_attn_f32.cpp over a bfloat16 chunk, where AVX2 + FMA (or "
                               "AVX-512) is and AVX512-BF16 is not",
    "bf16_prefill_sdpa": "SDPA over a bfloat16 prefill chunk: oneDNN's AMX kernels or ATen's float32 emulation",
    "bf16_matmul": "a bfloat16 prefill chunk's matmuls: oneDNN's AMX or AVX512-BF16 kernels, or ATen's emulation",
}
_taken: set[str] = set()


def take(path: str) -> None:
    """Record that this process ran `path` (a key of GATED)."""
    if path not in GATED:
        raise ValueError(f"path must be one of {sorted(GATED)}, got {path!r}")
    _taken.add(path)


def taken() -> list[str]:
    """The gated paths this process has run, sorted."""
    return sorted(_taken)


def reset() -> None:
    """Forget what was taken (tests)."""
    _taken.clear()


def cpu_flags() -> set[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo's first `flags` line; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split()) if line else set()


# oneDNN's names for its ISA levels that include AMX (ONEDNN_MAX_CPU_ISA caps oneDNN at a level; unset, ALL and
# DEFAULT leave it free to use everything the CPU has)
_AMX_ISAS = ("ALL", "DEFAULT", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16",
             "AVX10_2_512_AMX_2")


# oneDNN's ISA levels below its first with bfloat16 dot products (AVX512_CORE_BF16)
_NO_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def onednn_cap() -> str:
    """oneDNN's ISA cap for this process, upper case: ONEDNN_MAX_CPU_ISA, else DNNL_MAX_CPU_ISA, else "ALL" (none)."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").strip().upper()


def bf16_dot_products() -> bool:
    """Whether this process's bfloat16 matmuls run on bfloat16 dot products: the CPU has AVX512_BF16 or AMX-BF16 and
    oneDNN is not capped below them (`suite.cpuconfig`'s "alt" caps it at AVX2). Elsewhere ATen emulates them on one
    thread, about 2 GFLOP/s against float32's 185 on an Intel Xeon capped at AVX2 (2026-12-07)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags()) and onednn_cap() not in _NO_BF16_ISAS


@functools.lru_cache(maxsize=None)
def amx_bf16() -> bool:
    """Whether this process's oneDNN may run bfloat16 products on AMX tiles: the CPU has AMX-BF16 (/proc/cpuinfo's
    `amx_bf16`), the kernel granted this process the tile state (torch's `_is_amx_tile_supported`), and neither
    ONEDNN_MAX_CPU_ISA nor DNNL_MAX_CPU_ISA caps oneDNN below AMX (`suite.cpuconfig`'s "alt" caps it at AVX2).

    Where it holds, SDPA's bfloat16 flash attention runs its products through oneDNN's AMX microkernels, faster than
    both of the extension's prefill kernels on every case measured (benchmarks/results/prefill_native_xeon.json), so a
    bfloat16 prefill chunk takes SDPA (`attention.decode.prefill_attention`, backend "auto"). Read once per
    process: oneDNN reads its cap once too."""
    if "amx_bf16" not in cpu_flags():
        return False
    if onednn_cap() not in _AMX_ISAS:
        return False
    import torch
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False
