"""Measuring calls: median wall time after warm-up, and peak extra memory from the torch profiler."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def median_time(fn: Callable[[], object], repeats: int = 7, warmup: int = 2) -> float:
    """Median seconds of `repeats` calls of `fn` after `warmup` discarded calls (CPU wall clock)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_allocated_bytes(fn: Callable[[], object]) -> int:
    """The highest running total of bytes that torch allocated during `fn()` (frees subtract).

    Counts only torch allocations made inside the call, so it measures a step's temporaries
    and outputs, not memory that existed before (the cache itself).
    """
    from torch.profiler import profile
    with profile(profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    total = peak = 0
    for e in events:
        total += e.nbytes()
        peak = max(peak, total)
    return peak
