"""The fused C++/OpenMP decode kernel (`sparsekv.kernels.cpu_decode`, backend "cpp") against float64.

Grid: GQA ratios 1 to 8 (3 included), head dims 64 and 128, float32 and bfloat16 storage (queries float32,
accumulation float32), odd lengths with a partial last block, a single token, selections padded with -1,
and a fragmented block table. Each test makes sure the kernel itself ran (the torch fallback is patched to
fail), and the fallback is exercised by a build that fails on purpose.
"""
import warnings

import pytest
import torch
from conftest import exact_attention as exact

import sparsekv as sk
from sparsekv.attention import decode
from sparsekv.attention.plan import plan_decode
from sparsekv.kernels import cpu_decode
from sparsekv.storage.summaries import DEFAULT_SUMMARIES

pytestmark = pytest.mark.skipif(not cpu_decode.available(),
                                reason=f"the CPU kernel did not build here: {cpu_decode.reason()}")
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-5}     # vs float64 of the *stored* values; accumulation is fp32


@pytest.fixture
def kernel_only(monkeypatch):
    """Fail loudly if a call meant for the kernel falls back to the torch path."""
    def boom(*a, **k):
        raise AssertionError("the torch path ran where the fused kernel should have")
    monkeypatch.setattr(decode, "_sparse_torch", boom)
    monkeypatch.setattr(decode, "_dense_torch", boom)


