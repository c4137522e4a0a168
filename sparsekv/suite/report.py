"""The metrics JSON every notebook writes last, and the checks it asserts.

File format (one per notebook run):

    {"notebook": "00_tour", "metrics": {name: number}, "kinds": {name: kind}, "headline": [names],
     "gate_timing": bool,
     "checks": {claim: {"value": v, "op": "<=", "threshold": t, "role": "finding", "timing": false,
                        "passed": true, "gated": true}}}

`kind` says how a regression comparison treats the metric:
    "exact"    counts, block ids, hit tokens: must match exactly;
    "numeric"  recall, error, accuracy: compared with a tolerance;
    "timing"   a ratio against a peer measured in the same run: a wide band, and only in full runs.

A check is a measured value, a comparison and a threshold, never a bare bool, so a reader sees
by how much it held. Its role is one of:
    "invariant"  an identity worth guarding (a byte formula, a fork sharing its blocks): it holds by
                 construction when the code is right, and is labelled so, never presented as a finding;
    "finding"    a measured claim about the system (a router's recall, a speed-up);
    "hypothesis" a claim stated before the run whose outcome *is* the result (a proposed explanation, a goal that
                 may be missed): recorded with its verdict ("passed" is "supported"), "gated": false, never failing the run,
                 so a rejected hypothesis is reported, not hidden; the notebook prints the verdicts and renders
                 its words from them.
A check derived from wall-clock time (`timing=True`) is recorded in every run but gated only when
the notebook runs with `gate_timing=True` (full runs); smoke runs on a busy machine record it
with `gated: false`. Timing never fails `make test`.
"""
from __future__ import annotations

import json
import math
import operator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core import cpu_paths

KINDS = ("exact", "numeric", "timing")
ROLES = ("invariant", "finding", "hypothesis")
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


class NotebookCheckError(AssertionError):
    """A notebook's own check failed, or one of its metrics is NaN/inf."""


@dataclass(frozen=True)
class Check:
    """One claim: `value op threshold` must hold.

    value, threshold: finite numbers (bools count as 0/1; a count of violations compared `== 0`
    is the form for "every case holds").
    """

    value: float
    op: str
    threshold: float
    role: str = "finding"
    timing: bool = False

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS)}, got {self.op!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        for name in ("value", "threshold"):
            x = getattr(self, name)
            if isinstance(x, bool):
                object.__setattr__(self, name, float(x))
                continue
            try:
                x = float(x)
            except (TypeError, ValueError):
                raise TypeError(f"check {name} must be a number, got {type(getattr(self, name)).__name__}") from None
            if not math.isfinite(x):
                raise NotebookCheckError(f"check {name} is {x}: a check must compare finite numbers")
            object.__setattr__(self, name, x)

    @property
    def passed(self) -> bool:
        return bool(OPS[self.op](self.value, self.threshold))

    def describe(self) -> str:
        return f"{self.value:.6g} {self.op} {self.threshold:.6g}"


class Checks(dict):
    """{claim: Check}, filled by a notebook with `finding`, `invariant` and `timing`.

        checks = Checks()
        checks.finding("minmax keeps 95% of the mass at 4k", recall, ">=", 0.95)
        checks.invariant("dense reads 2·N·H·D·itemsize bytes", kv_bytes, "==", expected)
        checks.timing("routed decode is faster than dense at 64k", speedup, ">", 1)
        checks.hypothesis("the fast RoPE band holds most of Quest's slack", share, ">", 0.5)
    """

    def _add(self, claim: str, check: Check) -> Check:
        if not isinstance(claim, str) or not claim:
            raise TypeError(f"claim must be a non-empty str, got {claim!r}")
        if claim in self:
            raise ValueError(f"claim {claim!r} is recorded twice; give each check its own description")
        self[claim] = check
        return check

    def finding(self, claim: str, value, op: str, threshold) -> Check:
        return self._add(claim, Check(value, op, threshold, "finding"))

    def invariant(self, claim: str, value, op: str, threshold) -> Check:
        return self._add(claim, Check(value, op, threshold, "invariant"))

    def timing(self, claim: str, value, op: str, threshold) -> Check:
        return self._add(claim, Check(value, op, threshold, "finding", timing=True))

    def hypothesis(self, claim: str, value, op: str, threshold) -> Check:
        """A claim stated before the run, tested here; its verdict is recorded and never fails the run."""
        return self._add(claim, Check(value, op, threshold, "hypothesis"))

    def verdicts(self) -> str:
        """The hypotheses and whether this run supports them, one per line."""
        return "\n".join(f"{'supported' if c.passed else 'REJECTED '}  {c.describe():>24}  {k}"
                         for k, c in self.items() if c.role == "hypothesis")

    def table(self) -> str:
        """One line per check: status, role, the comparison, the claim."""
        lines = []
        for claim, c in self.items():
            status = ("yes " if c.passed else "no  ") if c.role == "hypothesis" else \
                "ok  " if c.passed else ("FAIL" if not c.timing else "slow")
            lines.append(f"{status} {c.role[:3]}{'/t' if c.timing else '  '} {c.describe():>26}  {claim}")
        return "\n".join(lines)


def _peak_rss_mib() -> float | None:
    """This process's peak resident set size in MiB: VmHWM from /proc/self/status (Linux: the high-water mark of
    this process image, reset at exec), else None. getrusage's ru_maxrss is not used: Linux carries it across exec, so
    a kernel started by a large pytest worker reported the worker's peak as its own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)          # kB
    except OSError:
        pass
    return None


def write_metrics(path: str | Path, notebook: str, metrics: dict, checks: dict[str, Check],
                  kinds: dict[str, str] | None = None, headline: list[str] | tuple = (),
                  gate_timing: bool = True) -> dict:
    """Validate and write a notebook's metrics, then raise if any gated check failed.

    metrics: flat {name: int | float}; every value must be finite.
    checks:  {claim: Check} (a `Checks`); each must hold, except timing checks when `gate_timing`
             is False (smoke runs), which are recorded with "gated": false.
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
    bad = {k: type(v).__name__ for k, v in checks.items() if not isinstance(v, Check)}
    if bad:
        raise TypeError(f"checks must map claims to report.Check (value, op, threshold), got {bad}")
    record = {"notebook": notebook, "metrics": clean, "kinds": {n: kinds[n] for n in clean},
              "headline": list(headline), "gate_timing": bool(gate_timing),
              "cpu_paths": cpu_paths.taken(),       # CPU-gated paths this process ran (core.cpu_paths: none in smokes)
              "peak_rss_mib": _peak_rss_mib(),      # this process's peak resident memory so far (the notebook's kernel)
              "checks": {k: {**asdict(c), "passed": c.passed, "gated": c.role != "hypothesis" and (gate_timing or not c.timing)}
                         for k, c in checks.items()}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True))
    failed = [f"{k} ({c.describe()})" for k, c in checks.items()
              if not c.passed and c.role != "hypothesis" and (gate_timing or not c.timing)]
    if failed:
        raise NotebookCheckError(f"{notebook}: {len(failed)} check(s) failed: " + "; ".join(failed))
    return record
