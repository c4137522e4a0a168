"""The live explorers (issue 19) without a browser: each compute function against the package's own
answer, each widget recomputing on a control change, and each explorer notebook headless under papermill."""
import numpy as np
import pytest
import torch
from conftest import REPO

import sparsekv as sk
from sparsekv.analysis import probes, sweeps
from sparsekv.model import fetch
from sparsekv.suite import explore, explorers

MODEL = REPO / "data/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.parametrize("scorer,budget,block,depth", [("minmax", 512, 64, 0.5), ("mean", 256, 32, 0.9),
                                                      ("recency", 1024, 128, 0.1)])
def test_routing_view_selects_what_router_select_selects(scorer, budget, block, depth):
    view = explore.routing_view(scorer, budget, block, strength=5.0, channels=4, depth=depth, length=4096, seed=3)
    cfg = probes.ProbeConfig(length=4096, num_kv_heads=2, gqa=4, head_dim=64, strength=5.0, channels=4, seed=3)
    probe = probes.needle(cfg, depth, block_size=block)
    store, seq = sweeps.probe_store(probe, block)
    want = sk.Router(scorer, token_budget=budget).select(probe.q, store, seq, 0).blocks
    assert torch.equal(view.blocks, want)
    assert view.selected.sum(1).tolist() == (want >= 0).sum(1).tolist()
    assert view.oracle.sum(1).tolist() == [int((want >= 0).sum(1).max())] * 2     # the oracle reads as many
    assert view.needle_blocks == probe.needle_blocks(block)
    assert 0 <= view.result.mass_recall <= 1 and view.mass.shape == view.selected.shape


def test_a_strong_needle_is_found_and_a_blind_window_misses_it():
    found = explore.routing_view("minmax", 512, 64, strength=12.0, channels=8, depth=0.5, length=8192)
    blind = explore.routing_view("recency", 512, 64, strength=12.0, channels=8, depth=0.5, length=8192)
    assert found.result.needle_recall == 1 and blind.result.needle_recall == 0