def filled(H, D, n, dtype, seed, bs=16, fragment=False):
    g = torch.Generator().manual_seed(seed)
    nb = -(-n // bs)
    store = sk.BlockStore(sk.StoreConfig(num_layers=2, num_kv_heads=H, head_dim=D, block_size=bs,
                                         num_blocks=2 * nb + 3, dtype=dtype))
    if fragment:       # interleave with a sequence that is then freed: the table is not one physical run
        other = store.new_sequence()
        store.append(other, torch.zeros(2, bs * (nb + 1), H, D, dtype=dtype), torch.zeros(2, bs * (nb + 1), H, D, dtype=dtype))
        store.free(other)
    seq = store.new_sequence()
    k = torch.randn(2, n, H, D, generator=g).to(dtype)
    v = torch.randn(2, n, H, D, generator=g).to(dtype)
    for i in range(0, n, 7):                              # appended in pieces
        store.append(seq, k[:, i:i + 7], v[:, i:i + 7])
    return store, seq, g


GRID = [(G, D, dt, n) for G in (1, 2, 3, 4, 8) for D in (64, 128) for dt in (torch.float32, torch.bfloat16)
        for n in (1, 37, 16 * 9 + 5)]


@pytest.mark.isa
@pytest.mark.parametrize("G,D,dtype,n", GRID)
def test_dense_matches_float64(kernel_only, G, D, dtype, n):
    H = 2
    store, seq, g = filled(H, D, n, dtype, seed=G * 1000 + D + n, fragment=n > 40)
    q = torch.randn(H * G, D, generator=g)
    K, V = store.gather(seq, 1)
    out = sk.dense_attention(q, store, seq, 1, backend="cpp")
    want, wlse = exact(q, K, V)
    assert out.dtype == torch.float32 and (out.double() - want).abs().max() < TOL[dtype]
    _, lse = decode._dense_cpp(q, store, seq, 1)
    assert (lse.double() - wlse).abs().max() < 1e-4


@pytest.mark.parametrize("G,D,dtype", [(G, D, dt) for G in (1, 3, 8) for D in (64, 128)
                                       for dt in (torch.float32, torch.bfloat16)])
@pytest.mark.isa
def test_sparse_matches_float64_with_padded_selections(kernel_only, G, D, dtype):
    H, bs, n = 3, 16, 16 * 11 + 9
    store, seq, g = filled(H, D, n, dtype, seed=G + D, fragment=True)
    q = torch.randn(H * G, D, generator=g)
    nb = seq.num_blocks
    rows = []
    for h in range(H):                                    # a different selection per head, then -1 padding
        pick = sorted(set(torch.randperm(nb, generator=g)[:2 + h * 2].tolist()) | {0, nb - 1})
        rows.append(pick)
    width = max(map(len, rows))
    blocks = torch.tensor([r + [-1] * (width - len(r)) for r in rows])
    out, res = sk.sparse_attention(q, store, seq, 0, blocks, backend="cpp")
    K, V = store.gather(seq, 0)
    want, _ = exact(q, K, V, blocks, bs)
    assert (out.double() - want).abs().max() < TOL[dtype]
    assert res.blocks_read == sum(map(len, rows))


def test_every_split_count_gives_the_same_answer():
    store, seq, g = filled(2, 64, 16 * 20 + 3, torch.float32, seed=7)
    q = torch.randn(8, 64, generator=g)
    k, v = store.k[0].transpose(0, 1), store.v[0].transpose(0, 1)
    every = decode.all_blocks(store, seq)
    ref, _ = cpu_decode.paged_decode(q, k, v, store.block_table(seq), every, seq.num_tokens, splits=1)
    for s in (2, 3, 7, 21, 40):                           # more splits than blocks leaves empty splits
        out, _ = cpu_decode.paged_decode(q, k, v, store.block_table(seq), every, seq.num_tokens, splits=s)
        assert (out - ref).abs().max() < 1e-5, s


def test_the_decode_plan_uses_it_and_agrees_with_the_torch_plan():
    store, seq, g = filled(2, 64, 100, torch.float32, seed=3)
    q = torch.randn(8, 64, generator=g)
    fast, slow = plan_decode(store, seq, 8, backend="cpp"), plan_decode(store, seq, 8, backend="torch")
    assert fast.backend == "cpp" and plan_decode(store, seq, 8).backend == "cpp"
    assert (fast.dense(1, q) - slow.dense(1, q)).abs().max() < 1e-5
    sel = sk.Router("minmax", token_budget=48).select(q, store, seq, 1)
    a, ra = fast.sparse(1, q, sel.blocks)
    b, rb = slow.sparse(1, q, sel.blocks)
    assert (a - b).abs().max() < 1e-5 and ra.traffic == rb.traffic
    with pytest.raises(ValueError, match="backend must be"):
        plan_decode(store, seq, 8, backend="triton")


def test_engine_greedy_tokens_match_the_torch_path(monkeypatch):
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    eng = sk.Engine(model, block_size=8, num_blocks=64, progress=False)
    prompt = torch.randint(0, model.config.vocab_size, (45,), generator=torch.Generator().manual_seed(0)).tolist()
    outs = {}
    for backend in ("cpp", "torch"):
        monkeypatch.setattr("sparsekv.model.engine.plan_decode",
                            lambda store, seqs, hq, _b=backend, **kw: plan_decode(store, seqs, hq, backend=_b, **kw))
        for name, router in (("dense", None), ("routed", sk.Router("minmax", token_budget=16))):
            seq = eng.new_sequence(); eng.prefill(seq, prompt)
            outs[backend, name] = eng.decode(seq, 8, router=router)
            eng.finish(seq)
    assert outs["cpp", "dense"] == outs["torch", "dense"] and outs["cpp", "routed"] == outs["torch", "routed"]


@pytest.mark.isa
def test_bad_calls_and_fallbacks():
    store, seq, g = filled(2, 64, 40, torch.float32, seed=1)
    from sparsekv.core.backend import resolve
    with pytest.raises(ValueError, match="backend 'cpp' runs on CPU"):
        resolve("cpp", torch.randn(4, 64, device="meta"))
    # float64 queries are outside the kernel: the torch path answers, exactly as the "torch" backend does
    q64 = torch.randn(4, 64, dtype=torch.float64)
    assert torch.equal(sk.dense_attention(q64, store, seq, 0, backend="cpp"),
                       sk.dense_attention(q64, store, seq, 0, backend="torch"))
    with pytest.raises(TypeError, match="q must be float32"):            # the operator's own check (cpu/checks.h)
        cpu_decode.paged_decode(torch.randn(4, 64, dtype=torch.float64), store.k[0].transpose(0, 1),
                                store.v[0].transpose(0, 1), store.block_table(seq), decode.all_blocks(store, seq), 40)


def test_a_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path):
    from torch.utils import cpp_extension
    saved = dict(cpu_decode._state)
    try:
        cpu_decode._state.clear()
        monkeypatch.setenv("SPARSEKV_EXT_DIR", str(tmp_path))          # nothing built there: it must build
        monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: (_ for _ in ()).throw(OSError("no compiler here")))
        with pytest.warns(RuntimeWarning, match="no compiler here"):
            assert cpu_decode.load() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")                 # the second ask is silent
            assert not cpu_decode.available() and "no compiler here" in cpu_decode.reason()
    finally:
        cpu_decode._state.clear()
        cpu_decode._state.update(saved)


