"""The bfloat16 prefill attention kernel (`cpu/prefill_attn.cpp`, `cpu_decode.prefill_attn_bf16`) against float64.

What it computes exactly: the causal (or windowed) softmax attention of the bf16 values it is given, with float32
scores and sums; the one coarse rounding is each key's weight to bf16 (8 significant bits: relative error at most
u = 2^-8) before it multiplies V. Its normaliser sums the rounded weights, so the output is a convex combination of
V's rows with weights p~_j = p_j (1 + d_j) / (1 + sum_k p_k d_k), |d_j| <= u: each within 2u / (1 - u) of p_j
(relative), so the error is at most 2u / (1 - u) * max|v|. Float32 scores, sums and exp add a relative 1e-4 of
max|v| at most at these sizes (D <= 256 products of bf16 values, exp within 2 ulp). That bound, derived rather than
read off a run on one machine, is the tolerance.

Grid: GQA ratios 1 to 8, head dims 64, 128 and 256, chunks and prefixes that are not multiples of the kernel's
tiles (64 rows, 8-row microkernels, 16- and 32-key tiles, 256-key blocks), a first chunk (no prefix), windows
narrower and wider than the chunk. Skipped where the extension is not built for AVX512-BF16; the engine then
takes SDPA, which tests/test_attention.py covers.
"""
import math

import pytest
import torch

import sparsekv as sk
from sparsekv.attention import decode
from sparsekv.kernels import cpu_decode

pytestmark = pytest.mark.skipif(not cpu_decode.bf16_prefill_available(),
                                reason="the extension is not built here for AVX512-BF16 dot products")


def exact(q, k, v, q0, k0, window):
    """float64 attention of q [T, Hq, D] over k, v [N, H, D] with the kernel's positions and window."""
    T, Hq, D = q.shape
    N, H, _ = k.shape
    G = Hq // H
    s = q.double().view(T, H, G, D).permute(1, 2, 0, 3) @ k.double().permute(1, 2, 0)[:, None] / math.sqrt(D)
    qp, kp = torch.arange(q0, q0 + T)[:, None], torch.arange(k0, k0 + N)[None]
    hidden = (kp > qp) | ((qp - kp >= window) if window else torch.zeros((), dtype=torch.bool))
    out = s.masked_fill(hidden, -torch.inf).softmax(-1) @ v.double().permute(1, 0, 2)[:, None]   # [H, G, T, D]
    return out.permute(2, 0, 1, 3).reshape(T, Hq, D)


def case(T, N, Hq, H, D, seed, q_scale=2.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(T, Hq, D, generator=g) * q_scale).bfloat16()      # peaked scores: weights far from uniform
    return q, torch.randn(N, H, D, generator=g).bfloat16(), torch.randn(N, H, D, generator=g).bfloat16()


U = 2.0 ** -8


def bound(v):
    return (2 * U / (1 - U) + 1e-4) * float(v.abs().max())


GRID = [(G, D) for G in (1, 2, 3, 4, 8) for D in (64, 128, 256)]


@pytest.mark.parametrize("G,D", GRID)
@pytest.mark.parametrize("T,N,window,k0", [(37, 37, 0, 0), (77, 301, 0, 5), (130, 1111, 0, 0), (29, 333, 50, 3),
                                          (130, 700, 40, 0), (200, 711, 300, 2)])
def test_matches_float64_within_the_weight_rounding(G, D, T, N, window, k0):
    """A first chunk (T = N), chunks over a prefix, keys starting after position 0 (a window layer's store view),
    windows narrower than the chunk and wider (crossing 256-key blocks)."""
    H = 2 if G < 8 else 1
    q, k, v = case(T, N, H * G, H, D, seed=G * 100 + D + T + N)
    q0 = k0 + N - T
    out = cpu_decode.prefill_attn_bf16(q, k, v, q0, k0, window, 1 / math.sqrt(D))
    assert out.dtype == torch.float32 and out.shape == q.shape
    err = (out.double() - exact(q, k, v, q0, k0, window)).abs().max().item()
    assert err <= bound(v), f"max error {err:.2e} > {bound(v):.2e}"


def test_a_wrong_mask_would_fail_it():
    """The tolerance separates: the same inputs with the window off (or one position off) miss it by far."""
    q, k, v = case(64, 300, 4, 1, 64, seed=5)
    ours = cpu_decode.prefill_attn_bf16(q, k, v, 236, 0, 40, 1 / 8)
    assert (ours.double() - exact(q, k, v, 236, 0, 40)).abs().max() <= bound(v)
    assert (ours.double() - exact(q, k, v, 236, 0, 0)).abs().max() > 10 * bound(v)
    assert (ours.double() - exact(q, k, v, 236, 0, 39)).abs().max() > bound(v)


def test_the_same_bits_at_any_thread_count():
    q, k, v = case(200, 900, 8, 2, 128, seed=7)
    saved = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            runs.append(cpu_decode.prefill_attn_bf16(q, k, v, 700, 0, 0, 1 / math.sqrt(128)))
    finally:
        torch.set_num_threads(saved)
    assert all(torch.equal(runs[0], r) for r in runs[1:])


