"""The cold tier (issue 18): exact round trips, checksums, placement, prefetch, spill, and decode parity."""
import os

import numpy as np
import pytest
import torch
from conftest import exact_attention
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import sparsekv as sk
from sparsekv.storage.tiers import COLD, EMPTY, HOT


def tiered(tmp_path, hot=3, layers=2, kv_heads=2, head_dim=8, block_size=4, num_blocks=32, **kw):
    return sk.BlockStore(sk.StoreConfig(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                                        block_size=block_size, num_blocks=num_blocks, cold_dir=tmp_path,
                                        hot_blocks=hot, **kw))


def filled(store, T, seed=0, step=7):
    """A sequence of T random tokens in `store`, appended `step` at a time; returns (seq, K, V) [L, T, H, D]."""
    c = store.config
    g = torch.Generator().manual_seed(seed)
    K = torch.randn(c.num_layers, T, c.num_kv_heads, c.head_dim, generator=g).to(c.dtype)
    V = torch.randn(c.num_layers, T, c.num_kv_heads, c.head_dim, generator=g).to(c.dtype)
    seq = store.new_sequence()
    for i in range(0, T, step):
        store.append(seq, K[:, i:i + step].contiguous(), V[:, i:i + step].contiguous())
    return seq, K, V


@pytest.mark.parametrize("dtype,kv_bits", [(torch.float32, 0), (torch.bfloat16, 0), (torch.float32, 8)])
def test_demoted_tiles_read_back_bit_exact(tmp_path, dtype, kv_bits):
    store = tiered(tmp_path, hot=3, dtype=dtype, kv_bits=kv_bits)
    plain = sk.BlockStore(sk.StoreConfig(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, num_blocks=32,
                                         dtype=dtype, kv_bits=kv_bits))
    seq, K, V = filled(store, 37)                                # 10 blocks, the last partial; 3 hot per layer
    ref = plain.new_sequence()
    plain.append(ref, K, V)
    t = store.tiers
    assert t.num_cold() > 0 and all(t.num_hot(layer) <= 3 for layer in range(2))
    for layer in range(2):
        k, v = store.gather(seq, layer)                          # more than the hot tier: staged from both tiers
        k0, v0 = plain.gather(ref, layer)
        assert torch.equal(k, k0) and torch.equal(v, v0)
    # promote a cold set through layer_kv, then compare every tile again
    cold_ids = [b for b in seq.block_ids if t.state[1, b] == COLD][:3]
    store.layer_kv(1, [seq], [torch.tensor([[seq.block_ids.index(b) for b in cold_ids]] * 2)])
    assert all(t.state[1, b] == HOT for b in cold_ids)
    idx = torch.tensor(seq.block_ids)
    for which in "kv":
        assert torch.equal(store.tiles(which, 1, idx), plain.tiles(which, 1, torch.tensor(ref.block_ids)))
    for name in store.config.summaries:                          # summaries never left memory
        assert torch.equal(store.summary(name), plain.summary(name))
    t.check()


@pytest.mark.parametrize("G,D", [(1, 64), (3, 128), (8, 64)])
def test_attention_over_a_cold_tier_matches_float64(tmp_path, G, D):
    """Dense and sparse decode on every backend, hot or staged, against the float64 reference."""
    store = tiered(tmp_path, hot=4, kv_heads=2, head_dim=D, block_size=8, num_blocks=24)
    seq, K, V = filled(store, 75, seed=G)                        # 10 blocks, the last partial
    g = torch.Generator().manual_seed(D)
    q = torch.randn(2 * G, D, generator=g)
    blocks = torch.tensor([[0, 3, 9], [2, 9, -1]])               # 4 distinct blocks: fits the hot tier
    wide = torch.tensor([[0, 1, 4, 5, 9], [2, 3, 6, 7, 8]])      # 10 distinct: staged
    for layer in range(2):
        want_dense = exact_attention(q, K[layer], V[layer])[0]
        for backend in ("torch", "reference", "cpp"):
            out = sk.dense_attention(q, store, seq, layer, backend=backend)
            torch.testing.assert_close(out.double(), want_dense, atol=1e-5, rtol=1e-5)
            for sel in (blocks, wide):
                out, res = sk.sparse_attention(q, store, seq, layer, sel, backend=backend)
                want, lse = exact_attention(q, K[layer], V[layer], sel, 8)
                torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(res.lse.double(), lse, atol=1e-5, rtol=1e-5)
    store.tiers.check()