# -- half-precision summaries and the fused scoring pass ----------------------------------------

@pytest.mark.parametrize("G,D", [(1, 64), (3, 128), (8, 64)])
def test_bf16_summaries_keep_quest_s_bound_conservative(G, D):
    H, n = 2, 16 * 13 + 7
    cfg = dict(num_layers=1, num_kv_heads=H, head_dim=D, block_size=16, num_blocks=16, repr_keys=0)
    f32, b16 = sk.BlockStore(sk.StoreConfig(**cfg)), sk.BlockStore(sk.StoreConfig(**cfg, summary_dtype="bf16"))
    g = torch.Generator().manual_seed(G * D)
    k, v = torch.randn(1, n, H, D, generator=g) * 3, torch.randn(1, n, H, D, generator=g)
    s32, s16 = f32.new_sequence(), b16.new_sequence()
    f32.append(s32, k, v)
    b16.append(s16, k, v)
    t32, t16 = f32.block_table(s32), b16.block_table(s16)
    lo32, hi32 = f32.kmin[0, t32], f32.kmax[0, t32]
    lo16, hi16 = b16.kmin[0, t16].float(), b16.kmax[0, t16].float()
    assert b16.kmin.dtype == torch.bfloat16
    assert (lo16 <= lo32).all() and (hi16 >= hi32).all()                         # rounded outward, never inward
    ulp = lambda x: x.abs() * 2.0 ** -7 + 1e-30                                   # one bf16 step, at most
    assert ((lo32 - lo16) <= ulp(lo32)).all() and ((hi16 - hi32) <= ulp(hi32)).all()
    q = torch.randn(H * G, D, generator=g)
    r = sk.Router("minmax", top_k=4)
    for backend in ("torch", "cpp"):
        s_32 = sk.SCORERS["minmax"]().logits(_inp(q, f32, s32, t32), backend, None)
        s_16 = sk.SCORERS["minmax"]().logits(_inp(q, b16, s16, t16), backend, None)
        assert (s_16 >= s_32 - 1e-4).all(), backend                                 # the bound never shrinks
    assert r.select(q, b16, s16, 0).traffic.summary_bytes * 2 == r.select(q, f32, s32, 0).traffic.summary_bytes


def _inp(q, store, seq, table):
    from sparsekv.routing.scorers import ScoreInput
    H = store.config.num_kv_heads
    return ScoreInput(q.view(H, -1, q.shape[-1]).float(), store, seq, 0, table)


@pytest.mark.isa
@pytest.mark.parametrize("summary_dtype", ["fp32", "bf16"])
def test_fused_minmax_scores_match_the_torch_definition(summary_dtype):
    H, G, D, n = 3, 3, 64, 16 * 9 + 2
    store = sk.BlockStore(sk.StoreConfig(num_layers=2, num_kv_heads=H, head_dim=D, block_size=16, num_blocks=40,
                                         summary_dtype=summary_dtype))
    g = torch.Generator().manual_seed(11)
    other = store.new_sequence()                                                    # fragment the pool
    store.append(other, torch.randn(2, 40, H, D, generator=g), torch.randn(2, 40, H, D, generator=g))
    seq = store.new_sequence()
    store.append(seq, torch.randn(2, n, H, D, generator=g), torch.randn(2, n, H, D, generator=g))
    q = torch.randn(H * G, D, generator=g)
    inp = _inp(q, store, seq, store.block_table(seq))
    ref = sk.SCORERS["minmax"]().logits(inp, "reference", None)
    fused = sk.SCORERS["minmax"]().logits(inp, "cpp", None)
    assert fused.shape == ref.shape and (fused - ref).abs().max() < 1e-5
    sel_cpp = sk.Router("minmax", token_budget=64).select(q, store, seq, 1, backend="cpp")
    sel_ref = sk.Router("minmax", token_budget=64).select(q, store, seq, 1, backend="reference")
    assert torch.equal(sel_cpp.blocks, sel_ref.blocks)


