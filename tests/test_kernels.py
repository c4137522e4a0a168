"""Triton kernels against float64 references: compiled on a CUDA machine, under the
interpreter (TRITON_INTERPRET=1) on a CPU.

Small shapes, fresh random inputs: a batch of odd lengths with partial last blocks, -1 padding
in the selection, GQA ratios 1 to 8, head dims 64 and 128, fp32/bf16/fp16 storage. Every
buffer the kernels allocate is poisoned with NaN first, so an unwritten element fails.
"""
import math

import pytest
import torch

pytest.importorskip("triton")
# conftest.py imported triton and the kernels with TRITON_INTERPRET=1 (decoration time); the
# fixture below sets it again while each test runs (triton checks it per call too).
from conftest import make_store  # noqa: E402

import sparsekv as sk  # noqa: E402
from sparsekv.kernels import block_score, paged_decode  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    if DEV == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")

# Max abs error against float64 on unit-variance V. Storage rounding is in the inputs the
# reference sees too; what remains is float32 accumulation and the output cast.
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LENGTHS = [1, 37, 100]                         # block 16: one token, partial, partial


def filled(G, D, dtype, seed, H=2, lengths=LENGTHS):
    store = make_store(layers=1, kv_heads=H, head_dim=D, block_size=16, num_blocks=24, dtype=dtype, repr_keys=0,
                       device=DEV)
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for n in lengths:
        s = store.new_sequence()
        store.append(s, torch.randn(1, n, H, D, generator=g).to(DEV, dtype), torch.randn(1, n, H, D, generator=g).to(DEV, dtype))
        seqs.append(s)
    return store, seqs, g


def exact(q, store, seq, blocks):
    """float64 softmax attention over the selected tokens, per query head."""
    K, V = (t.double().cpu() for t in store.gather(seq, 0))
    q, blocks = q.cpu(), blocks.cpu()
    Hq, D = q.shape
    H = K.shape[1]
    out, lse = torch.empty(Hq, D, dtype=torch.float64), torch.empty(Hq, dtype=torch.float64)
    for h in range(Hq):
        kv = h // (Hq // H)
        tok = torch.cat([torch.arange(b * 16, min(b * 16 + 16, seq.num_tokens)) for b in blocks[kv].tolist() if b >= 0])
        s = q[h].double() @ K[tok, kv].T / math.sqrt(D)
        out[h], lse[h] = s.softmax(-1) @ V[tok, kv], torch.logsumexp(s, -1)
    return out, lse