def test_a_flipped_byte_raises_cold_block_error_and_serves_nothing(tmp_path):
    store = tiered(tmp_path, hot=2)
    seq, K, V = filled(store, 24)                                # 6 blocks: 4 per layer are cold
    t = store.tiers
    victim = next(b for b in seq.block_ids if t.state[0, b] == COLD)
    with open(t.cold.path, "r+b") as f:                          # flip one byte inside the record
        f.seek(t.cold.offset(0, victim) + 17)
        byte = f.read(1)
        f.seek(t.cold.offset(0, victim) + 17)
        f.write(bytes([byte[0] ^ 0x40]))
    before = (t.state.copy(), t.slot_of.clone(), [list(s) for s in t.free_slots])
    logical = seq.block_ids.index(victim)
    with pytest.raises(sk.ColdBlockError, match=f"cold block {victim} \\(layer 0\\)") as info:
        store.layer_kv(0, [seq], [torch.tensor([[logical], [logical]])])
    assert info.value.block == victim and info.value.layer == 0 and "checksum" in info.value.reason
    assert t.state[0, victim] == COLD and int(t.slot_of[0, victim]) == -1
    with pytest.raises(sk.ColdBlockError):                        # staged reads check too
        store.gather(seq, 0)
    with pytest.raises(sk.ColdBlockError):                        # and so does a prefetched read
        store.prefetch(0, [victim])
        store.layer_kv(0, [seq], [torch.tensor([[logical], [logical]])])
    assert t.state[0, victim] == COLD
    t.check()
    k1, v1 = store.gather(seq, 1)                                # the other layer is intact
    assert torch.equal(k1, K[1]) and torch.equal(v1, V[1])
    del before


def test_a_torn_record_is_detected(tmp_path):
    store = tiered(tmp_path, hot=2)
    seq, *_ = filled(store, 24)
    t = store.tiers
    victim = next(b for b in seq.block_ids if t.state[1, b] == COLD)
    os.truncate(t.cold.path, t.cold.offset(1, victim) + 100)     # the file ends inside the record
    with pytest.raises(sk.ColdBlockError, match="torn record"):
        store.gather(seq, 1)


def test_bad_configuration_is_a_clear_error_at_construction(tmp_path):
    base = dict(num_layers=1, num_kv_heads=1, head_dim=4, block_size=4, num_blocks=8)
    with pytest.raises(ValueError, match="cold_dir must be an existing directory"):
        sk.StoreConfig(**base, cold_dir=tmp_path / "missing", hot_blocks=2)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cold_dir must be an existing directory"):
        sk.StoreConfig(**base, cold_dir=tmp_path / "file", hot_blocks=2)
    with pytest.raises(TypeError, match="cold_dir must be a path"):
        sk.StoreConfig(**base, cold_dir=3, hot_blocks=2)
    with pytest.raises(ValueError, match="hot_blocks needs a cold tier"):
        sk.StoreConfig(**base, hot_blocks=2)
    with pytest.raises(ValueError, match="hot_blocks"):
        sk.StoreConfig(**base, cold_dir=tmp_path, hot_blocks=9)
    with pytest.raises(ValueError, match="placement"):
        sk.StoreConfig(**base, cold_dir=tmp_path, hot_blocks=2, placement="random")
    if os.geteuid() != 0:                                         # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(ValueError, match="cold_dir must be writable"):
                sk.StoreConfig(**base, cold_dir=ro, hot_blocks=2)
        finally:
            ro.chmod(0o700)


@pytest.mark.parametrize("kv_bits", [0, 8])
def test_a_write_of_any_width_goes_through_to_the_cold_tier_exactly(tmp_path, kv_bits):
    """A prompt wider than the hot tier is one append: its tiles go cold as later ones need the slots, each
    written with its checksum, and every read (and every summary) equals the untiered store's."""
    store = tiered(tmp_path, hot=3, kv_bits=kv_bits)
    plain = sk.BlockStore(sk.StoreConfig(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, num_blocks=32,
                                         kv_bits=kv_bits))
    g = torch.Generator().manual_seed(4)
    head = torch.randn(2, 6, 2, 8, generator=g)
    wide = torch.randn(2, 53, 2, 8, generator=g)                  # 14 blocks from token 6, over a tier of 3
    seqs = []
    for s in (store, plain):
        seq = s.new_sequence()
        s.append(seq, head, head)
        s.append(seq, wide, -wide)
        seqs.append(seq)
    assert store.tiers.num_cold() > 0 and store.tiers.stats.demote_writes > 0
    store.tiers.check()
    for layer in range(2):
        for a, b in zip(store.gather(seqs[0], layer), plain.gather(seqs[1], layer)):
            assert torch.equal(a, b)
        t0, t1 = store.block_table(seqs[0]), plain.block_table(seqs[1])
        for name in store.config.summaries:
            assert torch.equal(store.summary(name)[layer, t0], plain.summary(name)[layer, t1]), name
    # the records the wide write left cold carry their checksums: flip a byte of one and its read raises
    victim = next(b for b in seqs[0].block_ids if store.tiers.state[0, b] == COLD)
    with open(store.tiers.cold.path, "r+b") as f:
        f.seek(store.tiers.cold.offset(0, victim) + 5)
        byte = f.read(1)
        f.seek(store.tiers.cold.offset(0, victim) + 5)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(sk.ColdBlockError, match=f"cold block {victim} \\(layer 0\\)"):
        store.gather(seqs[0], 0)


