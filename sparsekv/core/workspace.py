"""Reusable scratch buffers for the decode fast path.

A decode step gathers megabytes of K/V tiles into temporaries. Allocating them afresh each
step makes glibc hand large buffers back to the OS and fault them in again, which costs
several times the copy itself on this CPU (measured: 5.4 ms against 1.2 ms for a 2,048-token
selection at 8 kv heads x 128 dims). A `Workspace` keeps one growing buffer per name.

Invariant: a buffer taken under a name is valid until the next `take` of that name; callers
never return it (or a view of it) to users.
"""
from __future__ import annotations

import math

import torch


class Workspace:
    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._bufs: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of `shape`, backed by the buffer `name` (grown if needed)."""
        n = math.prod(shape)
        buf = self._bufs.get((name, dtype))
        if buf is None or buf.numel() < n:
            buf = torch.empty(n, dtype=dtype, device=self.device)
            self._bufs[(name, dtype)] = buf
        return buf[:n].view(shape)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs.values())
