"""Notebook 11's runs: each policy on the real engine, the simulator calibrated on some of them and checked on
the rest, rate sweeps, and the served-system metrics table."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..model.engine import Engine
from ..model.model import Model
from ..routing.router import Router
from ..serving.executors import CostModel, EngineExecutor, SimExecutor
from ..serving.scheduler import Scheduler, SchedulerConfig, ServeResult, solo_tokens
from ..serving.trace import ServeRequest


@dataclass
class Served:
    """One measured run: the result, its executor's operation log, and the run's settings."""

    policy: str
    routed: bool
    rate: float
    result: ServeResult
    ops: list
    parity: int = -1            # requests whose tokens equal their solo tokens (-1: not checked)


def serve(model: Model, requests: list[ServeRequest], policy: str, router: Router | None, budget: int | None,
          rate: float, block_size: int = 16, num_blocks: int = 2048, max_batch: int = 4, batch_tokens: int = 256,
          solo: list[list[int]] | None = None) -> Served:
    """Run `requests` on a fresh engine with a prefix cache; compare with `solo` tokens when given."""
    engine = Engine(model, block_size=block_size, num_blocks=num_blocks, progress=False, prefix_cache=True)
    ex = EngineExecutor(engine, router, budget)
    res = Scheduler(ex, SchedulerConfig(policy=policy, max_batch=max_batch, batch_tokens=batch_tokens)).run(requests)
    parity = -1 if solo is None else sum(r.tokens == s for r, s in zip(res.records, solo))
    leaked = engine.store.pool.num_used
    if leaked:
        raise RuntimeError(f"{leaked} blocks still referenced after the trace ({policy})")
    return Served(policy, router is not None, rate, res, ex.ops, parity)


def solos(model: Model, requests: list[ServeRequest], router: Router | None, block_size: int = 16) -> list[list[int]]:
    engine = Engine(model, router=router, block_size=block_size,
                    num_blocks=max(len(r.prompt) + r.max_new_tokens for r in requests) // block_size + 8, progress=False)
    return [solo_tokens(engine, r) for r in requests]


def simulate(cost: CostModel, requests: list[ServeRequest], policy: str, budget: int | None, block_size: int = 16,
             num_blocks: int = 2048, max_batch: int = 4, batch_tokens: int = 256) -> ServeResult:
    ex = SimExecutor(cost, block_size, num_blocks, prefix_cache=True, budget=budget)
    return Scheduler(ex, SchedulerConfig(policy=policy, max_batch=max_batch, batch_tokens=batch_tokens)).run(requests)


def relative_errors(real: ServeResult, sim: ServeResult) -> dict[str, float]:
    """|sim - real| / real for the median and 90th percentile of TTFT and TPOT, and the makespan."""
    a, b = real.summary(), sim.summary()
    keys = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "makespan_s")
    return {k: abs(b[k] - a[k]) / a[k] for k in keys if a[k] > 0 and not math.isnan(a[k])}


def metrics_row(s: Served, block_size: int) -> dict[str, float]:
    """The served-system metrics of one run: TTFT and TPOT percentiles, prefix hits, blocks read per step."""
    sm = s.result.summary()
    dec = [o for o in s.ops if o.kind == "decode"]
    tokens = sum(o.tokens for o in dec)
    return {"TTFT p50 (s)": sm["ttft_p50_s"], "TTFT p90 (s)": sm["ttft_p90_s"], "TPOT p50 (ms)": 1e3 * sm["tpot_p50_s"],
            "prefix hit rate": sm["hit_rate"],
            "blocks read per step (per layer, kv head)": sum(o.read for o in dec) / max(tokens, 1) / block_size,
            "decode throughput (tok/s)": sm["throughput_tok_s"],
            "CPU-seconds per token": 2 * sm["makespan_s"] / max(1, sum(len(r.tokens) for r in s.result.records)),
            "peak blocks": sm["peak_blocks"]}


def occupancy(result: ServeResult) -> tuple[np.ndarray, np.ndarray]:
    """(time at each iteration's end, blocks in use then)."""
    t = np.array([i.start_s + i.seconds for i in result.iterations])
    return t, np.array([i.used_blocks for i in result.iterations])
