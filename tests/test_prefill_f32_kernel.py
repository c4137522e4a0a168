"""The float32 prefill attention kernel (`cpu/prefill_attn_f32.cpp`, `cpu_decode.prefill_attn_f32`) against float64,
and the engine's choice of it: for every float32 chunk, and for a bfloat16 chunk where AVX512-BF16 is missing.

The bound, derived from the arithmetic (u = 2^-24, float32's unit roundoff; gamma(n) = n u / (1 - n u)):
  1. Scores. q and K are float32 or bf16 (widened exactly). s_ij = scale * (q_i . K_j) is a chain of D fmas, then one
     product with the float32 scale (itself rounded from the double): |s^_ij - s_ij| <= E_i = gamma(D + 2) * scale *
     max_j sum_d |q_id K_jd| (Higham's bound for a dot product; computed below per query row, in float64).
  2. Weights. P_ij = exp(s^_ij - m^) with the argument's subtraction rounded (absolute error <= 87.3 u while the weight
     is not flushed; below -87.3 it is 0, at most e^-87.3 of the largest weight) and simd.h's exp within EXP_ERR
     (relative); a block's weights are carried to the final maximum by at most nb rescales alpha = exp(m - m'), each
     with the same two errors and applied alike to the numerator and the normaliser. A common factor cancels in the
     ratio, so each key's weight is p_j (1 + d_j) relative to the exact softmax's, |d_j| <= delta_i =
     e^{E_i} (1 + EXP_ERR + 87.3 u)^(nb + 1) - 1.
  3. Output. out = sum_j p~_j v_j with p~_j = p_j (1 + d_j) / (1 + sum_k p_k d_k): each within 2 delta / (1 - delta) of
     p_j relatively, so |out - exact| <= 2 delta / (1 - delta) * max|v| (the argument of test_prefill_kernel.py).
     The float32 sums add at most gamma(N + 2 nb + 8) of sum_j p_j |v_j| <= max|v| each to the numerator (a chain of
     fmas over keys, nb rescales) and to the normaliser (16 lanes, hsum's 4 levels, nb rescales and adds), and 1 / l
     and the product by it u each.
  bound_i = max|v| * (2 delta_i / (1 - delta_i) + 2 gamma(N + 2 nb + 8) + 3 u).
EXP_ERR is simd.h's exp's relative error: Cephes' polynomial is within about 1 ulp, with the reduction's and the
2^n product's roundings 2 ulp; 4 u is taken, and test_exp_stays_within_EXP_ERR measures it through the kernel. The
bound is a worst case (measured errors sit near 1e-6 of max|v|); a mask wrong by one position still misses it
(test_a_wrong_mask_would_fail_it).

The kernel is written only in simd.h's vector type, so a build for x86-64-v3 (AVX2 + FMA) gives the bits of this
build (tests/test_cpu_kernel.py compares them, this op included): the float64 checks here hold for the AVX2 build.
test_the_avx2_build_takes_it_for_bf16_chunks runs the x86-64-v3 build itself, as an AVX2 machine would.
"""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparsekv as sk
from sparsekv.attention import decode
from sparsekv.core import cpu_paths
from sparsekv.kernels import cpu_decode

pytestmark = pytest.mark.skipif(not cpu_decode.available(), reason=f"no CPU extension here: {cpu_decode.reason()}")

U = 2.0 ** -24
EXP_ERR = 4 * U
BLOCK = 256                     # the kernel's keys per softmax block (kBlock)


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


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


