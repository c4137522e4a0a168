"""The prefix cache: exact block ids, eviction order, namespaces, pins, and engine integration."""
import pytest
import torch
from conftest import kv_for, make_store
from conftest import prefix_run as run

import sparsekv as sk
from sparsekv.storage.prefix_cache import PrefixCache


def test_match_returns_whole_blocks_and_leaves_the_last_token(sc):
    store, cache = sc
    toks = list(range(10, 22))                          # 12 tokens = 3 full blocks
    seq, hit = run(store, cache, toks)
    assert hit == 0 and seq.block_ids == [0, 1, 2]
    m = cache.match(toks)
    assert (m.num_tokens, m.block_ids) == (8, [0, 1])   # block 2 would leave no token to compute
    m = cache.match(toks + [99])
    assert (m.num_tokens, m.block_ids) == (12, [0, 1, 2])


def test_a_hit_shares_blocks_and_reads_back_the_cached_kv(sc):
    store, cache = sc
    toks = list(range(10, 23))
    a, _ = run(store, cache, toks)
    b, hit = run(store, cache, toks)
    assert hit == 12 and b.block_ids[:3] == a.block_ids[:3]
    assert store.pool.ref_counts[a.block_ids[0]] == 2
    assert torch.equal(store.gather(b, 0)[0], kv_for(toks, 0, store)[0][0])


def test_a_different_namespace_never_hits(sc):
    store, cache = sc
    toks = list(range(10, 23))
    run(store, cache, toks, ns="tenant-a")
    assert cache.match(toks, "tenant-b").num_tokens == 0
    assert cache.match(toks).num_tokens == 0
    assert cache.match(toks, "tenant-a").num_tokens == 12


@pytest.mark.parametrize("i", [0, 1, 2])
def test_a_changed_token_in_block_i_misses_from_block_i_on(i, sc):
    store, cache = sc
    toks = list(range(10, 23))
    run(store, cache, toks)
    changed = list(toks)
    changed[i * 4 + 2] += 100
    assert cache.match(changed).num_tokens == i * 4
    e = cache.explain(changed)
    assert (e.first_miss_block, e.diff_token) == (i, i * 4 + 2)


def test_free_blocks_go_first_then_eviction_in_lru_order(sc):
    store, cache = sc
    a, _ = run(store, cache, list(range(100, 108)) + [1])     # blocks 0, 1 cached, 2 partial
    store.free(a)                                              # 0, 1 evictable; 2 back to free queue
    assert cache.num_evictable == 2 and store.num_free_blocks == 8
    b, _ = run(store, cache, list(range(200, 208)) + [1])     # takes free blocks 3, 4, 5 first
    assert b.block_ids == [3, 4, 5] and cache.num_cached == 4
    store.free(b)
    c = store.new_sequence()
    store.append(c, *kv_for(list(range(300, 328)), 0, store))  # 7 blocks: 6 free (2, 5, 6, 7 ...) then evict
    # Free queue first (2, 5 released, 6, 7 never used) ... then LRU: a's leaf (1), a's root (0), b's leaf (4).
    assert sorted(c.block_ids) == [0, 1, 2, 4, 5, 6, 7]
    assert cache.match(list(range(100, 108)) + [1]).num_tokens == 0     # a's prefix evicted, root too
    assert cache.match(list(range(200, 208)) + [1]).num_tokens == 4     # b's root (3) survives


def test_eviction_never_touches_a_referenced_block_and_reports_shortage(sc):
    store, cache = sc
    a, _ = run(store, cache, list(range(100, 112)))           # 3 blocks in use
    b = store.new_sequence()
    with pytest.raises(sk.StoreFullError) as e:
        store.append(b, *kv_for(list(range(40)), 0, store))    # needs 10 blocks, 5 free
    assert (e.value.needed, e.value.free) == (10, 5)
    assert torch.equal(store.gather(a, 0)[0], kv_for(list(range(100, 112)), 0, store)[0][0])


@pytest.mark.parametrize("policy,expect_kept", [("lru", "recent"), ("lfu", "popular"), ("position", "popular")])
def test_policies_choose_different_victims(policy, expect_kept):
    store = make_store(layers=1, kv_heads=1, head_dim=4, block_size=4, num_blocks=6, repr_keys=0)
    cache = PrefixCache(store, policy=policy)
    popular, recent = list(range(100, 108)) + [1], list(range(200, 208)) + [1]
    for _ in range(3):                                           # popular: 3 hits on its blocks
        s, _ = run(store, cache, popular)
        store.free(s)
    s, _ = run(store, cache, recent)                             # recent: used last, once
    store.free(s)
    filler = store.new_sequence()
    store.append(filler, *kv_for(list(range(300, 312)), 0, store))   # 3 blocks: 2 free + 1 evicted... and more
    store.append(filler, *kv_for(list(range(312, 316)), 12, store))
    kept = "popular" if cache.match(popular).num_tokens else "recent"
    assert kept == expect_kept


