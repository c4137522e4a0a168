"""The equal-bytes study's fast-memory axis (studies.equal_bytes.fast_memory): a router over a cold tier answers as it
does in memory, bit for bit, and its fast bytes are its hot tiles plus its summaries."""
import pytest
import torch

import sparsekv as sk
from sparsekv import methods as mt
from sparsekv.analysis import tasks
from sparsekv.studies.equal_bytes import fast_memory as fm


def _doc(n=200, seed=0) -> tasks.Document:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (n,), generator=g).tolist()
    qs = tuple(tasks.Question(f"q{i}", torch.randint(3, 250, (5,), generator=g).tolist(),
                              torch.randint(3, 250, (3,), generator=g).tolist(), "", (0,)) for i in range(2))
    return tasks.Document("toy", ids, (), qs, n, "random tokens", seed)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return sk.Model(sk.ModelConfig.from_name("tiny"))


def test_a_cold_tier_changes_no_answer_and_counts_its_reads(net):
    methods = mt.routers(["halves", "minmax"], [0.25])
    rows = fm.run_document(net, _doc(), methods, [0.1, 1.0], prefetch=1, meta={"doc": 7})
    assert len(rows) == 2 * 2 * 2                              # questions x routers x hot shares
    assert all(r["exact"] for r in rows)                       # the disk returns what was written
    assert {r["doc"] for r in rows} == {7}
    small = [r for r in rows if r["hot_share"] == 0.1]
    full = [r for r in rows if r["hot_share"] == 1.0]
    assert all(r["hot_blocks"] == 2 for r in small)            # ceil(0.1 * 13 blocks of 16 tokens)
    assert sum(r["misses"] + r["late_prefetches"] + r["prefetch_hits"] + r["staged"] for r in small) > 0
    for a, b in zip(small, full):                               # the same question and router, more tiles hot
        assert (a["question"], a["method"]) == (b["question"], b["method"])
        assert b["misses"] + b["late_prefetches"] <= a["misses"] + a["late_prefetches"] and b["hits"] >= a["hits"]
    for r in rows:                                              # hot tiles' share plus the summaries' share
        assert r["fast_held"] == pytest.approx(min(r["hot_blocks"], 14) / 14 + r["held"] - 1)    # of 200 + 16 tokens
        assert r["fast_held"] < r["held"] or r["hot_share"] == 1.0


def test_a_hybrid_model_keeps_its_sliding_layers_and_summaries_in_fast_memory():
    """Gemma's layout in small: the cold tier holds the global layer's tiles only. Answers stay bit for bit, and the
    fast bytes are what the model holds less the global tiles that are not hot, counted here by hand: per kv head and
    layer, dense holds 216 tokens in the global layer and 32 in each of the 2 sliding ones (280 in all), so the global
    layer is 216/280 of the reference."""
    torch.manual_seed(0)
    net = sk.Model(sk.ModelConfig.from_name("tiny", n_layers=3, windows=(32, 0, 32)))
    rows = fm.run_document(net, _doc(), mt.routers(["halves"], [0.25]), [0.1, 1.0], prefetch=1)
    assert len(rows) == 2 * 2 and all(r["exact"] for r in rows)
    assert sum(r["misses"] + r["late_prefetches"] + r["prefetch_hits"] + r["staged"] for r in rows) > 0
    for r in rows:
        assert r["fast_held"] == pytest.approx(r["held"] - 216 / 280 * (1 - r["hot_blocks"] / 14))
    small = next(r for r in rows if r["hot_share"] == 0.1)
    assert small["fast_held"] > (32 + 32) / 280                 # the sliding layers alone stay above this


def test_bad_settings_are_refused_before_any_work(net):
    doc = _doc()
    with pytest.raises(ValueError, match="hot share must be in"):
        fm.run_document(net, doc, mt.routers(["halves"], [0.25]), [0.0])
    with pytest.raises(ValueError, match="routers over exact blocks under the dense rule"):
        fm.run_document(net, doc, mt.routers(["halves"], [0.25], kv_bits=(8,)), [0.5])
    with pytest.raises(ValueError, match="routers over exact blocks under the dense rule"):
        fm.run_document(net, doc, mt.routers(["halves"], [0.25], rules=("routed",)), [0.5])
    with pytest.raises(TypeError, match="methods must be"):
        fm.run_document(net, doc, ["halves@0.25"], [0.5])
    with pytest.raises(ValueError, match="prefetch must be"):
        fm.run_document(net, doc, mt.routers(["halves"], [0.25]), [0.5], prefetch=-1)


def test_the_table_and_figure_read_the_rows(net, tmp_path):
    import pandas as pd

    from sparsekv.studies.equal_bytes import report as rep
    rows = []
    for d in range(2):
        meta = {"model": "tiny", "length": 200, "task": "toy", "doc": d}
        rows += fm.run_document(net, _doc(seed=d), mt.routers(["halves"], [0.25]), [0.1, 0.5], meta=meta)
    import json

    from sparsekv.studies.equal_bytes import analysis as an
    for cpu in ("CPU A", "CPU B"):                               # the same cell timed on two machines
        (tmp_path / cpu).mkdir()
        pd.DataFrame(rows).to_csv(tmp_path / cpu / "fast_memory_tiny.csv", index=False)
        (tmp_path / cpu / "fast_memory_tiny.json").write_text(json.dumps({"machine": {"cpu": cpu, "threads": 1}}))
    both = rep.fast_memory_table(an.load_fast_memory(tmp_path))
    assert len(both) == 4 and set(both["cpu"]) == {"CPU A", "CPU B"}       # never pooled across machines
    table = rep.fast_memory_table(pd.DataFrame(rows))
    assert len(table) == 2 and set(table["docs"]) == {2} and set(table["questions"]) == {4}
    assert table["exact"].all() and (table["lo"] <= table["stall_ms"]).all() and (table["stall_ms"] <= table["hi"]).all()
    assert (table["fast_held"] < table["held"]).all() and table["fast_held"].is_monotonic_increasing
    rep.fast_memory_figure(table, tmp_path / "fm.png")
    assert (tmp_path / "fm.png").stat().st_size > 0
    fig = rep.fast_memory_figure(both)
    assert sum(ax.get_visible() for ax in fig.axes) == 2 and all("CPU" in ax.get_title() for ax in fig.axes)