def bound(q, k, v) -> torch.Tensor:
    """The derived bound per query row, [T, Hq, 1] (the module docstring)."""
    T, Hq, D = q.shape
    N, H, _ = k.shape
    G = Hq // H
    a = q.double().abs().view(T, H, G, D).permute(1, 2, 0, 3) @ k.double().abs().permute(1, 2, 0)[:, None]
    E = gamma(D + 2) / math.sqrt(D) * a.amax(-1)                               # [H, G, T]
    nb = -(-N // BLOCK) + 1                                                    # blocks: an unaligned start adds one
    delta = torch.exp(E) * (1 + EXP_ERR + 87.3 * U) ** (nb + 1) - 1
    per_row = float(v.double().abs().max()) * (2 * delta / (1 - delta) + 2 * gamma(N + 2 * nb + 8) + 3 * U)
    return per_row.permute(2, 0, 1).reshape(T, Hq, 1)


def case(T, N, Hq, H, D, seed, dtype=torch.bfloat16, q_scale=2.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(T, Hq, D, generator=g) * q_scale).to(dtype)      # peaked scores: weights far from uniform
    return q, torch.randn(N, H, D, generator=g).to(dtype), torch.randn(N, H, D, generator=g).to(dtype)


def check(q, k, v, q0, k0, window):
    out = cpu_decode.prefill_attn_f32(q, k, v, q0, k0, window, 1 / math.sqrt(q.shape[-1]))
    assert out.dtype == torch.float32 and out.shape == q.shape
    err = (out.double() - exact(q, k, v, q0, k0, window)).abs()
    b = bound(q, k, v)
    assert bool((err <= b).all()), f"max error {err.max():.2e}, worst ratio to its bound {(err / b).max():.2f}"
    return out


# GQA ratios 1 to 8, head dims 16 to 256 (48 and 80: a last 16-dim chunk past the AVX-512 path's 32-dim pairs),
# float32 and bf16 storage
GRID = [(1, 64, torch.bfloat16), (3, 64, torch.float32), (2, 48, torch.bfloat16), (4, 256, torch.bfloat16),
        (8, 128, torch.float32), (5, 16, torch.float32), (3, 80, torch.bfloat16)]


@pytest.mark.parametrize("G,D,dtype", GRID)
@pytest.mark.parametrize("T,N,window,k0", [(37, 37, 0, 0), (77, 301, 0, 5), (130, 1111, 0, 0), (29, 333, 50, 3),
                                          (130, 700, 40, 0), (61, 711, 300, 2), (1, 517, 0, 0), (1, 517, 7, 1)])
@pytest.mark.isa
def test_matches_float64_within_the_derived_bound(G, D, dtype, T, N, window, k0):
    """A first chunk (T = N), chunks over a prefix, keys starting after position 0 (a window layer's store view),
    windows narrower and wider than the chunk (crossing 256-key blocks), one query (a decode-sized chunk); tiles of
    60 rows and microkernels of 6 cut rows of one token's G heads apart."""
    H = 2 if G < 5 else 1
    q, k, v = case(T, N, H * G, H, D, seed=G * 100 + D + T + N, dtype=dtype)
    check(q, k, v, k0 + N - T, k0, window)


def test_mixed_dtypes_and_uniform_weights():
    """float32 queries over bf16 K/V (the kernel widens each exactly); q = 0 (every visible key weighs alike)."""
    q, k, v = case(45, 400, 6, 3, 64, seed=4)
    check(q.float(), k, v, 355, 0, 0)
    check(torch.zeros(45, 6, 64), k, v, 355, 0, 33)


@pytest.mark.isa
def test_exp_stays_within_EXP_ERR():
    """One query over two keys with equal values 1 and 0: the output is w / (1 + w) with w = exp(s) of the score gap,
    so the kernel's exp is read back; over 2,001 gaps in [-80, 0] its relative error stays under the EXP_ERR the
    bound assumes (plus the division's and the sums' roundings, 4 u)."""
    D = 16
    gaps = torch.linspace(-80, 0, 2001, dtype=torch.float64)
    worst = 0.0
    for s in gaps.tolist():
        # q . k1 * scale = 0, q . k0 * scale = s: q = (4 s, 0, ...), k0 = e_0, k1 = 0 (scale 1/4)
        qf = torch.zeros(1, 1, D)
        qf[0, 0, 0] = 4 * s
        s32 = float(qf[0, 0, 0]) / 4                     # the float32 score the kernel forms
        k = torch.zeros(2, 1, D)
        k[0, 0, 0] = 1.0
        v = torch.zeros(2, 1, D)
        v[0, 0, 0] = 1.0                                 # out[0] = w0 / (w0 + w1), w0 = exp(s - 0), w1 = 1
        out = float(cpu_decode.prefill_attn_f32(qf, k, v, 1, 0, 0, 0.25)[0, 0, 0])
        w = math.exp(s32)
        want = w / (1 + w)
        worst = max(worst, abs(out - want) / want)
    assert worst <= EXP_ERR + 87.3 * U + 4 * U, f"exp's relative error reached {worst / U:.1f} u"


@pytest.mark.isa
def test_a_wrong_mask_would_fail_it():
    """The bound separates: the same inputs with the window off, or one position off, miss it."""
    q, k, v = case(64, 300, 4, 1, 64, seed=5)
    ours = cpu_decode.prefill_attn_f32(q, k, v, 236, 0, 40, 1 / 8).double()
    b = bound(q, k, v)
    assert bool(((ours - exact(q, k, v, 236, 0, 40)).abs() <= b).all())
    assert not bool(((ours - exact(q, k, v, 236, 0, 0)).abs() <= b).all())
    assert not bool(((ours - exact(q, k, v, 236, 0, 39)).abs() <= b).all())
    assert not bool(((ours - exact(q, k, v, 235, 0, 40)).abs() <= b).all())      # causal edge one key short


@pytest.mark.parametrize("window", [0, 100])
def test_the_same_bits_at_any_thread_count(window):
    """14 tiles of 60 rows per head, 2 heads: grouped 4 per head at 1 and 2 threads, 6 per head at 3 (the item count a
    multiple of the threads), so each tile runs beside other tiles; with a window, tiles of one item start their
    key blocks at different keys."""
    q, k, v = case(200, 900, 8, 2, 128, seed=7)
    saved = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            runs.append(cpu_decode.prefill_attn_f32(q, k, v, 700, 0, window, 1 / math.sqrt(128)))
    finally:
        torch.set_num_threads(saved)
    assert all(torch.equal(runs[0], r) for r in runs[1:])


def test_strided_inputs_give_what_contiguous_ones_give():
    q, k, v = case(45, 160, 8, 4, 64, seed=9)
    kk, vv, qq = k[:, ::2], v[:, 1::2], q[:, :4]       # [N, 2, D] views, and q with its heads sliced
    ours = cpu_decode.prefill_attn_f32(qq, kk, vv, 115, 0, 0, 0.125)
    assert torch.equal(ours, cpu_decode.prefill_attn_f32(qq.contiguous(), kk.contiguous(), vv.contiguous(), 115, 0,
                                                         0, 0.125))


def _bf16_store(H, D, n, seed):
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=16, num_blocks=32,
                                         dtype=torch.bfloat16))
    g = torch.Generator().manual_seed(seed)
    seq = store.new_sequence()
    k, v = torch.randn(1, n, H, D, generator=g), torch.randn(1, n, H, D, generator=g)
    store.append(seq, k.bfloat16(), v.bfloat16())
    return store, seq, k, v, g


