"""Hierarchical routing (routing.hierarchy): its definition in float64, flat routing as its two limits, the bytes it
reads, and a cache of coarse summaries that follows the sequence's blocks."""
import math

import pytest
import torch

import sparsekv as sk
from sparsekv.core.traffic import hierarchical_vectors
from sparsekv.routing.hierarchy import GroupIndex, HierarchicalMinMaxScorer, hierarchical
from sparsekv.routing.scorers import ScoreInput, make_scorer


def setup(n, H, G, D, bs, seed, dtype=torch.float32):
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs,
                                         num_blocks=-(-n // bs) + 4, dtype=dtype))
    g = torch.Generator().manual_seed(seed)
    seq = store.new_sequence()
    k = torch.randn(1, n, H, D, generator=g) * (1 + torch.rand(1, n, H, 1, generator=g))
    store.append(seq, k.to(dtype), torch.randn(1, n, H, D, generator=g).to(dtype))
    return store, seq, torch.randn(H * G, D, generator=g) * 2


def inp_of(store, seq, q):
    c = store.config
    return ScoreInput(q.float().view(c.num_kv_heads, -1, c.head_dim), store, seq, 0, store.block_table(seq))


def reference(store, seq, q, group, keep):
    """The module docstring's definition in float64, written out block by block."""
    c = store.config
    H, D = c.num_kv_heads, c.head_dim
    qd = q.double().view(H, -1, D)
    table = store.block_table(seq)
    lo = store.kmin[0][table].double().transpose(0, 1)                     # [H, nb, D]
    hi = store.kmax[0][table].double().transpose(0, 1)
    bound = lambda a, b: (qd.clamp(min=0) @ b.transpose(1, 2) + qd.clamp(max=0) @ a.transpose(1, 2)) / math.sqrt(D)
    fine = bound(lo, hi)                                                   # [H, G, nb]
    ng = (seq.num_tokens // c.block_size) // group           # complete groups of full blocks
    out = fine.clone()
    for h in range(H):
        coarse = torch.stack([bound(lo[:, j * group:(j + 1) * group].amin(1, keepdim=True),
                                    hi[:, j * group:(j + 1) * group].amax(1, keepdim=True))[h, :, 0]
                              for j in range(ng)], -1) if ng else torch.zeros(qd.shape[1], 0, dtype=torch.float64)
        mass = coarse.softmax(-1).mean(0)
        kept = sorted(range(ng), key=lambda j: (-float(mass[j]), j))[:keep]
        for j in range(ng):
            if j not in kept:
                out[h, :, j * group:(j + 1) * group] = coarse[:, j:j + 1] - math.log(group)
    return out


@pytest.mark.parametrize("G", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_logits_match_the_float64_definition(G, D):
    for seed, (n, group, keep) in enumerate([(37 * 16 + 5, 4, 2), (29 * 16 + 11, 3, 1), (61 * 16 + 1, 7, 3)]):
        store, seq, q = setup(n, 2, G, D, 16, seed + 10 * G + D)
        scorer = HierarchicalMinMaxScorer(group, keep)
        got = scorer.logits(inp_of(store, seq, q), "torch", None)
        want = reference(store, seq, q, group, keep)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        ref = scorer.logits(inp_of(store, seq, q), "reference", None)
        torch.testing.assert_close(ref.double(), want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


def selection(name, store, seq, q, k):
    return sk.Router(name, top_k=k).select(q, store, seq, 0)


@pytest.mark.parametrize("seed", range(4))
def test_groups_of_one_block_route_exactly_as_flat_minmax(seed):
    store, seq, q = setup(53 * 16 + 7, 3, 4, 64, 16, seed)
    for k in (2, 5, 16):
        flat, hier = selection("minmax", store, seq, q, k), selection(hierarchical(1, 3), store, seq, q, k)
        assert torch.equal(flat.blocks, hier.blocks), k
        torch.testing.assert_close(hier.mass, flat.mass, rtol=1e-5, atol=1e-7)
        assert hier.traffic.summary_bytes == flat.traffic.summary_bytes


@pytest.mark.parametrize("seed", range(4))
def test_refining_every_group_routes_exactly_as_flat_minmax(seed):
    store, seq, q = setup(41 * 16 + 3, 2, 3, 128, 16, seed)
    name = hierarchical(4, 11)                            # 10 complete groups of 4, all refined, and the tail
    for k in (3, 8):
        flat, hier = selection("minmax", store, seq, q, k), selection(name, store, seq, q, k)
        assert torch.equal(flat.blocks, hier.blocks), k
        torch.testing.assert_close(hier.mass, flat.mass, rtol=1e-5, atol=1e-7)


def test_a_budget_covering_every_block_gives_dense_attention():
    store, seq, q = setup(30 * 16 + 9, 2, 4, 64, 16, 3)
    sel = sk.Router(hierarchical(4, 1), top_k=seq.num_blocks).select(q, store, seq, 0)
    out, _ = sk.sparse_attention(q, store, seq, 0, sel.blocks)
    torch.testing.assert_close(out, sk.dense_attention(q, store, seq, 0), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_byte_model_counts_the_tiles_a_step_reads(dtype):
    for n, group, keep in ((57 * 16 + 9, 8, 2), (16 * 16, 4, 9), (5 * 16 + 1, 8, 2)):
        store, seq, q = setup(n, 2, 4, 64, 16, n, dtype)
        name = hierarchical(group, keep)
        router = sk.Router(name, top_k=4)
        sel = router.select(q, store, seq, 0)
        c = store.config
        read = 2 * router.scorer.last_read_tiles * c.num_kv_heads * c.head_dim * c.summary_itemsize
        assert sel.traffic.summary_bytes == read
        assert read == hierarchical_vectors(seq.num_tokens, 16, group, keep) * 2 * 64 * c.summary_itemsize
    flat = sk.Router("minmax", top_k=4).select(q, store, seq, 0).traffic.summary_bytes
    assert hierarchical_vectors(seq.num_tokens, 16, 1, 5) * 2 * 64 * c.summary_itemsize == flat


def test_coarse_summaries_are_built_once_and_follow_appends():
    store, seq, q = setup(20 * 16 + 3, 2, 2, 64, 16, 5)
    router = sk.Router(hierarchical(4, 2), top_k=4)
    router.select(q, store, seq, 0)
    ix = next(iter(router.scorer._index.values()))
    assert ix.num_groups == 5 and ix.built_blocks == 20
    g = torch.Generator().manual_seed(9)
    for _ in range(4 * 16):                                 # four more blocks, one group more
        store.append(seq, torch.randn(1, 1, 2, 64, generator=g), torch.randn(1, 1, 2, 64, generator=g))
        router.select(q, store, seq, 0)
    assert ix.num_groups == 6 and ix.built_blocks == 24     # no group rebuilt
    table = store.block_table(seq)
    kmin, kmax = store.kmin[0], store.kmax[0]
    torch.testing.assert_close(ix.lo, kmin[table[:24]].view(6, 4, 2, 64).amin(1).transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(ix.hi, kmax[table[:24]].view(6, 4, 2, 64).amax(1).transpose(0, 1), rtol=0, atol=0)


def test_a_changed_block_id_rebuilds_its_group_and_every_later_one():
    store, seq, q = setup(16 * 16, 1, 1, 64, 16, 6)
    table = store.block_table(seq)
    ix = GroupIndex(seq, 4, 1, 64, torch.float32, torch.device("cpu"))
    ix.update(store.kmin[0], store.kmax[0], table, 16)
    moved = table.clone()
    moved[[5, 6]] = moved[[6, 5]]                          # same blocks, another order inside group 1: same bounds
    moved[9] = table[0]                                    # group 2 now holds another block
    ix.update(store.kmin[0], store.kmax[0], moved, 16)
    assert ix.built_blocks == 16 + 12                      # groups 1, 2 and 3 rebuilt
    want = store.kmin[0][moved].view(4, 4, 1, 64).amin(1).transpose(0, 1)
    torch.testing.assert_close(ix.lo, want, rtol=0, atol=0)


def test_a_fork_gets_its_own_index_and_the_same_blocks():
    store, seq, q = setup(24 * 16 + 5, 2, 2, 64, 16, 7)
    router = sk.Router(hierarchical(4, 2), top_k=6)
    a = router.select(q, store, seq, 0).blocks
    child = store.fork(seq)
    b = router.select(q, store, child, 0).blocks
    assert torch.equal(a, b) and len(router.scorer._index) == 2


@pytest.mark.parametrize("args,exc,words", [((0, 2), ValueError, "group must be >= 1"),
                                            ((4, 0), ValueError, "keep must be >= 1"),
                                            ((4.0, 2), TypeError, "group must be an int")])
def test_bad_group_or_keep_is_refused(args, exc, words):
    before = set(sk.ROUTERS)
    with pytest.raises(exc, match=words):
        hierarchical(*args)
    assert set(sk.ROUTERS) == before


def test_a_variant_is_an_instance_named_by_its_parameters():
    """(Invariant 1 of HierarchicalMinMaxScorer) the name spells (group, keep), the defaults keep the bare family name,
    and reading a name back gives an equal scorer; nothing is registered on the way."""
    before = dict(sk.SCORERS)
    assert hierarchical(64, 4) == HierarchicalMinMaxScorer(group=64, keep=4) and hierarchical(64, 4).name == \
        "hminmax-g64-k4"
    assert hierarchical(16, 8).name == HierarchicalMinMaxScorer().name == "hminmax"          # the defaults
    assert make_scorer("hminmax-g64-k4") == hierarchical(64, 4) != hierarchical(64, 2)
    assert make_scorer("hminmax-g16-k8").name == "hminmax"                                   # read, then named plainly
    assert hash(make_scorer("hminmax-g64-k4")) == hash(hierarchical(64, 4))
    assert sk.Router("hminmax-g64-k4", top_k=4).scorer.name == "hminmax-g64-k4"
    assert dict(sk.SCORERS) == before and "hminmax-g64-k4" not in sk.SCORERS


@pytest.mark.parametrize("name", ["hminmax", "hminmax-g4-k2", "hminmax-g3-k1", "minmax", "mean", "halves", "oracle"])
@pytest.mark.parametrize("gqa", ["shared", "per_head"])
def test_a_scorer_given_as_an_instance_routes_as_its_name_does(name, gqa):
    cfg = sk.StoreConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, num_blocks=40,
                         summaries=("kmin", "kmax", "kmean", "khalf"))
    store = sk.BlockStore(cfg)
    g = torch.Generator().manual_seed(7)
    seq = store.new_sequence()
    store.append(seq, torch.randn(1, 33 * 16 + 5, 2, 64, generator=g), torch.randn(1, 33 * 16 + 5, 2, 64, generator=g))
    q = torch.randn(8, 64, generator=g)
    by_name = sk.Router(name, token_budget=96, gqa=gqa)
    by_instance = sk.Router(make_scorer(name), token_budget=96, gqa=gqa)
    assert type(by_instance.scorer) is type(by_name.scorer) and by_instance.scorer.name == by_name.scorer.name == name
    for _ in range(2):                                      # the second step reads the hierarchical cache
        a, b = by_name.select(q, store, seq, 0), by_instance.select(q, store, seq, 0)
        assert torch.equal(a.blocks, b.blocks) and torch.equal(a.mass, b.mass) and a.traffic == b.traffic


def test_summary_reads_stop_growing_with_the_fine_level():
    """At 1M tokens in blocks of 64 (16,384 blocks), groups of 64 blocks and 3 refined read 896 vectors per kv head
    against flat routing's 32,768: the byte model's arithmetic, which test_the_byte_model_counts_the_tiles_a_step_reads
    ties to the tiles actually read."""
    assert hierarchical_vectors(2**20, 64, 64, 3) == 2 * (256 + 3 * 64)
    assert hierarchical_vectors(2**20, 64, 1, 3) == 2 * 16384
    assert hierarchical_vectors(2**20 + 1, 64, 64, 3) == 2 * (256 + 3 * 64 + 1)     # the partial block, refined
