"""Backend choice for the decode and routing fast paths, made once per call.

    "reference"  plain torch: the readable definition
    "torch"      the vectorised torch fast path
    "triton"     `sparsekv.kernels`: on CUDA, or on the CPU under the Triton interpreter
    "cpp"        the fused C++/OpenMP decode kernel (`sparsekv.kernels.cpu_decode`), CPU tensors
    "auto"       "triton" for CUDA tensors, or on the CPU while TRITON_INTERPRET=1 (the
                 interpreter needs it set both when the kernels are imported and while they
                 run); otherwise "cpp" on the CPU when the kernel builds, else "torch"

Importing sparsekv never imports triton; this module looks for it only when asked.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .checks import check_choice

BACKENDS = ("auto", "reference", "torch", "triton", "cpp")


@functools.lru_cache(maxsize=1)          # asked on every decode call: look it up once
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def kernels_interpreted() -> bool:
    """Whether `sparsekv.kernels` runs under the Triton interpreter (decided when first imported)."""
    if not triton_installed():
        return False
    from triton.runtime.interpreter import InterpretedFunction

    from ..kernels import paged_decode
    fn = paged_decode._decode_split_kernel
    while not isinstance(fn, InterpretedFunction) and hasattr(fn, "fn"):   # unwrap the autotuner
        fn = fn.fn
    return isinstance(fn, InterpretedFunction)


def resolve(backend: str, x: torch.Tensor) -> str:
    """The concrete backend for tensors like `x`."""
    check_choice("backend", backend, BACKENDS)
    if backend == "auto":
        if triton_installed() and (x.is_cuda or _interpreting()):
            return "triton"
        return "cpp" if x.device.type == "cpu" and cpp_available() else "torch"
    if backend == "cpp":
        if x.device.type != "cpu":
            raise ValueError(f"backend 'cpp' runs on CPU tensors, got {x.device}")
        if not cpp_available():
            from ..kernels import cpu_decode
            raise ValueError(f"backend 'cpp' is unavailable: {cpu_decode.reason()}")
    if backend == "triton":
        if not triton_installed():
            raise ValueError("backend 'triton' needs the triton package (pip install triton)")
        if not x.is_cuda and not (_interpreting() and kernels_interpreted()):
            raise ValueError("backend 'triton' on CPU tensors needs the Triton interpreter: set TRITON_INTERPRET=1 "
                             "before importing sparsekv.kernels, and keep it set while they run")
    return backend


def cpp_available() -> bool:
    """Whether the fused CPU decode kernel is built (builds it on first call; False after one warning)."""
    from ..kernels import cpu_decode
    return cpu_decode.available()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"
