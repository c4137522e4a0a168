"""Argument checks shared by the public entry points.

Each check raises `TypeError` (wrong kind of object) or `ValueError` (right kind, wrong
value) with a message that names the argument and what was expected. Checks never mutate
anything, so an entry point that runs all its checks first rejects bad input atomically.
"""
from __future__ import annotations

from typing import Sequence as Seq

import torch


def check_tensor(
    name: str,
    x,
    shape: Seq[int | None],
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    device: torch.device | None = None,
    finite: bool = False,
) -> None:
    """Check that `x` is a tensor of the given shape (None = any size on that axis)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != len(shape):
        raise ValueError(f"{name} must have rank {len(shape)} (shape {_fmt(shape)}), got shape {tuple(x.shape)}")
    for axis, (want, got) in enumerate(zip(shape, x.shape)):
        if want is not None and want != got:
            raise ValueError(f"{name} must have shape {_fmt(shape)}, got {tuple(x.shape)} (axis {axis})")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if x.dtype not in allowed:
            raise TypeError(f"{name} must have dtype {' or '.join(map(str, allowed))}, got {x.dtype}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on device {device}, got {x.device}")
    if finite and x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must hold only finite values (found NaN or inf)")


def check_int(name: str, x, lo: int | None = None, hi: int | None = None) -> int:
    """Check that `x` is an int (not bool) in [lo, hi]; returns it."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if lo is not None and x < lo:
        raise ValueError(f"{name} must be >= {lo}, got {x}")
    if hi is not None and x > hi:
        raise ValueError(f"{name} must be <= {hi}, got {x}")
    return x


def check_choice(name: str, x, choices) -> None:
    if x not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {x!r}")


def _fmt(shape) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
