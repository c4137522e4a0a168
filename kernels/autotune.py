"""Autotune configurations shared by the kernels (imports triton: import it only from kernel modules)."""
from __future__ import annotations

import os

import triton


def autotune_configs() -> list:
    """Launch configurations to try on a GPU (warps x pipeline stages); one under the interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [triton.Config({}, num_warps=4, num_stages=1)]
    return [triton.Config({}, num_warps=w, num_stages=s) for w in (2, 4, 8) for s in (1, 2, 3)]
