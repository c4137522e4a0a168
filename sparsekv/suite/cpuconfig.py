"""Named CPU configurations a notebook run can be forced into, so that a baseline is checked beyond the machine
that recorded it.

A smoke baseline recorded on one CPU must hold on any x86-64 CPU and at any thread count. Two machines differ in
the kernels their libraries pick: ATen's vectorised kernels (AVX-512 or AVX2), MKL's and oneDNN's GEMMs (by
vendor and ISA), the thread count (split reductions), and our own C++ extension (built with -march=native).
Each of those can be forced on any machine, which is what `alt` does:

    native   nothing forced: what this machine picks (AVX-512 here, both cores)
    alt      ATen's AVX2 kernels (or its default ones without AVX2), MKL and oneDNN capped at AVX2, one thread,
             and the C++ extension built for another -march (`alt_arch`): x86-64-v3 (AVX2 + FMA) on a machine
             with AVX-512, else x86-64 (neither)

    python -m sparsekv notebooks smoke --cpu alt 02 09     # the baselines, under the other configuration

`environment(name)` is what a notebook's kernel process inherits (the runner sets it around papermill).
"""
from __future__ import annotations

from pathlib import Path

CONFIGS = ("native", "alt")


def cpu_flags() -> set[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def alt_arch(flags: set[str] | None = None) -> str:
    """A -march for the C++ extension other than this machine's: AVX2 without AVX-512 where the CPU has AVX-512
    (the SIMD layer then takes its AVX2 path), else plain x86-64 (its portable path)."""
    flags = cpu_flags() if flags is None else flags
    return "x86-64-v3" if {"avx512f", "avx2", "fma"} <= flags else "x86-64"


def environment(name: str) -> dict[str, str]:
    """Environment variables that force configuration `name` (see the module docstring)."""
    if name not in CONFIGS:
        raise ValueError(f"name must be one of {list(CONFIGS)}, got {name!r}")
    if name == "native":
        return {}
    flags = cpu_flags()
    return {"ATEN_CPU_CAPABILITY": "avx2" if "avx2" in flags else "default",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "SPARSEKV_CPU_ARCH": alt_arch(flags)}
