"""Notebook 09's machinery: the one byte model (`core.traffic.cache_bytes`), the two-question probes
(`analysis.turns`), and the lossy peers (`analysis.peers`: kvpress presses, transformers' QuantizedCache
with HQQ), on a tiny random Llama (no files) and, for the prompt layout, the real tokenizer."""
import pytest
import torch

import sparsekv as sk
from sparsekv.analysis import peers, turns
from sparsekv.core.traffic import cache_bytes, routed_traffic
from sparsekv.model import fetch
from sparsekv.studies import equalbytes as eb

GGUF = fetch.model_path(fetch.SMOLLM2, fetch.__file__.rsplit("/sparsekv/", 1)[0])


# -- the byte model ------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens,budget,bs", [(500, 64, 16), (37, 16, 16), (1000, 256, 32), (129, 1024, 64)])
def test_lossless_read_bytes_agree_with_the_per_layer_traffic_model(tokens, budget, bs):
    got = cache_bytes("lossless", layers=3, kv_heads=2, head_dim=16, tokens=tokens, block_size=bs, budget=budget,
                      summaries_read=2)
    t = routed_traffic(tokens, budget, 2, bs, 16, 4, 6, summary_vectors=2)
    assert got.read == 3 * (t.kv_bytes + t.summary_bytes)


@pytest.mark.parametrize("kv_bits", [0, 8])
@pytest.mark.parametrize("T", [1, 16, 203])
def test_lossless_held_bytes_equal_the_store_s_tensors(kv_bits, T):
    c = sk.StoreConfig(num_layers=2, num_kv_heads=3, head_dim=64, block_size=16, num_blocks=32, kv_bits=kv_bits)
    store = sk.BlockStore(c)
    seq = store.new_sequence()
    store.append(seq, torch.randn(2, T, 3, 64), torch.randn(2, T, 3, 64))
    from sparsekv.storage.summaries import summary_vectors
    model = cache_bytes("lossless", layers=2, kv_heads=3, head_dim=64, tokens=T, block_size=16, kv_bits=kv_bits,
                        summaries_held=summary_vectors(c.summaries, c))
    table = store.block_table(seq)
    held = sum(t[:, table].numel() * t.element_size() for t in (store.k, store.v))
    held += sum(store.summary(n)[:, table].numel() * 4 for n in c.summaries)
    if kv_bits:
        held += sum(t[:, table].numel() * 4 for t in (store.k_scale, store.v_scale))
    assert model.held == held == store.sequence_bytes(seq)
    dense = cache_bytes("lossless", layers=2, kv_heads=3, head_dim=64, tokens=T, block_size=16, kv_bits=kv_bits)
    assert dense.read == 2 * 3 * 2 * T * (64 * (1 if kv_bits else 4) + (4 if kv_bits else 0))


def test_cache_bytes_rejects_bad_arguments():
    geom = dict(layers=2, kv_heads=2, head_dim=64, tokens=100)
    with pytest.raises(ValueError, match="family must be one of"):
        cache_bytes("h2o", **geom)
    with pytest.raises(ValueError, match="kept must be in"):
        cache_bytes("evict", kept=101, **geom)
    with pytest.raises(ValueError, match="'quant' needs bits"):
        cache_bytes("quant", bits=5, **geom)
    with pytest.raises(ValueError, match="tokens must be a positive int"):
        cache_bytes("dense", layers=2, kv_heads=2, head_dim=64, tokens=0)


# -- scoring -------------------------------------------------------------------------------------

def test_correct_and_tail_loss_read_the_right_rows():
    p = turns.TwoFacts("t", [1, 2, 3], [10, 11, 12, 13, 14, 15], ((2, 3), (5,)), ((0, 1), (1, 2)), (0.1, 0.5))
    logits = torch.full((5, 20), -5.0)
    for i, nxt in enumerate(p.after[1:]):
        logits[i, nxt] = 5.0                                        # row i predicts after[i + 1]
    assert turns.correct(p, logits) == [True, True]
    logits[2, 13] = -9.0; logits[2, 0] = 9.0                        # row 2 predicts after[3], answer 1's second token
    assert turns.correct(p, logits) == [False, True]
    assert turns.tail_loss(p, logits) > 0
    with pytest.raises(ValueError, match="logits must have 5 rows"):
        turns.correct(p, logits[:4])


# -- the probes on the real tokenizer ------------------------------------------------------------

@pytest.fixture(scope="module")
def tok():
    if not GGUF.exists():
        pytest.skip("the real model is not fetched (make model)")
    return sk.load_tokenizer(GGUF)


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_two_fact_probes_lay_out_the_ids_they_claim(tok, task):
    p = turns.PROBES[task](tok, 700, (0.2, 0.7), seed=3)
    assert p.length == 700
    text = tok.decode(p.context + p.after)
    assert text.count("<|im_start|>user") == 2 and text.count("<|im_start|>assistant") == 2
    for (s, e), pos in zip(p.needles, p.answers):
        fact = tok.decode(p.context[s:e])
        answer = tok.decode([p.after[i] for i in pos]).strip()
        assert answer and answer in fact                            # each answer is planted in its own fact
    assert p.needles[0][1] <= p.needles[1][0]
    with pytest.raises(ValueError, match="depths must be increasing"):
        turns.PROBES[task](tok, 700, (0.7, 0.2), seed=3)
    with pytest.raises(ValueError, match="no room"):
        turns.PROBES[task](tok, 60, (0.2, 0.7), seed=3)


