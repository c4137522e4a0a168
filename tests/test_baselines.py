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


def _base(**metrics):
    kinds = {k: ("exact" if isinstance(v, int) else "numeric") for k, v in metrics.items()}
    return {"notebook": "x", "metrics": dict(metrics), "kinds": kinds}


def test_a_spread_between_cpu_configurations_widens_a_numeric_tolerance():
    base = _base(kl=0.50)
    now = {**base, "metrics": {"kl": 0.53}}
    tol = baselines.DEFAULT_TOLERANCES                            # +-0.01 by rule
    assert not baselines.compare(base, now, tol).ok
    base["spread"] = {"metrics": {"kl": 0.012}}                   # measured between native and alt
    assert baselines.compare(base, now, tol).ok                    # 3 x 0.012 = 0.036 allowed
    assert not baselines.compare(base, {**base, "metrics": {"kl": 0.54}}, tol).ok     # 0.04 is past it


def test_a_chaotic_metric_is_observed_and_a_listed_pattern_too():
    tol = baselines.DEFAULT_TOLERANCES                            # observe_above 0.25 of the value
    base = _base(kl=0.10, count=3, kept=0.9)
    base["spread"] = {"metrics": {"kl": 0.01, "count": 1}}        # 3 x 0.01 > 0.25 x 0.10; a count that moved
    now = {**base, "metrics": {"kl": 0.9, "count": 7, "kept": 0.9}}
    cmp = baselines.compare(base, now, tol)
    assert cmp.ok
    observed = {d.metric: d.tolerance for d in cmp.diffs if d.observed}
    assert set(observed) == {"kl", "count"}                       # "kept" did not move: compared
    assert "chaotic" in observed["kl"] and "differs between" in observed["count"]
    tiny = _base(err=8e-5)                                        # a rounding-level error under its 0.01 rule
    tiny["spread"] = {"metrics": {"err": 1.2e-5}}                 # 3 x spread > 25% of the value, < the rule
    assert not any(d.observed for d in baselines.compare(tiny, tiny, tol).diffs)
    assert not baselines.compare(tiny, {**tiny, "metrics": {"err": 0.05}}, tol).ok     # still a regression signal
    listed = {**tol, "observations": {"ke*": "a reason"}}
    cmp = baselines.compare(base, {**now, "metrics": {**now["metrics"], "kept": 0.1}}, listed)
    assert cmp.ok and next(d.tolerance for d in cmp.diffs if d.metric == "kept") == "observed: a reason"


def test_record_spread_keeps_only_metrics_that_differ_and_refuses_unequal_sets():
    a = {"metrics": {"x": 1.0, "y": 2.0, "t": 0.3}, "kinds": {"t": "timing"}}
    b = {"metrics": {"x": 1.0, "y": 2.5, "t": 0.9}, "kinds": {"t": "timing"}}
    assert baselines.record_spread(a, b)["metrics"] == {"y": 0.5}  # x equal, t a timing
    with pytest.raises(ValueError, match="different metrics"):
        baselines.record_spread(a, {"metrics": {"x": 1.0}})


def test_the_committed_tolerances_observe_only_what_they_give_a_reason_for():
    tol = baselines.load_tolerances(root=REPO)
    assert all(isinstance(why, str) and len(why) > 20 for why in tol["observations"].values())
    for stem in STEMS:                                            # every notebook keeps metrics that are compared
        base = load(stem)
        cmp = baselines.compare(base, base, tol)
        compared = [d for d in cmp.diffs if not d.observed and d.kind != "timing" and not d.metric.startswith("check")]
        assert len(compared) >= 0.5 * len([d for d in cmp.diffs if d.kind != "timing"]), stem


def test_merge_spread_keeps_the_baseline_s_values_and_the_larger_spread():
    base = {**_base(x=1.0, y=2.0), "spread": {"metrics": {"x": 0.3}, "configurations": {"alt": {"aten": "AVX2"}}}}
    other = _base(x=1.1, y=2.5)
    merged = baselines.merge_spread(base, other, "native on another CPU", {"aten": "AVX512"})
    assert merged["metrics"] == base["metrics"]                   # the values stay the baseline's
    assert merged["spread"]["metrics"] == {"x": 0.3, "y": 0.5}    # x keeps its larger recorded spread
    assert set(merged["spread"]["configurations"]) == {"alt", "native on another CPU"}
    assert base["spread"]["metrics"] == {"x": 0.3}                # the input is not modified
