"""Scorers and selectors on constructed cases whose right answer is known exactly."""
import math

import pytest
import torch
from conftest import make_store

import sparsekv as sk
from sparsekv import metrics, probes

QUERY_AWARE = [n for n, c in sk.ROUTERS.items() if c.query_aware]


def random_labels(L, H, D, r, seed=0):
    """Random label channels (the `labels` scorer's calibration), r per kv head."""
    from sparsekv.storage.summaries import LabelChannels
    g = torch.Generator().manual_seed(1000 + seed)
    return LabelChannels(tuple(tuple(tuple(torch.randperm(D, generator=g)[:r].tolist()) for _ in range(H))
                               for _ in range(L)), "random")


def random_setup(n=203, H=2, G=4, D=32, bs=16, seed=0, dtype=torch.float32):
    """Every scorer's summaries, the label cache (random channels, r = 2 D / bs: Quest's bytes) and the half-block
    means included."""
    from sparsekv.storage.summaries import DEFAULT_SUMMARIES
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=64,
                                         dtype=dtype, repr_keys=3, summaries=DEFAULT_SUMMARIES + ("klabel", "khalf"),
                                         labels=random_labels(1, H, D, 2 * D // bs, seed)))
    g = torch.Generator().manual_seed(seed)
    seq = store.new_sequence()
    store.append(seq, (2 * torch.randn(1, n, H, D, generator=g)).to(dtype), torch.randn(1, n, H, D, generator=g).to(dtype))
    return store, seq, torch.randn(H * G, D, generator=g) * 2


def probe_store(p, bs=16):
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=p.k.shape[1], head_dim=p.k.shape[2],
                                         block_size=bs, num_blocks=p.k.shape[0] // bs + 2))
    return store, p.write(store)


def test_registry_lists_every_scorer():
    assert set(sk.ROUTERS) == {"minmax", "mean", "halves", "repr", "labels", "oracle", "recency", "random", "hminmax"}


@pytest.mark.parametrize("scorer", QUERY_AWARE)
def test_top_p_one_selects_every_block(scorer):
    store, seq, q = random_setup()
    sel = sk.Router(scorer, top_p=1.0).select(q, store, seq, 0)
    assert sel.blocks.tolist() == [list(range(seq.num_blocks))] * 2


@pytest.mark.parametrize("scorer", list(sk.ROUTERS))
def test_forced_blocks_always_read_and_count_toward_budget(scorer):
    store, seq, q = random_setup()                   # 13 blocks, the last partial (11 tokens)
    sel = sk.Router(scorer, top_k=5, sink_blocks=2, local_blocks=2).select(q, store, seq, 0)
    for row in sel.blocks.tolist():
        assert len(row) == 5 and -1 not in row       # exactly the budget, sinks and locals included
        assert {0, 1, 11, 12} <= set(row)
        assert row == sorted(row)


def test_token_budget_converts_to_blocks():
    store, seq, q = random_setup()
    sel = sk.Router("minmax", token_budget=70).select(q, store, seq, 0)   # 70 // 16 = 4 blocks
    assert sel.num_selected.tolist() == [4, 4]


def test_oracle_mass_recall_is_never_below_any_scorer_at_the_same_k():
    for seed in range(5):
        store, seq, q = random_setup(seed=seed)
        mass = sk.block_attention_mass(q, store, seq, 0)
        for k in (2, 4, 7):
            # Compare with the group-shared selection both sides, forced blocks off except one local.
            best = metrics.attention_mass_recall(mass, sk.Router("oracle", top_k=k, sink_blocks=0).select(
                q, store, seq, 0).blocks).view(2, 4).mean(1)
            for name in sk.ROUTERS:
                other = metrics.attention_mass_recall(mass, sk.Router(name, top_k=k, sink_blocks=0).select(
                    q, store, seq, 0).blocks).view(2, 4).mean(1)
                assert (best >= other - 1e-6).all(), (seed, k, name)


def test_minmax_finds_the_washout_needle_that_mean_misses():
    p = probes.washout(probes.ProbeConfig(length=1024, head_dim=64, seed=1), depth=0.43, block_size=16)
    store, seq = probe_store(p)
    needle = p.needle_blocks(16)
    blocks = {n: sk.Router(n, top_k=4).select(p.q, store, seq, 0).blocks for n in ("minmax", "mean")}
    assert metrics.needle_recall(blocks["minmax"], needle) == 1.0
    assert metrics.needle_recall(blocks["mean"], needle) == 0.0


def test_mean_is_fooled_by_near_duplicate_distractors_and_minmax_is_not():
    p = probes.needle(probes.ProbeConfig(length=2048, head_dim=64, seed=2), depth=0.5, distractor_sim=0.3,
                      distractor_blocks=8, block_size=16)
    store, seq = probe_store(p)
    needle = p.needle_blocks(16)
    assert metrics.needle_recall(sk.Router("minmax", top_k=6).select(p.q, store, seq, 0).blocks, needle) == 1.0
    assert metrics.needle_recall(sk.Router("mean", top_k=6).select(p.q, store, seq, 0).blocks, needle) == 0.0


def test_minmax_logit_is_an_upper_bound_on_every_key_in_the_block():
    store, seq, q = random_setup(seed=3)
    sel = sk.Router("minmax", top_p=1.0)
    inp = sk.routing.scorers.ScoreInput(q.view(2, 4, 32), store, seq, 0, store.block_table(seq))
    bound = sel.scorer.logits(inp, "torch", None) * math.sqrt(32)          # [H, G, nb]
    K, _ = store.gather(seq, 0)
    for j in range(seq.num_blocks):
        rows = K[j * 16:(j + 1) * 16]                                         # [n, H, D]
        qk = torch.einsum("hgd,nhd->hgn", q.view(2, 4, 32), rows).amax(-1)
        assert (bound[:, :, j] >= qk - 1e-4).all()


@pytest.mark.parametrize("scorer", ["minmax", "mean", "halves", "repr", "oracle"])
def test_scoring_backends_agree(scorer):
    store, seq, q = random_setup(seed=4)
    r = sk.Router(scorer, top_k=4)
    a = r.select(q, store, seq, 0, backend="reference")
    b = r.select(q, store, seq, 0, backend="torch")
    torch.testing.assert_close(a.mass, b.mass, rtol=1e-5, atol=1e-6)
    assert torch.equal(a.blocks, b.blocks)


def test_mean_and_repr_scores_match_their_definitions():
    store, seq, q = random_setup(seed=5)
    K, _ = store.gather(seq, 0)
    qg = q.view(2, 4, 32)
    inp = sk.routing.scorers.ScoreInput(qg, store, seq, 0, store.block_table(seq))
    mean = sk.routing.scorers.MeanScorer().logits(inp, "torch", None) * math.sqrt(32)
    rep = sk.routing.scorers.ReprScorer().logits(inp, "torch", None) * math.sqrt(32)
    for j in range(seq.num_blocks):
        rows = K[j * 16:(j + 1) * 16]
        torch.testing.assert_close(mean[:, :, j], torch.einsum("hgd,hd->hg", qg, rows.mean(0)), atol=1e-4, rtol=1e-5)
        far = (rows - rows.mean(0)).norm(dim=-1).topk(3, dim=0).indices      # [3, H] the stated rule
        for h in range(2):
            want = (qg[h] @ rows[far[:, h], h].T).amax(-1)
            torch.testing.assert_close(rep[h, :, j], want, atol=1e-4, rtol=1e-5)


def test_recency_reads_the_latest_blocks_and_random_is_seeded():
    store, seq, q = random_setup()
    assert sk.Router("recency", top_k=4).select(q, store, seq, 0).blocks.tolist() == [[0, 10, 11, 12]] * 2
    a = sk.Router("random", top_k=5, seed=7).select(q, store, seq, 0).blocks
    b = sk.Router("random", top_k=5, seed=7).select(q, store, seq, 0).blocks
    assert torch.equal(a, b)


def test_threshold_margins():
    store, seq, q = random_setup()
    tight = sk.Router("oracle", threshold=0.0, sink_blocks=0).select(q, store, seq, 0)
    top1 = sk.Router("oracle", top_k=2, sink_blocks=0).select(q, store, seq, 0)   # best + local
    assert set(tight.blocks[0].tolist()) - {-1} <= set(top1.blocks[0].tolist())
    loose = sk.Router("oracle", threshold=1e6).select(q, store, seq, 0)
    assert loose.num_selected.tolist() == [seq.num_blocks] * 2


def test_adaptive_reads_fewer_blocks_on_a_peaked_query_and_k_on_a_diffuse_one():
    p = probes.needle(probes.ProbeConfig(length=1024, head_dim=64, strength=20, seed=3), depth=0.5)
    store, seq = probe_store(p)
    peaked = sk.Router("minmax", top_k=12, adaptive_mass=0.9).select(p.q, store, seq, 0)
    assert peaked.num_selected.max() < 12
    assert metrics.needle_recall(peaked.blocks, p.needle_blocks(16)) == 1.0
    store2, seq2, q2 = random_setup(n=1024, D=64)
    diffuse = sk.Router("minmax", top_k=12, adaptive_mass=0.99).select(q2 * 0.01, store2, seq2, 0)
    assert diffuse.num_selected.tolist() == [12, 12]


def test_per_head_reads_the_union_of_its_query_heads():
    store, seq, q = random_setup(seed=6)
    sel = sk.Router("minmax", top_k=4, gqa="per_head").select(q, store, seq, 0)
    assert sel.head_blocks.shape == (8, 4)
    for h in range(2):
        union = set(sel.head_blocks[4 * h:4 * h + 4].flatten().tolist()) - {-1}
        assert set(sel.blocks[h].tolist()) - {-1} == union
    shared = sk.Router("minmax", top_k=4).select(q, store, seq, 0)
    assert (sel.num_selected >= shared.num_selected).all()


def test_union_takes_each_query_head_s_blocks_in_rank_order():
    """gqa="union": head 0's best, head 1's best, head 0's second, head 1's second, ... (a block already taken
    is skipped), so the first picks are every head's own best."""
    from sparsekv.routing.router import _round_robin
    m = torch.zeros(1, 2, 8)                                 # one kv head, two query heads, 8 blocks
    m[0, 0, [3, 1, 2]] = torch.tensor([0.5, 0.3, 0.2])      # head 0: 3 > 1 > 2
    m[0, 1, [3, 6, 4]] = torch.tensor([0.6, 0.3, 0.1])      # head 1: 3 > 6 > 4
    # arrivals (rank * 2 + head): 3 at 0 (and 1), 1 at 2, 6 at 3, 2 at 4, 4 at 5
    assert _round_robin(m)[0].argsort(descending=True)[:5].tolist() == [3, 1, 6, 2, 4]


def test_union_reads_exactly_shared_s_blocks_and_every_head_s_best():
    from sparsekv.routing.scorers import ScoreInput
    store, seq, q = random_setup(seed=7)                    # 13 blocks, H = 2, G = 4
    K = 6                                                    # 2 forced + 4 free: one per query head
    union = sk.Router("minmax", top_k=K, gqa="union").select(q, store, seq, 0)
    shared = sk.Router("minmax", top_k=K).select(q, store, seq, 0)
    assert union.num_selected.tolist() == shared.num_selected.tolist() == [K, K]      # the same K/V bytes
    assert union.route_bytes == shared.route_bytes                                    # and the same summaries
    inp = ScoreInput(q.view(2, 4, -1), store, seq, 0, store.block_table(seq))
    best = sk.ROUTERS["minmax"]().logits(inp, "torch", None).argmax(-1)              # [H, G] each head's best
    for h in range(2):
        assert set(best[h].tolist()) <= set(union.blocks[h].tolist()), (h, best[h], union.blocks[h])
    # one query head per kv head: its own ranking is the group's, so union is shared
    q1 = q[::4].contiguous()
    g1 = sk.Router("minmax", top_k=K, gqa="union").select(q1, store, seq, 0)
    assert torch.equal(g1.blocks, sk.Router("minmax", top_k=K).select(q1, store, seq, 0).blocks)


def test_union_needs_a_k_to_fill():
    for kw in ({"top_p": 0.9}, {"threshold": 2.0}, {"top_k": 8, "adaptive_mass": 0.9}):
        with pytest.raises(ValueError, match="gqa='union' needs top_k or token_budget"):
            sk.Router("minmax", gqa="union", **kw)
    with pytest.raises(ValueError, match="gqa"):
        sk.Router("minmax", top_k=4, gqa="pooled")


def test_oracle_selection_of_all_blocks_equals_dense():
    store, seq, q = random_setup()
    sel = sk.Router("oracle", top_k=seq.num_blocks).select(q, store, seq, 0)
    out, _ = sk.sparse_attention(q, store, seq, 0, sel.blocks)
    torch.testing.assert_close(out, sk.dense_attention(q, store, seq, 0), rtol=0, atol=1e-6)


def test_routing_bytes_follow_the_summaries_each_scorer_reads():
    store, seq, q = random_setup()
    nb, H, D = seq.num_blocks, 2, 32
    b = {n: sk.Router(n, top_k=4).select(q, store, seq, 0).traffic.summary_bytes for n in sk.ROUTERS}
    assert b["minmax"] == nb * H * 2 * D * 4 and b["mean"] == nb * H * D * 4
    assert b["halves"] == b["minmax"]                                  # two means per tile: Quest's bytes
    assert b["repr"] == nb * H * 3 * D * 4 and b["oracle"] == seq.num_tokens * H * D * 4
    assert b["recency"] == b["random"] == 0


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(scorer="quest"), ValueError, "scorer must be one of .*'hminmax', 'labels', 'mean', 'minmax'"),
    (dict(scorer="hminmax-g0-k4"), ValueError, "scorer must be one of .* got 'hminmax-g0-k4'"),
    (dict(scorer="minmax-g4-k2"), ValueError, "scorer must be one of"),      # minmax has no parametrised names
    (dict(scorer=3), TypeError, "scorer must be a registered scorer name or a routing.Scorer, got int"),
    (dict(scorer=sk.SCORERS["minmax"]), TypeError, "scorer must be .* got type"),   # the class, not an instance
    (dict(), ValueError, "exactly one of"),
    (dict(top_k=4, top_p=0.5), ValueError, "exactly one of"),
    (dict(top_k=1), ValueError, "top_k must be >= 2"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(scorer="recency", top_p=0.5), ValueError, "ignores the query"),
    (dict(top_k=4, gqa="group"), ValueError, "gqa must be one of"),
    (dict(top_k=4, local_blocks=0), ValueError, "local_blocks"),
    (dict(top_p=0.9, adaptive_mass=0.5), ValueError, "adaptive_mass needs top_k"),
    (dict(top_k="4"), TypeError, "top_k must be an int"),
])
def test_bad_router_arguments(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        sk.Router(**kwargs)


def test_metrics_on_known_selections():
    store, seq, q = random_setup()
    mass = sk.block_attention_mass(q, store, seq, 0)
    every = sk.all_blocks(store, seq)
    torch.testing.assert_close(metrics.attention_mass_recall(mass, every), torch.ones(8), atol=1e-5, rtol=0)
    assert metrics.needle_recall(torch.tensor([[0, 3], [3, -1]]), [3]) == 1.0
    assert metrics.needle_recall(torch.tensor([[0, 3], [1, -1]]), [3]) == 0.5
    assert metrics.block_recall(torch.tensor([[0, 3], [1, -1]]), torch.tensor([[3, 5], [1, 2]])) == 0.5
    e = metrics.evaluate(sk.Router("oracle", top_k=seq.num_blocks), q, store, seq, 0)
    assert e.rel_error < 1e-6 and abs(e.mass_recall - 1) < 1e-5 and e.block_recall == 1.0


# -- half-block means (`halves`) -------------------------------------------------------------------------------------

@pytest.mark.parametrize("G,D,bs", [(1, 64, 16), (3, 64, 16), (8, 128, 8), (2, 256, 4), (4, 64, 1), (5, 128, 2), (6, 64, 32)])
def test_half_means_and_their_scores_match_float64_definitions(G, D, bs):
    """khalf holds the mean of each half of every block's valid keys (first half ceil(bs/2) rows), written in odd
    pieces and single decode rows; halves' logit is the larger of the two halves' q . mean / sqrt(D), a partial
    last block's empty second half not counting: against float64 from the keys themselves, on both backends."""
    from sparsekv.routing.scorers import SCORERS, ScoreInput
    from sparsekv.storage.summaries import DEFAULT_SUMMARIES
    H, n = 2, 11 * bs + (bs + 1) // 2 - (bs > 1)                   # the last block's second half empty (or half full)
    g = torch.Generator().manual_seed(G + D + bs)
    store = sk.BlockStore(sk.StoreConfig(num_layers=2, num_kv_heads=H, head_dim=D, block_size=bs,
                                         num_blocks=n // bs + 4, summaries=DEFAULT_SUMMARIES + ("khalf",)))
    seq = store.new_sequence()
    k = torch.randn(2, n, H, D, generator=g)
    cut = n - 3
    for i in range(0, cut, 13):                                    # odd pieces, then three decode rows
        store.append(seq, k[:, i:min(i + 13, cut)], torch.randn(2, min(13, cut - i), H, D, generator=g))
    for i in range(cut, n):
        store.append(seq, k[:, i:i + 1], torch.randn(2, 1, H, D, generator=g))
    q = torch.randn(H, G, D, generator=g)
    first = (bs + 1) // 2
    for layer in (0, 1):
        table = store.block_table(seq)
        halves = store.summary("khalf")[layer][table]                                  # [nb, H, 2, D]
        want = torch.full((H, G, seq.num_blocks), -torch.inf, dtype=torch.float64)
        for b in range(seq.num_blocks):
            for j, (lo, hi) in enumerate(((b * bs, b * bs + first), (b * bs + first, (b + 1) * bs))):
                rows = k[layer, lo:min(hi, n)].double()                               # [m, H, D]
                if len(rows) == 0:                              # an empty second half repeats the first's mean
                    assert torch.equal(halves[b, :, 1], halves[b, :, 0])
                    continue
                mean = rows.mean(0)
                assert (halves[b, :, j].double() - mean).abs().max() < 1e-5
                want[:, :, b] = torch.maximum(want[:, :, b], torch.einsum("hgd,hd->hg", q.double(), mean) / D ** 0.5)
        inp = ScoreInput(q, store, seq, layer, table)
        for backend in ("reference", "torch"):
            got = SCORERS["halves"]().logits(inp, backend, g)
            assert (got.double() - want).abs().max() < 1e-4


def test_a_budget_over_every_block_routes_halves_like_dense():
    from sparsekv.storage.summaries import DEFAULT_SUMMARIES
    store = make_store(layers=1, kv_heads=2, head_dim=64, block_size=16, num_blocks=16)
    store = sk.BlockStore(sk.StoreConfig(**{**store.config.__dict__, "summaries": DEFAULT_SUMMARIES + ("khalf",)}))
    g = torch.Generator().manual_seed(7)
    seq = store.new_sequence()
    store.append(seq, torch.randn(1, 16 * 5 + 3, 2, 64, generator=g), torch.randn(1, 16 * 5 + 3, 2, 64, generator=g))
    q = torch.randn(6, 64, generator=g)
    blocks = sk.Router("halves", token_budget=16 * 8).select(q, store, seq, 0).blocks
    assert blocks.tolist() == [list(range(6))] * 2
    out, _ = sk.sparse_attention(q, store, seq, 0, blocks, backend="torch")
    torch.testing.assert_close(out, sk.dense_attention(q, store, seq, 0, backend="torch"), rtol=1e-5, atol=1e-5)


def test_halves_on_a_store_without_half_means_is_a_value_error_naming_the_summary():
    store, seq, q = random_setup()
    bare = make_store(layers=1, kv_heads=2, head_dim=32, block_size=16, num_blocks=64)
    s = bare.new_sequence()
    bare.append(s, torch.randn(1, 40, 2, 32), torch.randn(1, 40, 2, 32))
    with pytest.raises(ValueError, match="khalf"):
        sk.Router("halves", top_k=2).select(q, bare, s, 0)


# -- the label-channel router (Double Sparsity) --------------------------------------------------------------------

def _labelled_store(L, H, D, bs, n, r, seed, dtype=torch.float32):
    from sparsekv.storage.summaries import DEFAULT_SUMMARIES, LabelChannels
    g = torch.Generator().manual_seed(seed)
    ch = tuple(tuple(tuple(sorted(torch.randperm(D, generator=g)[:r].tolist())) for _ in range(H)) for _ in range(L))
    labels = LabelChannels(ch, "random")
    store = sk.BlockStore(sk.StoreConfig(num_layers=L, num_kv_heads=H, head_dim=D, block_size=bs,
                                         num_blocks=n // bs + 4, dtype=dtype, labels=labels,
                                         summaries=DEFAULT_SUMMARIES + ("klabel",)))
    seq = store.new_sequence()
    k = torch.randn(L, n, H, D, generator=g).to(dtype)
    for i in range(0, n, 13):                                  # odd pieces: partial blocks rewritten
        store.append(seq, k[:, i:i + 13], torch.randn(L, min(13, n - i), H, D, generator=g).to(dtype))
    return store, seq, k, labels, g


@pytest.mark.parametrize("G,D,r", [(1, 64, 8), (3, 64, 8), (8, 128, 16), (2, 256, 32), (4, 64, 16)])
def test_label_scores_match_their_float64_definition(G, D, r):
    """logit_b = log sum_t exp(q[ch] . k_t[ch] / sqrt(D)) over block b's valid rows, against float64 from the keys
    themselves, with a partial last block; the label cache is exactly the chosen channels of every key."""
    from sparsekv.routing.scorers import SCORERS, ScoreInput
    H, bs, n = 2, 16, 16 * 6 + 5
    store, seq, k, labels, g = _labelled_store(2, H, D, bs, n, r, seed=G + D + r)
    q = torch.randn(H, G, D, generator=g)
    for layer in (0, 1):
        inp = ScoreInput(q, store, seq, layer, store.block_table(seq))
        got = SCORERS["labels"]().logits(inp, "torch", g)
        ch = labels.index()[layer]
        want = torch.empty(H, G, seq.num_blocks, dtype=torch.float64)
        for h in range(H):
            s = (q[h][:, ch[h]].double() @ k[layer, :, h][:, ch[h]].double().T) / D ** 0.5      # [G, n]
            for b in range(seq.num_blocks):
                want[h, :, b] = s[:, b * bs:min(n, (b + 1) * bs)].logsumexp(-1)
        assert (got.double() - want).abs().max() < 1e-5
        packed = store.summary("klabel")[layer][store.block_table(seq)].reshape(seq.num_blocks, H, bs, r)
        for h in range(H):
            assert torch.equal(packed[:, h].reshape(-1, r)[:n], k[layer, :, h][:, ch[h]])
            assert not packed[-1, h, n - (seq.num_blocks - 1) * bs:].any()          # rows past the end are 0


def test_the_label_cache_costs_what_the_byte_model_charges_and_can_cost_quest_s():
    store, seq, _, labels, _ = _labelled_store(2, 2, 64, 16, 100, 8, seed=1)
    scorer = sk.SCORERS["labels"]()
    c = store.config
    assert scorer.vectors(c) == 16 * 8 // 64 == sk.SCORERS["minmax"]().vectors(c)        # r = 2 D / bs: Quest's bytes
    tiles = seq.num_blocks * c.num_kv_heads
    assert scorer.score_bytes(store, seq) == tiles * 16 * 8 * 4                           # bs * r float32 per tile
    assert store.summary("klabel").shape == (2, c.num_blocks, 2, 2, 64)


def test_a_budget_over_every_block_routes_labels_like_dense():
    store, seq, _, _, g = _labelled_store(2, 2, 64, 16, 16 * 5 + 3, 8, seed=2)
    q = torch.randn(6, 64, generator=g)
    router = sk.Router("labels", token_budget=16 * 8)
    out, _ = sk.sparse_attention(q, store, seq, 1, router.select(q, store, seq, 1).blocks, backend="torch")
    torch.testing.assert_close(out, sk.dense_attention(q, store, seq, 1, backend="torch"), rtol=1e-5, atol=1e-5)


def test_bad_labels_are_rejected_by_name():
    from sparsekv.storage.summaries import DEFAULT_SUMMARIES, LabelChannels
    with pytest.raises(ValueError, match="klabel.*labels"):
        sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=64, summaries=DEFAULT_SUMMARIES + ("klabel",))
    lab = LabelChannels(((tuple(range(8)),),))
    with pytest.raises(ValueError, match="multiple of head_dim"):
        sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=4, labels=lab)
    with pytest.raises(ValueError, match="labels are for 1 layers.*has 2"):
        sk.StoreConfig(num_layers=2, num_kv_heads=1, head_dim=64, block_size=16, labels=lab)
    with pytest.raises(ValueError, match="distinct"):
        LabelChannels((((1, 1, 2, 3),),))
    with pytest.raises(TypeError, match="LabelChannels"):
        sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=64, labels=[[[1, 2]]])


