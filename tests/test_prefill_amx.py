"""Prefill attention where oneDNN has AMX tiles: "auto" sends a bfloat16 chunk to SDPA (`decode._amx_sdpa`).

On an AMX CPU, SDPA's bfloat16 flash attention runs its products on oneDNN's AMX microkernels, faster than the
extension's AVX512-BF16 kernel (benchmarks/results/prefill_native_xeon.json). The tests check the choice (which path
runs, what it records, that an explicit backend is obeyed and nothing else moves), the detection (`cpu_paths.amx_bf16`:
the CPU flag, the kernel's tile permission and oneDNN's ISA cap), and that SDPA's bfloat16 path as the engine calls it
meets a bound derived from its arithmetic against float64, on odd sizes: the bf16 products of q and k accumulate in
float32; each unnormalised weight is rounded to bf16 once (relative u = 2^-8) before it multiplies V while the
normaliser sums them unrounded, so the output is off by at most u * max|v|, and at most 2u / (1 - u) * max|v| if the
normaliser sums rounded weights (the extension kernel's arithmetic); float32 scores, sums and exp add 1e-4 * max|v|;
then the output's rounding to bf16 adds u * |out| (2^-9 when rounding to nearest; 2^-8 covers truncation too).
"""
import math

import pytest
import torch

import sparsekv as sk
from sparsekv.attention import decode
from sparsekv.core import cpu_paths
from sparsekv.kernels import cpu_decode

U = 2.0 ** -8


def _forced(monkeypatch, value: bool):
    """amx_bf16() forced to `value` (the choice is tested on every CPU; SDPA itself runs whatever this CPU has)."""
    monkeypatch.setattr(cpu_paths, "amx_bf16", lambda: value)
    cpu_paths.reset()
    yield
    cpu_paths.reset()


@pytest.fixture
def amx(monkeypatch):
    yield from _forced(monkeypatch, True)


@pytest.fixture
def no_amx(monkeypatch):
    yield from _forced(monkeypatch, False)


def _store(H, D, n, seed, dtype=torch.bfloat16, window=0):
    cfg = sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=16, num_blocks=(n + 15) // 16 + 4,
                         dtype=dtype)
    store = sk.BlockStore(cfg)
    g = torch.Generator().manual_seed(seed)
    seq = store.new_sequence()
    k, v = torch.randn(1, n, H, D, generator=g), torch.randn(1, n, H, D, generator=g)
    store.append(seq, k.to(dtype), v.to(dtype))
    return store, seq, k[0], v[0], g


def _boom(*a, **kw):
    raise AssertionError("an extension kernel ran where SDPA should have")


def test_auto_sends_a_bf16_chunk_to_sdpa_where_amx_is(amx, monkeypatch):
    """The same bits as backend="torch", the SDPA gated path recorded, neither extension kernel called."""
    store, seq, k, v, g = _store(3, 64, 173, seed=1)
    q = (torch.randn(41, 9, 64, generator=g) * 2).bfloat16()
    fresh = (k[-41:], v[-41:])
    want = decode.prefill_attention(q, store, seq, 0, backend="torch", fresh=fresh)
    cpu_paths.reset()
    monkeypatch.setattr(cpu_decode, "prefill_attn_bf16", _boom)
    monkeypatch.setattr(cpu_decode, "prefill_attn_f32", _boom)
    got = decode.prefill_attention(q, store, seq, 0, fresh=fresh)
    assert torch.equal(got, want)
    assert cpu_paths.taken() == ["bf16_prefill_sdpa"]
    assert decode.auto_prefill_path(q, store) == "sdpa_amx"


def _kernel_runs(monkeypatch, path: str, **kw) -> list:
    """A bf16 chunk through prefill_attention(**kw) with the extension's kernel for this CPU patched to a marker
    named `path`; returns its calls (skipped where the extension is not built: "cpp" is then unavailable)."""
    if not cpu_decode.available():
        pytest.skip("the extension is not built here")
    store, seq, *_ = _store(1, 64, 40, seed=2)
    q = torch.randn(8, 2, 64).bfloat16()
    called = []
    monkeypatch.setattr(decode, "_prefill_kernel",
                        lambda q, s: (path, lambda *a: called.append(1) or torch.zeros(q.shape)))
    decode.prefill_attention(q, store, seq, 0, **kw)
    assert decode.auto_prefill_path(q, store) == ("sdpa_amx" if cpu_paths.amx_bf16() else path)
    return called


def test_an_explicit_cpp_backend_still_takes_the_kernel(amx, monkeypatch):
    """backend="cpp" is obeyed on an AMX CPU: the kernel this CPU has runs."""
    assert _kernel_runs(monkeypatch, "bf16_prefill_kernel", backend="cpp") == [1]
    assert cpu_paths.taken() == ["bf16_prefill_kernel"]


def test_without_amx_auto_keeps_the_extension_kernel(no_amx, monkeypatch):
    """Where amx_bf16() is False, "auto" takes the kernel this CPU has, as before."""
    assert _kernel_runs(monkeypatch, "bf16_prefill_f32_kernel") == [1]
    assert cpu_paths.taken() == ["bf16_prefill_f32_kernel"]