def random_selection(seq, H, K, g):
    sel = torch.full((H, K), -1, dtype=torch.long)
    for h in range(H):
        n = int(torch.randint(1, min(K, seq.num_blocks) + 1, (1,), generator=g))
        sel[h, :n] = torch.randperm(seq.num_blocks, generator=g)[:n]
    return sel


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("G", [1, 2, 3, 4, 8])
def test_paged_decode_matches_float64(G, D, dtype):
    store, seqs, g = filled(G, D, dtype, seed=G * 1000 + D)
    q = torch.randn(len(seqs), 2 * G, D, generator=g).to(DEV, dtype)
    sels = [random_selection(s, 2, 5, g).to(DEV) for s in seqs]
    # small splits so several splits (and some empty ones) are merged
    out, lse = sk.attention.decode._batch_triton(q, store, seqs, 0, sels, poison=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    for b, s in enumerate(seqs):
        want, want_lse = exact(q[b], store, s, sels[b])
        assert (out[b].double().cpu() - want).abs().max() < TOL[dtype]
        assert (lse[b].double().cpu() - want_lse).abs().max() < 1e-4


@pytest.mark.parametrize("bps", [1, 2, 64])
def test_split_counts_do_not_change_the_result(bps):
    store, seqs, g = filled(4, 64, torch.float32, seed=bps)
    q = torch.randn(1, 8, 64, generator=g).to(DEV)
    s = seqs[2]
    sel = torch.tensor([[6, 0, 3, -1, 5], [-1, 2, -1, 6, -1]], device=DEV)
    table = store.block_table(s)[None]
    out, lse = paged_decode.paged_decode(q, store.k[0], store.v[0], table, torch.tensor([s.num_tokens], device=DEV),
                                         sel[None], blocks_per_split=bps, poison=True)
    want, want_lse = exact(q[0], store, s, sel)
    assert (out[0].double().cpu() - want).abs().max() < 2e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_is_the_same_kernel_with_every_block(dtype):
    store, seqs, g = filled(4, 64, dtype, seed=7)
    for s in seqs:
        q = torch.randn(8, 64, generator=g).to(DEV, dtype)
        got = sk.dense_attention(q, store, s, 0, backend="triton")
        want, _ = exact(q, store, s, sk.all_blocks(store, s))
        assert (got.double().cpu() - want).abs().max() < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("G", [1, 2, 4, 8])
def test_block_scores_match_float64(G, D, dtype):
    store, seqs, g = filled(G, D, dtype, seed=G + D)
    s = seqs[2]
    q = torch.randn(2 * G, D, generator=g).to(DEV)
    mm, me = block_score.block_scores(q[None], store.kmin[0], store.kmax[0], store.kmean[0], store.block_table(s)[None],
                                      torch.tensor([s.num_blocks], device=DEV), block_n=4, poison=True)
    mm, me, q = mm.cpu(), me.cpu(), q.cpu()
    table = store.block_table(s)
    kmin, kmax, kmean = (t[0][table].double().cpu() for t in (store.kmin, store.kmax, store.kmean))   # [nb, H, D]
    qd = q.double().view(2, G, D)
    bound = torch.maximum(qd[:, :, None, :] * kmin.permute(1, 0, 2)[:, None],
                          qd[:, :, None, :] * kmax.permute(1, 0, 2)[:, None]).sum(-1) / math.sqrt(D)
    mean = torch.einsum("hgd,nhd->hgn", qd, kmean) / math.sqrt(D)
    tol = 1e-4 * math.sqrt(D)                   # float32 accumulation of D products
    assert (mm[0].double() - bound.reshape(2 * G, -1)).abs().max() < tol
    assert (me[0].double() - mean.reshape(2 * G, -1)).abs().max() < tol


@pytest.mark.parametrize("scorer", ["minmax", "mean"])
def test_router_triton_backend_selects_what_torch_selects(scorer):
    store, seqs, g = filled(4, 64, torch.float32, seed=11)
    q = torch.randn(8, 64, generator=g).to(DEV)
    r = sk.Router(scorer, top_k=4)
    a = r.select(q, store, seqs[2], 0, backend="triton")
    b = r.select(q, store, seqs[2], 0, backend="torch")
    torch.testing.assert_close(a.mass, b.mass, rtol=1e-5, atol=1e-6)
    assert torch.equal(a.blocks, b.blocks)


def test_sparse_attention_triton_backend_and_auto_dispatch(monkeypatch):
    store, seqs, g = filled(2, 64, torch.float32, seed=12)
    q = torch.randn(4, 64, generator=g).to(DEV)
    sel = torch.tensor([[6, 1], [0, -1]], device=DEV)
    a, ra = sk.sparse_attention(q, store, seqs[2], 0, sel, backend="triton")
    b, rb = sk.sparse_attention(q, store, seqs[2], 0, sel, backend="torch")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert ra.kv_bytes == rb.kv_bytes
    from sparsekv.core.backend import resolve
    assert resolve("auto", q) == "triton"        # CUDA, or CPU under the interpreter
    if DEV == "cuda":
        return
    monkeypatch.delenv("TRITON_INTERPRET")
    from sparsekv.kernels import cpu_decode  # CPU without the interpreter: the fused kernel, else torch
    assert resolve("auto", q) == ("cpp" if cpu_decode.available() else "torch")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve("triton", q)


def test_paged_kernel_reads_a_cold_tier_through_layer_kv(tmp_path):
    """The Triton kernel over a tiered store: hot rows through the slot table, and a set wider than the hot
    tier staged; both against float64 (the store's tiles, where they sit, are the kernel's business no more)."""
    from conftest import exact_attention
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, num_blocks=16,
                                         cold_dir=tmp_path, hot_blocks=4))
    g = torch.Generator().manual_seed(7)
    K, V = torch.randn(1, 85, 2, 64, generator=g), torch.randn(1, 85, 2, 64, generator=g)
    seq = store.new_sequence()
    for i in range(0, 85, 32):
        store.append(seq, K[:, i:i + 32].contiguous(), V[:, i:i + 32].contiguous())
    q = torch.randn(6, 64, generator=g)
    for sel in (torch.tensor([[0, 5], [2, -1]]), torch.tensor([[0, 1, 2], [3, 4, 5]])):
        out, _ = sk.sparse_attention(q, store, seq, 0, sel, backend="triton")
        want = exact_attention(q, K[0], V[0], sel, 16)[0]
        assert (out.double() - want).abs().max() < TOL[torch.float32]
    assert store.tiers.num_cold() > 0
    store.close()


def test_every_kernel_file_is_compiled_or_included_and_hashed_into_the_extension_s_name():
    """ops.cpp includes the other files whole (one parse of ATen's headers): a .cpp left out of both lists would
    never be built, and a file outside the hash would not rebuild the extension when edited."""
    import re

    from sparsekv.kernels import cpu_decode as c
    d = c._DIR
    included = re.findall(r'^#include "(\w+\.cpp)"$', (d / "ops.cpp").read_text(), re.M)
    assert len(included) == len(set(included))
    assert {p.name for p in d.glob("*.cpp")} == {p.name for p in c._SOURCES} | set(included)
    assert not {p.name for p in c._SOURCES} & set(included)
    assert {p.name for p in d.iterdir()} == {p.name for p in c._SOURCES + c._HEADERS}
