"""studies.router_bytes (notebook 16): cells and pairs over the prompts dense answers, on hand-made rows."""
import pytest

from sparsekv.analysis import stats
from sparsekv.studies import router_bytes as rb


def _rows():
    # dense answers prompts 0, 1, 3 (not 2); a answers 0 and 2; b answers 0, 1, 3
    right = {"dense": {0, 1, 3}, "a": {0, 2}, "b": {0, 1, 3}}
    return [{"prompt": p, "method": m, "correct": p in ok} for m, ok in right.items() for p in range(4)]


def test_cells_and_pairs_count_only_the_prompts_dense_answers():
    ok, cells, tests = rb.paired_cells(_rows(), pairs=[("a", "b"), ("a", "missing")])
    assert ok == [0, 1, 3]
    assert cells["a"]["k"] == 1 and cells["a"]["n"] == 3            # prompt 2 (dense wrong) does not count
    assert (cells["b"]["k"], cells["b"]["n"]) == (3, 3)
    assert (cells["a"]["lo"], cells["a"]["hi"]) == stats.wilson(1, 3)
    assert tests == {("a", "b"): stats.mcnemar([True, False, False], [True, True, True])}   # a pair it lacks is skipped
    assert tests["a", "b"]["b_only"] == 2 and tests["a", "b"]["a_only"] == 0


def test_summarize_refuses_a_pair_the_grid_lacks():
    rows = [{**r, "scorer": r["method"] if r["method"] != "dense" else "dense", "budget": 64, "block_size": 16,
             "method": r["method"] if r["method"] == "dense" else f"{r['method']}@64.bs16"} for r in _rows()]
    for r in rows:
        if r["method"] == "dense":
            r["method"] = "dense.bs16"
    cfg = rb.GridConfig(prompts=4, scorers=("a", "b"), budgets=(64,), block_sizes=(16,), summaries=("kmean",))
    with pytest.raises(ValueError, match="pairs name methods"):
        rb.summarize(rows, cfg, {}, 9, pairs=[("a@64.bs16", "c@64.bs16")])
    with pytest.raises(ValueError, match="prompts must be a positive int"):
        rb.GridConfig(prompts=0)


def test_the_summaries_a_store_keeps_for_its_scorers():
    """One helper names what `paired.run` and `router_bytes` key their stores with: the defaults, then what the
    scorers read beyond them, in order, once; the grid's default is what it kept before the helper (the defaults and
    `khalf`), and an unknown scorer is named."""
    from sparsekv.routing.scorers import summaries_for
    from sparsekv.storage.summaries import DEFAULT_SUMMARIES
    assert summaries_for(("minmax", "halves", "halves", "mean")) == DEFAULT_SUMMARIES + ("khalf",)
    assert summaries_for("oracle") == summaries_for(()) == DEFAULT_SUMMARIES
    assert rb.GridConfig().summaries == DEFAULT_SUMMARIES + ("khalf",)
    assert rb.GridConfig(scorers=("minmax",)).summaries == DEFAULT_SUMMARIES
    with pytest.raises(ValueError, match="'halfs'"):
        summaries_for(["minmax", "halfs"])
