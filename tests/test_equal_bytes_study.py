"""The equal-bytes study (notebook 24, issue 55): methods as values, the design fixed before the run, the claim that
a router's store needs only its scorer's summaries, and the analysis (headline rule, clustered intervals, one Holm
family over the pre-listed contrasts) on synthetic rows whose truth is known."""
import numpy as np
import pandas as pd
import pytest
import torch

import sparsekv as sk
from sparsekv import methods as mt
from sparsekv.analysis import clustered
from sparsekv.studies.equal_bytes import analysis as an
from sparsekv.studies.equal_bytes import design as dz
from sparsekv.studies.equal_bytes import run as rn

# -- methods --------------------------------------------------------------------------------------

def test_a_method_s_line_knob_and_name_come_from_its_fields():
    m = mt.Method("router", "sparsekv", "mean", 8, 4, 0.125, rule="routed")
    assert (m.line, m.knob, m.name) == ("int4 mean/8, routed question", 0.125, "int4 mean/8, routed question@0.125")
    assert mt.Method("press", "transformers", press="SnapKVPress", share=0.25, question_aware=True).name == \
        "SnapKV, question-aware@0.25"
    assert mt.Method("quant", "transformers", bits=4).name == "HQQ4"
    assert [m.line for m in (mt.Method("dense", "sparsekv"), mt.Method("dense", "sparsekv", kv_bits=8),
                             mt.Method("dense", "transformers"))] == ["dense", "int8 dense", "transformers dense"]
    assert [m.name for m in mt.routers(["halves", "mean/8"], [0.5], block_sizes=(16, 32))] == \
        ["halves/16@0.5", "halves/32@0.5", "mean/8@0.5"]


@pytest.mark.parametrize("kw,words", [
    (dict(family="evict", engine="sparsekv"), "family must be one of"),
    (dict(family="router", engine="sparsekv", scorer="halves", share=0), r"share in \(0, 1\]"),
    (dict(family="router", engine="transformers", scorer="halves", share=0.5), "runs on sparsekv"),
    (dict(family="press", engine="transformers", press="SnapKVPress", share=0.5, rule="routed"), "'routed' only"),
    (dict(family="quant", engine="transformers", bits=3), r"bits in \(2, 4, 8\)"),
    (dict(family="dense", engine="transformers", kv_bits=8), "sparsekv's store only"),
    (dict(family="dense", engine="sparsekv", share=0.5), "share must be None"),
    (dict(family="press", engine="transformers", press="SnapKV", share=0.5), "ending in 'Press'"),
    (dict(family="press", engine="transformers", press="snapKVPress", share=0.5), "capitalised"),
    (dict(family="router", engine="sparsekv", scorer="mean/8", share=0.5), "scorer must be"),
])
def test_a_bad_method_is_refused_naming_the_field(kw, words):
    with pytest.raises(ValueError, match=words):
        mt.Method(**kw)


def test_a_name_parses_back_to_its_method_and_nothing_else_parses():
    """`methods.parse` is the exact inverse of `Method.name` over every method a design runs (fresh knobs, the
    parametrised scorers' names, a registered press's), and refuses what no method is named."""
    import itertools
    rng = np.random.default_rng()
    shares = tuple(float(x) for x in rng.uniform(1e-3, 1, 3)) + (1.0, 0.015625)
    everything = dz.Design().methods() + dz.Design(shares=shares, block_size=int(rng.integers(1, 99))).methods()
    everything += mt.routers(["hminmax-g64-k4", "mean/8"], shares, (16, 7), (0, 8, 4), ("dense", "routed"))
    everything += mt.presses(["KeepRecentPress", "SnapKVPress"], shares, question_aware=True)
    everything += [mt.Method("dense", "sparsekv", kv_bits=4)] + mt.quantisers((2, 4, 8))
    for m in everything:
        assert mt.parse(m.name) == m, m.name
    assert len({m.name for m in everything}) == len(set(everything))      # a name names one method
    for bad in ("halves/16@0.1250", "halves/16", "halves@0.125", "halves/x@0.125", "int2 halves/16@0.125",
                "halves/16, routed@0.125", "SnapKV, aware@0.125", "SnapKV@1.5", "HQQ3", "HQQ", "fp8 dense", "",
                "halves/16@nan", "halves/16@"):
        with pytest.raises(ValueError, match="name must be a method's name"):
            mt.parse(bad)
    with pytest.raises(TypeError, match="name must be a str"):
        mt.parse(0.125)
    for a, b in itertools.combinations(("dense", "int8 dense", "transformers dense", "HQQ4"), 2):
        assert mt.parse(a) != mt.parse(b)