def test_summary_dtype_is_checked():
    with pytest.raises(ValueError, match="summary_dtype must be one of"):
        sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=8, summary_dtype="int4")
    with pytest.raises(TypeError, match="summary_dtype must be a floating"):
        sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=8, summary_dtype=torch.int8)


# -- head dims off the 32-lane grid, empty heads, any physical order --------------------------------

@pytest.mark.isa
@pytest.mark.parametrize("D,dtype", [(72, torch.float32), (72, torch.bfloat16), (40, torch.float32), (8, torch.bfloat16)])
def test_head_dims_with_a_partial_lane_group(kernel_only, D, dtype):
    """The kernel reads rows 32 elements at a time; a head dim that is not a multiple of 32 ends in a
    masked partial group (and for bf16, its even/odd lane order must be undone exactly)."""
    H, G, n = 2, 3, 16 * 6 + 11
    store, seq, g = filled(H, D, n, dtype, seed=D)
    q = torch.randn(H * G, D, generator=g)
    K, V = store.gather(seq, 1)
    want, _ = exact(q, K, V)
    assert (sk.dense_attention(q, store, seq, 1, backend="cpp").double() - want).abs().max() < TOL[dtype]


def test_a_head_with_nothing_to_read_gives_zero_and_minus_inf(kernel_only):
    store, seq, g = filled(2, 64, 50, torch.float32, seed=5)
    q = torch.randn(4, 64, generator=g)
    k, v = store.k[0].transpose(0, 1), store.v[0].transpose(0, 1)
    blocks = torch.tensor([[-1, -1], [0, 2]])                       # head 0: padding only
    out, lse = cpu_decode.paged_decode(q, k, v, store.block_table(seq), blocks, seq.num_tokens)
    assert (out[:2] == 0).all() and torch.isinf(lse[:2]).all() and (lse[:2] < 0).all()
    K, V = store.gather(seq, 0)
    want, _ = exact(q, K, V, torch.tensor([[0, 2], [0, 2]]), 16)
    assert (out[2:].double() - want[2:]).abs().max() < 2e-5
    with pytest.raises(ValueError, match="at least one block for every kv head"):   # the checked API refuses it
        sk.sparse_attention(q, store, seq, 0, blocks, backend="cpp")


def test_tiles_in_any_physical_order(kernel_only):
    """Logical blocks mapped to a shuffled set of physical tiles read the same as a copy laid out in order."""
    H, G, D, bs, nb = 2, 4, 64, 16, 9
    g = torch.Generator().manual_seed(21)
    k = torch.randn(H, 20, bs, D, generator=g)
    v = torch.randn(H, 20, bs, D, generator=g)
    table = torch.randperm(20, generator=g)[:nb]
    n = nb * bs - 5
    q = torch.randn(H * G, D, generator=g)
    K = k[:, table].reshape(H, nb * bs, D)[:, :n].permute(1, 0, 2)       # [n, H, D], logical order
    V = v[:, table].reshape(H, nb * bs, D)[:, :n].permute(1, 0, 2)
    blocks = torch.tensor([[8, 1, 4, -1], [0, 3, 5, 8]])              # any order within a row; -1 skipped
    out, _ = cpu_decode.paged_decode(q, k, v, table, blocks, n)
    want, _ = exact(q, K, V, blocks.clamp(min=-1), bs)
    assert (out.double() - want).abs().max() < 2e-5


# -- the fused route: score + block distribution + top-k in one pass -----------------------------