def test_float32_and_int8_chunks_are_untouched_by_amx(amx):
    """The float32 prefill (every smoke notebook's) records no gated path with AMX on and takes the extension's float32
    kernel, the bits it gives without AMX; an int8 store keeps the torch path it always took."""
    store, seq, *_ = _store(2, 32, 70, seed=4, dtype=torch.float32)
    q = torch.randn(11, 4, 32)
    out = decode.prefill_attention(q, store, seq, 0)
    assert cpu_paths.taken() == []
    if cpu_decode.available():
        k, v = store.gather(seq, 0)
        assert torch.equal(out, cpu_decode.prefill_attn_f32(q, k, v, 70 - 11, 0, 0, 32 ** -0.5))
        assert decode.auto_prefill_path(q, store) == "f32_prefill_kernel"
    else:
        assert torch.equal(out, decode.prefill_attention(q, store, seq, 0, backend="torch"))
    qstore = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=2, head_dim=32, block_size=16, num_blocks=8,
                                          kv_bits=8))
    qseq = qstore.new_sequence()
    qstore.append(qseq, torch.randn(1, 30, 2, 32), torch.randn(1, 30, 2, 32))
    assert not decode._amx_sdpa(q.bfloat16(), qstore)


def _exact(q, k, v, q0, window):
    """float64 attention of q [T, Hq, D] (positions q0..) over k, v [N, H, D] (positions 0..), causal, windowed."""
    T, Hq, D = q.shape
    N, H, _ = k.shape
    s = q.double().view(T, H, Hq // H, D).permute(1, 2, 0, 3) @ k.double().permute(1, 2, 0)[:, None] / math.sqrt(D)
    qp, kp = torch.arange(q0, q0 + T)[:, None], torch.arange(N)[None]
    hidden = (kp > qp) | ((qp - kp >= window) if window else torch.zeros((), dtype=torch.bool))
    out = s.masked_fill(hidden, -torch.inf).softmax(-1) @ v.double().permute(1, 0, 2)[:, None]
    return out.permute(2, 0, 1, 3).reshape(T, Hq, D)


@pytest.mark.parametrize("G,D", [(1, 64), (3, 64), (4, 256), (8, 128), (2, 48)])
@pytest.mark.parametrize("T,N,window", [(37, 37, 0), (77, 301, 0), (130, 611, 0), (29, 333, 50), (130, 700, 40)])
def test_sdpa_bf16_as_the_engine_calls_it_meets_the_bound(amx, G, D, T, N, window):
    """The path "auto" takes on AMX (SDPA over bf16 q, stored K/V and the chunk's fresh K/V), on fresh random inputs
    of odd sizes: GQA 1 to 8, head dims on and off the 32-lane grid, a first chunk, windows narrower than the chunk.
    A hybrid store's sliding layer is modelled by the window argument of the implementation, as the store view gives
    it."""
    H = 2 if G < 8 else 1
    store, seq, k, v, g = _store(H, D, N, seed=G * 1000 + D + T + N)
    q = (torch.randn(T, H * G, D, generator=g) * 2).bfloat16()        # peaked scores: weights far from uniform
    fresh = (k[-T:], v[-T:])                                         # float32, read rounded to bf16 as SDPA reads
    out = decode._prefill_torch(q, store, seq, 0, fresh, window)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    kk, vv = decode._prefill_kv(q, store, seq, 0, (fresh[0].bfloat16(), fresh[1].bfloat16()),
                                dtype=torch.bfloat16)               # the bf16 values SDPA multiplies
    ref = _exact(q, kk, vv, N - T, window)
    vmax = float(vv.abs().max())
    bound = (2 * U / (1 - U) + 1e-4) * vmax + U * ref.abs()
    err = (out.double() - ref).abs()
    assert bool((err <= bound).all()), f"max excess {float((err - bound).max()):.2e}"


def test_the_bound_separates_a_wrong_window():
    """The tolerance is tight enough to catch a mask one position off (so the test above can fail)."""
    store, seq, k, v, g = _store(1, 64, 300, seed=5)
    q = (torch.randn(64, 4, 64, generator=g) * 2).bfloat16()
    out = decode._prefill_torch(q, store, seq, 0, None, 40)
    kk, vv = decode._prefill_kv(q, store, seq, 0, None, dtype=torch.bfloat16)
    vmax = float(vv.abs().max())
    for window, ok in ((40, True), (39, False), (0, False)):
        ref = _exact(q, kk, vv, 236, window)
        fits = bool(((out.double() - ref).abs() <= (2 * U / (1 - U) + 1e-4) * vmax + U * ref.abs()).all())
        assert fits == ok, window


@pytest.fixture
def fresh_detection():
    cpu_paths.amx_bf16.cache_clear()
    yield
    cpu_paths.amx_bf16.cache_clear()


@pytest.mark.parametrize("flags,cap,tiles,want", [
    ({"avx2", "amx_bf16", "amx_tile"}, None, True, True),
    ({"avx2", "amx_bf16", "amx_tile"}, "AVX512_CORE_AMX", True, True),
    ({"avx2", "amx_bf16", "amx_tile"}, "avx2", True, False),                   # suite.cpuconfig's "alt"
    ({"avx2", "amx_bf16", "amx_tile"}, "AVX512_CORE_BF16", True, False),
    ({"avx2", "amx_bf16", "amx_tile"}, None, False, False),                    # the kernel denied the tile state
    ({"avx2", "avx512_bf16"}, None, True, False),                              # AVX512-BF16 without AMX
])
def test_amx_detection_reads_the_flag_the_tiles_and_onednn_s_cap(monkeypatch, fresh_detection, cpu_as, flags, cap,
                                                                 tiles, want):
    cpu_as(flags, cap)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: tiles, raising=False)
    assert cpu_paths.amx_bf16() is want


def test_cpu_flags_reads_this_machine(fresh_detection):
    """The flags come from /proc/cpuinfo where it exists (every x86-64 Linux CPU the suite runs on has sse2)."""
    import os
    flags = cpu_paths.cpu_flags()
    assert ("sse2" in flags) == os.path.exists("/proc/cpuinfo")