def test_the_figures_style_a_method_by_its_fields():
    """Curves are styled from the parsed Method: a router by its scorer (a circle at 16-token blocks, hollow over
    int codes, dashed when the question is routed), a press by its own marker, HQQ and dense apart."""
    from sparsekv.studies.equal_bytes import report as rep
    from sparsekv.suite import viz
    st = {n: rep.style(mt.parse(n)) for n in ("halves/16@0.125", "mean/8@0.125", "int4 halves/16@0.125",
                                              "halves/16, routed question@0.125", "SnapKV@0.125",
                                              "SnapKV, question-aware@0.125", "HQQ4", "dense")}
    assert st["halves/16@0.125"]["color"] == viz.ROUTER_COLORS["halves"] != st["mean/8@0.125"]["color"]
    assert (st["halves/16@0.125"]["marker"], st["mean/8@0.125"]["marker"]) == ("o", "s")
    assert st["int4 halves/16@0.125"]["markerfacecolor"] == "white"
    assert st["halves/16, routed question@0.125"]["linestyle"] == "--"
    assert st["SnapKV, question-aware@0.125"]["linestyle"] == ":" != st["SnapKV@0.125"]["linestyle"]
    assert len({st[n]["color"] for n in ("halves/16@0.125", "SnapKV@0.125", "HQQ4", "dense")}) == 4
    with pytest.raises(TypeError, match="method must be a methods.Method"):
        rep.style("halves/16@0.125")
    with pytest.raises(ValueError, match="name must be a method's name"):
        rep.named(["halves@256"])
    ms = [mt.parse(n) for n in ("dense", "halves/16@0.125", "halves/16@0.25", "halves/16, routed question@0.125",
                                "int4 halves/16@0.125", "mean/16@0.125", "SnapKV@0.125", "HQQ4")]
    assert [m.line for m in rep._panel_lines(ms, "routers")] == ["dense", "halves/16",
                                                                   "halves/16, routed question", "mean/16"]
    assert [m.line for m in rep._panel_lines(ms, "peers")] == ["dense", "HQQ", "SnapKV", "halves/16",
                                                                 "int4 halves/16"]


# -- the design -----------------------------------------------------------------------------------

def test_the_design_lists_every_family_and_the_pilot_only_dense():
    d = dz.Design()
    names = [m.name for m in d.methods()]
    assert len(names) == len(set(names)) and names[0] == "dense"
    assert {"int8 dense", "int4 dense", "transformers dense", "HQQ2", "HQQ8", "oracle/16@0.25",
            "halves/16, routed question@0.015625", "int4 halves/16@0.125", "SnapKV, question-aware@0.125"} <= set(names)
    assert [m.name for m in dz.pilot().methods()] == ["dense"]
    with pytest.raises(ValueError, match="include the headline rule"):
        dz.Design(rules=["routed"])
    with pytest.raises(TypeError, match="scorers must be a list"):
        dz.Design(scorers="halves")


def test_the_contrasts_depend_on_the_byte_model_never_on_outcomes():
    """Matched bytes pick the router point nearest the peer on the byte model; the list is the same for any
    outcomes, and a method the design lacks drops its contrast."""
    d = dz.Design(shares=(0.0625, 0.125, 0.25))
    nbytes = {m.name: {"read": 0.0, "held": 1.0} for m in d.methods()}
    for s, r in ((0.0625, 0.10), (0.125, 0.17), (0.25, 0.31)):
        nbytes[f"halves/16@{s:g}"] = {"read": r, "held": 1.06}
        nbytes[f"int4 halves/16@{s:g}"] = {"read": r / 3, "held": 0.33 + s / 100}
    nbytes["HQQ4"] = {"read": 0.29, "held": 0.29}
    cs = {c.name.split(": ", 1)[1]: c for c in dz.contrasts("cell", nbytes, d)}
    assert len(cs) == 8 and cs["halves@0.125 no worse than dense"].kind == "non-inferiority"
    assert cs["halves@0.125 no worse than dense"].margin == dz.MARGIN
    assert cs["halves vs HQQ-4 at matched bytes read"].method_a == "halves/16@0.25"        # 0.31 is nearest 0.29
    assert cs["int4 halves vs HQQ-4 at matched bytes held"].method_a == "int4 halves/16@0.0625"
    del nbytes["SnapKV, question-aware@0.125"]
    assert len(dz.contrasts("cell", nbytes, d)) == 7