@pytest.mark.parametrize("window", [0, 24])
def test_without_avx512_bf16_the_engine_s_bf16_chunks_take_it(monkeypatch, window):
    """Where prefill_attn_bf16 is not built (patched off here; an AVX2 machine) and this kernel is vectorised, a bf16
    chunk takes it instead of SDPA: recorded as the gated path "bf16_prefill_f32_kernel", within the bound of the
    float64 reference of the same stored and fresh values (bf16), then the output's rounding to bf16."""
    if not cpu_decode.f32_prefill_vectorized():
        pytest.skip("the float32 prefill kernel is not vectorised in this build (no AVX2 + FMA)")
    H, G, D, T = 2, 3, 48, 45
    store, seq, k, v, g = _bf16_store(H, D, 190, seed=3)
    fresh = (k[0, -T:], v[0, -T:])                   # float32: read rounded to bf16, as SDPA reads them
    q = (torch.randn(T, H * G, D, generator=g) * 2).bfloat16()

    def boom(*a, **kw):
        raise AssertionError("the torch path ran where the float32 prefill kernel should have")
    fb = (fresh[0].bfloat16(), fresh[1].bfloat16())
    ref = decode._prefill_reference(q.double(), store, seq, 0, (fb[0].double(), fb[1].double()), window)
    monkeypatch.setattr(cpu_decode, "bf16_prefill_available", lambda: False)
    monkeypatch.setattr(decode, "_prefill_torch", boom)
    cpu_paths.reset()
    out = decode.IMPLEMENTATIONS["cpp"]["prefill"](q, store, seq, 0, fresh, window)
    assert cpu_paths.taken() == ["bf16_prefill_f32_kernel"]
    assert out.dtype == torch.bfloat16
    kk, vv = decode._prefill_kv(q, store, seq, 0, fresh, dtype=torch.bfloat16)
    b = bound(q, kk, vv) + 2.0 ** -8 * ref.abs().amax(-1, keepdim=True)      # then bf16's rounding of the output
    assert bool(((out.double() - ref).abs() <= b).all())
    cpu_paths.reset()


