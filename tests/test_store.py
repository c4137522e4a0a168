"""The block store: exact block ids, ref counts, copy-on-write, summaries, atomic rejection."""
import pytest
import torch
from conftest import assert_same, make_store, rand_kv, snapshot

import sparsekv as sk


def test_append_allocates_in_free_queue_order_and_reads_back(store):
    seq = store.new_sequence()
    k, v = rand_kv(store, 10)                       # 10 tokens, block 4 -> 3 blocks
    store.append(seq, k, v)
    assert seq.block_ids == [0, 1, 2]               # taken from the front of the queue, in order
    assert seq.num_tokens == 10
    assert store.num_free_blocks == 13
    for layer in range(2):
        K, V = store.gather(seq, layer)
        assert torch.equal(K, k[layer]) and torch.equal(V, v[layer])   # invariant 2: lossless


def test_tiles_are_contiguous_block_size_by_head_dim(store):
    tile = store.k[1, 3, 0]
    assert tile.shape == (4, 16) and tile.is_contiguous()
    assert store.k.stride(1) == 4 * 16               # head-major: the next block of a head is the next tile
    run = store.k[0, 2:5, 1]                         # three consecutive blocks of kv head 1
    assert run.reshape(3 * 4, 16).data_ptr() == run.data_ptr()   # one contiguous [3 * bs, D] matrix
    assert store.kmax[0].transpose(0, 1).is_contiguous()         # summaries head-major too


def test_fork_shares_then_copy_on_write(store):
    parent = store.new_sequence()
    k, v = rand_kv(store, 6)                         # blocks [0 full, 1 partial(2)]
    store.append(parent, k, v)
    child = store.fork(parent)
    assert child.block_ids == [0, 1]                 # invariant 3: shared, nothing copied
    assert store.pool.ref_counts[:2] == [2, 2]
    store.append(child, *rand_kv(store, 1))          # writes into shared partial block 1
    assert child.block_ids == [0, 2]                 # invariant 4: block 1 copied to block 2
    assert store.pool.ref_counts[:3] == [2, 1, 1]
    assert torch.equal(store.gather(parent, 0)[0], k[0])            # parent untouched
    assert torch.equal(store.gather(child, 0)[0][:6], k[0])         # child kept the prefix


def test_full_blocks_shared_without_copy(store):
    parent = store.new_sequence()
    store.append(parent, *rand_kv(store, 8))         # two full blocks
    child = store.fork(parent)
    store.append(child, *rand_kv(store, 1))          # invariant 5: a new block, no copy
    assert child.block_ids == [0, 1, 2] and parent.block_ids == [0, 1]


def test_free_returns_blocks_in_logical_order(store):
    a = store.new_sequence()
    store.append(a, *rand_kv(store, 12))             # blocks 0,1,2
    b = store.fork(a)
    assert store.free(a) == []                       # still referenced by b
    assert store.free(b) == [0, 1, 2]                # invariant 6
    assert store.pool.free_queue()[-3:] == [0, 1, 2]
    assert store.num_free_blocks == 16


def test_summaries_match_valid_rows_including_partial_block():
    store = make_store(block_size=8, repr_keys=3)
    seq = store.new_sequence()
    for T in (5, 1, 7, 2):                           # grows across block boundaries
        store.append(seq, *rand_kv(store, T))
    for layer in range(2):
        K, _ = store.gather(seq, layer)
        for j, b in enumerate(seq.block_ids):
            rows = K[j * 8:(j + 1) * 8]              # valid rows only (last block partial)
            for h in range(2):
                x = rows[:, h]
                assert torch.equal(store.kmin[layer, b, h], x.amin(0))
                assert torch.equal(store.kmax[layer, b, h], x.amax(0))
                assert torch.allclose(store.kmean[layer, b, h], x.mean(0), atol=1e-6)
                far = (x - x.mean(0)).norm(dim=-1).topk(min(3, len(x))).indices
                got = store.krepr[layer, b, h]
                for i in far:                        # each of the farthest keys is a representative
                    assert any(torch.equal(x[i], r) for r in got)


def test_store_full_error_reports_needed_and_free_and_changes_nothing(store):
    seq = store.new_sequence()
    store.append(seq, *rand_kv(store, 60))           # 15 of 16 blocks
    before = snapshot(store)
    with pytest.raises(sk.StoreFullError) as e:
        store.append(seq, *rand_kv(store, 9))        # needs 3 blocks, 1 free
    assert (e.value.needed, e.value.free) == (3, 1)
    assert "needs 3 blocks" in str(e.value) and "1 are free" in str(e.value)
    assert_same(before, snapshot(store))


def test_store_full_counts_copy_on_write_block():
    store = make_store(num_blocks=2)
    a = store.new_sequence()
    store.append(a, *rand_kv(store, 3))
    b = store.fork(a)
    store.append(b, *rand_kv(store, 1))              # uses the last free block for the copy
    c = store.fork(b)
    with pytest.raises(sk.StoreFullError) as e:
        store.append(c, *rand_kv(store, 1))
    assert (e.value.needed, e.value.free) == (1, 0)