@pytest.mark.parametrize("window", [0, 24])
def test_the_engine_s_bf16_chunks_take_it_and_agree_with_the_reference(monkeypatch, window):
    """A bf16 chunk over a bf16 store with the chunk's own fresh float32 K/V (a sliding layer's window given as a
    hybrid store's view gives it): the "cpp" prefill (the kernel; the torch path patched to fail) against the float64
    reference of the same stored and fresh values."""
    H, G, D, T = 2, 3, 64, 45
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=16, num_blocks=32,
                                         dtype=torch.bfloat16))
    g = torch.Generator().manual_seed(3)
    seq = store.new_sequence()
    k, v = torch.randn(1, 190, H, D, generator=g), torch.randn(1, 190, H, D, generator=g)
    store.append(seq, k.bfloat16(), v.bfloat16())
    fresh = (k[0, -T:], v[0, -T:])                   # float32: the kernel reads them rounded to bf16, as SDPA did
    q = (torch.randn(T, H * G, D, generator=g) * 2).bfloat16()

    def boom(*a, **kw):
        raise AssertionError("the torch path ran where the prefill kernel should have")
    ref = decode._prefill_reference(q.double(), store, seq, 0, (fresh[0].bfloat16().double(),
                                                                fresh[1].bfloat16().double()), window)
    monkeypatch.setattr(decode, "_prefill_torch", boom)
    out = decode.IMPLEMENTATIONS["cpp"]["prefill"](q, store, seq, 0, fresh, window)
    assert out.dtype == torch.bfloat16
    # the kernel's bound, then the output's own rounding to bf16 (the contract: q's dtype)
    assert (out.double() - ref).abs().max() <= bound(v) + U * float(ref.abs().max())
    if not window:                                   # and the public entry point takes the same path
        assert torch.equal(decode.prefill_attention(q, store, seq, 0, backend="cpp", fresh=fresh), out)


def test_float32_chunks_and_odd_head_dims_never_take_it(monkeypatch):
    """Only bf16 queries with a head dim a multiple of 32 take this kernel: a float32 chunk takes the float32 kernel
    (tests/test_prefill_f32_kernel.py), a bf16 chunk of head dim 40 SDPA."""
    calls = []
    real = decode._prefill_torch
    monkeypatch.setattr(cpu_decode, "prefill_attn_bf16", lambda *a: pytest.fail("prefill_attn_bf16 ran"))
    monkeypatch.setattr(decode, "_prefill_torch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for D, dtype in ((64, torch.float32), (40, torch.bfloat16)):
        store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=D, block_size=16, num_blocks=8,
                                             dtype=torch.bfloat16))
        seq = store.new_sequence()
        store.append(seq, torch.randn(1, 40, 1, D).bfloat16(), torch.randn(1, 40, 1, D).bfloat16())
        decode.prefill_attention(torch.randn(8, 2, D).to(dtype), store, seq, 0, backend="cpp")
    assert len(calls) == 1


def test_strided_inputs_give_what_contiguous_ones_give():
    """k and v as a store gathers them for one layer out of a wider tensor; q with its heads sliced."""
    q, k, v = case(45, 160, 8, 4, 64, seed=9)
    kk, vv = k[:, ::2], v[:, 1::2]                   # [N, 2, D] views, not contiguous
    qq = q[:, :4]
    ours = cpu_decode.prefill_attn_bf16(qq, kk, vv, 115, 0, 0, 0.125)
    assert torch.equal(ours, cpu_decode.prefill_attn_bf16(qq.contiguous(), kk.contiguous(), vv.contiguous(), 115, 0, 0,
                                                          0.125))


def test_the_operator_itself_refuses_what_the_wrapper_refuses():
    """The C++ checks hold without the Python wrapper in front of them (ValueError, TypeError for a dtype:
    TORCH_CHECK_VALUE and TORCH_CHECK_TYPE)."""
    q, k, v = case(8, 20, 4, 2, 64, seed=2)
    op = torch.ops.sparsekv_cpu.prefill_attn_bf16
    for args in ((q.float(), k, v, 12, 0, 0, 0.125), (q, k, v[:10], 12, 0, 0, 0.125),
                 (q[..., :40], k[..., :40], v[..., :40], 12, 0, 0, 0.125), (q, k, v, 13, 0, 0, 0.125),
                 (q, k, v, 12, 0, -1, 0.125)):
        with pytest.raises((ValueError, TypeError), match="prefill_attn_bf16"):
            op(*args)


def test_bad_calls_name_the_argument():
    q, k, v = case(8, 20, 4, 2, 64, seed=1)
    with pytest.raises(TypeError, match="q must have dtype"):
        cpu_decode.prefill_attn_bf16(q.float(), k, v, 12, 0, 0, 0.125)
    with pytest.raises(ValueError, match="v must have shape"):
        cpu_decode.prefill_attn_bf16(q, k, v[:10], 12, 0, 0, 0.125)
    with pytest.raises(ValueError, match="multiple of k's 2 heads"):
        cpu_decode.prefill_attn_bf16(q[:, :3], k, v, 12, 0, 0, 0.125)
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_decode.prefill_attn_bf16(q[..., :40], k[..., :40], v[..., :40], 12, 0, 0, 0.125)
    with pytest.raises(ValueError, match="q0"):
        cpu_decode.prefill_attn_bf16(q, k, v, 13, 0, 0, 0.125)           # the last query past the last key
    with pytest.raises(ValueError, match="window"):
        cpu_decode.prefill_attn_bf16(q, k, v, 12, 0, -1, 0.125)
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="scale"):
            cpu_decode.prefill_attn_bf16(q, k, v, 12, 0, 0, bad)
