"""Repeated timings, and what may be said from them: a median with an interval, a paired ratio, a verdict.

The benchmarks against peers (`bench_vs_llamacpp`, `bench_gemma_speed`) time each engine `n` times, interleaved
(repeat r of every engine, then repeat r + 1), after an untimed warm-up. From those `n` values:

    median      the median of the n values;
    interval    their min and max. For n independent repeats the population median lies between the smallest and the
                largest value with probability 1 - 2 * 0.5**n (75% for 3 repeats, 87.5% for 4, 94% for 5): the
                order-statistic interval for a median, distribution-free. `coverage` carries that number, so a
                reader sees how much the interval promises;
    ratio       paired (`paired_ratio`): repeat r of one engine over repeat r of the other (the same round, so drift on a shared
                machine hits both), then the median and min-max of the n per-round ratios; for engines timed in
                separate processes (`ratio_bounds`), the ratio of medians within the intervals' far ends;
    verdict     "faster" only when the ratio's whole interval lies below 1 - margin, "slower" only when it lies
                above 1 + margin, else "tie": a difference inside the repeats' own spread, or inside the margin
                (`NOISE_MARGIN`, 5%: what a shared 2-core machine drifts by between runs), is not called.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

NOISE_MARGIN = 0.05       # a ratio must clear 1 by this much, at its interval's nearer end, to be called a win or a loss
INTERVAL = "min-max of the repeats (order-statistic interval for the median, coverage 1 - 2 * 0.5**n)"


@dataclass(frozen=True)
class Spread:
    """The median of n repeats and their min-max interval.

    Invariants: 1. lo <= median <= hi; 2. n >= 1; 3. coverage = 1 - 2 * 0.5**n (0 for a single value)."""
    median: float
    lo: float
    hi: float
    n: int

    @property
    def coverage(self) -> float:
        return 1 - 2 * 0.5 ** self.n if self.n > 1 else 0.0

    def scaled(self, k: float) -> "Spread":
        """The same spread in other units (k > 0: seconds to ms, or time over a floor)."""
        return Spread(self.median * k, self.lo * k, self.hi * k, self.n)

    def as_dict(self) -> dict:
        return {"median": self.median, "lo": self.lo, "hi": self.hi, "n": self.n, "coverage": self.coverage}

    @classmethod
    def from_dict(cls, d: dict) -> "Spread":
        """The Spread a results JSON holds (`as_dict`'s output; its derived coverage is ignored)."""
        return cls(d["median"], d["lo"], d["hi"], d["n"])


def spread(values: Sequence[float]) -> Spread:
    """The median and min-max of `values` (one per repeat)."""
    if not values:
        raise ValueError("no repeats to summarise")
    return Spread(statistics.median(values), min(values), max(values), len(values))


def span_text(values: Sequence[float], digits: int = 2) -> str:
    """The full range of ratios as a title gives it, every value counted (never the best one): "0.87-0.92x", or
    "0.87x" where both ends print alike."""
    if not values:
        raise ValueError("no ratios to give a range of")
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def both_ways(run: Callable[[bool], T], rounds: int) -> tuple[list[T], list[T]]:
    """One untimed call of `run(True)` and one of `run(False)`, then `rounds` rounds calling it both ways, True first
    in even rounds (so neither side always runs on the other's warm caches): what `run(True)` and `run(False)`
    returned, round by round, for `paired_ratio`."""
    run(True), run(False)                                        # warm-up, untimed
    out: dict[bool, list[T]] = {True: [], False: []}
    for r in range(rounds):
        for side in ((True, False) if r % 2 == 0 else (False, True)):
            out[side].append(run(side))
    return out[True], out[False]


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> Spread:
    """num[r] / den[r] for each round r (both measured in round r), summarised: below 1, `num` is faster."""
    if len(num) != len(den):
        raise ValueError(f"paired repeats differ in count: {len(num)} and {len(den)}")
    return spread([a / b for a, b in zip(num, den)])


def ratio_bounds(num: Spread, den: Spread) -> Spread:
    """num / den for engines not timed in the same rounds (separate processes): the ratio of the medians, and an
    interval from the intervals' far ends (num.lo / den.hi to num.hi / den.lo), wider than a paired one."""
    return Spread(num.median / den.median, num.lo / den.hi, num.hi / den.lo, min(num.n, den.n))


def verdict(ratio: Spread, margin: float = NOISE_MARGIN) -> str:
    """"faster" (the whole interval below 1 - margin), "slower" (above 1 + margin), or "tie"."""
    if ratio.hi < 1 - margin:
        return "faster"
    if ratio.lo > 1 + margin:
        return "slower"
    return "tie"


def fastest(spreads: dict[str, Spread]) -> str:
    """The key with the lowest median (ties broken by the lower interval top, then by name, so the pick is stable)."""
    if not spreads:
        raise ValueError("nothing to choose from")
    return min(spreads, key=lambda k: (spreads[k].median, spreads[k].hi, k))
