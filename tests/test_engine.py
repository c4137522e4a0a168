"""The Engine, specified: what prefill, extend, attach_prefix, feed, fork, decode and decode_batch do, and that
their stats agree with each other on the same forks (one decode step, one plan, one byte count)."""
import pytest
import torch
from conftest import feed_last_against_all

import sparsekv as sk
from sparsekv.attention.plan import step_traffic
from sparsekv.core.traffic import StepTraffic


@pytest.fixture(scope="module")
def model():
    return sk.Model(sk.ModelConfig.from_name("tiny"))


def prompt(n, seed=0, vocab=256):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def engine(model, **kw):
    return sk.Engine(model, **{"block_size": 8, "num_blocks": 256, "progress": False, **kw})


# -- the prompt side ---------------------------------------------------------------------------------------

def test_prefill_in_chunks_equals_one_shot_and_counts_its_tokens(model):
    ids = prompt(77)
    one, chunked = engine(model, chunk_size=512), engine(model, chunk_size=10)
    a, b = one.new_sequence(), chunked.new_sequence()
    la, lb = one.prefill(a, ids), chunked.prefill(b, ids)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
    st = chunked.stats(b)
    assert (st.prompt_tokens, st.computed_tokens, st.cached_tokens) == (77, 77, 0) and st.ttft_s > 0
    assert chunked.tokens(b) == ids and b.num_tokens == 77


def test_a_later_turn_starts_a_new_ttft_and_extend_adds_to_it(model):
    eng = engine(model)
    seq = eng.new_sequence()
    eng.prefill(seq, prompt(30))
    first = eng.stats(seq).ttft_s
    eng.prefill(seq, prompt(5, seed=1))                        # a later turn: ttft_s is this call's time
    assert eng.stats(seq).ttft_s != first and eng.stats(seq).prompt_tokens == 35
    other = eng.new_sequence()
    assert eng.attach_prefix(other, prompt(30)) == 0           # no cache: nothing attached, the turn starts at 0
    eng.extend(other, prompt(30)[:16])
    t1 = eng.stats(other).ttft_s
    eng.extend(other, prompt(30)[16:])
    assert eng.stats(other).ttft_s > t1                        # each chunk adds its time
    torch.testing.assert_close(eng.last_logits(other), eng.prefill(eng.new_sequence(), prompt(30)), atol=1e-5, rtol=1e-5)


def test_a_prefix_cache_serves_a_repeated_prompt(model):
    eng = engine(model, prefix_cache=True)
    ids = prompt(40)
    a = eng.new_sequence()
    la = eng.prefill(a, ids)
    eng.finish(a)
    b = eng.new_sequence()
    lb = eng.prefill(b, ids)
    st = eng.stats(b)
    assert st.cached_tokens == 32 and st.computed_tokens == 8        # whole blocks, at least one token computed
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)


# -- the decode side -----------------------------------------------------------------------------------

def test_feed_of_the_greedy_tokens_is_decode(model):
    eng = engine(model, router=sk.Router("minmax", token_budget=16))
    seq = eng.new_sequence()
    eng.prefill(seq, prompt(50))
    a, b = eng.fork(seq), eng.fork(seq)
    toks = eng.decode(a, 6)                                    # toks[0] is the parent's greedy token
    logits = eng.feed(b, toks)                                 # the same tokens, given: the logits after each
    assert logits.shape == (6, model.config.vocab_size) and logits[:-1].argmax(-1).tolist() == toks[1:]
    assert torch.equal(eng.last_logits(a), eng.last_logits(b))
    assert [s.kv_bytes for s in eng.stats(a).steps] == [s.kv_bytes for s in eng.stats(b).steps]


@pytest.mark.parametrize("preset,routed", [("tiny", True), ("tiny", False), ("recall", True)],
                         ids=["attn-routed", "attn-dense", "conv-attn"])
def test_feed_of_only_the_last_logits_skips_the_head_and_changes_nothing_else(preset, routed):
    """feed(logits="last") on one fork and feed(logits="all") on another from the same state: the last row bit-equal,
    the store's K/V and the steps' bytes equal, the same greedy tokens after; the output head ran once instead of
    n times (what makes it cheaper). Covers batched all-attention steps and the conv mixer's per-sequence path."""
    m = sk.Model(sk.ModelConfig.from_name(preset), seed=3)
    router = sk.Router("minmax", token_budget=16) if routed else None
    eng = engine(m, router=router)
    seq = eng.new_sequence()
    eng.prefill(seq, prompt(45, vocab=m.config.vocab_size))
    a, b = feed_last_against_all(eng, m, seq, prompt(19, seed=5, vocab=m.config.vocab_size), router)
    for layer in range(eng.store.config.num_layers):
        ka, va = eng.store.gather(a, layer, 0)
        kb, vb = eng.store.gather(b, layer, 0)
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    assert eng.decode(a, 4) == eng.decode(b, 4)


def test_a_feed_that_runs_out_of_blocks_keeps_what_it_fed_and_under_last_has_no_logits(model):
    """A pool of 4 blocks of 8 holds 32 tokens: feeding 20 after a 20-token prompt stops at the 13th with
    StoreFullError. Both choices keep the 12 tokens fed; "all" keeps the 12th token's logits, "last" (which skipped
    them) none, so decoding from it is refused rather than sampled from stale logits."""
    for choice in ("all", "last"):
        eng = sk.Engine(model, block_size=8, num_blocks=4, progress=False)
        seq = eng.new_sequence()
        eng.prefill(seq, prompt(20))
        with pytest.raises(sk.StoreFullError):
            eng.feed(seq, prompt(20, seed=1), logits=choice)
        assert seq.num_tokens == 32 and eng.tokens(seq) == prompt(20) + prompt(20, seed=1)[:12]
        if choice == "all":
            assert eng.last_logits(seq).shape == (model.config.vocab_size,)
        else:
            assert eng.last_logits(seq) is None
            with pytest.raises(ValueError, match="no logits to sample from"):
                eng.decode(seq, 1)


