"""Requests with arrival times: an agent workload (`analysis.workloads`) turned into a serving trace."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..analysis.workloads import Trace
from ..storage.prefix_cache import namespace_bytes


@dataclass(frozen=True)
class ServeRequest:
    """One request: its prompt token ids [T] int64, when it arrives (seconds from the trace's start), and how
    many tokens it generates."""

    rid: int
    name: str
    arrival_s: float
    prompt: torch.Tensor
    max_new_tokens: int
    namespace: str | bytes | int | None = None     # prefix-cache namespace (None: shared by every request without one)

    def __post_init__(self):
        namespace_bytes(self.namespace)             # anything else is a TypeError here, before any scheduling


def with_arrivals(trace: Trace, rate_per_s: float, seed: int = 0, max_new_tokens: int | None = None) -> list[ServeRequest]:
    """The trace's requests in order, arriving as a Poisson process of `rate_per_s` (exponential gaps, seeded).

    rate_per_s = inf: everything arrives at 0 (a burst). max_new_tokens: overrides each request's `decode_tokens`.
    """
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    g = torch.Generator().manual_seed(seed)
    t, out = 0.0, []
    for i, r in enumerate(trace.requests):
        if rate_per_s != float("inf") and i:
            t += float(torch.empty(1).exponential_(rate_per_s, generator=g))
        out.append(ServeRequest(i, r.name, t, r.token_ids, max_new_tokens or r.decode_tokens, r.namespace))
    return out