def _route_pair(scorer, store, seq, q, **kw):
    r = sk.Router(scorer, **kw)
    assert r.fusable
    return r.select(q, store, seq, 0, backend="cpp"), r.select(q, store, seq, 0, backend="torch")


@pytest.mark.parametrize("G,D,summary_dtype", [(G, D, sd) for G in (1, 2, 3, 8) for D in (64, 128, 72)
                                               for sd in ("fp32", "bf16")])
@pytest.mark.isa
def test_fused_route_selects_what_the_torch_router_selects(monkeypatch, G, D, summary_dtype):
    H, bs = 3, 16
    g = torch.Generator().manual_seed(G * 100 + D)
    n = int(torch.randint(bs * 3, bs * 40, (1,), generator=g)) + 5              # a partial last block
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs,
                                         num_blocks=60, summary_dtype=summary_dtype,
                                         summaries=DEFAULT_SUMMARIES + ("khalf",)))
    other = store.new_sequence()                                                  # blocks in no physical order
    store.append(other, torch.randn(1, 5 * bs, H, D, generator=g), torch.randn(1, 5 * bs, H, D, generator=g))
    seq = store.new_sequence()
    store.append(seq, torch.randn(1, n, H, D, generator=g) * 2, torch.randn(1, n, H, D, generator=g))
    store.free(other)
    q = torch.randn(H * G, D, generator=g)
    calls = []
    real = cpu_decode.route_topk
    monkeypatch.setattr(cpu_decode, "route_topk", lambda *a: calls.append(1) or real(*a))
    for scorer in ("minmax", "mean", "halves"):
        for kw in (dict(top_k=2), dict(top_k=5, sink_blocks=2, local_blocks=2), dict(token_budget=10 ** 6)):
            fused, ref = _route_pair(scorer, store, seq, q, **kw)
            assert fused.blocks.shape == ref.blocks.shape and fused.blocks.dtype == torch.int64
            assert torch.equal(fused.blocks, ref.blocks), (scorer, kw)
            assert (fused.mass - ref.mass).abs().max() < 1e-5 and fused.traffic == ref.traffic
    assert len(calls) == 9                                                        # the kernel ran each time


def test_fused_route_breaks_an_exact_tie_by_block_id_as_torch_does():
    """Identical blocks tie exactly: both paths take the later blocks (selectors' rule), the same ids."""
    H, D, bs = 1, 64, 16
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=12,
                                         summaries=DEFAULT_SUMMARIES + ("khalf",)))
    g = torch.Generator().manual_seed(2)
    block = torch.randn(1, bs, H, D, generator=g)
    seq = store.new_sequence()
    store.append(seq, torch.cat([block] * 10, 1), torch.randn(1, 10 * bs, H, D, generator=g))
    q = torch.randn(2, D, generator=g)
    for scorer in ("minmax", "mean", "halves"):
        fused, ref = _route_pair(scorer, store, seq, q, top_k=5)
        assert bool((ref.mass[0] == ref.mass[0, 0]).all())                        # the tie is exact
        # sink 0 and local 9 forced, then the three latest of the tied blocks 1..8
        assert fused.blocks[0].tolist() == ref.blocks[0].tolist() == [0, 6, 7, 8, 9]


def test_only_the_configurations_it_computes_are_fused():
    assert sk.Router("minmax", top_k=4).fusable and sk.Router("mean", token_budget=64).fusable
    assert sk.Router("halves", top_k=4).fusable
    assert not sk.Router("repr", top_k=4).fusable                                 # no kernel for this scorer
    assert not sk.Router("minmax", top_k=4, gqa="per_head").fusable
    assert not sk.Router("minmax", top_k=4, agg="max").fusable
    assert not sk.Router("minmax", top_p=0.9).fusable
    assert not sk.Router("minmax", top_k=8, adaptive_mass=0.9).fusable            # a TopK subclass, not TopK