def test_prefix_view_finds_where_each_edit_breaks_the_chain():
    base = explore.agent_prompt()
    bs = 8
    same = explore.prefix_view(base, base, bs)
    full = same.num_tokens // bs
    cacheable = (same.num_tokens - 1) // bs                    # a hit always leaves one token to compute
    assert same.hit_tokens == cacheable * bs and same.explanation.first_miss_block is None
    spans = {name: (a, b) for name, a, b in same.spans}
    for edited, segment in ((explore.agent_prompt(timestamp_first=False), "timestamp"),
                            (explore.agent_prompt(tool_order="reversed"), "tool search_docs"),
                            (explore.agent_prompt(history_edit="assistant: I read the log; the failure is real."),
                             "history 1")):
        v = explore.prefix_view(base, edited, bs)
        diff = v.explanation.diff_token                        # the first token that differs is in this segment
        assert diff is not None and spans[segment][0] <= diff < spans[segment][1], segment
        assert v.hit_tokens == (diff // bs) * bs, segment      # every block before the edit hits, none after
        assert v.status[: diff // bs] == ["hit"] * (diff // bs) and "hit" not in v.status[diff // bs:]
        assert v.recomputed_tokens == v.num_tokens - v.hit_tokens
    assert len(same.status) == full + (same.num_tokens % bs > 0)
    with pytest.raises(ValueError, match="tool_order"):
        explore.agent_prompt(tool_order="random")


def test_widgets_recompute_on_a_control_change(tmp_path):
    ex = explorers.routing_explorer(length=4096, save=tmp_path / "r.png")
    assert ex.renders == 1 and (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    before = ex.readout.value
    ex.controls["scorer"].value = "recency"
    assert ex.renders == 2 and ex.view.scorer == "recency" and ex.readout.value != before
    px = explorers.prefix_cache_explorer(8, save=tmp_path / "p.png")
    hits = px.view.hit_tokens
    px.controls["tools"].value = "reversed"
    assert px.view.hit_tokens < hits and not px.errors


EXAMPLE_SWEEP = REPO / "sweeps" / "examples" / "01_budget_by_block"


def test_the_sweep_explorer_draws_what_the_sweep_s_table_holds(tmp_path):
    """The committed example sweep (the README's grid over notebook 01): the explorer's view is `summarize` of the
    folder's table, follows its controls, and refuses a folder with no sweep and a metric the sweep lacks."""
    from sparsekv.suite import sweep
    df = sweep.load(EXAMPLE_SWEEP)
    ex = explorers.sweep_explorer(EXAMPLE_SWEEP, "mean.mass_recall@65536", "token_budget", "block_size",
                                  save=tmp_path / "s.png")
    assert ex.renders == 1 and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG" and not ex.errors
    want = sweep.summarize(df, "mean.mass_recall@65536", "token_budget", "block_size")
    assert ex.view.equals(want) and int(want["n"].sum()) == 6
    assert want.groupby("block_size")["mean"].is_monotonic_increasing.all()      # a larger budget reads more mass
    ex.controls["x"].value = "block_size"             # by == x: one line
    assert ex.renders == 2 and list(ex.view.columns[:1]) == ["block_size"] and not ex.errors
    ex.controls["metric"].value = "minmax.mass_recall@65536"
    assert ex.renders == 3 and ex.view.equals(sweep.summarize(df, "minmax.mass_recall@65536", "block_size"))
    with pytest.raises(FileNotFoundError, match="no cells"):
        explorers.sweep_explorer(tmp_path)
    with pytest.raises(ValueError, match="metric must be one of"):
        explorers.sweep_explorer(EXAMPLE_SWEEP, "nope")


@pytest.fixture(scope="module")
def real():
    if not MODEL.exists():
        pytest.skip("the real model is missing: run `make model`")
    return sk.load_model(MODEL), sk.load_tokenizer(MODEL)


def test_router_reads_session_on_the_real_model(real):
    model, tok = real
    doc = explore.facts_document(tok, 256)
    engine = sk.Engine(model, block_size=16, num_blocks=64, record_selections=True, progress=False)
    session = explore.ReadsSession(engine, tok, doc, answer_tokens=3)
    routers = {"minmax": sk.Router("minmax", token_budget=64), "recency": sk.Router("recency", token_budget=64)}
    v = session.view("What is the pass key?", routers, layer=None)
    nb = len(v.block_texts)
    assert set(v.answers) == {"dense", "minmax", "recency"} and all(isinstance(a, str) for a in v.answers.values())
    assert np.array_equal(v.weights["dense"], np.ones(nb))
    for name in routers:
        w = v.weights[name]
        assert w.shape == (nb,) and 0 <= w.min() and w.max() <= 1 and 0 < (w > 0).sum() < nb
    rec = v.weights["recency"]
    assert rec[-1] == 1 and rec[nb // 2] == 0          # the window reads the end, never the middle
    one = session.view("What is the pass key?", routers, layer=3)
    assert one.answers == v.answers                     # the same decode; only the shading's layer differs
    assert set(np.unique(one.weights["minmax"])) <= {0.0, 1 / 3, 2 / 3, 1.0}   # 3 kv heads at one layer
    with pytest.raises(ValueError, match="question"):
        session.view("  ", routers)


GEMMA = fetch.model_path(fetch.GEMMA3_270M, REPO)


@pytest.mark.skipif(not GEMMA.exists(), reason=f"{GEMMA} is absent: run `make model`")
def test_router_reads_session_on_gemma_shades_its_global_layers_only():
    """Gemma 3 270M (a base model: completion-style prompt) over a document longer than two of its windows: each
    router's shading comes from the 3 global layers, and a sliding layer is refused by name."""
    model, tok = sk.load_model(GEMMA), sk.load_tokenizer(GEMMA)
    doc = explore.facts_document(tok, 1100)
    engine = sk.Engine(model, block_size=16, num_blocks=256, record_selections=True, progress=False)
    session = explore.ReadsSession(engine, tok, doc, answer_tokens=3)
    assert session.doc[0] == tok.bos_token_id
    routers = {"minmax": sk.Router("minmax", token_budget=128)}
    v = session.view("What is the door code?", routers)
    one = session.view("What is the door code?", routers, layer=5)
    nb = len(v.block_texts)
    assert v.weights["minmax"].shape == (nb,) and 0 < (v.weights["minmax"] > 0).sum() < nb
    assert set(np.unique(one.weights["minmax"])) <= {0.0, 1.0}          # one kv head at one global layer
    with pytest.raises(ValueError, match="sliding-window layer"):
        session.view("What is the door code?", routers, layer=0)


EXPLORER_NOTEBOOKS = sorted((REPO / "notebooks" / "explorers").glob("*.ipynb"))


@pytest.mark.notebook
@pytest.mark.parametrize("path", EXPLORER_NOTEBOOKS, ids=[p.stem for p in EXPLORER_NOTEBOOKS])
def test_explorer_notebooks_run_headless_and_save_their_static_render(path, tmp_path):
    import papermill as pm

    from sparsekv.suite.runner import kernel_name
    out = tmp_path / "saved"
    pm.execute_notebook(str(path), str(tmp_path / path.name), parameters={"save_dir": str(out)},
                        kernel_name=kernel_name(), cwd=str(path.parent), progress_bar=False)
    saved = list(out.iterdir())
    assert len(saved) == 1 and saved[0].stat().st_size > 1000, saved
