"""The paired-question study (studies.questions): transformers' dense cache answers as sparsekv's dense store does,
question by question; a press that removes nothing and a router that reads everything change no answer; every
method answers the same questions; the bytes of each family and the paired test behave as stated."""
import pytest

import sparsekv as sk
from sparsekv.analysis import peers, stats, tasks
from sparsekv.model import fetch
from sparsekv.model.checkpoint import converted_folder
from sparsekv.storage.store import StoreConfig
from sparsekv.studies import questions as qs

ROOT = fetch.__file__.rsplit("/sparsekv/", 1)[0]
SMOL = fetch.model_path(fetch.SMOLLM2, ROOT)


@pytest.fixture(scope="module")
def smol():
    if not SMOL.exists():
        pytest.skip("the real model is missing: run `make model`")
    model, tok = sk.load_model(SMOL), sk.load_tokenizer(SMOL)
    return model, tok, peers.hf_model(converted_folder(SMOL))


def test_every_method_answers_the_same_questions_and_nothing_removed_changes_no_answer(smol):
    model, tok, hf = smol
    doc = tasks.make("passkey", tok, 384, 6, seed=7)
    engine = sk.Engine(model, block_size=16, num_blocks=128, progress=False)
    lossless = [qs.Lossless("dense"), qs.Lossless("minmax@all", sk.Router("minmax", token_budget=1024), 1024),
                qs.Lossless("minmax@32", sk.Router("minmax", token_budget=32), 32)]
    ticks = []
    rows = qs.lossless_answers(engine, doc, lossless, progress=lambda: ticks.append(1))
    assert len(ticks) == len(doc.questions) and engine.store.num_free_blocks == 128     # every fork finished
    lossy = [peers.PeerMethod("hf dense", "dense"), peers.PeerMethod("SnapKV@0", "evict", "SnapKVPress", 0.0)]
    prow, held = qs.peer_answers(hf, doc, lossy)
    rows += prow
    by = {(r["method"], r["question"]): r for r in rows}
    n = len(doc.questions)
    assert {m for m, _ in by} == {"dense", "minmax@all", "minmax@32", "hf dense", "SnapKV@0"} and len(rows) == 5 * n
    for i in range(n):
        dense = by[("dense", i)]
        assert by[("minmax@all", i)]["correct"] == dense["correct"]            # a full budget is dense
        assert by[("hf dense", i)]["correct"] == dense["correct"]              # the two engines agree
        assert by[("SnapKV@0", i)]["correct"] == by[("hf dense", i)]["correct"]  # a press at ratio 0 is dense
        assert dense["depth"] == doc.facts[doc.questions[i].facts[0]].depth
    assert sum(by[("dense", i)]["correct"] for i in range(n)) >= n // 2    # the model retrieves at this length
    geom = dict(layers=model.config.n_layers, kv_heads=model.config.n_kv_heads, head_dim=64)
    for m in lossy:                      # what the float32 caches held after the prefill, against the byte model
        assert held[m.name] == qs.method_bytes(m, len(doc.ids), itemsize=4, residual=0, **geom)["held_bytes"]
    with pytest.raises(ValueError, match="rule"):
        qs.lossless_answers(engine, doc, lossless, rule="quest")


def test_bytes_per_family_against_bf16_dense():
    geom = dict(layers=30, kv_heads=3, head_dim=64, block_size=16)
    sc = StoreConfig(block_size=16, num_blocks=8, num_layers=30, num_kv_heads=3, head_dim=64)
    tokens = 2048
    dense = qs.method_bytes(qs.Lossless("dense"), tokens, store_config=sc, **geom)
    assert dense["read"] == 1.0 and dense["held"] >= 1.0                    # exact K/V, plus the block summaries
    routed = qs.method_bytes(qs.Lossless("minmax@256", sk.Router("minmax", token_budget=256), 256), tokens,
                             store_config=sc, **geom)
    assert routed["held"] == dense["held"] and 256 / tokens < routed["read"] < 2 * 256 / tokens
    press = qs.method_bytes(peers.PeerMethod("SnapKV@256", "evict", "SnapKVPress", 1 - 256 / tokens), tokens, **geom)
    assert press["read"] == press["held"] == 256 / tokens
    hqq = {b: qs.method_bytes(peers.PeerMethod(f"hqq{b}", "quant", bits=b), tokens, **geom) for b in (2, 4, 8)}
    for b, v in hqq.items():             # codes, a float16 scale and zero-point per 64 channels, 128 bf16 tokens
        assert v["read"] == v["held"]
        assert v["held"] == pytest.approx(((tokens - 128) * (b / 16 + 2 * 2 / 128) + 128) / tokens)


def test_cells_and_the_paired_test():
    rows = [{"task": "t", "length": 8, "doc": 0, "question": i, "method": m, "correct": c}
            for m, outs in (("a", [1, 1, 1, 0, 1, 1]), ("b", [0, 1, 0, 0, 0, 1])) for i, c in enumerate(outs)]
    cells = {c["method"]: c for c in qs.cells(rows)}
    assert (cells["a"]["n"], cells["a"]["k"]) == (6, 5) and (cells["a"]["lo"], cells["a"]["hi"]) == stats.wilson(5, 6)
    r = qs.paired(rows, "a", "b", task="t", length=8)
    assert r == {**stats.mcnemar([1, 1, 1, 0, 1, 1], [0, 1, 0, 0, 0, 1]), "acc_a": 5 / 6, "acc_b": 2 / 6}
    assert (r["a_only"], r["b_only"]) == (3, 0)
    with pytest.raises(ValueError, match="no common question"):
        qs.paired(rows, "a", "b", task="other")