def test_half_precision_summaries_keep_every_block_ranked_in_by_more_than_the_rounding():
    """Adversarial: many blocks tie within bf16 rounding, some are just clear of it. With G = 1 the mass
    is monotone in the bound, so a block whose fp32 bound beats every block outside the fp32 top-k by
    more than the largest rounding shift (computed from the stored summaries) must stay selected."""
    H, D, bs, nb = 2, 64, 16, 48
    g = torch.Generator().manual_seed(9)
    base = torch.randn(H, D, generator=g)
    keys = []
    for j in range(nb):       # every block: the same direction, scaled by 1 + a step that is tiny for most
        step = 2.0 ** -9 * (j % 7) if j % 3 else 0.05 * (j % 5)
        keys.append(base * (1 + step) + 2.0 ** -12 * torch.randn(bs, H, D, generator=g))
    k = torch.stack(keys).reshape(1, nb * bs, H, D)
    cfg = dict(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=nb + 1)
    f32, b16 = sk.BlockStore(sk.StoreConfig(**cfg)), sk.BlockStore(sk.StoreConfig(**cfg, summary_dtype="bf16"))
    s32, s16 = f32.new_sequence(), b16.new_sequence()
    f32.append(s32, k, k)
    b16.append(s16, k, k)
    q = base.clone()                                                               # G = 1: q [H, D]
    t = f32.block_table(s32)
    scale = D ** -0.5
    lo32, hi32 = f32.kmin[0, t].transpose(0, 1), f32.kmax[0, t].transpose(0, 1)   # [H, nb, D]
    lo16, hi16 = b16.kmin[0, t].transpose(0, 1).float(), b16.kmax[0, t].transpose(0, 1).float()
    shift = scale * (q.abs()[:, None] * torch.maximum(lo32 - lo16, hi16 - hi32)).sum(-1)   # [H, nb] >= bound change
    bound32 = scale * torch.maximum(q[:, None] * lo32, q[:, None] * hi32).sum(-1)
    K = 12
    flipped = protected = 0
    for backend in ("torch", "cpp"):
        r = sk.Router("minmax", top_k=K, sink_blocks=0, local_blocks=1)
        a, b = r.select(q, f32, s32, 0, backend=backend), r.select(q, b16, s16, 0, backend=backend)
        for h in range(H):
            sel32, sel16 = set(a.blocks[h].tolist()), set(b.blocks[h].tolist())
            outside = [i for i in range(nb) if i not in sel32]
            worst_out = max(bound32[h, i] + shift[h, i] for i in outside)
            for j in sel32 - {nb - 1}:                                            # the forced last block aside
                if bound32[h, j] > worst_out:
                    protected += 1
                    assert j in sel16, (backend, h, j)
            flipped += len(sel32 ^ sel16)
    assert protected > 0 and flipped > 0          # the check bit on both sides: kept blocks, and ties that moved


def test_a_built_library_loads_without_the_compiler(monkeypatch):
    """A library already built for these sources and this CPU is loaded directly: no cpp_extension.load (whose
    lock file a killed process would leave behind for every later one to wait on)."""
    from torch.utils import cpp_extension
    assert (cpu_decode.build_dir() / f"{cpu_decode._name()}.so").is_file()      # built by the module's first load
    saved = dict(cpu_decode._state)
    try:
        cpu_decode._state.clear()
        monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built again")))
        assert cpu_decode.load() is not None and cpu_decode.reason() is None
    finally:
        cpu_decode._state.clear()
        cpu_decode._state.update(saved)


# -- the same bits on any machine ------------------------------------------------------------------
# Routing decisions and decode outputs must not depend on the thread count or the instruction set (a baseline
# recorded on one CPU is checked on others): splits come from the selection's width alone, and simd.h fixes
# every reduction's order, every fused multiply-add and the exp.