def test_a_write_that_does_not_fit_the_pool_is_rejected_and_changes_nothing(tmp_path):
    store = tiered(tmp_path, hot=3, num_blocks=8)
    seq, *_ = filled(store, 6)
    state = (store.pool.ref_counts.copy(), seq.num_tokens, seq.block_ids, store.tiers.state.copy())
    k = torch.randn(2, 40, 2, 8)                                  # 10 more blocks than the pool's 8
    with pytest.raises(sk.StoreFullError):
        store.append(seq, k, k)
    assert state[:3] == (store.pool.ref_counts, seq.num_tokens, seq.block_ids)
    assert np.array_equal(state[3], store.tiers.state)


def test_the_cold_file_is_deleted_on_close(tmp_path):
    store = tiered(tmp_path, hot=2)
    filled(store, 30)
    path = store.tiers.cold.path
    assert path.exists() and store.cold_bytes() > 0
    store.close()
    store.close()                                                 # idempotent
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_placement_policies_pick_their_victims(tmp_path):
    """Hot tier of 3 tiles per layer: after using blocks a, b, c and then a again, lru demotes b and fifo a."""
    for policy, victim in (("lru", 1), ("fifo", 0)):
        store = tiered(tmp_path, hot=3, layers=1, placement=policy)
        seq, *_ = filled(store, 12)                               # 3 full blocks, all hot
        a, b, c = seq.block_ids
        store.layer_kv(0, [seq], [torch.tensor([[0], [0]])])     # use a again
        d_seq = store.new_sequence()
        store.append(d_seq, torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8))    # a fourth tile needs a slot
        t = store.tiers
        assert t.state[0, seq.block_ids[victim]] == COLD, policy
        assert sorted(b for b in range(32) if t.state[0, b] == HOT) == sorted(
            [x for i, x in enumerate(seq.block_ids) if i != victim] + d_seq.block_ids)
        assert t.stats.demote_writes == 1
        store.close()


def test_clean_tiles_are_demoted_without_a_write(tmp_path):
    store = tiered(tmp_path, hot=2, layers=1)
    seq, *_ = filled(store, 16)                                   # 4 full blocks: 2 were written to disk
    t = store.tiers
    writes = t.cold.stats.writes
    store.layer_kv(0, [seq], [torch.tensor([[0, 1], [0, 1]])])   # promote the two cold ones (demotes two hot)
    store.layer_kv(0, [seq], [torch.tensor([[2, 3], [2, 3]])])   # and back: those were read, never changed
    assert t.cold.stats.writes == writes + 2                      # only the first two demotions wrote
    assert t.stats.demotions == 6 and t.stats.demote_writes == 4


def test_prefetch_turns_misses_into_hits_and_counts_wasted_reads(tmp_path):
    store = tiered(tmp_path, hot=3, layers=1)
    seq, *_ = filled(store, 32)                                   # 8 blocks, 5 cold
    t = store.tiers
    cold = [i for i, b in enumerate(seq.block_ids) if t.state[0, b] == COLD]
    store.prefetch(0, [seq.block_ids[i] for i in cold[:3]])
    t.wait_prefetches()
    store.layer_kv(0, [seq], [torch.tensor([cold[:2], cold[:2]])])
    assert t.stats.prefetch_hits == 2 and t.stats.misses == 0
    store.prefetch(0, [seq.block_ids[cold[3]]])                    # the third prediction was wrong
    assert t.stats.prefetch_wasted == 1
    t.wait_prefetches()
    assert t.cold.stats.prefetched == 4


