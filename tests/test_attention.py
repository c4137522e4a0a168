"""Every attention path against a float64 computation on fresh random inputs.

Grid: GQA ratios 1, 2, 4, 8; head dims 64 and 128; float32 and bfloat16 storage; odd
lengths with a partial last block, and a single-token sequence.
"""

import pytest
import torch
from conftest import exact_attention, make_store

import sparsekv as sk

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}   # max abs error vs float64 on unit-variance V
GRID = [(g, d, dt, n) for g in (1, 2, 4, 8) for d in (64, 128) for dt in (torch.float32, torch.bfloat16)
        for n in (1, 37)]


exact = exact_attention


def fill(store, n, seed):
    g = torch.Generator().manual_seed(seed)
    c = store.config
    seq = store.new_sequence()
    k = torch.randn(c.num_layers, n, c.num_kv_heads, c.head_dim, generator=g).to(c.dtype)
    v = torch.randn(c.num_layers, n, c.num_kv_heads, c.head_dim, generator=g).to(c.dtype)
    store.append(seq, k, v)
    return seq, g


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("G,D,dtype,n", GRID)
def test_dense_matches_float64(backend, G, D, dtype, n):
    store = make_store(layers=2, kv_heads=2, head_dim=D, block_size=16, num_blocks=8, dtype=dtype)
    seq, g = fill(store, n, seed=hash((G, D, n)) % 1000)
    q = torch.randn(2 * G, D, generator=g).to(dtype)
    K, V = store.gather(seq, 1)
    out = sk.dense_attention(q, store, seq, 1, backend=backend)
    assert out.shape == (2 * G, D) and out.dtype == dtype
    want, _ = exact(q, K, V)
    assert (out.double() - want).abs().max() < TOL[dtype] * (10 if dtype == torch.bfloat16 else 1)


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("G,D,dtype", [(g, d, dt) for g in (1, 2, 4, 8) for d in (64, 128)
                                       for dt in (torch.float32, torch.bfloat16)])
def test_sparse_matches_float64_with_padding_and_partial_block(backend, G, D, dtype):
    store = make_store(layers=1, kv_heads=3, head_dim=D, block_size=16, num_blocks=16, dtype=dtype)
    seq, g = fill(store, 101, seed=G * D)            # 7 blocks, the last holds 5 tokens
    q = torch.randn(3 * G, D, generator=g)
    blocks = torch.tensor([[6, 0, 3, -1], [2, -1, -1, 6], [5, 4, 1, 0]])   # unsorted, padded
    out, res = sk.sparse_attention(q, store, seq, 0, blocks, backend=backend)
    K, V = store.gather(seq, 0)
    want, lse = exact(q, K, V, blocks, 16)
    tol = 2e-5 if dtype == torch.float32 else 1e-5     # K/V already rounded; compute is float32
    assert (out.double() - want).abs().max() < tol
    assert (res.lse.double() - lse).abs().max() < 1e-4
    # bytes: 16 rows per full block, 5 for block 6; K and V; fp32 4 B, bf16 2 B
    rows = (5 + 16 + 16) + (16 + 5) + 16 * 4      # per kv head: {6,0,3}, {2,6}, {5,4,1,0}
    assert res.kv_bytes == 2 * rows * D * store.config.itemsize
    assert res.blocks_read == 9


def test_backends_agree_and_sparse_all_equals_dense():
    store = make_store(layers=1, kv_heads=4, head_dim=64, block_size=8, num_blocks=32)
    seq, g = fill(store, 77, seed=3)
    q = torch.randn(16, 64, generator=g)
    dense = sk.dense_attention(q, store, seq, 0)
    for backend in ("reference", "torch"):
        out, _ = sk.sparse_attention(q, store, seq, 0, sk.all_blocks(store, seq), backend=backend)
        torch.testing.assert_close(out, dense, rtol=0, atol=1e-6)


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("G,D", [(1, 64), (4, 128), (8, 64)])
def test_chunked_prefill_matches_float64(backend, G, D):
    store = make_store(layers=1, kv_heads=2, head_dim=D, block_size=16, num_blocks=16)
    seq, g = fill(store, 45, seed=G)
    T = 13                                           # the last 13 tokens attend causally
    q = torch.randn(T, 2 * G, D, generator=g)
    out = sk.prefill_attention(q, store, seq, 0, backend=backend)
    K, V = store.gather(seq, 0)
    for t in range(T):
        n = 45 - T + t + 1                           # token t sees positions [0, n)
        want, _ = exact(q[t], K[:n], V[:n])
        assert (out[t].double() - want).abs().max() < 2e-5
    # The whole sequence at once (T == N) takes SDPA's causal path.
    full = sk.prefill_attention(torch.randn(45, 2 * G, D, generator=g), store, seq, 0, backend=backend)
    assert full.shape == (45, 2 * G, D) and torch.isfinite(full).all()
    with pytest.raises(ValueError, match="no prefill kernel"):
        sk.prefill_attention(q, store, seq, 0, backend="triton")