def bit_cases(seed: int = 11) -> list[dict]:
    """Inputs for every CPU op, odd sizes: partial last blocks, head dims off the lane grid, G 1 to 8, a padded
    sparse selection, float32 and bfloat16 storage and summaries."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for G, D, dtype in ((1, 64, torch.float32), (3, 72, torch.bfloat16), (4, 128, torch.float32),
                        (8, 256, torch.bfloat16), (3, 40, torch.float32)):
        H, bs = 2, 16
        n = bs * int(torch.randint(9, 30, (1,), generator=g)) + int(torch.randint(1, bs, (1,), generator=g))
        nb = -(-n // bs)
        k = torch.randn(H, nb + 2, bs, D, generator=g).to(dtype)
        v = torch.randn(H, nb + 2, bs, D, generator=g).to(dtype)
        table = torch.randperm(nb + 2, generator=g)[:nb]
        picks = [sorted(torch.randperm(nb, generator=g)[:5 + 2 * h].tolist()) for h in range(H)]
        width = max(map(len, picks))
        sel = torch.tensor([r + [-1] * (width - len(r)) for r in picks])
        lo = torch.randn(H, nb + 2, D, generator=g)
        cases.append(dict(q=torch.randn(H * G, D, generator=g), k=k, v=v, table=table, n=n, sel=sel,
                          dense=torch.arange(nb).expand(H, nb).contiguous(), lo=lo.to(dtype),
                          hi=(lo + torch.rand(H, nb + 2, D, generator=g)).to(dtype)))
    return cases


def bit_outputs(cases: list[dict]) -> list[torch.Tensor]:
    """Every op's outputs on `cases`, flattened into one list of tensors."""
    out = []
    for c in cases:
        for blocks in (c["dense"], c["sel"]):
            out += list(cpu_decode.paged_decode(c["q"], c["k"], c["v"], c["table"], blocks, c["n"]))
        out.append(cpu_decode.minmax_scores(c["q"], c["lo"], c["hi"], c["table"]))
        for kind, (a, b) in ((0, (c["lo"], c["hi"])), (1, (c["lo"], c["lo"])), (2, (c["lo"], c["hi"]))):
            out += list(cpu_decode.route_topk(c["q"], a, b, c["table"], kind, 7, 1, 1))
    from test_quant import int8_layouts, layouts, random_weight
    g = torch.Generator().manual_seed(11)           # the weight-only matmuls (qlinear.cpp), every layout, at a K of
    for bits, group, scale, offset in layouts():    # one scale chunk and at one of 64 groups and a tail (73 or 80)
        factored = "factored" in (scale, offset)
        for N, K in ((45, 512 if factored else 160), (19, 2560 if factored else 2336)):
            w = random_weight(bits, group, scale, offset, N, K, g)
            for M in (1, 3, 6):
                out.append(cpu_decode.qlinear(torch.randn(M, K, generator=g), w.codes, w.scale, w.offset, bits,
                                              group))
            out.append(cpu_decode.qdequant(w.codes, w.scale, w.offset, bits, group))
            if (bits, group, scale, offset) in int8_layouts():   # int8 activations: maddubs (AVX2), dpbusd (VNNI),
                for M in (1, 3, 6):                                # or loops; every code width
                    x = torch.randn(M, K, generator=g)
                    out += [cpu_decode.qlinear_q8(x, w.codes, w.scale, w.offset, bits, group),
                            *cpu_decode.quantize_q8(x)]
    g = torch.Generator().manual_seed(13)           # the float32 prefill (prefill_attn_f32.cpp): 16-key tiles with
    for T, N, G, D, window, dtype in ((45, 301, 3, 64, 0, torch.bfloat16),    # AVX2, 32 with AVX-512, loops in x86-64
                                      (70, 600, 4, 48, 100, torch.float32), (1, 517, 8, 256, 0, torch.bfloat16),
                                      (130, 130, 1, 80, 0, torch.float32), (61, 711, 2, 128, 300, torch.bfloat16)):
        q, k, v = (torch.randn(*s, generator=g).to(dtype) for s in ((T, 2 * G, D), (N, 2, D), (N, 2, D)))
        out.append(cpu_decode.prefill_attn_f32(q, k, v, 3 + N - T, 3, window, D ** -0.5))
    return out + decode_layer_outputs()