def test_feed_rejects_an_unknown_logits_choice_and_changes_nothing(model):
    eng = engine(model)
    seq = eng.new_sequence()
    eng.prefill(seq, prompt(20))
    before = (seq.num_tokens, eng.tokens(seq), eng.last_logits(seq).clone())
    with pytest.raises(ValueError, match="logits must be 'all' or 'last', got 'first'"):
        eng.feed(seq, prompt(3), logits="first")
    assert (seq.num_tokens, eng.tokens(seq)) == before[:2] and torch.equal(eng.last_logits(seq), before[2])


def test_a_fork_continues_from_the_parent_and_leaves_it_unchanged(model):
    eng = engine(model)
    seq = eng.new_sequence()
    eng.prefill(seq, prompt(29))                               # a partial last block: the fork's first write copies it
    parent_blocks, parent_logits = seq.block_ids, eng.last_logits(seq).clone()
    child = eng.fork(seq)
    assert torch.equal(eng.last_logits(child), parent_logits) and eng.tokens(child) == eng.tokens(seq)
    eng.decode(child, 3)
    assert seq.block_ids == parent_blocks and seq.num_tokens == 29 and torch.equal(eng.last_logits(seq), parent_logits)
    assert child.block_ids[-1] != parent_blocks[-1]            # copy-on-write of the shared partial block
    assert eng.decode(seq, 3) == eng.tokens(child)[29:]        # the same greedy tokens from the same state


@pytest.mark.parametrize("kv_bits", [0, 8], ids=["float", "int8"])
@pytest.mark.parametrize("routed", [True, False], ids=["routed", "dense"])
def test_decode_and_decode_batch_give_the_same_tokens_and_traffic_on_the_same_forks(model, routed, kv_bits):
    """Four forks decoded together, against the same four forks decoded one at a time: identical tokens, and
    identical StepTraffic at every step (the one plan counts both)."""
    router = sk.Router("minmax", token_budget=16) if routed else None
    eng = engine(model, router=router, kv_bits=kv_bits)
    bases = []
    for i, n in enumerate((33, 40, 57, 64)):
        s = eng.new_sequence()
        eng.prefill(s, prompt(n, seed=i))
        bases.append(s)
    alone, together = [eng.fork(s) for s in bases], [eng.fork(s) for s in bases]
    for _ in range(5):
        for s in alone:
            eng.decode(s, 1)
        eng.decode_batch(together)
    for a, b in zip(alone, together):
        assert eng.tokens(a) == eng.tokens(b)
        ta, tb = [s.traffic for s in eng.stats(a).steps], [s.traffic for s in eng.stats(b).steps]
        assert ta == tb and all(isinstance(t, StepTraffic) and t.kv_bytes > 0 for t in ta)
        assert [s.route_bytes for s in eng.stats(a).steps] == [s.route_bytes for s in eng.stats(b).steps]


@pytest.mark.parametrize("kv_bits", [0, 8], ids=["float", "int8"])
def test_a_step_counts_bytes_at_the_stored_width(model, kv_bits):
    """Dense: every row of every layer at StoreConfig.kv_row_bytes (int8: the code bytes plus a float32 scale),
    one table entry per block; the engine's numbers are the plan's `step_traffic`, summed over the layers."""
    eng = engine(model, kv_bits=kv_bits)
    seq = eng.new_sequence()
    eng.prefill(seq, prompt(45))
    eng.decode(seq, 1)
    c, L = eng.store.config, eng.store.config.num_layers
    step = eng.stats(seq).steps[-1]
    row = c.head_dim * (1 if kv_bits else 4) + (4 if kv_bits else 0)
    assert c.kv_row_bytes == row
    assert step.kv_bytes == L * 2 * 46 * c.num_kv_heads * row
    assert step.traffic == StepTraffic(*(L * x for x in (step_traffic(eng.store, seq, model.config.n_heads).kv_bytes, 0,
                                                         -(-46 // 8) * 4, 2 * model.config.n_heads * c.head_dim * 4)))


def test_a_full_pool_stops_a_batch_before_anything_changes(model):
    eng = sk.Engine(model, block_size=8, num_blocks=8, progress=False)
    a, b = eng.new_sequence(), eng.new_sequence()
    eng.prefill(a, prompt(24))
    eng.prefill(b, prompt(24, seed=1))                         # 6 of 8 blocks; each needs a new one, with 2 free
    c = eng.new_sequence()
    eng.prefill(c, prompt(16, seed=2))                         # 8 of 8
    before = [(s.num_tokens, s.block_ids, eng.tokens(s), len(eng.stats(s).steps)) for s in (a, b)]
    with pytest.raises(sk.StoreFullError):
        eng.decode_batch([a, b])
    assert [(s.num_tokens, s.block_ids, eng.tokens(s), len(eng.stats(s).steps)) for s in (a, b)] == before


def test_dense_layers_per_call_read_the_leading_layers_densely(model):
    eng = engine(model, router=sk.Router("minmax", token_budget=8))
    seq = eng.new_sequence()
    eng.prefill(seq, prompt(64))
    a, b = eng.fork(seq), eng.fork(seq)
    eng.decode(a, 1)
    eng.decode(b, 1, dense_layers=1)
    assert eng.config.dense_layers == 0                        # a per-call choice, the config unchanged
    assert eng.stats(b).steps[0].kv_bytes > eng.stats(a).steps[0].kv_bytes
