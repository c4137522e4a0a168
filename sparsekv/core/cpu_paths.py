"""CPU-gated paths: code whose bits depend on an optional CPU feature, and a record of the ones this process took.

A smoke baseline must hold on any x86-64 CPU, Intel or AMD, with or without AVX-512 or bfloat16 dot products, at
any thread count (tests/baselines/tolerances.yaml). The paths whose results differ between CPUs fall in three kinds,
each held to that rule its own way:

1. Same bits as the fallback: the extension's SIMD paths (AVX-512, AVX2 + FMA, portable loops; `kernels/cpu/simd.h`
   fixes the reduction order) and its int8 dot products (VNNI or plain integer loops). tests/test_cpu_kernel.py
   compares a build for another -march with this one, bit for bit.
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

GATED = {
    "bf16_prefill_kernel": "kernels/cpu/prefill_attn.cpp, built only for AVX512-BF16 (SDPA elsewhere)",
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