def decode_layer_outputs(seed: int = 12) -> list[torch.Tensor]:
    """The fused step's operator (decode_layer.cpp) on one random layer of each block layout, dense and routed, over
    float32 and bf16 pools and summaries: its output, its selection, and the pools and summaries it wrote."""
    g = torch.Generator().manual_seed(seed)

    def lin(N, K, bits):
        group = 32 if bits == 4 else 16
        codes = (torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8) if bits == 4
                 else torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8))
        off = torch.randn(N, K // group, generator=g) * 0.01 if bits == 4 else torch.zeros(0)
        return [codes, torch.rand(N, K // group, generator=g) * 0.01, off], [bits, group, int(bits == 4 or group == 32)]

    out = []
    for sandwich, dtype, (Hq, H, D) in ((0, torch.float32, (6, 2, 64)), (1, torch.bfloat16, (4, 1, 256))):
        dim, inter, bs, nb, row = 96, 160, 16, 7, 5
        n = (nb - 1) * bs + row + 1
        w = [torch.rand(dim, generator=g) + 0.5 for _ in range(4)] + [torch.rand(D, generator=g) for _ in range(2)]
        if not sandwich:
            w[2], w[3], w[4], w[5] = (torch.zeros(0),) * 4
        meta = [Hq, H, D, 1, 1, sandwich, sandwich]
        for N, K, bits in (((Hq + 2 * H) * D, dim, 4), (dim, Hq * D, 8), (2 * inter, dim, 4), (dim, inter, 8)):
            t, m = lin(N, K, bits)
            w += t
            meta += m
        table = torch.randperm(nb + 3, generator=g)[:nb]
        for route in (-1, 0):
            pools = [torch.randn(H, nb + 3, bs, D, generator=g).to(dtype) for _ in range(2)]
            lo = torch.randn(H, nb + 3, D, generator=g)
            sums = [lo.to(dtype), (lo + 1).to(dtype)]
            x = torch.randn(1, dim, generator=g)
            cs = torch.rand(D, generator=g)
            y, sel = torch.ops.sparsekv_cpu.decode_layer(
                x, w, meta, [1e-6, float(sandwich), 0.4 * sandwich], cs, 1 - cs, *pools, sums, [0, 1], table,
                torch.arange(nb).expand(H, nb).contiguous(), int(table[-1]), row, n, 0, 2, route, 4, 1, 1)
            out += [y, sel, *pools, *sums]
    return out


def test_the_kernels_give_the_same_bits_at_any_thread_count():
    cases = bit_cases()
    saved = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            runs.append(bit_outputs(cases))
    finally:
        torch.set_num_threads(saved)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


BITS_SCRIPT = """
import sys, torch
sys.path.insert(0, sys.argv[3])
from test_cpu_kernel import bit_cases, bit_outputs
from sparsekv.kernels import cpu_decode
assert cpu_decode.available(), cpu_decode.reason()
torch.save({"arch": cpu_decode.arch(), "outputs": bit_outputs(bit_cases())}, sys.argv[1])
"""


def test_the_kernels_give_the_same_bits_for_another_instruction_set(tmp_path):
    """This build (-march=native) against one for another -march (cpuconfig.alt_arch: AVX2 without AVX-512
    where the CPU has AVX-512, so simd.h's AVX2 path runs against its AVX-512 one; plain x86-64 on an AVX2 CPU, its
    portable path against the AVX2 one), in a subprocess (one process holds one build
    of the op library). Built once into the same build folder, where the `alt` notebook runs find it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sparsekv.suite.cpuconfig import alt_arch
    arch = alt_arch()
    env = {**os.environ, "SPARSEKV_CPU_ARCH": arch, "SPARSEKV_EXT_DIR": str(cpu_decode.build_dir())}
    out = tmp_path / "alt.pt"
    run = subprocess.run([sys.executable, "-c", BITS_SCRIPT, str(out), arch, str(Path(__file__).parent)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = torch.load(out)
    assert theirs["arch"] == arch != cpu_decode.arch()
    ours = bit_outputs(bit_cases())
    same = [torch.equal(a, b) for a, b in zip(ours, theirs["outputs"])]
    assert len(same) == len(ours) and all(same), f"{same.count(False)} of {len(same)} outputs differ"