def test_the_prefix_cache_spills_and_reloads_exactly(tmp_path):
    store = tiered(tmp_path, hot=4, num_blocks=32)
    cache = sk.PrefixCache(store)
    tokens = list(range(20))
    seq, K, V = filled(store, 20)
    cache.insert(seq, tokens)
    store.free(seq)                                               # released, still cached
    moved = cache.spill()
    t = store.tiers
    cached = [b for b in range(32) if cache.is_cached(b)]
    assert moved > 0 and all(t.state[layer, b] == COLD for layer in range(2) for b in cached)
    again = store.new_sequence()
    hit = cache.attach(again, tokens)
    assert hit == 16                                              # 4 full blocks, leaving the last token
    for layer in range(2):
        k, v = store.gather(again, layer)
        assert torch.equal(k, K[layer, :16]) and torch.equal(v, V[layer, :16])
    assert t.stats.promotions + t.stats.staged > 0


def test_evicting_from_the_pool_forgets_cold_records(tmp_path):
    store = tiered(tmp_path, hot=2, num_blocks=8, layers=1)
    cache = sk.PrefixCache(store)
    seq, *_ = filled(store, 16)
    cache.insert(seq, list(range(16)))
    store.free(seq)
    cache.spill()
    other, *_ = filled(store, 32, seed=5)                         # needs all 8 ids: the cached ones are evicted
    t = store.tiers
    assert cache.num_cached == 0
    assert all(t.state[0, b] in (HOT, COLD) for b in other.block_ids)
    t.check()


# -- random operation sequences ---------------------------------------------------------------------

VOCAB = 3


def rows(position: int, token: int, layers=2, H=2, D=4):
    """The K/V of `token` at `position`: a fixed function of both, so a prefix-cache hit reuses equal rows."""
    g = torch.Generator().manual_seed(position * VOCAB + token)
    return torch.randn(2, layers, H, D, generator=g)


class TieredMachine(RuleBasedStateMachine):
    """A prefix-cached store with 3 hot tiles per layer over 20 blocks, against a shadow of token lists.

    The cold file goes through the page cache (`cold_direct=False`): the records, tags and generations are the same,
    and O_DIRECT's own reads are tested above and in the engine's tests. With O_DIRECT, the invariant's reads of
    every block after every operation took 0.6 ms each on this machine's disk: 12 of 27 s per 1,000 operations."""

    runs, checks = 0, 0

    def __init__(self):
        super().__init__()
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        self.store = sk.BlockStore(sk.StoreConfig(num_layers=2, num_kv_heads=2, head_dim=4, block_size=2,
                                                  num_blocks=20, cold_dir=self.dir.name, hot_blocks=3,
                                                  cold_direct=False))
        self.cache = sk.PrefixCache(self.store)
        self.live = {}                     # seq_id -> (Sequence, token list)
        type(self).runs += 1

    def _append(self, seq, tokens, new) -> int:
        """Append `new` after `tokens` in one write (any width, over 3 hot tiles); returns how many went in."""
        start = len(tokens)
        kv = torch.stack([rows(start + i, t) for i, t in enumerate(new)], 2)      # [2, L, T, H, D]
        try:
            self.store.append(seq, kv[0].contiguous(), kv[1].contiguous())
        except sk.StoreFullError:
            return 0
        return len(new)

    def _pick(self, pick):
        return self.live[sorted(self.live)[pick % len(self.live)]]

    @rule(tokens=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=13))   # up to 7 blocks: over the tier
    def new(self, tokens):
        seq = self.store.new_sequence()
        hit = self.cache.attach(seq, tokens)
        if hit < len(tokens) and self._append(seq, tokens[:hit], tokens[hit:]) < len(tokens) - hit:
            self.store.free(seq)                         # out of blocks: drop it
            return
        self.live[seq.seq_id] = (seq, list(tokens))

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6), tokens=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3))
    def append(self, pick, tokens):
        seq, toks = self._pick(pick)
        toks.extend(tokens[:self._append(seq, toks, tokens)])

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6))
    def fork(self, pick):
        seq, toks = self._pick(pick)
        child = self.store.fork(seq)
        self.live[child.seq_id] = (child, list(toks))

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6))
    def finish(self, pick):
        seq, toks = self.live.pop(self._pick(pick)[0].seq_id)
        self.cache.insert(seq, toks)
        self.store.free(seq)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6), which=st.lists(st.integers(0, 50), min_size=1, max_size=3), layer=st.integers(0, 1))
    def route(self, pick, which, layer):
        """Promote a random selection (what a router would), then check attention over it in float64."""
        seq, toks = self._pick(pick)
        sel = sorted({w % seq.num_blocks for w in which})
        blocks = torch.tensor([sel, sel])
        q = torch.randn(4, 4)
        out, _ = sk.sparse_attention(q, self.store, seq, layer, blocks, backend="torch")
        K = torch.stack([rows(i, t)[0, layer] for i, t in enumerate(toks)])
        V = torch.stack([rows(i, t)[1, layer] for i, t in enumerate(toks)])
        torch.testing.assert_close(out.double(), exact_attention(q, K, V, blocks, 2)[0], atol=1e-5, rtol=1e-5)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6), n=st.integers(1, 4))
    def demote(self, pick, n):
        seq, _ = self._pick(pick)
        self.store.spill(seq.block_ids[:n])

    @rule()
    def spill(self):
        self.cache.spill()

    @invariant()
    def reads_return_what_was_written(self):
        for seq, toks in self.live.values():
            assert seq.num_tokens == len(toks)
            for layer in range(2):
                k, v = self.store.gather(seq, layer)
                want = torch.stack([rows(i, t) for i, t in enumerate(toks)], 1)       # [2, T, L, H, D]
                assert torch.equal(k, want[0, :, layer]) and torch.equal(v, want[1, :, layer])

    @invariant()
    def ref_counts_never_drift(self):
        want = [0] * 20
        for seq, _ in self.live.values():
            for b in seq.block_ids:
                want[b] += 1
        assert want == self.store.pool.ref_counts

    @invariant()
    def tiers_are_consistent_and_referenced_blocks_are_never_dropped(self):
        t = self.store.tiers
        t.check()                                      # never hot and cold at once; slots consistent
        for seq, _ in self.live.values():
            assert not (t.state[:, seq.block_ids] == EMPTY).any()
        for b in range(20):
            if self.cache.is_cached(b):                 # a cached block keeps its content in some tier
                assert not (t.state[:, b] == EMPTY).any()
        type(self).checks += 1

    def teardown(self):
        self.store.close()
        self.dir.cleanup()


