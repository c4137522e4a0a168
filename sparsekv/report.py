"""The metrics JSON every notebook writes last, and the checks it asserts.

File format (one per notebook run):

    {"notebook": "00_tour", "metrics": {name: number}, "kinds": {name: kind},
     "headline": [names], "checks": {description: bool}}

`kind` says how a regression comparison treats the metric:
    "exact"    counts, block ids, hit tokens: must match exactly;
    "numeric"  recall, error, accuracy: compared with a tolerance;
    "timing"   a ratio against a peer measured in the same run: a wide band.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

KINDS = ("exact", "numeric", "timing")


class NotebookCheckError(AssertionError):
    """A notebook's own check failed, or one of its metrics is NaN/inf."""


def write_metrics(path: str | Path, notebook: str, metrics: dict, checks: dict[str, bool],
                  kinds: dict[str, str] | None = None, headline: list[str] | tuple = ()) -> dict:
    """Validate and write a notebook's metrics, then raise if any check failed.

    metrics: flat {name: int | float}; every value must be finite.
    checks:  {human-readable claim: bool}; all must hold.
    kinds:   {name: "exact" | "numeric" | "timing"}; unnamed metrics are "numeric".
    The file is written before the checks are asserted, so a failing run leaves evidence.
    """
    kinds = dict(kinds or {})
    clean = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)  # numpy / 0-d tensors
            except (TypeError, ValueError):
                raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}") from None
        if not math.isfinite(value):
            raise NotebookCheckError(f"metric {name!r} is {value}: a notebook must not report NaN or inf")
        clean[name] = value
        kinds.setdefault(name, "numeric")
    bad_kinds = {n: k for n, k in kinds.items() if k not in KINDS}
    if bad_kinds:
        raise ValueError(f"kinds must be one of {KINDS}, got {bad_kinds}")
    unknown = [n for n in list(kinds) + list(headline) if n not in clean]
    if unknown:
        raise ValueError(f"kinds/headline name metrics that were not recorded: {unknown}")
    record = {"notebook": notebook, "metrics": clean, "kinds": {n: kinds[n] for n in clean},
              "headline": list(headline), "checks": {k: bool(v) for k, v in checks.items()}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True))
    failed = [k for k, v in checks.items() if not v]
    if failed:
        raise NotebookCheckError(f"{notebook}: {len(failed)} check(s) failed: " + "; ".join(failed))
    return record
