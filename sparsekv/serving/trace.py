"""Workload traces and requests with arrival times: a `Trace` of prompts (the workloads of `analysis.workloads`
build them) turned into a serving trace of `ServeRequest`s."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..storage.prefix_cache import namespace_bytes


@dataclass(frozen=True)
class Request:
    """One prompt of a workload, with the tokens it would generate (`with_arrivals` gives it an arrival time)."""

    name: str
    token_ids: torch.Tensor          # [T] int64 prompt
    namespace: str | bytes | int | None = None     # prefix-cache namespace (None: shared by every request without one)
    decode_tokens: int = 16

    def __post_init__(self):
        namespace_bytes(self.namespace)             # anything else is a TypeError here, before any replay


@dataclass
class Trace:
    """A named workload: its requests in order, and what the segments were (`notes`)."""

    name: str
    requests: list[Request]
    notes: str = ""

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    def theoretical_hits(self, block_size: int = 1) -> list[int]:
        """Per request: the longest prefix shared with an earlier request's prompt or
        generated tokens can't be known in advance, so this counts prompts only: the longest
        common prefix with any earlier prompt in the namespace, rounded down to whole blocks
        and capped at len - 1."""
        out = []
        for i, r in enumerate(self.requests):
            best = 0
            for e in self.requests[:i]:
                if e.namespace != r.namespace:
                    continue
                best = max(best, _lcp(r.token_ids, e.token_ids))
            best = min(best, len(r.token_ids) - 1)
            out.append(best // block_size * block_size)
        return out

    def max_hit_rate(self, block_size: int = 1) -> float:
        return sum(self.theoretical_hits(block_size)) / self.prompt_tokens


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


def _lcp(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    diff = torch.nonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