def test_calibration_text_is_held_out_of_every_haystack():
    from sparsekv.analysis import calibrate, corpus
    assert not set(calibrate.CALIBRATION_MODULES) & (set(corpus.PROSE_MODULES) | set(corpus.CODE_MODULES))
    text = calibrate.calibration_text()
    assert len(text) > 50_000 and text[:2000] not in corpus.haystack("prose")


def test_quest_slack_splits_exactly_over_bands_and_matches_the_bound():
    """analysis.diagnose: U_b - max_t q.k_t equals the sum of its per-band parts, is never negative, and U_b is the
    minmax scorer's bound (times sqrt(D)) on the same keys."""
    from sparsekv.analysis.diagnose import block_slack, rope_bands
    from sparsekv.routing.scorers import SCORERS, ScoreInput
    H, G, D, bs, n = 1, 3, 64, 16, 16 * 5 + 7
    g = torch.Generator().manual_seed(9)
    store = make_store(layers=1, kv_heads=H, head_dim=D, block_size=bs, num_blocks=16)
    seq = store.new_sequence()
    k = torch.randn(1, n, H, D, generator=g)
    store.append(seq, k, torch.randn(1, n, H, D, generator=g))
    q = torch.randn(G, D, generator=g)
    bands = rope_bands(1.0 / (1e5 ** (torch.arange(0, D, 2).double() / D)), bs)
    assert set(bands.tolist()) == {0, 1, 2} and bands.shape == (D,)
    r = block_slack(q, k[0, :, 0], bs, bands)
    assert (r["slack"] >= -1e-9).all()
    torch.testing.assert_close(r["by_band"].sum(0), r["slack"], rtol=0, atol=1e-9)
    best = torch.stack([(q.double() @ k[0, i * bs:min(n, (i + 1) * bs), 0].double().T).amax(-1)
                        for i in range(seq.num_blocks)], -1)
    torch.testing.assert_close(r["bound"] - r["slack"], best, rtol=0, atol=1e-9)
    inp = ScoreInput(q[None], store, seq, 0, store.block_table(seq))
    quest = SCORERS["minmax"]().logits(inp, "reference", None)[0].double() * D ** 0.5
    torch.testing.assert_close(quest, r["bound"], rtol=1e-5, atol=1e-4)