def test_pinned_prefix_survives_pressure_and_unpin_releases_it(sc):
    store, cache = sc
    toks = list(range(100, 108)) + [1]
    s, _ = run(store, cache, toks)
    store.free(s)
    assert cache.pin("sys", toks) == 2
    hog = store.new_sequence()
    store.append(hog, *kv_for(list(range(24)), 0, store))       # all 6 unpinned blocks
    assert cache.match(toks).num_tokens == 8
    with pytest.raises(sk.StoreFullError):
        store.append(hog, *kv_for([1], 24, store))
    cache.unpin("sys")
    store.append(hog, *kv_for([1], 24, store))                  # now the pinned blocks can go
    assert cache.match(toks).num_tokens == 4
    assert cache.occupancy()["pinned"] == {}


def test_watermarks_evict_in_the_background():
    store = make_store(layers=1, kv_heads=1, head_dim=4, block_size=4, num_blocks=10, repr_keys=0)
    cache = PrefixCache(store, high_watermark=0.5, low_watermark=0.2)
    for base in (100, 200, 300):
        s, _ = run(store, cache, list(range(base, base + 8)) + [1])
        store.free(s)
    assert len(store.pool.free_queue()) == 4                     # 6 cached blocks occupy 60%
    assert cache.maintain() == 4                                 # down to 20% occupied
    assert len(store.pool.free_queue()) == 8 and cache.num_cached == 2


def test_stats_count_queries_hits_and_a_recent_window(sc):
    store, cache = sc
    toks = list(range(10, 23))
    run(store, cache, toks)
    run(store, cache, toks)
    s = cache.stats
    assert (s.queries, s.prompt_tokens, s.hit_tokens) == (2, 26, 12)
    assert s.hit_rate == pytest.approx(12 / 26) and s.recent_hit_rate == pytest.approx(12 / 26)
    assert cache.occupancy()["namespaces"] == {"None": 3}


def test_bad_arguments(sc):
    store, cache = sc
    with pytest.raises(ValueError, match="already has a prefix cache"):
        PrefixCache(store)
    with pytest.raises(ValueError, match="policy must be one of"):
        PrefixCache(make_store(), policy="fifo")
    with pytest.raises(ValueError, match="watermarks"):
        PrefixCache(make_store(), high_watermark=0.3, low_watermark=0.5)
    seq = store.new_sequence()
    store.append(seq, *kv_for([1, 2, 3], 0, store))
    with pytest.raises(ValueError, match="sequence's 3 tokens"):
        cache.insert(seq, [1, 2])


def test_engine_logits_after_a_hit_equal_logits_from_scratch():
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    prompt = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(0))
    turn2 = torch.cat([prompt, torch.randint(0, 256, (25,), generator=torch.Generator().manual_seed(1))])
    cold = sk.Engine(model, block_size=8, num_blocks=64)
    ref_seq = cold.new_sequence()
    ref = cold.prefill(ref_seq, turn2)
    ref_tokens = cold.decode(ref_seq, 8)
    warm = sk.Engine(model, block_size=8, num_blocks=64, prefix_cache=True)
    s1 = warm.new_sequence()
    warm.prefill(s1, prompt)
    warm.finish(s1)
    s2 = warm.new_sequence()
    logits = warm.prefill(s2, turn2)
    assert warm.stats(s2).cached_tokens == 64 and warm.stats(s2).computed_tokens == 31
    torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
    assert warm.decode(s2, 8) == ref_tokens


def test_evicted_prefix_misses_and_is_recomputed_correctly():
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, 256, (60,), generator=g), torch.randint(0, 256, (60,), generator=g)
    eng = sk.Engine(model, block_size=8, num_blocks=10, prefix_cache=True)
    ref = None
    for i, prompt in enumerate((a, b, a)):                       # b's request evicts a's blocks
        s = eng.new_sequence()
        logits = eng.prefill(s, prompt)
        if i == 0:
            ref = logits
        if i == 2:
            # a cached 7 full blocks; b needed 8 of 10 and took the 3 free ones, then evicted
            # a's 5 deepest blocks (leaves first). a's first 2 blocks survive: a 16-token hit.
            assert eng.stats(s).cached_tokens == 16
            torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
        eng.finish(s)
    assert eng.prefix_cache.stats.evictions > 0


def test_engine_warmup_pins_the_prefix():
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    prefix = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(3))
    eng = sk.Engine(model, block_size=8, num_blocks=32, prefix_cache=True)
    assert eng.warmup("system", prefix) == 8
    s = eng.new_sequence()
    eng.prefill(s, torch.cat([prefix, torch.tensor([5, 6, 7])]))
    assert eng.stats(s).cached_tokens == 64


