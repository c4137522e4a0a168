import pytest
import torch

import sparsekv as sk


def make_store(layers=2, kv_heads=2, head_dim=16, block_size=4, num_blocks=16, dtype=torch.float32, repr_keys=2):
    return sk.BlockStore(sk.StoreConfig(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                                        block_size=block_size, num_blocks=num_blocks, dtype=dtype,
                                        repr_keys=repr_keys))


def rand_kv(store, T, gen=None):
    c = store.config
    shape = (c.num_layers, T, c.num_kv_heads, c.head_dim)
    return (torch.randn(shape, generator=gen).to(c.dtype), torch.randn(shape, generator=gen).to(c.dtype))


def snapshot(store):
    """Everything observable about a store, to prove a rejected call changed nothing."""
    return (store.pool.ref_counts.copy(), store.pool.free_queue(), list(store._fill),
            [(s.seq_id, s.num_tokens, s.block_ids) for s in store.sequences],
            store.k.clone(), store.v.clone(), store.kmin.clone(), store.kmax.clone(), store.kmean.clone())


def assert_same(a, b):
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        else:
            assert x == y


@pytest.fixture
def store():
    return make_store()