# -- a router's store needs only its scorer's summaries ------------------------------------------------

@pytest.mark.parametrize("scorer", ["halves", "mean", "minmax"])
def test_a_store_holding_only_its_scorer_s_summaries_routes_the_same(scorer):
    """The study charges a router's store for its scorer's summaries alone (`run.method_bytes`) while its engine
    keeps the defaults too: the router must choose the same blocks from either store (it reads nothing else), on
    fresh random K/V of an odd length and fresh queries, at every layer; and a real decode on the tiny model gives the
    same tokens, its logits equal to float rounding (the decode step may take another kernel path when the store's
    summaries differ, `model.fused.why_not`)."""
    from sparsekv.routing.scorers import SCORERS, summaries_for
    g = torch.Generator().manual_seed(7)
    k, v = torch.randn(3, 203, 2, 32, generator=g), torch.randn(3, 203, 2, 32, generator=g)
    picks = []
    for summaries in (summaries_for(scorer), SCORERS[scorer].reads):
        store = sk.BlockStore(sk.StoreConfig(num_layers=3, num_kv_heads=2, head_dim=32, block_size=8, num_blocks=64,
                                             summaries=summaries))
        seq = store.new_sequence()
        store.append(seq, k, v)
        q = torch.randn(6, 32, generator=torch.Generator().manual_seed(11))
        picks.append([sk.Router(scorer, token_budget=48).select(q, store, seq, layer=layer).blocks
                      for layer in range(3)])
    assert all(torch.equal(a, b) for a, b in zip(*picks))
    m = sk.Model(sk.ModelConfig.from_name("tiny"))
    ids = torch.randint(0, 256, (131,), generator=torch.Generator().manual_seed(5)).tolist()
    out = []
    for summaries in (summaries_for(scorer), SCORERS[scorer].reads):
        eng = sk.Engine(m, block_size=8, num_blocks=64, progress=False, summaries=summaries)
        s = eng.new_sequence()
        eng.prefill(s, ids)
        logits = []
        for _ in range(6):
            eng.decode(s, 1, router=sk.Router(scorer, token_budget=24))
            logits.append(eng.last_logits(s).clone())
        out.append((eng.tokens(s), torch.stack(logits)))
    assert out[0][0] == out[1][0] and torch.allclose(out[0][1], out[1][1], rtol=1e-5, atol=1e-5)


# -- cells -------------------------------------------------------------------------------------------

def test_cells_have_disjoint_seeds_and_refuse_bad_fields():
    a = rn.Cell("smollm2", 2048, "passkey", "study", 0, 30)
    b = rn.Cell("smollm2", 2048, "passkey", "pilot", 0, 30)
    c = rn.Cell("smollm2", 2048, "fact-code", "study", 0, 30)
    assert not set(a.seeds()) & set(b.seeds()) and not set(a.seeds()) & set(c.seeds())
    assert min(a.seeds() + b.seeds()) >= 10_000                    # earlier notebooks' seeds are below this
    for kw, words in ((dict(model="llama"), "model must be one of"), (dict(questions=5), "questions must be"),
                      (dict(split="test"), "split must be one of"), (dict(doc0=990, docs=20), "doc0 \\+ docs")):
        with pytest.raises(ValueError, match=words):
            rn.Cell(**{"model": "smollm2", "length": 2048, "task": "passkey", **kw})
    # dialogue tasks: their own seed blocks after every task's, which keep theirs; two or four dialogues a document
    assert a.seeds()[0] == rn.SPLITS["study"] and c.seeds()[0] == rn.SPLITS["study"] + 1000 * 2
    cells = [rn.Cell("smollm2", 2048, t, sp, 0, 1000) for t in rn.CELL_TASKS for sp in rn.SPLITS]
    every = [s for cl in cells for s in cl.seeds()]
    assert len(every) == len(set(every))
    d = rn.Cell("smollm2", 2048, "two-turn-fact-code", questions=4)
    assert (d.turns, d.base_task, a.turns, a.base_task) == (2, "fact-code", 1, "passkey")
    for kw, words in ((dict(questions=3), "questions must be 2 or 4"), (dict(task="two-turn-variable"), "task must be")):
        with pytest.raises(ValueError, match=words):
            rn.Cell(**{"model": "smollm2", "length": 2048, "task": "two-turn-fact-code", **kw})


