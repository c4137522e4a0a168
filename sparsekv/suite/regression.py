"""Notebook regression: compare a run's metrics JSON with a committed baseline.

Each metric is compared by its kind (recorded in the metrics JSON, see `report.py`):
    exact    must be equal;
    numeric  |now - base| <= max(abs, rel * |base|);
    timing   a ratio from the same run; passes while now / base is within [1/ratio, ratio].
Tolerances come from `tests/baselines/tolerances.yaml`: per-kind defaults, then overrides by
metric-name pattern (fnmatch), first match wins. A metric that is new or missing fails.

A baseline also holds what holds it on another CPU (`record_spread`): `notebooks baseline` runs each notebook under
both of `suite.cpuconfig`'s configurations and keeps, per metric, how far the two runs differ ("spread"). A
metric's tolerance is then the larger of its rule's and `derived.factor` times its spread. Two kinds of metric are
observations, recorded and shown but never compared: those named in the file's `observations` (with the reason),
and those the spread shows to be chaotic (an exact metric that differs between the configurations, or a numeric
one whose derived tolerance exceeds `derived.observe_above` of its value).
With `gate_timing=False` (smoke runs, `make test`) timing metrics are reported but never fail:
a busy machine moves them, and timing claims are asserted in full runs only.

Checks are compared too: a check the baseline holds that the run no longer records, or one the
baseline gated that the run no longer gates, fails, so deleting or disabling a check is caught.

    python -m sparsekv notebooks baseline [names]   re-records tests/baselines/NN.smoke.json
    python -m sparsekv notebooks spread [names] [--cpu alt]   adds this machine's (or configuration's) spread to them
"""
from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.tables import format_table

BASELINES = Path("tests") / "baselines"            # relative to the repository root
DEFAULT_TOLERANCES = {"defaults": {"exact": {}, "numeric": {"abs": 0.01, "rel": 0.01}, "timing": {"ratio": 3.0}},
                      "overrides": {}, "observations": {}, "derived": {"factor": 3.0, "observe_above": 0.25}}


def baseline_path(stem: str, mode: str = "smoke", root: Path | str = ".") -> Path:
    """Smoke baselines live under tests/baselines; full-run metrics beside the figures (root: the repository)."""
    root = Path(root)
    return root / BASELINES / f"{stem}.smoke.json" if mode == "smoke" else root / "figures" / f"{stem}.metrics.json"


def has_timing(stem: str, root: Path | str = ".") -> bool:
    """Whether the notebook's committed smoke baseline records a timing metric (its findings include timings)."""
    path = baseline_path(stem, "smoke", root)
    return path.exists() and "timing" in json.loads(path.read_text())["kinds"].values()


def load_tolerances(path: Path | None = None, root: Path | str = ".") -> dict:
    path = path or Path(root) / BASELINES / "tolerances.yaml"
    if not path.exists():
        return DEFAULT_TOLERANCES
    import yaml
    spec = yaml.safe_load(path.read_text()) or {}
    out = {"defaults": {**DEFAULT_TOLERANCES["defaults"], **(spec.get("defaults") or {})},
           "overrides": spec.get("overrides") or {}, "observations": spec.get("observations") or {},
           "derived": {**DEFAULT_TOLERANCES["derived"], **(spec.get("derived") or {})}}
    return out


@dataclass(frozen=True)
class MetricDiff:
    metric: str
    kind: str
    baseline: float | None
    now: float | None
    tolerance: str
    direction: str       # "=", "up", "down", "new", "missing", "ungated" (checks)
    ok: bool
    observed: bool = False   # an observation: recorded and shown, never compared (module docstring)


@dataclass
class Comparison:
    notebook: str
    diffs: list[MetricDiff]

    @property
    def failures(self) -> list[MetricDiff]:
        return [d for d in self.diffs if not d.ok]

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self, only_failures: bool = True) -> str:
        rows = self.failures if only_failures else self.diffs
        head = ["metric", "kind", "baseline", "now", "tolerance", "direction"]
        cells = [dict(zip(head, (d.metric, d.kind, _fmt(d.baseline), _fmt(d.now), d.tolerance, d.direction)))
                 for d in rows]
        return (f"{self.notebook}: {len(self.failures)} of {len(self.diffs)} metrics out of tolerance\n"
                + format_table(cells, head, align="left"))

    def to_json(self) -> str:
        return json.dumps({"notebook": self.notebook, "ok": self.ok,
                           "failures": [asdict(d) for d in self.failures]}, indent=1)


def compare(baseline: dict, current: dict, tolerances: dict | None = None, gate_timing: bool = True,
            root: Path | str = ".") -> Comparison:
    """Compare two metrics records (as written by `report.write_metrics`), metrics and checks."""
    tol = tolerances or load_tolerances(root=root)
    tol = {**DEFAULT_TOLERANCES, **tol}
    base_m, now_m = baseline["metrics"], current["metrics"]
    spread = (baseline.get("spread") or {}).get("metrics", {})
    kinds = {**current.get("kinds", {}), **baseline.get("kinds", {})}
    diffs = []
    for name in sorted(set(base_m) | set(now_m)):
        kind = kinds.get(name, "numeric")
        if name not in now_m:
            diffs.append(MetricDiff(name, kind, base_m[name], None, "-", "missing", False))
            continue
        if name not in base_m:
            diffs.append(MetricDiff(name, kind, None, now_m[name], "-", "new", False))
            continue
        b, n = base_m[name], now_m[name]
        direction = "=" if n == b else ("up" if n > b else "down")
        why = observation(name, kind, b, spread.get(name), tol)
        if why:
            diffs.append(MetricDiff(name, kind, b, n, f"observed: {why}", direction, True, observed=True))
            continue
        spec = _tolerance_for(name, kind, tol)
        if kind == "numeric" and spread.get(name):
            spec = _widened(spec, b, tol["derived"]["factor"] * spread[name])
        ok, text = _within(b, n, kind, spec)
        if kind == "timing" and not gate_timing:
            ok, text = True, text + " (not gated)"
        diffs.append(MetricDiff(name, kind, b, n, text, direction, ok))
    diffs += _compare_checks(baseline.get("checks", {}), current.get("checks", {}))
    return Comparison(current.get("notebook", baseline.get("notebook", "?")), diffs)