@pytest.mark.parametrize("storage,window,with_fresh", [(torch.float32, 0, True), (torch.bfloat16, 24, True),
                                                        (torch.bfloat16, 0, False), (torch.float32, 31, False)])
def test_float32_chunks_take_it_on_every_cpu(monkeypatch, storage, window, with_fresh):
    """The engine's float32 prefill (every smoke notebook's) takes this kernel, whatever the CPU has: "auto" and "cpp"
    alike, no gated path recorded (its bits are the same on every instruction set and thread count), the stored K/V
    read as stored (bf16 widened exactly) and the chunk's fresh K/V in float32, within the derived bound of the
    float64 reference of those same values."""
    H, G, D, T, n = 2, 3, 48, 45, 190
    store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=16, num_blocks=32,
                                         dtype=storage))
    g = torch.Generator().manual_seed(7)
    seq = store.new_sequence()
    k, v = torch.randn(n, H, D, generator=g), torch.randn(n, H, D, generator=g)
    store.append(seq, k[None].to(storage), v[None].to(storage))
    fresh = (k[-T:], v[-T:]) if with_fresh else None
    q = torch.randn(T, H * G, D, generator=g) * 2

    def boom(*a, **kw):
        raise AssertionError("the torch path ran where the float32 prefill kernel should have")
    monkeypatch.setattr(decode, "_prefill_torch", boom)
    kk, vv = decode._prefill_kv(q, store, seq, 0, fresh)                      # [n, H, D]: what the kernel reads
    assert kk.dtype == (torch.float32 if with_fresh else storage)
    start = decode._prefill_start(n, T, window)
    ref = exact(q, kk[start:], vv[start:], n - T, start, window)
    for backend in ("auto", "cpp"):              # the window as a hybrid store's view passes it
        cpu_paths.reset()
        out = decode._implementation("prefill", backend, q, store)(q, store, seq, 0, fresh, window)
        assert cpu_paths.taken() == [] and out.dtype == torch.float32
        assert bool(((out.double() - ref).abs() <= bound(q, kk[start:], vv[start:])).all())
    assert decode.auto_prefill_path(q, store) == "f32_prefill_kernel"


def test_what_keeps_the_torch_path(monkeypatch):
    """A float32 chunk with a head dim off the 16-lane grid and a bf16 chunk off the grid keep SDPA (the second
    records that gated path); a float64 chunk keeps the reference; a float32 chunk over float16 storage keeps SDPA. (Where the extension is not built, "auto" resolves
    to the torch backend before any of this.)"""
    calls = []
    real = decode._prefill_torch
    monkeypatch.setattr(cpu_decode, "bf16_prefill_available", lambda: False)
    monkeypatch.setattr(decode, "_prefill_torch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    cpu_paths.reset()
    store, seq, *_ = _bf16_store(1, 40, 40, seed=2)
    decode.prefill_attention(torch.randn(8, 2, 40), store, seq, 0, backend="cpp")
    assert len(calls) == 1 and cpu_paths.taken() == []
    decode.prefill_attention(torch.randn(8, 2, 40).bfloat16(), store, seq, 0, backend="cpp")
    assert len(calls) == 2 and cpu_paths.taken() == ["bf16_prefill_sdpa"]
    cpu_paths.reset()
    store, seq, *_ = _bf16_store(1, 64, 40, seed=1)
    decode.prefill_attention(torch.randn(8, 2, 64).double(), store, seq, 0, backend="cpp")
    assert len(calls) == 3 and cpu_paths.taken() == []
    half = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, num_blocks=8,
                                        dtype=torch.float16))
    hseq = half.new_sequence()
    half.append(hseq, torch.randn(1, 40, 1, 64).half(), torch.randn(1, 40, 1, 64).half())
    decode.prefill_attention(torch.randn(8, 2, 64), half, hseq, 0, backend="cpp")
    assert len(calls) == 4 and cpu_paths.taken() == []