# -- the peers on a tiny random Llama ------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_hf():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def probe():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (300,), generator=g).tolist()
    return turns.TwoFacts("t", ids[:260], ids[260:], ((5, 6), (30, 31, 32)), ((40, 48), (150, 158)), (0.2, 0.6))


def test_nothing_compressed_gives_the_dense_logits_exactly(tiny_hf, probe):
    dense = peers.run(tiny_hf, probe, peers.PeerMethod("dense", "dense"))
    for press in ("SnapKVPress", "KnormPress", "StreamingLLMPress"):
        r = peers.run(tiny_hf, probe, peers.PeerMethod(press, "evict", press, 0.0))
        assert torch.equal(r.logits, dense.logits), press
    # the same logits as one plain forward pass over the whole sequence
    full = tiny_hf(torch.tensor([probe.context + probe.after])).logits[0, len(probe.context):-1]
    assert (full - dense.logits).abs().max() < 1e-4


def test_peer_bytes_equal_the_byte_model(tiny_hf, probe):
    geom = dict(layers=2, kv_heads=2, head_dim=32, itemsize=4, tokens=len(probe.context) + len(probe.after) - 1)
    d = peers.run(tiny_hf, probe, peers.PeerMethod("dense", "dense"))
    assert d.held_bytes == cache_bytes("dense", **geom).held
    e = peers.run(tiny_hf, probe, peers.PeerMethod("snap", "evict", "SnapKVPress", 0.5))
    assert e.cached_tokens == 130 + len(probe.after) - 1              # half the context, then every later token
    assert e.held_bytes == cache_bytes("evict", kept=e.cached_tokens, **geom).held
    for bits in (8, 4, 2):
        m = peers.PeerMethod("hqq", "quant", bits=bits, group=32)
        q = peers.run(tiny_hf, probe, m)
        assert q.held_bytes == cache_bytes("quant", bits=bits, group=32, residual=peers.residual_tokens(probe, m),
                                           **geom).held, bits
    q1 = peers.run(tiny_hf, probe, peers.PeerMethod("snap+q1", "evict", "SnapKVPress", 0.5, sees_question=True))
    assert q1.logits.shape == d.logits.shape                         # question 1 went through the press's prefill
    assert q1.cached_tokens == (260 + 5) // 2 + (len(probe.after) - 1 - 5)


def test_peer_methods_reject_bad_configurations():
    with pytest.raises(ValueError, match="family must be"):
        peers.PeerMethod("x", "prune")
    with pytest.raises(ValueError, match="needs a press and a ratio"):
        peers.PeerMethod("x", "evict", "SnapKVPress", 1.0)
    with pytest.raises(ValueError, match="bits in"):
        peers.PeerMethod("x", "quant", bits=3)
    with pytest.raises(ValueError, match="backend must be 'hqq'"):
        peers.PeerMethod("x", "quant", bits=4, backend="quanto")


def test_peer_methods_keep_the_routers_budget_of_context_tokens():
    ms = eb.peer_methods(["SnapKVPress", "KnormPress"], [64, 128], 1000, bits=(8,))
    snap = [m for m in ms if m.press == "SnapKVPress" and not m.sees_question]
    assert [round((1 - m.ratio) * 1000) for m in snap] == [64, 128]
    assert sum(m.sees_question for m in ms) == 2 and ms[-1].bits == 8


# -- the sparsekv rows on the tiny model ----------------------------------------------------------

def test_lossless_rows_run_every_method_on_its_store_and_quest_s_protocol_routes_only_the_answers(probe):
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    engines = {bits: sk.Engine(model, block_size=16, num_blocks=64, progress=False, kv_bits=bits) for bits in (0, 8)}
    methods = eb.lossless_methods(["minmax"], [32], int8_scorers=("minmax",), dense_prompt=[("minmax", 32)])
    assert [m.name for m in methods] == ["dense", "minmax@32", "int8 dense", "int8 minmax@32", "minmax@32 qdense"]
    rows = eb.lossless_rows(engines, probe, methods)
    assert sorted(r["method"] for r in rows) == sorted(m.name for m in methods)
    assert {r["method"]: r["family"] for r in rows}["int8 minmax@32"] == "lossless int8"
    assert all(r["held"] == r["held_measured"] for r in rows)        # the byte model against the store's tensors
    # Quest's protocol: the rows before the first answer-predicting row are fed densely (dense's rows); that row is
    # routed; routing every step moves the rows before it too
    e = engines[0]
    seq = e.new_sequence()
    e.prefill(seq, probe.context)
    logits = {}
    for m in (methods[0], methods[1], methods[-1]):
        child = e.fork(seq)
        logits[m.name] = eb._feed(e, child, probe, m)
        e.finish(child)
    first = min(p - 1 for pos in probe.answers for p in pos)
    q, d, r = logits["minmax@32 qdense"], logits["dense"], logits["minmax@32"]
    torch.testing.assert_close(q[:first], d[:first], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(q[first], d[first], atol=1e-3)
    assert not torch.allclose(q[:first], r[:first], atol=1e-3)
    with pytest.raises(ValueError, match=r"engines must hold an Engine for every method's kv_bits, missing \[8\]"):
        eb.lossless_rows({0: engines[0]}, probe, methods)
