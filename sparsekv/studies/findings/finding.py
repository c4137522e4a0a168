"""A finding: one sentence of the findings page, a template whose every value is read from a notebook's full-run
metrics, and the words any study's finding may use (they know no study).

The type lives here, beside the page that renders it (`findings.page`) and the studies that write findings (layer
9, above the suite's machinery, which knows no study).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...analysis import peers

Metrics = dict[str, dict[str, float]]          # notebook stem -> {metric: value}


@dataclass(frozen=True)
class Finding:
    """A str.format template and where each of its named values comes from.

    1. A value is a (notebook stem, metric) pair, read as is, or a function of all the loaded metrics (for derived
       words: which bound applies, which router leads).
    2. Rendering a pair whose metric the run does not hold raises a KeyError naming `stem:metric`.
    """
    template: str                                        # str.format template
    values: dict[str, tuple[str, str] | Callable[[Metrics], object]]

    def render(self, m: Metrics) -> str:
        out = {}
        for name, src in self.values.items():
            if callable(src):
                out[name] = src(m)
                continue
            stem, metric = src
            if stem not in m or metric not in m[stem]:
                raise KeyError(f"finding needs {stem}:{metric}, which the full-run metrics do not hold")
            out[name] = m[stem][metric]
        return self.template.format(**out)


# -- the method families a finding names ------------------------------------------------------------

PRESSES = tuple(p.removesuffix("Press") for p in peers.PRESSES)      # as notebook 09 names its methods


def router_names() -> tuple[str, ...]:
    """Every registered scorer but the oracle (which reads true attention mass, not a summary): the routers a
    finding may call the best router."""
    from ...routing.scorers import SCORERS
    return tuple(s for s in SCORERS if s != "oracle")


# -- words from comparisons ---------------------------------------------------------------------------

def versus(x: float, y: float, below: str, near: str, above: str, tol: float = 0.05) -> str:
    """A word from comparing x with y: `near` within `tol` of y (relative), else `below` or `above`."""
    if abs(x - y) <= tol * max(abs(y), 1e-9) or abs(x - y) <= 1e-9:
        return near
    return below if x < y else above


def paired_word(a: str, b: str, pair: str, label: str, stem: str) -> Callable[[Metrics], str]:
    """Notebook `stem`'s metric `a` against `b` in words, from the exact McNemar p of `pair` (0.05)."""
    def f(m: Metrics) -> str:
        x, y, p = m[stem][a], m[stem][b], m[stem][pair]
        if p < 0.05:
            return f"is significantly {'more' if x > y else 'fewer'} than {label} (p = {p:.2g})"
        return f"is not significantly different from {label}'s {y:.0%} (p = {p:.2g})"
    return f