def test_a_dialogue_cell_asks_each_question_second_and_both_engines_hold_the_first_turn():
    """Every question of a "two-turn-" cell is the second turn of a dialogue on its document (`tasks.two_turn`): the
    first question and its true answer come before it, half the dialogues ask the later fact first. The rows' dense
    answers (sparsekv's and transformers') equal one float64-free reference: transformers' forward over the whole
    dialogue in one pass, scored by argmax, computed here and not by the study's code."""
    from sparsekv.model import fetch
    root = fetch.__file__.rsplit("/sparsekv/", 1)[0]
    path = fetch.model_path(fetch.SMOLLM2, root)
    if not path.exists():
        pytest.skip("the real model is missing: run `make model`")
    cell = rn.Cell("smollm2", 384, "two-turn-fact-prose", "study", 0, 1, 2)
    tok = sk.load_tokenizer(str(path))
    (doc,) = rn.documents(cell, tok)
    assert len(doc.questions) == 2 and doc.seed == cell.seeds()[0]
    firsts = set()
    for q in doc.questions:
        f = q.first
        assert f is not None and f.facts != q.facts
        assert q.ids[:len(f.ids)] == f.ids and q.ids[len(f.ids):len(f.ids) + len(f.answer)] == f.answer
        firsts.add(doc.facts[f.facts[0]].depth > doc.facts[q.facts[0]].depth)
    assert firsts == {False, True}                              # one dialogue each way round
    design = dz.Design(scorers=("halves",), shares=(0.25,), rules=("dense",), int_scorers=(), int_bits=(),
                       presses=("StreamingLLMPress",), press_shares=(0.25,), aware_presses=(), aware_shares=(),
                       hqq_bits=())
    lm = rn.load(cell.model, cell.length, design.methods(), root)
    rows = pd.DataFrame(rn.run_cell(cell, design.methods(), loaded=lm))
    assert set(rows["task"]) == {"two-turn-fact-prose"} and len(rows) == 2 * len(design.methods())
    hf = lm.hf
    for i, q in enumerate(doc.questions):
        ids = doc.ids + q.ids + q.answer[:-1]
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([ids])).logits[0, len(doc.ids) + len(q.ids) - 1:]
        ref = logits.argmax(-1).tolist() == q.answer
        mine = rows[rows["question"] == i].set_index("method")["correct"]
        assert mine["dense"] == ref and mine["transformers dense"] == ref, (i, ref, mine.to_dict())


# -- the analysis ---------------------------------------------------------------------------------------

def synthetic_rows(n_docs=34, q=4, seed=0, split="study", acc=None):
    """Rows of one (model, length, task) cell: per-document difficulty shared by every method (the clustering),
    each method's own accuracy shift."""
    rng = np.random.default_rng(seed)
    d = dz.Design(shares=(0.125, 0.25))
    acc = acc or {}
    rows = []
    for doc in range(n_docs):
        ease = rng.normal(0, 1.0)
        for qi in range(q):
            u = rng.random()
            for m in d.methods():
                p = 1 / (1 + np.exp(-(ease + acc.get(m.name, 1.0))))
                rows.append({"model": "M", "length": 2048, "task": "passkey", "split": split, "doc": 1000 + doc,
                             "question": qi, "method": m.name, "line": m.line, "family": m.family,
                             "engine": m.engine, "knob": m.knob, "rule": m.rule, "kv_bits": m.kv_bits,
                             "block_size": m.block_size, "correct": bool(u < p), "answer_steps": 3, "top1": 1.0,
                             "kl": 0.0, "read": m.knob or 1.0, "held": 1.0, "read_bytes": 1, "held_bytes": 1})
    return pd.DataFrame(rows)


def test_the_headline_rule_reads_the_pilot_only():
    pilot = pd.concat([synthetic_rows(8, split="pilot", acc={"dense": 3.0}),
                       synthetic_rows(8, split="pilot", acc={"dense": -3.0}).assign(task="variable")])
    h = an.dense_cells(pilot).set_index("task")
    assert bool(h.loc["passkey", "headline"]) and not bool(h.loc["variable", "headline"])
    assert h.loc["passkey", "docs"] == 8 and h.loc["passkey", "lo"] <= h.loc["passkey", "dense"] <= h.loc["passkey", "hi"]


