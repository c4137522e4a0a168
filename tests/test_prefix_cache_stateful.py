"""Random interleavings of match/attach, insert, fork, free, pin, unpin and eviction under pressure."""
import pytest
import torch
from conftest import make_store
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from test_prefix_cache import kv_for

import sparsekv as sk
from sparsekv.storage.prefix_cache import POLICIES, PrefixCache

PREFIXES = [[7] * 8, [7] * 4 + [8] * 4, [9] * 12]          # shared starts, so requests hit


class CacheMachine(RuleBasedStateMachine):
    policy, runs, checks = "lru", 0, 0      # the eviction policy under test; counters of set-ups and checks

    def __init__(self):
        super().__init__()
        self.store = make_store(layers=1, kv_heads=1, head_dim=2, block_size=4, num_blocks=16, repr_keys=0)
        self.cache = PrefixCache(self.store, policy=self.policy)
        type(self).runs += 1
        self.live = {}            # seq_id -> (Sequence, tokens)
        self.pins = {}            # name -> blocks

    @rule(p=st.integers(0, 2), tail=st.lists(st.integers(1, 5), min_size=1, max_size=9), ns=st.sampled_from([None, "b"]))
    def request(self, p, tail, ns):
        toks = PREFIXES[p] + tail
        seq = self.store.new_sequence()
        hit = self.cache.attach(seq, toks, ns)
        assert hit % 4 == 0 and hit < len(toks)
        try:
            self.store.append(seq, *kv_for(toks[hit:], hit, self.store))
        except sk.StoreFullError as e:
            assert e.needed > e.free
            self.store.free(seq)
            return
        self.cache.insert(seq, toks, ns)
        self.live[seq.seq_id] = (seq, toks)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6))
    def fork(self, pick):
        seq, toks = self.live[sorted(self.live)[pick % len(self.live)]]
        child = self.store.fork(seq)
        self.live[child.seq_id] = (child, list(toks))

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6))
    def free(self, pick):
        seq, _ = self.live.pop(sorted(self.live)[pick % len(self.live)])
        self.store.free(seq)

    @precondition(lambda self: len(self.pins) < 2)
    @rule(p=st.integers(0, 2))
    def pin(self, p):
        name = f"pin{len(self.pins)}-{p}"
        if name not in self.pins:
            self.cache.pin(name, PREFIXES[p] + [1])
            self.pins[name] = self.cache._pins[name]

    @precondition(lambda self: self.pins)
    @rule()
    def unpin(self):
        self.cache.unpin(self.pins.popitem()[0])

    @invariant()
    def ref_counts_match_tables_and_pins(self):
        want = [0] * 16
        for seq, _ in self.live.values():
            for b in seq.block_ids:
                want[b] += 1
        for blocks in self.pins.values():
            for b in blocks:
                want[b] += 1
        assert want == self.store.pool.ref_counts

    @invariant()
    def free_plus_evictable_plus_used_is_total(self):
        pool = self.store.pool
        free, evictable = len(pool.free_queue()), self.cache.num_evictable
        used = sum(1 for r in pool.ref_counts if r > 0)
        assert free + evictable + used == 16
        assert all(pool.ref_counts[b] == 0 and self.cache.is_cached(b) for b in self.cache._evictable)

    @invariant()
    def every_live_sequence_and_cached_block_reads_back(self):
        for seq, toks in self.live.values():
            assert torch.equal(self.store.gather(seq, 0)[0], kv_for(toks, 0, self.store)[0][0])
        for b, m in self.cache._meta.items():
            start = m.position * 4
            want = kv_for(m.tokens.tolist(), start, self.store)[0][0]
            assert torch.equal(self.store.k[0, b, 0], want[:, 0])


    @invariant()
    def count_operations(self):
        type(self).checks += 1          # runs after set-up and after every operation


@pytest.mark.parametrize("policy", POLICIES)
def test_random_operations_under_every_eviction_policy(policy):
    """At least 3,400 random operations per policy (over 10,000 in all), every invariant after each."""
    CacheMachine.policy, CacheMachine.runs, CacheMachine.checks = policy, 0, 0
    run_state_machine_as_test(CacheMachine, settings=settings(max_examples=120, stateful_step_count=50, deadline=None))
    operations = CacheMachine.checks - CacheMachine.runs
    assert operations >= 3400, f"only {operations} operations ran under {policy!r}"