@pytest.mark.parametrize("make,exc,words", [
    (lambda s, q: dict(q=q[:, :8]), ValueError, "q must have shape"),
    (lambda s, q: dict(q=q[:3]), ValueError, "multiple of num_kv_heads"),
    (lambda s, q: dict(q=q * float("nan")), ValueError, "finite"),
    (lambda s, q: dict(blocks=torch.tensor([[0], [1]], dtype=torch.int32)), TypeError, "blocks must have dtype"),
    (lambda s, q: dict(blocks=torch.tensor([[0, 9], [1, 2]])), ValueError, "logical indices"),
    (lambda s, q: dict(blocks=torch.tensor([[0, 0], [1, 2]])), ValueError, "twice"),
    (lambda s, q: dict(blocks=torch.tensor([[-1, -1], [1, 2]])), ValueError, "all -1"),
    (lambda s, q: dict(layer=5), ValueError, "layer"),
    (lambda s, q: dict(backend="cuda"), ValueError, "backend must be one of"),
])
def test_bad_attention_arguments_name_the_argument(make, exc, words):
    store = make_store()
    seq = store.new_sequence()
    store.append(seq, torch.randn(2, 10, 2, 16), torch.randn(2, 10, 2, 16))
    q = torch.randn(4, 16)
    args = dict(q=q, layer=0, blocks=torch.tensor([[0, 1], [2, -1]]), backend="auto")
    args.update(make(store, q))
    with pytest.raises(exc, match=words):
        sk.sparse_attention(args["q"], store, seq, args["layer"], args["blocks"], backend=args["backend"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_fast_path_over_fragmented_tables_matches_float64(dtype):
    """Interleaved appends and a copy-on-write fork split block tables into many physical runs."""
    store = make_store(layers=1, kv_heads=2, head_dim=64, block_size=8, num_blocks=64, dtype=dtype)
    g = torch.Generator().manual_seed(11)
    a, b = store.new_sequence(), store.new_sequence()
    for T in (13, 5, 9, 20, 3):                     # alternate: a and b take turns allocating blocks
        for seq in (a, b):
            store.append(seq, torch.randn(1, T, 2, 64, generator=g).to(dtype), torch.randn(1, T, 2, 64, generator=g).to(dtype))
    c = store.fork(a)
    store.append(c, torch.randn(1, 6, 2, 64, generator=g).to(dtype), torch.randn(1, 6, 2, 64, generator=g).to(dtype))
    for seq in (a, b, c):
        assert len(store.physical_runs(seq)) > 1
        q = torch.randn(8, 64, generator=g)
        K, V = store.gather(seq, 0)
        want, _ = exact(q, K, V)
        got = sk.dense_attention(q, store, seq, 0, backend="torch")
        assert (got.double() - want).abs().max() < 2e-5


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("G,D", [(1, 64), (4, 128), (8, 64)])
def test_batched_decode_matches_per_sequence_float64(backend, G, D):
    store = make_store(layers=1, kv_heads=2, head_dim=D, block_size=16, num_blocks=64)
    g = torch.Generator().manual_seed(G + D)
    seqs = []
    for n in (1, 37, 100, 64):                       # different lengths, one single-token, one exact fit
        s = store.new_sequence()
        store.append(s, torch.randn(1, n, 2, D, generator=g), torch.randn(1, n, 2, D, generator=g))
        seqs.append(s)
    q = torch.randn(4, 2 * G, D, generator=g)
    blocks = [torch.tensor([[0], [0]]), torch.tensor([[2, 0], [1, -1]]),
              torch.tensor([[6, 3, 0], [5, -1, -1]]), torch.tensor([[3, 1], [0, 2]])]
    out, lse = sk.batch_attention(q, store, seqs, 0, blocks, backend=backend)
    dense, _ = sk.batch_attention(q, store, seqs, 0, None, backend=backend)
    for b, seq in enumerate(seqs):
        K, V = store.gather(seq, 0)
        want, want_lse = exact(q[b], K, V, blocks[b], 16)
        assert (out[b].double() - want).abs().max() < 2e-5
        assert (lse[b].double() - want_lse).abs().max() < 1e-4
        assert (dense[b].double() - exact(q[b], K, V)[0]).abs().max() < 2e-5


def test_batched_decode_rejects_mismatched_blocks():
    store = make_store()
    s = store.new_sequence()
    store.append(s, torch.randn(2, 5, 2, 16), torch.randn(2, 5, 2, 16))
    with pytest.raises(ValueError, match="one selection per sequence"):
        sk.batch_attention(torch.randn(1, 4, 16), store, [s], 0, [])
    with pytest.raises(ValueError, match="q must have shape"):
        sk.batch_attention(torch.randn(2, 4, 16), store, [s], 0)