def test_half_means_survive_copy_on_write_and_are_stored_half_major():
    """A fork that appends into a shared partial last block gets its own copy (copy-on-write): the parent's khalf is
    unchanged and the child's is the recompute of its own rows; each half of a layer and kv head is one contiguous
    [NB, D] matrix (what the fused route reads in place)."""
    from sparsekv.storage.summaries import DEFAULT_SUMMARIES
    H, D, bs = 2, 32, 8
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=16,
                                         summaries=DEFAULT_SUMMARIES + ("khalf",)))
    g = torch.Generator().manual_seed(11)
    parent = store.new_sequence()
    k = torch.randn(1, 2 * bs + 3, H, D, generator=g)                  # the last block holds 3 rows: its first half
    store.append(parent, k, torch.randn_like(k))
    before = store.summary("khalf").clone()
    child = store.fork(parent)
    extra = torch.randn(1, 3, H, D, generator=g)                       # rows 3..5: into the second half
    store.append(child, extra, torch.randn_like(extra))
    pb, cb = store.block_table(parent)[-1], store.block_table(child)[-1]
    assert pb != cb                                                    # the child wrote its own copy
    assert torch.equal(store.summary("khalf")[:, pb], before[:, pb])
    rows = torch.cat([k[0, 2 * bs:], extra[0]])                        # [6, H, D]
    want = torch.stack([rows[:4].mean(0), rows[4:].mean(0)], 1)        # halves of 8 rows: [0, 4) and [4, 8)
    assert (store.summary("khalf")[0, cb] - want).abs().max() < 1e-6
    halves = store.summary("khalf")[0]
    assert all(halves[:, :, j].transpose(0, 1).is_contiguous() for j in (0, 1))