def test_the_contrast_table_is_one_holm_family_over_documents():
    rows = synthetic_rows(34)
    headline = pd.DataFrame([{"model": "M", "length": 2048, "task": "passkey", "docs": 8, "questions": 32,
                              "dense": 0.7, "lo": 0.5, "hi": 0.9, "headline": True}])
    table = an.contrast_table(rows, headline, dz.Design(shares=(0.125, 0.25)))
    assert table is not None and len(table) == 8
    from statsmodels.stats.multitest import multipletests
    raw = [r.p_raw for r in table]
    assert np.allclose([r.p_adj for r in table], multipletests(raw, method="holm")[1])
    r = table["M 2k passkey: halves@0.125 no worse than dense"]
    g = rows[rows["method"].isin(["halves/16@0.125", "dense"])].pivot_table(index=["doc", "question"],
                                                                             columns="method", values="correct")
    diff = g["halves/16@0.125"].astype(float) - g["dense"].astype(float)
    assert r.estimate == pytest.approx(diff.mean())
    ni = clustered.noninferiority(g["halves/16@0.125"].astype(float).to_numpy(), g["dense"].astype(float).to_numpy(),
                                  np.array([d for d, _ in g.index]), dz.MARGIN)
    assert r.p_raw == pytest.approx(ni.p)


def test_contrasts_wait_for_thirty_documents_and_say_what_is_owed():
    rows = synthetic_rows(12)
    headline = pd.DataFrame([{"model": "M", "length": 2048, "task": "passkey", "docs": 8, "questions": 32,
                              "dense": 0.7, "lo": 0.5, "hi": 0.9, "headline": True}])
    d = dz.Design(shares=(0.125, 0.25))
    assert an.contrast_table(rows, headline, d) is None
    owed = an.owed(rows, headline, d)
    assert len(owed) == 8 and set(owed["documents"]) == {12} and set(owed["needed"]) == {an.MIN_DOCS}
    assert an.contrast_table(rows, headline.assign(headline=False), d) is None    # not a headline cell: never tested


