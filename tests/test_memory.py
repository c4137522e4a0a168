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


def _kv_freed_without_the_collector(make) -> bool:
    """Whether the K/V tensors of the store (or engine, or hybrid store) `make()` returns are freed as soon as its
    last reference goes, with the cycle collector off."""
    import gc
    import weakref
    was = gc.isenabled()
    gc.disable()
    try:
        obj = make()
        stores = getattr(getattr(obj, "store", obj), "stores")
        refs = [weakref.ref(t) for s in stores for t in s._kv.values()]
        assert refs
        del obj, stores
        return all(r() is None for r in refs)
    finally:
        if was:
            gc.enable()


def _used_engine(**kw):
    engine = sk.Engine(sk.Model(sk.ModelConfig.from_name("tiny")), block_size=8, num_blocks=32, progress=False, **kw)
    seq = engine.new_sequence()
    engine.prefill(seq, torch.arange(40))
    engine.decode(seq, 3)
    engine.finish(seq)                                   # its blocks stay cached when there is a prefix cache
    return engine


@pytest.mark.parametrize("what", ["store", "store with a prefix cache", "tiered store with a prefix cache",
                                  "hybrid store with a prefix cache", "engine with a prefix cache"])
def test_a_store_s_memory_goes_with_its_last_reference_not_at_the_next_collection(what, tmp_path):
    """No reference cycle holds a store's K/V: notebook 11 built six engines of 2,048 blocks (1.7 GB each on
    SmolLM2), each freed only when the cycle collector ran, and its kernel peaked at 10 GB (a CI run's kernel died).
    The store owns its residency and its pool owns the prefix cache; both point back with weak proxies."""
    from sparsekv.storage.hybrid import HybridStore
    cfg = dict(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, num_blocks=16)

    def with_cache(store):
        cache = sk.PrefixCache(store) if not isinstance(store, HybridStore) else None
        seq = store.new_sequence()
        store.append(seq, torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8))
        if cache is not None:
            cache.insert(seq, list(range(10)))
        store.free(seq)
        return store
    make = {"store": lambda: sk.BlockStore(sk.StoreConfig(**cfg)),
            "store with a prefix cache": lambda: with_cache(sk.BlockStore(sk.StoreConfig(**cfg))),
            "tiered store with a prefix cache": lambda: with_cache(sk.BlockStore(sk.StoreConfig(
                **cfg, cold_dir=str(tmp_path), hot_blocks=3))),
            "hybrid store with a prefix cache": lambda: _hybrid_with_cache(),
            "engine with a prefix cache": lambda: _used_engine(prefix_cache=True)}[what]
    assert _kv_freed_without_the_collector(make)


def _hybrid_with_cache():
    from sparsekv.storage.hybrid import HybridStore
    from sparsekv.storage.hybrid_cache import make_prefix_cache
    store = HybridStore(sk.StoreConfig(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, num_blocks=16),
                        windows=(0, 8))
    cache = make_prefix_cache(store)
    seq = store.new_sequence()
    store.append(seq, torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8))
    cache.insert(seq, list(range(10)))
    store.free(seq)
    return store