def observation(name: str, kind: str, base: float, spread: float | None, tol: dict) -> str:
    """Why metric `name` is an observation (recorded, never compared), or "" when it is compared: it matches a
    pattern of the tolerances' `observations`, or its spread between the CPU configurations shows it chaotic: an
    exact metric that differs, or a numeric one whose derived tolerance exceeds both its rule's and
    `derived.observe_above` of its value."""
    for pattern, why in (tol.get("observations") or {}).items():
        if fnmatch.fnmatchcase(name, pattern):
            return str(why)
    if not spread or kind == "timing":
        return ""
    if kind == "exact":
        return f"differs between the CPU configurations by {spread:.4g}"
    derived, rule = tol["derived"], _tolerance_for(name, kind, tol)
    allowed = max(float(rule.get("abs", 0.0)), float(rule.get("rel", 0.0)) * abs(base))
    if derived["factor"] * spread > max(allowed, derived["observe_above"] * abs(base)):
        return (f"chaotic: {derived['factor']:g} x its spread between the CPU configurations ({spread:.3g}) exceeds "
                f"{derived['observe_above']:.0%} of its value")
    return ""


def _widened(spec: dict, base: float, allowed: float) -> dict:
    """`spec` with its allowance raised to at least `allowed` (a derived tolerance)."""
    a, rel = float(spec.get("abs", 0.0)), float(spec.get("rel", 0.0))
    return {"abs": max(a, rel * abs(base), allowed), "rel": 0.0}


def record_spread(native: dict, other: dict, configurations: dict[str, dict] | None = None) -> dict:
    """The spread block a baseline keeps: per metric that is not a timing, |other - native| where they differ
    (metrics equal in both runs are left out), and what each configuration ran (`cpuconfig.describe`)."""
    kinds = native.get("kinds", {})
    a, b = native["metrics"], other["metrics"]
    missing = sorted(set(a) ^ set(b))
    if missing:
        raise ValueError(f"the two configurations recorded different metrics: {missing[:8]}")
    diff = {k: abs(float(b[k]) - float(a[k])) for k in sorted(a) if kinds.get(k) != "timing" and a[k] != b[k]}
    return {"metrics": diff, "configurations": dict(configurations or {})}


def merge_spread(baseline: dict, other: dict, configuration: str, description: dict | None = None) -> dict:
    """`baseline` with the spread to another run of the same smoke added (`notebooks spread`): per metric that is
    not a timing, the larger of the spread it had and |other - baseline|; the baseline's values are unchanged.
    `configuration` names where `other` ran (a CPU configuration on a machine) and `description` what it ran."""
    fresh = record_spread(baseline, other)["metrics"]
    old = dict(baseline.get("spread") or {})
    merged = dict(old.get("metrics") or {})
    for k, v in fresh.items():
        merged[k] = max(merged.get(k, 0.0), v)
    configurations = {**(old.get("configurations") or {}), configuration: dict(description or {})}
    return {**baseline, "spread": {"metrics": dict(sorted(merged.items())), "configurations": configurations}}


def _compare_checks(base: dict, now: dict) -> list[MetricDiff]:
    """A failing row for each baseline check that is missing now, or gated then and not now."""
    out = []
    for claim, b in sorted(base.items()):
        n = now.get(claim)
        if n is None:
            out.append(MetricDiff(f"check: {claim}", "check", _value(b), None, "-", "missing", False))
        elif _gated(b) and not _gated(n):
            out.append(MetricDiff(f"check: {claim}", "check", _value(b), _value(n), "-", "ungated", False))
    return out


def _gated(c) -> bool:
    return bool(c.get("gated", True)) if isinstance(c, dict) else True


def _value(c):
    return c.get("value") if isinstance(c, dict) else float(bool(c))


def _tolerance_for(name: str, kind: str, tol: dict) -> dict:
    for pattern, spec in tol["overrides"].items():
        if fnmatch.fnmatchcase(name, pattern):
            return spec
    return tol["defaults"].get(kind, {})


def _within(b: float, n: float, kind: str, spec: dict) -> tuple[bool, str]:
    if kind == "exact":
        return n == b, "exact"
    if kind == "timing":
        ratio = float(spec.get("ratio", 3.0))
        if b == 0 or n == 0:
            return (b == n), f"x{ratio:g}"
        r = n / b
        return (1 / ratio <= r <= ratio), f"x{ratio:g}"
    a, rel = float(spec.get("abs", 0.0)), float(spec.get("rel", 0.0))
    allowed = max(a, rel * abs(b))
    return math.isclose(n, b, rel_tol=0, abs_tol=allowed) or abs(n - b) <= allowed, f"±{allowed:.3g}"


def _fmt(x) -> str:
    if x is None:
        return "-"
    return f"{x:.6g}" if isinstance(x, float) else str(x)
