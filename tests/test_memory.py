"""Peak extra allocation of decode steps, measured with the torch profiler at a modest size."""
import pytest
import torch
from conftest import make_store

import sparsekv as sk
from sparsekv.core.profiling import peak_allocated_bytes


@pytest.fixture(scope="module")
def big():
    store = make_store(layers=1, kv_heads=4, head_dim=64, block_size=32, num_blocks=520, repr_keys=0)
    seq = store.new_sequence()
    g = torch.Generator().manual_seed(0)
    store.append(seq, torch.randn(1, 16_000, 4, 64, generator=g), torch.randn(1, 16_000, 4, 64, generator=g))
    return store, seq, torch.randn(16, 64, generator=g)


def test_sparse_step_allocates_a_small_multiple_of_the_selected_bytes(big):
    store, seq, q = big
    router = sk.Router("minmax", token_budget=1024)
    blocks = router.select(q, store, seq, 0).blocks
    selected = 2 * int((blocks >= 0).sum()) * 32 * 64 * 4           # K and V tiles read
    step = lambda: sk.sparse_attention(q, store, seq, 0, router.select(q, store, seq, 0).blocks)
    cold = peak_allocated_bytes(step)                                # first call sizes the workspace
    warm = peak_allocated_bytes(step)
    assert cold <= 3 * selected, (cold, selected)
    assert warm <= selected, (warm, selected)                        # scratch reused: scores and outputs only


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_step_never_copies_the_cache(dtype):
    store = make_store(layers=1, kv_heads=4, head_dim=64, block_size=32, num_blocks=520, dtype=dtype, repr_keys=0)
    seq = store.new_sequence()
    store.append(seq, torch.randn(1, 16_000, 4, 64).to(dtype), torch.randn(1, 16_000, 4, 64).to(dtype))
    q = torch.randn(16, 64)
    kv = 2 * 16_000 * 4 * 64 * store.config.itemsize
    sk.dense_attention(q, store, seq, 0)
    peak = peak_allocated_bytes(lambda: sk.dense_attention(q, store, seq, 0))
    # float32: only the scores ([H, G, N], G / (2 D) of the K/V bytes). bf16 adds at most two
    # fixed-size conversion chunks (K and V), whatever the context length.
    chunks = 0 if dtype == torch.float32 else 2 * sk.attention.decode.CONVERT_CHUNK_BYTES
    assert peak < 0.25 * kv + chunks, (peak, kv)