def test_compare_ttft_interleaves_fresh_engines_after_a_warmup_and_pairs_the_ratios_by_repeat():
    """W.compare_ttft: one untimed replay each, then off, on, off, on, ... on a fresh engine per replay; the counts
    equal a single replay's; per-request TTFT is the median over repeats and each ratio pairs one repeat's two
    replays (checked against numpy, not against the function's own arithmetic). No timing is asserted."""
    import numpy as np

    from sparsekv.analysis import workloads as W
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    trace = W.multi_agent_build(agents=2, turns=2, system=48, tools=2, tool_len=8, snapshot=40, growth=8, message=8,
                                tool_result=8, vocab=256, decode_tokens=2)
    calls, made = [], []

    def make(cached):
        calls.append(cached)
        made.append(sk.Engine(model, block_size=8, num_blocks=256, prefix_cache=cached, progress=False))
        return made[-1]

    cmp = W.compare_ttft(make, trace, repeats=3, keep_engines=True)
    assert calls == [False, True] * 4 and cmp.repeats == 3 and cmp.warmup and cmp.warmup_requests == 2
    warm = made[1].prefix_cache.stats                                  # the warm-up's cached engine: 2 requests,
    assert made[0].prefix_cache is None and warm.queries == 2 and warm.hit_tokens > 0   # the second one a hit
    assert cmp.engines[0] is made[-2] and cmp.engines[1] is made[-1]   # the last repeat's engines, off then on
    assert cmp.engines[1].prefix_cache.stats.queries == len(trace.requests)
    single = W.replay(make(True), trace)
    assert [(r.cached_tokens, r.computed_tokens) for r in cmp.on] == [(r.cached_tokens, r.computed_tokens) for r in single]
    assert sum(r.cached_tokens for r in cmp.on) > 0 and all(r.cached_tokens == 0 for r in cmp.off)
    off, on = np.array(cmp.off_s), np.array(cmp.on_s)                  # [repeats, requests]
    assert off.shape == (3, len(trace.requests)) and (off > 0).all() and (on > 0).all()
    np.testing.assert_allclose([r.ttft_s for r in cmp.on], np.median(on, axis=0), rtol=0, atol=0)
    np.testing.assert_allclose(cmp.ratios(), off.sum(1) / on.sum(1), rtol=1e-12)
    np.testing.assert_allclose(cmp.ratios(slice(0, 1)), off[:, 0] / on[:, 0], rtol=1e-12)
    med, lo, hi = cmp.speedup()
    assert med == np.median(off.sum(1) / on.sum(1)) and lo == min(cmp.ratios()) and hi == max(cmp.ratios())
    for bad, err in ((0, TypeError), (slice(5, 5), ValueError)):
        with pytest.raises(err, match="requests must"):
            cmp.ratios(bad)
    calls.clear()
    quick = W.compare_ttft(make, trace, repeats=1, warmup=False)
    assert not quick.warmup and calls == [False, True] and quick.engines == (None, None)   # kept only when asked
    dropped = cmp.without_engines()                                    # the timings stay, the engines go
    assert dropped.engines == (None, None) and cmp.engines[1] is not None and dropped.off_s == cmp.off_s
    made.clear()
    assert W.compare_ttft(make, trace, repeats=1, warmup_requests=None).warmup_requests == len(trace.requests)
    assert made[1].prefix_cache.stats.queries == len(trace.requests)   # None: the whole trace warms up


def test_compare_ttft_rejects_bad_arguments_before_any_replay_and_engines_that_cache_differently():
    from sparsekv.analysis import workloads as W
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    trace = W.repo_qa(snapshot=64, questions=2, system=16, q_len=(4, 8), vocab=256, decode_tokens=1)
    calls = []

    def make(cached):
        calls.append(cached)
        return sk.Engine(model, block_size=8, num_blocks=128, prefix_cache=cached, progress=False)

    for kw, err, word in ((dict(repeats=0), ValueError, "repeats"), (dict(repeats=1.5), TypeError, "repeats"),
                          (dict(repeats=True), TypeError, "repeats"), (dict(warmup="yes"), TypeError, "warmup"),
                          (dict(warmup_requests=0), ValueError, "warmup_requests"),
                          (dict(warmup_requests=1.0), TypeError, "warmup_requests"),
                          (dict(keep_engines=1), TypeError, "keep_engines")):
        with pytest.raises(err, match=word):
            W.compare_ttft(make, trace, **kw)
    with pytest.raises(TypeError, match="make_engine"):
        W.compare_ttft("engine", trace)
    assert calls == []                                                  # nothing replayed on a rejected call
    flips = iter([False, True, True, False])                            # the treated engine caches once, then not

    def unsteady(treated):
        return sk.Engine(model, block_size=8, num_blocks=128, prefix_cache=next(flips) if treated else False,
                         progress=False)

    with pytest.raises(RuntimeError, match="different token counts"):
        W.compare_ttft(unsteady, trace, repeats=2, warmup=False)