def test_random_operation_sequences_over_two_tiers():
    # At least 10,000 operations (one invariant check after each): the count per example is random (about 30 of
    # at most 40), so 330 examples fell short once (9,703); batches of 100 run until the count is reached.
    TieredMachine.runs, TieredMachine.checks = 0, 0
    while TieredMachine.checks - TieredMachine.runs < 10_000:
        run_state_machine_as_test(TieredMachine,
                                  settings=settings(max_examples=100, stateful_step_count=40, deadline=None))
    # (what is asserted is the machine's: its invariants after every operation, and each rule's own checks)


# -- the engine ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefetch", [0, 2])
def test_routed_decode_with_a_cold_tier_gives_the_same_tokens(tmp_path, prefetch):
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    prompt = torch.randint(0, model.config.vocab_size, (150,), generator=torch.Generator().manual_seed(0))
    router = sk.Router("minmax", top_k=4)
    hot = sk.Engine(model, router=router, block_size=8, num_blocks=64, progress=False)
    cold = sk.Engine(model, router=router, block_size=8, num_blocks=64, progress=False,
                     cold_dir=str(tmp_path), hot_blocks=6, prefetch=prefetch)
    outs = []
    for engine in (hot, cold):
        seq = engine.new_sequence()
        engine.prefill(seq, prompt)
        outs.append((engine.decode(seq, 24), engine.last_logits(seq)))
    assert outs[0][0] == outs[1][0]
    assert torch.equal(outs[0][1], outs[1][1])
    t = cold.store.tiers
    assert t.num_cold() > 0 and t.stats.promotions > 0            # the decode really read the cold tier
    if prefetch:
        t.wait_prefetches()                                        # reads still queued count once they ran
        assert t.cold.stats.prefetched > 0
    cold.close()


def test_engine_passes_the_tier_through_and_rejects_prefetch_without_one(tmp_path):
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    engine = sk.Engine(model, block_size=8, num_blocks=64, chunk_size=512, cold_dir=str(tmp_path), hot_blocks=5)
    assert engine.store.config.hot_blocks == 5 and engine.config.chunk_size == 512     # a chunk of any width is written
    with pytest.raises(ValueError, match="prefetch reads ahead from a cold tier"):
        sk.Engine(model, block_size=8, num_blocks=64, prefetch=2)
    engine.close()


def test_the_tag_is_the_one_written(tmp_path):
    store = tiered(tmp_path, hot=1, layers=1)
    seq, *_ = filled(store, 8)
    t = store.tiers
    b = seq.block_ids[0]
    with open(t.cold.path, "rb") as f:
        f.seek(t.cold.offset(0, b))
        data = f.read(t.cold.record_bytes)
    generation, tag = t.cold.expected(0, b)
    assert generation == 1                                        # the slot was written once
    assert t.cold._mac(0, b, generation, data) == tag             # keyed BLAKE2b of what is on disk
