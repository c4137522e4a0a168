"""Statistics for accuracies measured on samples: intervals for one cell, paired tests between methods.

    wilson(k, n)                         Wilson 95% score interval for k successes in n trials
    mcnemar(a, b)                        exact McNemar test of two methods' paired right/wrong answers
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
    return max(0.0, mid - half), min(1.0, mid + half)


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