BAD_APPENDS = [
    ("k", lambda s: (torch.randn(2, 3, 2), torch.randn(2, 3, 2)), ValueError, "rank 4"),
    ("k", lambda s: (torch.randn(2, 3, 3, 16), torch.randn(2, 3, 3, 16)), ValueError, "shape"),
    ("k", lambda s: (torch.randn(2, 3, 2, 8), torch.randn(2, 3, 2, 8)), ValueError, "shape"),
    ("k", lambda s: (torch.randn(2, 3, 2, 16, dtype=torch.float64), torch.randn(2, 3, 2, 16)), TypeError, "dtype"),
    ("v", lambda s: (torch.randn(2, 3, 2, 16), torch.randn(2, 4, 2, 16)), ValueError, "shape"),
    ("k", lambda s: (torch.full((2, 3, 2, 16), float("nan")), torch.randn(2, 3, 2, 16)), ValueError, "finite"),
    ("v", lambda s: (torch.randn(2, 3, 2, 16), torch.full((2, 3, 2, 16), float("inf"))), ValueError, "finite"),
    ("k", lambda s: ([[1.0]], torch.randn(2, 3, 2, 16)), TypeError, "torch.Tensor"),
    ("k", lambda s: (torch.randn(2, 0, 2, 16), torch.randn(2, 0, 2, 16)), ValueError, "at least one token"),
]


@pytest.mark.parametrize("arg,make,exc,words", BAD_APPENDS)
def test_bad_append_is_rejected_atomically(store, arg, make, exc, words):
    seq = store.new_sequence()
    store.append(seq, *rand_kv(store, 5))
    before = snapshot(store)
    k, v = make(store)
    with pytest.raises(exc, match=words) as e:
        store.append(seq, k, v)
    assert arg in str(e.value)
    assert_same(before, snapshot(store))


def test_freed_and_foreign_sequences_are_rejected(store):
    seq = store.new_sequence()
    store.append(seq, *rand_kv(store, 3))
    store.free(seq)
    with pytest.raises(ValueError, match="freed"):
        store.append(seq, *rand_kv(store, 1))
    with pytest.raises(ValueError, match="freed"):
        store.gather(seq, 0)
    other = make_store().new_sequence()
    with pytest.raises(ValueError, match="another store"):
        store.fork(other)
    with pytest.raises(TypeError, match="seq must be a Sequence"):
        store.free(3)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(block_size=48), ValueError, "power of two"),
    (dict(block_size=0), ValueError, "block_size"),
    (dict(num_blocks=0), ValueError, "num_blocks"),
    (dict(dtype=torch.int32), TypeError, "floating"),
    (dict(dtype="float8"), ValueError, "dtype"),
    (dict(head_dim=2.5), TypeError, "head_dim"),
])
def test_bad_config_names_the_field(kwargs, exc, words):
    base = dict(num_layers=1, num_kv_heads=1, head_dim=8)
    with pytest.raises(exc, match=words):
        sk.StoreConfig(**{**base, **kwargs})


def test_layerwise_write_rejects_wrong_head_dim_and_layer(store):
    seq = store.new_sequence()
    res = store.reserve(seq, 3)
    before = snapshot(store)
    with pytest.raises(ValueError, match="k must have shape"):
        store.write(res, 0, torch.randn(3, 2, 8), torch.randn(3, 2, 8))
    with pytest.raises(ValueError, match="layer must be <= 1"):
        store.write(res, 2, torch.randn(3, 2, 16), torch.randn(3, 2, 16))
    assert_same(before, snapshot(store))
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    store.write(res, 0, k, v)
    assert torch.equal(store.gather(seq, 0)[0], k)


def test_summary_bytes_reported_apart_from_kv(store):
    c = store.config
    assert store.kv_bytes() == 2 * c.num_layers * c.num_blocks * c.num_kv_heads * c.block_size * c.head_dim * 4
    assert store.summary_bytes() == c.num_layers * c.num_blocks * c.num_kv_heads * (3 + c.repr_keys) * c.head_dim * 4


@pytest.mark.parametrize("dtype,summary_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                                 (torch.float32, torch.bfloat16), (torch.float16, torch.bfloat16)])
def test_one_token_writes_extend_minmax_summaries_exactly_as_a_recompute(dtype, summary_dtype):
    """Invariant 8 on the decode path: a store keeping only kmin/kmax extends them in place on one-token writes
    (`Summary.extend`); after every write they equal a second store's, which recomputes them from the tiles
    (kmean kept there forces the recompute), bit for bit, across block boundaries and a fork's copy-on-write."""
    base = dict(num_layers=2, num_kv_heads=3, head_dim=24, block_size=4, num_blocks=32, dtype=dtype,
                summary_dtype=summary_dtype, repr_keys=0)
    fast = sk.BlockStore(sk.StoreConfig(**base, summaries=("kmin", "kmax")))
    slow = sk.BlockStore(sk.StoreConfig(**base, summaries=("kmin", "kmax", "kmean")))
    assert fast._extend and not slow._extend
    g = torch.Generator().manual_seed(5)
    k0, v0 = torch.randn(2, 6, 3, 24, generator=g).to(dtype), torch.randn(2, 6, 3, 24, generator=g).to(dtype)
    seqs = {}
    for name, st in (("fast", fast), ("slow", slow)):
        s = st.new_sequence()
        st.append(s, k0, v0)                           # a prefill: 6 tokens, a partial second block
        seqs[name] = [s, st.fork(s)]                   # the fork's first write copies the shared partial block
    for step in range(11):
        k, v = torch.randn(2, 1, 3, 24, generator=g).to(dtype), torch.randn(2, 1, 3, 24, generator=g).to(dtype)
        for name, st in (("fast", fast), ("slow", slow)):
            seq = seqs[name][step % 2]
            res = st.reserve(seq, 1)
            for layer in range(2):
                st.write(res, layer, k[layer], v[layer])
        for b in set(seqs["fast"][0].block_ids) | set(seqs["fast"][1].block_ids):
            for name in ("kmin", "kmax"):
                assert torch.equal(fast.summary(name)[:, b], slow.summary(name)[:, b]), (step, b, name)
    assert seqs["fast"][0].block_ids == seqs["slow"][0].block_ids       # the same blocks on both stores
