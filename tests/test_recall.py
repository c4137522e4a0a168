"""Recall tasks, training, end-to-end routed evaluation, and the transformers integration."""
import json
from pathlib import Path

import pytest
import torch

import sparsekv as sk
from sparsekv.recall import evaluation as recall_eval
from sparsekv.recall import tasks
from sparsekv.recall.train import TrainConfig, load_trained, train

MODELS = Path(sk.__file__).resolve().parents[1] / "data" / "models"


@pytest.mark.parametrize("task", tasks.TASKS)
def test_tasks_are_seeded_and_score_the_answers(task):
    a, b = tasks.make_batch(task, 4, 160, seed=3), tasks.make_batch(task, 4, 160, seed=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    mask = a.targets != -100
    assert mask.any(1).all()
    pos = mask.nonzero()
    assert torch.equal(a.tokens[pos[:, 0], pos[:, 1] + 1], a.targets[mask])    # the answer is the next token
    assert (pos[:, 1] >= a.first_query[pos[:, 0]]).all()


def _follow_chain(tokens, ctx, name):
    """Follow `name -> next token` statements in tokens[:ctx]: (hops, value, statement positions)."""
    where = []
    while tasks.KEYS[0] <= name < tasks.KEYS[1]:
        at = (tokens[:ctx - 1:2] == name).nonzero().flatten() * 2      # statements start at even positions
        assert len(at) == 1, "each name is defined exactly once"
        where.append(int(at[0]))
        name = int(tokens[at[0] + 1])
    return len(where), name, where


@pytest.mark.parametrize("hops,min_hops,shuffled", [(2, 2, False), (3, 3, False), (2, 1, False), (3, 1, False),
                                                    (2, 2, True), (3, 1, True)])
def test_multihop_answers_need_every_link_of_their_chain(hops, min_hops, shuffled):
    b = tasks.make_batch("multihop", 16, 200, seed=5, hops=hops, min_hops=min_hops, chains=4, n_queries=4,
                         shuffled=shuffled)
    seen, in_order = set(), []
    for row in range(16):
        ctx = int(b.first_query[row])
        for q in (b.targets[row] != -100).nonzero().flatten().tolist():
            n, value, where = _follow_chain(b.tokens[row], ctx, int(b.tokens[row, q]))
            assert value == int(b.targets[row, q]) and min_hops <= n <= hops
            seen.add(n)
            if n > 1:           # followed from the query back: variable tracking writes sources first
                in_order.append(where == sorted(where, reverse=True))
    assert seen == set(range(min_hops, hops + 1))                  # a mix really mixes
    assert all(in_order) if not shuffled else not all(in_order)
    with pytest.raises(ValueError, match="min_hops"):
        tasks.make_batch("multihop", 1, 64, seed=0, hops=2, min_hops=3)


def test_stages_come_first_and_validate_on_their_own_task():
    cfg = TrainConfig(task="multihop", lengths=(64, 128), task_kwargs={"hops": 2, "chains": 4},
                      stages=({"hops": 1}, {"min_hops": 1}), eval_kwargs={"min_hops": 2})
    plan = cfg.curriculum()
    assert [p[0] for p in plan] == [64, 64, 128]
    assert plan[0][1] == plan[0][2] == {"hops": 1, "chains": 4}
    assert plan[1][1] == {"hops": 2, "chains": 4, "min_hops": 1} and plan[1][2] == cfg.validation_kwargs
    assert cfg.validation_kwargs == {"hops": 2, "chains": 4, "min_hops": 2}
    assert TrainConfig.from_log(json.loads(json.dumps(vars(cfg)))) == cfg
    assert [p[0] for p in TrainConfig(lengths=(64, 128)).curriculum()] == [64, 128]


def test_evaluation_sets_never_overlap_training_data():
    cfg = TrainConfig(task="niah", lengths=(128, 256))
    train_seeds = {(cfg.seed * 100_003 + step) % tasks.EVAL_SEED_OFFSET for step in range(cfg.max_steps)}
    eval_seeds = {tasks.EVAL_SEED_OFFSET + 7919 * L + i for L in (128, 256, 4096) for i in range(100)}
    assert not train_seeds & eval_seeds                            # disjoint seed streams
    seen = {tuple(t.tolist()) for step in range(40) for t in tasks.make_batch("niah", 8, 128, seed=step).tokens}
    ev = {tuple(t.tolist()) for i in range(5) for t in tasks.eval_batch("niah", 8, 128, index=i).tokens}
    assert not seen & ev                                           # and no identical sequence


@pytest.mark.parametrize("preset", ["recall", "recall-linear", "recall-hops"])
def test_training_forward_equals_the_store_backed_engine(preset):
    model = sk.Model(sk.ModelConfig.from_name(preset))
    toks = tasks.make_batch("mqar", 1, 90, seed=1).tokens
    with torch.no_grad():
        ref = model.train_forward(toks)[0]
    engine = sk.Engine(model, block_size=8, num_blocks=32, chunk_size=16)
    seq = engine.new_sequence()
    engine.prefill(seq, toks[0, :60])
    fed = engine.feed(seq, toks[0, 60:])
    torch.testing.assert_close(fed, ref[60:], rtol=1e-5, atol=1e-5)


def test_a_short_training_run_saves_and_reloads(tmp_path):
    cfg = TrainConfig(task="mqar", max_steps=6, eval_every=3, eval_examples=8, lengths=(64, 96), batch=4)
    model, log = train(cfg, out=tmp_path, progress=False)
    assert log["steps"] == 6 and len(log["curve"]) == 2 and set(log["final_val_acc"]) == {64, 96}
    again = load_trained(tmp_path)
    toks = tasks.make_batch("mqar", 2, 64, seed=0).tokens
    with torch.no_grad():
        torch.testing.assert_close(again.train_forward(toks), model.train_forward(toks))
    assert json.loads((tmp_path / "train_log.json").read_text())["steps"] == 6


def test_routing_every_block_gives_the_dense_answers():
    model = sk.Model(sk.ModelConfig.from_name("recall"))
    batch = tasks.eval_batch("niah", 3, 200)
    res = recall_eval.evaluate_routers(model, batch, {"dense": None, "every": sk.Router("minmax", top_k=64),
                                                      "small": sk.Router("minmax", top_k=2)}, block_size=16)
    assert res["every"].correct == res["dense"].correct and len(res["dense"].correct) == 3 * 8
    assert res["small"].bytes_per_answer < res["every"].bytes_per_answer


def test_prefix_cache_refuses_models_with_recurrent_state():
    with pytest.raises(ValueError, match="all-attention model"):
        sk.Engine(sk.Model(sk.ModelConfig.from_name("recall")), prefix_cache=True)


def test_hf_attention_with_every_block_equals_the_models_own():
    transformers = pytest.importorskip("transformers")
    import sparsekv.recall.hf
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    reg = sparsekv.recall.hf.register(sk.Router("minmax", top_k=1000), block_size=8)
    import copy
    ref = transformers.LlamaForCausalLM(copy.deepcopy(cfg)).eval()      # each model its own config object
    ref.config._attn_implementation = "eager"
    routed = transformers.LlamaForCausalLM(copy.deepcopy(cfg)).eval()
    routed.load_state_dict(ref.state_dict())
    routed.config._attn_implementation = reg.name
    assert ref.config._attn_implementation == "eager"
    prompt = torch.randint(0, 97, (1, 29))
    kw = dict(max_new_tokens=12, do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        a, b = ref.generate(prompt, **kw), routed.generate(prompt, **kw)
    assert torch.equal(a.sequences, b.sequences)
    for x, y in zip(a.scores, b.scores):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    assert len(reg.steps) == 11 * 2                                       # 11 routed decode steps x 2 layers


@pytest.mark.skipif(not MODELS.exists(), reason="no trained models committed")
@pytest.mark.parametrize("name", sorted(p.name for p in MODELS.glob("*") if (p / "config.json").exists()) if MODELS.exists() else [])
def test_committed_weights_reproduce_their_recorded_dense_accuracy(name):
    from sparsekv.recall.train import evaluate
    path = MODELS / name
    log = json.loads((path / "train_log.json").read_text())
    cfg = log["config"]
    model = load_trained(path)
    for length, acc in log["final_val_acc"].items():
        now = evaluate(model, cfg["task"], int(length), cfg["eval_examples"] * 2,
                       **TrainConfig.from_log(cfg).validation_kwargs)
        assert abs(now - acc) <= 0.01, (name, length, now, acc)


def test_hf_evaluation_path_runs_routed_and_dense_alike(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    batch = tasks.eval_batch("passkey", 2, 96)
    res = recall_eval.evaluate_hf(model, batch, {"dense": None, "every": sk.Router("minmax", top_k=100)}, block_size=16)
    assert res["every"].correct == res["dense"].correct and len(res["dense"].correct) == 2 * 5
    assert res["every"].bytes_read > 0


def test_dense_layers_counts_attention_layers_not_conv_layers():
    model = sk.Model(sk.ModelConfig.from_name("recall-hops"))          # conv, attn, attn
    assert model.config.attn_layers == [1, 2]
    read = {}
    for dense in (0, 1, 2):
        engine = sk.Engine(model, router=sk.Router("minmax", top_k=3), block_size=8, num_blocks=64, dense_layers=dense)
        seq = engine.new_sequence()
        engine.prefill(seq, torch.arange(8, 88))
        engine.decode(seq, 1)
        read[dense] = engine.stats(seq).steps[-1].blocks_read
    every = -(-81 // 8)                                    # blocks of one kv head at the routed step
    assert read[2] == 2 * every                            # both attention layers dense
    assert every < read[1] < 2 * every                     # the first dense, the second routed
    assert read[0] < read[1]


def test_training_walks_the_stages_then_the_lengths(tmp_path):
    cfg = TrainConfig(task="multihop", lengths=(64, 96), task_kwargs={"hops": 2, "chains": 2, "n_queries": 2},
                      stages=({"hops": 1}, {"min_hops": 1}), eval_kwargs={"min_hops": 2}, advance_at=0.0, target=2.0,
                      max_steps=8, eval_every=2, eval_examples=4, batch=4)
    _, log = train(cfg, out=tmp_path, progress=False)
    assert [(c["stage"], c["length"]) for c in log["curve"]] == [(0, 64), (1, 64), (2, 96), (2, 96)]
    assert set(log["final_val_acc"]) == {64, 96} and log["threads"] >= 1
    card = (tmp_path / "MODEL_CARD.md").read_text()
    with pytest.raises(ValueError, match="min_hops"):                # the last stage is 1-hop: min_hops 2 can't be
        train(TrainConfig(task="multihop", stages=({"hops": 1},), eval_kwargs={"min_hops": 2}), progress=False)
    assert "--stages '[{\"hops\": 1}, {\"min_hops\": 1}]'" in card and "--eval-kwargs '{\"min_hops\": 2}'" in card
