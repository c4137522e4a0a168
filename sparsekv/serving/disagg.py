"""Prefill/decode separation (DistServe) against mixing (Sarathi-style colocation), simulated at equal hardware.

    separated(cost, requests, ...)   one prefill device and one decode device
    colocated(cost, requests, ...)   two replicas, each running the chunked scheduler on half the requests

Separated: the prefill device takes requests in arrival order, one prompt at a time (its own prefix cache
skips what it has seen), and ships each prompt's K/V to the decode device over a link; the decode device
runs continuous batching over requests whose K/V has arrived (its "prefill" is free: the K/V is already
computed). Decode steps are never stalled by a prompt, and a prompt never waits behind decode steps; the
price is the transfer and one device's compute each. Colocated: the same two devices as replicas, requests
alternating between them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .executors import CostModel, SimExecutor
from .scheduler import RequestRecord, Scheduler, SchedulerConfig, ServeResult
from .trace import ServeRequest


def separated(cost: CostModel, requests: list[ServeRequest], block_size: int, num_blocks: int, max_batch: int,
              kv_bytes_per_token: int, link_bytes_per_s: float, prefill_chunk: int = 2048) -> ServeResult:
    """Simulate one prefill and one decode device; TTFT counts from each request's own arrival."""
    pre = SimExecutor(cost, block_size, num_blocks, prefix_cache=True)
    ready, free_at = [], 0.0
    for r in sorted(requests, key=lambda r: (r.arrival_s, r.rid)):
        t = max(free_at, r.arrival_s)
        seq, done = pre.start(r.prompt.numpy(), r.namespace)
        tokens = r.prompt.numpy()
        busy = 0.0
        while done < len(tokens):
            n = min(prefill_chunk, len(tokens) - done)
            busy += pre.prefill(seq, tokens[done:done + n])
            done += n
        pre.finish(seq)
        free_at = t + busy
        ready.append((r, free_at + len(tokens) * kv_bytes_per_token / link_bytes_per_s))
    decode_cost = CostModel(p=(0.0, 0.0, 0.0), d=cost.d, source=cost.source + " (decode device; K/V arrives computed)")
    dec = SimExecutor(decode_cost, block_size, num_blocks, prefix_cache=False)
    shifted = [dataclasses.replace(r, arrival_s=t) for r, t in ready]
    res = Scheduler(dec, SchedulerConfig(policy="continuous", max_batch=max_batch,
                                         prefill_chunk=10**9)).run(shifted)
    arrival = {r.rid: r.arrival_s for r in requests}
    records = [RequestRecord(x.rid, x.name, arrival[x.rid], x.prompt_tokens, 0, x.tokens, x.times, x.preemptions)
               for x in res.records]
    return ServeResult("separated", records, res.iterations, pre.hit_rate, res.preemptions)


def colocated(cost: CostModel, requests: list[ServeRequest], block_size: int, num_blocks: int, max_batch: int,
              batch_tokens: int, replicas: int = 2) -> ServeResult:
    """`replicas` independent chunked schedulers, request i going to replica i mod replicas."""
    parts = [Scheduler(SimExecutor(cost, block_size, num_blocks, prefix_cache=True),
                       SchedulerConfig(policy="chunked", max_batch=max_batch, batch_tokens=batch_tokens))
             .run([r for i, r in enumerate(requests) if i % replicas == k]) for k in range(replicas)]
    records = sorted((x for p in parts for x in p.records), key=lambda x: x.rid)
    hits = [p.hit_rate for p in parts]
    return ServeResult("colocated", records, [i for p in parts for i in p.iterations], float(np.mean(hits)),
                       sum(p.preemptions for p in parts))
