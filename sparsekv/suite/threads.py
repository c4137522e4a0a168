"""How many intra-op threads a run should use on a machine others may be using too.

torch waits for all of its threads at the end of every parallel op. If another process keeps a core busy, a thread
there is descheduled for a scheduler slice at a time and every op waits for it, so a run with as many threads as
cores slows by far more than the one core it lost (benchmarks/bench_threads.py measures it). The graceful choice is
to use the cores that are idle: `choose()` samples /proc/stat for a moment and returns the cores other processes
leave free (at least 1). The notebook runner passes it to each notebook's kernel as OMP_NUM_THREADS, and the tests
set it for their own process, unless OMP_NUM_THREADS is already set (which always wins).
"""
from __future__ import annotations

import os
import time

SAMPLE_S = 0.3          # how long to watch the machine before choosing


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs from /proc/stat, or None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)          # idle + iowait
    total = sum(fields[:8])                                          # guest time is already in user
    return total - idle, total


def busy_cores(sample_s: float = SAMPLE_S) -> float:
    """Cores kept busy by other processes (and this one) over `sample_s` seconds; 0 where it cannot be read."""
    a = _cpu_times()
    time.sleep(sample_s)
    b = _cpu_times()
    if a is None or b is None or b[1] == a[1]:
        return 0.0
    return (os.cpu_count() or 1) * (b[0] - a[0]) / (b[1] - a[1])


def choose(sample_s: float = SAMPLE_S) -> int:
    """Intra-op threads for a run starting now: OMP_NUM_THREADS if set, else the idle cores (at least 1)."""
    env = os.environ.get("OMP_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    cores = os.cpu_count() or 1
    return max(1, min(cores, round(cores - busy_cores(sample_s))))
