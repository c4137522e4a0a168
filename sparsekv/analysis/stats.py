"""Statistics for accuracies measured on samples: intervals for one cell, paired tests between methods.

    wilson(k, n)                         Wilson 95% score interval for k successes in n trials
    mcnemar(a, b)                        exact McNemar test of two methods' paired right/wrong answers
    paired_bootstrap(a, b)               mean of a - b over paired values, with a bootstrap 95% interval
"""
from __future__ import annotations

import math


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (95% by default)."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # at k = 0 the lower bound is exactly 0 and at k = n the upper exactly 1; computed, either can miss its estimate
    # by a rounding step (6 of 6 gave an upper bound of 1 - 1e-16), so the interval always contains k / n
    return (0.0 if k == 0 else max(0.0, mid - half)), (1.0 if k == n else min(1.0, mid + half))


def mcnemar(a, b) -> dict:
    """Exact (binomial) McNemar test on paired outcomes: `a`, `b` are equal-length sequences of booleans, one pair per
    question. Returns {"n", "a_only", "b_only", "p"}: the questions, those only a got right, those only b got right,
    and the two-sided p-value of "a and b are equally accurate" (1.0 when they never disagree)."""
    a, b = [bool(x) for x in a], [bool(x) for x in b]
    if len(a) != len(b) or not a:
        raise ValueError(f"a and b must be non-empty and paired, got {len(a)} and {len(b)} outcomes")
    a_only = sum(x and not y for x, y in zip(a, b))
    b_only = sum(y and not x for x, y in zip(a, b))
    n, k = a_only + b_only, min(a_only, b_only)
    p = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)
    return {"n": len(a), "a_only": a_only, "b_only": b_only, "p": p}


def paired_bootstrap(a, b, reps: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """The mean difference of paired values (a[i] - b[i]: per-token losses of two methods on the same tokens, say)
    and its percentile bootstrap interval: `reps` resamples of the pairs with replacement, seeded. Returns
    {"n", "mean", "lo", "hi"}. ValueError unless a and b are non-empty and of equal length."""
    import random
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) != len(b) or not a:
        raise ValueError(f"a and b must be non-empty and paired, got {len(a)} and {len(b)} values")
    d = [x - y for x, y in zip(a, b)]
    n, rng = len(d), random.Random(seed)
    means = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(reps))
    tail = (1 - level) / 2
    return {"n": n, "mean": sum(d) / n, "lo": means[int(tail * reps)], "hi": means[min(reps - 1, int((1 - tail) * reps))]}
