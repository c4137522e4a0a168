import json
import math

import pytest

from sparsekv.suite.report import Check, Checks, NotebookCheckError, write_metrics


def test_nan_metric_fails_loudly(tmp_path):
    with pytest.raises(NotebookCheckError, match="'recall' is nan"):
        write_metrics(tmp_path / "m.json", "x", {"recall": math.nan}, Checks())


def test_failed_check_raises_after_writing_its_value_and_threshold(tmp_path):
    checks = Checks()
    checks.finding("oracle beats minmax", 0.4, ">", 0.5)
    with pytest.raises(NotebookCheckError, match=r"oracle beats minmax \(0.4 > 0.5\)"):
        write_metrics(tmp_path / "m.json", "x", {"a": 1}, checks)
    rec = json.loads((tmp_path / "m.json").read_text())["checks"]["oracle beats minmax"]
    assert rec == {"value": 0.4, "op": ">", "threshold": 0.5, "role": "finding", "timing": False,
                   "passed": False, "gated": True}


def test_timing_checks_are_recorded_but_gated_only_in_full_runs(tmp_path):
    checks = Checks()
    checks.timing("routed is faster", 0.8, ">", 1)          # a busy machine made it slower
    rec = write_metrics(tmp_path / "m.json", "x", {"a": 1}, checks, gate_timing=False)
    assert rec["checks"]["routed is faster"]["passed"] is False
    assert rec["checks"]["routed is faster"]["gated"] is False
    with pytest.raises(NotebookCheckError, match="routed is faster"):
        write_metrics(tmp_path / "m.json", "x", {"a": 1}, checks, gate_timing=True)


def test_a_non_timing_check_fails_even_when_timing_is_not_gated(tmp_path):
    checks = Checks()
    checks.invariant("bytes formula", 3, "==", 4)
    with pytest.raises(NotebookCheckError, match="bytes formula"):
        write_metrics(tmp_path / "m.json", "x", {"a": 1}, checks, gate_timing=False)


def test_checks_reject_bare_bools_bad_ops_nan_and_duplicates(tmp_path):
    with pytest.raises(TypeError, match="report.Check"):
        write_metrics(tmp_path / "m.json", "x", {"a": 1}, {"ok": True})
    with pytest.raises(ValueError, match="op must be one of"):
        Check(1, "=>", 0)
    with pytest.raises(ValueError, match="role must be one of"):
        Check(1, ">", 0, role="claim")
    with pytest.raises(NotebookCheckError, match="finite"):
        Check(math.nan, ">", 0)
    checks = Checks()
    checks.finding("a", 1, ">", 0)
    with pytest.raises(ValueError, match="recorded twice"):
        checks.invariant("a", 1, ">", 0)
    assert Check(True, "==", 1).passed and not Check(2, "<", 2).passed and Check(2, "<=", 2).passed


def test_kinds_default_to_numeric_and_unknown_names_are_rejected(tmp_path):
    rec = write_metrics(tmp_path / "m.json", "x", {"a": 1, "b": 0.5}, Checks(), kinds={"a": "exact"})
    assert rec["kinds"] == {"a": "exact", "b": "numeric"}
    with pytest.raises(ValueError, match="not recorded"):
        write_metrics(tmp_path / "m.json", "x", {"a": 1}, Checks(), headline=["zzz"])


def test_a_rejected_hypothesis_is_recorded_and_does_not_fail_the_run(tmp_path):
    from sparsekv.suite.report import Checks, write_metrics
    checks = Checks()
    checks.hypothesis("the fast band holds most of the slack", 0.16, ">", 0.5)
    checks.hypothesis("the slow bound keeps more mass", 0.01, ">", 0)
    checks.invariant("the slack splits exactly", 0.0, "==", 0)
    rec = write_metrics(tmp_path / "m.json", "x", {"share": 0.16}, checks)
    assert rec["checks"]["the fast band holds most of the slack"]["passed"] is False
    assert rec["checks"]["the slow bound keeps more mass"]["passed"] is True
    assert "REJECTED" in checks.verdicts() and "supported" in checks.verdicts()
    checks.finding("a real finding", 0.0, ">", 1)
    with pytest.raises(AssertionError, match="a real finding"):
        write_metrics(tmp_path / "m.json", "x", {"share": 0.16}, checks)


def test_every_registered_scorer_is_drawn_in_a_router_colour_never_dense_s():
    """A paired-study figure styles each method family: every scorer of the registry (`halves`, added after the
    palette, among them) gets its router colour and its router marker, distinct from dense's, the presses' grey and
    HQQ's, and no two scorers share a colour except `hminmax`, minmax's hierarchical variant, and its (group, keep)
    variants, named "hminmax-g{group}-k{keep}" (CI's full run once drew seven in `OTHER`, the grey of no router, until
    they took hminmax's colour). A variant is an instance of the one registered class, never a registry entry of its
    own."""
    from sparsekv.routing.hierarchy import hierarchical
    from sparsekv.routing.scorers import SCORERS, make_scorer
    from sparsekv.suite import viz
    variant = hierarchical(4, 3).name
    builtin = [n for n, s in SCORERS.items() if s.__module__.startswith("sparsekv.")]   # not other tests' scorers
    dense = viz.method_style("dense")["color"]
    for name in builtin:
        style = viz.method_style(name)
        assert style["color"] == viz.router_color(name) and style["marker"] == viz.router_marker(name), name
        assert style["color"] not in (dense, viz.QUANT_COLOR, "#777777"), name
    colours = [viz.router_color(n) for n in builtin if not n.startswith("hminmax")]
    markers = [viz.router_marker(n) for n in builtin if not n.startswith("hminmax")]
    assert len(set(markers)) == len(markers)            # mean's orange and halves' vermillion differ in shape too
    assert len(set(colours)) == len(colours) and viz.router_color("hminmax") == viz.router_color("minmax")
    assert viz.router_color(variant) == viz.router_color(f"{variant}@64") == viz.router_color("hminmax")
    assert type(make_scorer(variant)).family() == "hminmax" and all(SCORERS[n].family() == n for n in builtin)
    assert variant not in SCORERS and "hminmax-g40-k5" not in SCORERS      # a variant is read from its name
    assert viz.router_color("hminmax-g40-k5@128") == viz.router_color("hminmax") != viz.OTHER
    assert viz.router_color("hminmax-g0-k5") == viz.router_color("hminmaxx") == viz.OTHER
    assert viz.method_style("Knorm")["color"] == "#777777" and viz.method_style("HQQ4")["color"] == viz.QUANT_COLOR
