"""Scheduling policies: which waiting requests are admitted, and how prefill shares an iteration with decode.

    fcfs_static    FCFS static batches: admit up to `max_batch` only when nothing runs; each batch runs to its end.
    continuous     continuous batching (Orca, vLLM): admit whenever a slot and the blocks are free; a newly
                   admitted prompt is prefilled whole in its first iteration, stalling the decodes beside it.
    chunked        continuous batching with chunked prefill (Sarathi-Serve): each iteration decodes every running
                   request and spends the rest of a token budget on prompt chunks, so decodes never wait a
                   whole prompt.
    buckets        chunked, admitting requests of the oldest waiting request's length bucket (log2 of the
                   prompt) first: batches of similar lengths.
    prefix_aware   chunked, admitting the request with the longest cached prefix first (SGLang's
                   longest-prefix-first), so shared prefixes are reused before they are evicted.

A policy is bound once (`make_policy`); a new one is one class registered with `register_scheduling_policy`.
"""
from __future__ import annotations

import math

from ..core import registry


class SchedulingPolicy:
    """Base class. `static`: admit only into an empty batch. `chunked`: prefill under the token budget.
    `order(waiting, cached)` -> the waiting requests in admission order (cached(req) = its cached prefix tokens)."""

    name = ""
    static = False
    chunked = False

    def order(self, waiting: list, cached) -> list:
        return list(waiting)                                   # first come, first served


SCHEDULING_POLICIES: dict[str, type[SchedulingPolicy]] = {}


def register_scheduling_policy(cls: type[SchedulingPolicy]) -> type[SchedulingPolicy]:
    return registry.add(SCHEDULING_POLICIES, cls, SchedulingPolicy, "scheduling policy")


def make_policy(name: str) -> SchedulingPolicy:
    if name not in SCHEDULING_POLICIES:
        raise ValueError(f"policy must be one of {sorted(SCHEDULING_POLICIES)}, got {name!r}")
    return SCHEDULING_POLICIES[name]()


@register_scheduling_policy
class FCFSStatic(SchedulingPolicy):
    name = "fcfs_static"
    static = True


@register_scheduling_policy
class Continuous(SchedulingPolicy):
    name = "continuous"


@register_scheduling_policy
class Chunked(SchedulingPolicy):
    name = "chunked"
    chunked = True


@register_scheduling_policy
class LengthBuckets(SchedulingPolicy):
    name = "buckets"
    chunked = True

    def order(self, waiting, cached):
        if not waiting:
            return []
        bucket = lambda w: int(math.log2(max(1, len(w.tokens))))
        first = bucket(waiting[0])
        return [w for w in waiting if bucket(w) == first] + [w for w in waiting if bucket(w) != first]


@register_scheduling_policy
class PrefixAware(SchedulingPolicy):
    name = "prefix_aware"
    chunked = True

    def order(self, waiting, cached):
        return sorted(waiting, key=lambda w: -cached(w))       # stable: FCFS among equal hits
