"""The regression comparison itself, exercised on copies of the committed baselines."""
import copy
import json

import pytest
from conftest import REPO

from sparsekv.suite import regression as baselines
from sparsekv.suite import runner as nbrun

STEMS = [p.stem for p in nbrun.discover(root=REPO)]


def load(stem):
    return json.loads(baselines.baseline_path(stem, "smoke", root=REPO).read_text())


@pytest.mark.parametrize("stem", STEMS)
def test_every_notebook_has_committed_smoke_and_full_metrics(stem):
    smoke = baselines.baseline_path(stem, "smoke", root=REPO)
    full = baselines.baseline_path(stem, "full", root=REPO)
    assert smoke.exists(), f"record it: python -m sparsekv notebooks baseline {stem}"
    assert full.exists(), f"run the full notebook: python -m sparsekv notebooks run {stem}"
    assert baselines.compare(load(stem), load(stem)).ok


def test_a_five_point_recall_drop_fails_with_a_readable_table():
    base = load("01_dense_vs_sparse_baselines")
    now = copy.deepcopy(base)
    name = next(k for k in now["metrics"] if k.startswith("minmax.mass_recall"))
    now["metrics"][name] -= 0.05           # as if the router dropped its best block
    cmp = baselines.compare(base, now)
    assert not cmp.ok and [d.metric for d in cmp.failures] == [name]
    table = cmp.table()
    for word in (name, "baseline", "now", "tolerance", "direction", "down"):
        assert word in table
    assert json.loads(cmp.to_json())["failures"][0]["metric"] == name


def test_doubled_bytes_fail():
    base = load("01_dense_vs_sparse_baselines")
    now = copy.deepcopy(base)
    name = next(k for k in now["metrics"] if "bytes_ratio" in k)
    now["metrics"][name] *= 2
    assert [d.metric for d in baselines.compare(base, now).failures] == [name]


def test_removed_and_new_metrics_fail():
    base = load("00_tour")
    now = copy.deepcopy(base)
    gone = sorted(now["metrics"])[0]
    del now["metrics"][gone]
    now["metrics"]["surprise"] = 1.0
    cmp = baselines.compare(base, now)
    assert {(d.metric, d.direction) for d in cmp.failures} == {(gone, "missing"), ("surprise", "new")}


def test_exact_metrics_allow_no_change_and_timing_allows_a_wide_band():
    base = {"notebook": "x", "metrics": {"count": 3, "t": 0.4, "r": 0.9},
            "kinds": {"count": "exact", "t": "timing", "r": "numeric"}}
    tol = baselines.DEFAULT_TOLERANCES
    move = lambda **kw: {**base, "metrics": {**base["metrics"], **kw}}
    assert not baselines.compare(base, move(count=4), tol).ok
    assert baselines.compare(base, move(t=1.1), tol).ok          # x2.75: inside x3
    assert not baselines.compare(base, move(t=1.3), tol).ok      # x3.25
    assert baselines.compare(base, move(r=0.905), tol).ok
    assert not baselines.compare(base, move(r=0.85), tol).ok


def _with_checks(**checks):
    return {"notebook": "x", "metrics": {"r": 0.9}, "kinds": {"r": "numeric"},
            "checks": {k: {"value": 1.0, "op": ">", "threshold": 0.0, "role": "finding", "timing": t,
                           "passed": True, "gated": g} for k, (t, g) in checks.items()}}


def test_a_deleted_check_fails_with_a_message_naming_it():
    base = _with_checks(**{"minmax beats recency": (False, True), "oracle is best": (False, True)})
    now = _with_checks(**{"oracle is best": (False, True)})
    cmp = baselines.compare(base, now)
    assert [(d.metric, d.direction) for d in cmp.failures] == [("check: minmax beats recency", "missing")]
    assert "minmax beats recency" in cmp.table()


def test_a_check_gated_off_fails_but_an_ungated_timing_check_stays_ungated():
    base = _with_checks(**{"faster": (True, True), "slow ok": (True, False)})
    now = _with_checks(**{"faster": (True, False), "slow ok": (True, False)})
    assert [(d.metric, d.direction) for d in baselines.compare(base, now).failures] == [("check: faster", "ungated")]


def test_timing_metrics_are_reported_but_not_gated_in_smoke_comparisons():
    base = {"notebook": "x", "metrics": {"t": 0.4, "r": 0.9}, "kinds": {"t": "timing", "r": "numeric"}}
    now = {**base, "metrics": {"t": 40.0, "r": 0.9}}          # a 100x slowdown on a busy machine
    assert not baselines.compare(base, now).ok
    cmp = baselines.compare(base, now, gate_timing=False)
    assert cmp.ok and "not gated" in next(d.tolerance for d in cmp.diffs if d.metric == "t")
