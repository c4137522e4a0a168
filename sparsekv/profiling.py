"""Peak extra memory of a call, from the torch profiler's allocation events (CPU or GPU)."""
from __future__ import annotations

from typing import Callable


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