AVX2_SCRIPT = r"""
import math, sys, torch
sys.path.insert(0, sys.argv[1])
from test_prefill_f32_kernel import _bf16_store, bound
from sparsekv.attention import decode
from sparsekv.core import cpu_paths
from sparsekv.kernels import cpu_decode
assert cpu_decode.arch() == "x86-64-v3" and not cpu_decode.bf16_prefill_available() and cpu_decode.f32_prefill_vectorized()
store, seq, k, v, g = _bf16_store(1, 256, 300, seed=8)          # Gemma 3's attention shape: 4 heads over 1 of 256
q = (torch.randn(60, 4, 256, generator=g) * 2).bfloat16()
out = decode.prefill_attention(q, store, seq, 0, backend="cpp")
ref = decode._prefill_reference(q.double(), store, seq, 0)
kk, vv = store.gather(seq, 0)
b = bound(q, kk, vv) + 2.0 ** -8 * ref.abs().amax(-1, keepdim=True)
assert cpu_paths.taken() == ["bf16_prefill_f32_kernel"], cpu_paths.taken()
assert bool(((out.double() - ref).abs() <= b).all())
print("ok")
"""


def test_the_avx2_build_takes_it_for_bf16_chunks():
    """The extension built for x86-64-v3 (no AVX-512, so no prefill_attn_bf16), in a subprocess: the engine's bf16
    prefill takes this kernel there, records it, and meets the bound. Only on a CPU with AVX2 and FMA."""
    from sparsekv.suite.cpuconfig import cpu_flags
    if not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("this CPU cannot run an x86-64-v3 build")
    env = {**os.environ, "SPARSEKV_CPU_ARCH": "x86-64-v3", "SPARSEKV_EXT_DIR": str(cpu_decode.build_dir()),
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", AVX2_SCRIPT, str(Path(__file__).parent)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


@pytest.mark.isa
def test_bad_calls_name_the_argument():
    q, k, v = case(8, 20, 4, 2, 64, seed=1)
    with pytest.raises(TypeError, match="q must have dtype"):
        cpu_decode.prefill_attn_f32(q.double(), k, v, 12, 0, 0, 0.125)
    with pytest.raises(TypeError, match="v must have dtype"):
        cpu_decode.prefill_attn_f32(q, k, v.float(), 12, 0, 0, 0.125)
    with pytest.raises(ValueError, match="v must have shape"):
        cpu_decode.prefill_attn_f32(q, k, v[:10], 12, 0, 0, 0.125)
    with pytest.raises(ValueError, match="multiple of k's 2 heads"):
        cpu_decode.prefill_attn_f32(q[:, :3], k, v, 12, 0, 0, 0.125)
    with pytest.raises(ValueError, match="multiple of 16"):
        cpu_decode.prefill_attn_f32(q[..., :40], k[..., :40], v[..., :40], 12, 0, 0, 0.125)
    with pytest.raises(ValueError, match="q0"):
        cpu_decode.prefill_attn_f32(q, k, v, 13, 0, 0, 0.125)
    with pytest.raises(ValueError, match="window"):
        cpu_decode.prefill_attn_f32(q, k, v, 12, 0, -1, 0.125)
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="scale"):
            cpu_decode.prefill_attn_f32(q, k, v, 12, 0, 0, bad)