def test_curves_give_document_level_intervals_and_rows_load_once(tmp_path):
    rows = synthetic_rows(10)
    for i, part in enumerate((rows, rows.iloc[: len(rows) // 2])):              # a cell written twice
        (tmp_path / f"c{i}").mkdir()
        part.to_csv(tmp_path / f"c{i}" / "x.rows.csv", index=False)
    back = an.load_rows(tmp_path)
    assert len(back) == len(rows)
    cv = an.curves(back).set_index("method")
    acc = clustered.accuracy(rows[rows["method"] == "dense"]["correct"].astype(float).to_numpy(),
                             rows[rows["method"] == "dense"]["doc"].to_numpy())
    assert cv.loc["dense", "docs"] == 10 and cv.loc["dense", "accuracy"] == pytest.approx(acc.estimate)
    assert (cv.loc["dense", "lo"], cv.loc["dense", "hi"]) == pytest.approx((acc.lo, acc.hi))


def _cell(folder, status: str, seconds: float, threads: int, rows=None):
    import json
    folder.mkdir(parents=True)
    (folder / "status.json").write_text(json.dumps({"status": status, "seconds": seconds, "threads": threads,
                                                    "notebook": "24_equal_bytes.ipynb", "version": "v"}))
    if rows is not None:
        rows.to_csv(folder / "24_equal_bytes.rows.csv", index=False)


def test_compute_sums_each_finished_cell_once_by_its_rows_keys(tmp_path):
    """A cell's cost is its wall time x its threads; failed cells and the scratch folders of cells in flight are
    not counted; nested sweep folders are; the keys come from the rows; the pilot's tasks fold into one row."""
    import json

    from sparsekv.suite import sweep
    rows = synthetic_rows(4)
    _cell(tmp_path / "study" / "cells" / "a", "ok", 600.0, 2, rows[rows["doc"] < 1002])
    _cell(tmp_path / "study" / "cells" / "b", "error", 900.0, 1, rows)              # ran again: not counted
    _cell(tmp_path / "study" / "cells" / ".a.k.1.2", "ok", 900.0, 1, rows)          # in flight: not counted
    _cell(tmp_path / "study" / "sub" / "cells" / "c", "ok", 300.0, 1, rows[rows["doc"] >= 1002])
    for i, task in enumerate(("passkey", "variable")):
        _cell(tmp_path / "pilot" / "cells" / f"p{i}", "ok", 60.0, 1,
              synthetic_rows(2, split="pilot").assign(task=task))
    fm = tmp_path / "fm"
    fm.mkdir()
    (fm / "fast_memory_m.json").write_text(json.dumps({"seconds": 90.0, "machine": {"threads": 2}}))
    rows[rows["doc"] == 1000][an.KEYS + ["doc"]].to_csv(fm / "fast_memory_m.csv", index=False)

    assert sorted(sweep.compute(tmp_path / "study")["core_seconds"]) == [300.0, 1200.0]
    got = an.compute(tmp_path / "study", tmp_path / "pilot", fast_memory=fm).set_index("split")
    assert got.loc["study", "cells"] == 2 and got.loc["study", "docs"] == 4
    assert got.loc["study", "core_hours"] == pytest.approx(1500 / 3600)
    assert got.loc["study", "core_min_per_doc"] == pytest.approx(1500 / 60 / 4)
    assert got.loc["pilot", "task"] == "every pilot task (2)" and got.loc["pilot", "cells"] == 2
    assert got.loc["fast memory", "core_hours"] == pytest.approx(180 / 3600) and got.loc["fast memory", "docs"] == 1
    assert got.loc["all", "core_hours"] == pytest.approx((1500 + 120 + 180) / 3600)
    assert np.isnan(got.loc["all", "core_min_per_doc"])
    assert an.compute(tmp_path / "none").empty


def test_the_committed_compute_covers_every_document_the_rows_hold():
    """Every document of the committed study rows was run by exactly one finished cell: a cell run twice, or rows
    without a status, would make the compute table disagree with the rows."""
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    study = repo / "results" / "equal_bytes" / "study"
    rows = an.load_rows(study)
    if rows.empty:
        pytest.skip("no committed results of the equal-bytes study")
    cost = an.compute(study)
    cost = cost[cost["split"] == "study"].set_index(an.KEYS)["docs"]
    docs = rows.groupby(an.KEYS)["doc"].nunique()
    assert cost.sort_index().to_dict() == docs.sort_index().to_dict()


@pytest.mark.notebook
def test_the_course_run_reads_the_committed_results_without_running_a_cell(tmp_path):
    """`make notebooks` runs notebook 24 at its defaults: no cell is run (run = False), every committed cell is read,
    the pilot decides the headline cells, and the curves are drawn, within the issue's 5 minutes (here seconds)."""
    import json
    import time
    from pathlib import Path

    from sparsekv.suite.notebook import run_notebook
    repo = Path(__file__).resolve().parents[1]
    pilot = an.load_rows(repo / "results" / "equal_bytes" / "pilot")
    study = an.load_rows(repo / "results" / "equal_bytes" / "study")
    if pilot.empty or study.empty:
        pytest.skip("no committed results of the equal-bytes study")
    t = time.perf_counter()
    run = run_notebook(repo / "notebooks" / "24_equal_bytes.ipynb", tmp_path, tmp_path / "figures",
                       {"gate_timing": False, "progress": False}, timeout=300)
    assert run.status == "ok", run.error
    assert time.perf_counter() - t < 300
    metrics = json.loads(run.metrics_path.read_text())["metrics"]
    assert not any(k.startswith("acc.") for k in metrics)            # nothing was run
    assert metrics["headline_cells"] == int(an.dense_cells(pilot)["headline"].sum())
    drawn = {p.name for p in (tmp_path / "figures").glob("24_curves_*.png")}
    assert len(drawn) == study.groupby(an.KEYS).ngroups


def test_matched_bytes_ties_go_to_the_smaller_share_in_any_order():
    """int4 blocks hold the same bytes at every share, so the held match is a tie among them: the declared rule
    (the smaller share) decides it, never the order the methods arrive in (a set's order moved with the hash seed
    and changed which point faced HQQ-4 from one run to the next)."""
    import itertools

    from sparsekv.studies.equal_bytes import design as dz
    int4 = {m: 0.328 for m in mt.routers(["halves"], [0.25, 0.0625, 0.125], kv_bits=(4,))}
    for order in itertools.permutations(int4):
        assert dz._nearest({m: int4[m] for m in order}, 0.33) == "int4 halves/16@0.0625"
    exact = dict(zip(mt.routers(["halves"], [0.25, 0.125]), (0.31, 0.19)))
    assert dz._nearest(exact, 0.33) == "halves/16@0.25" and dz._nearest({}, 0.33) is None


def test_the_best_of_a_kind_is_the_top_score_with_ties_to_the_last_name():
    from sparsekv.methods import best
    assert best({"minmax@64": 0.5, "halves@64": 0.75, "mean@64": 0.75}) == "mean@64"
    assert best({"SnapKV@64": 2.25, "Knorm@64": 2.0, "TOVA@64": 2.0}, higher=False) == "TOVA@64"
    assert best({"hqq4": 0.1}, higher=False) == "hqq4"
    with pytest.raises(ValueError, match="scores must hold at least one method"):
        best({})
