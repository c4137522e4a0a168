"""The int4 codec (`storage.codec.Int4Codec`): routing over int4 blocks, the equal-bytes study's smallest lossless-
in-structure store. Codes against a float64 reference, the packed layout the byte model counts, and the engine."""
import pytest
import torch

import sparsekv as sk
from sparsekv.core.traffic import cache_bytes
from sparsekv.storage.codec import CODECS, Int4Codec, pack_int4, quantize_int8, quantize_sym, unpack_int4


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 3, 63), (33, 5, 64), (2, 1, 129)])
def test_int4_codes_meet_their_bound_against_float64(shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * torch.rand(shape[:2] + (1,), generator=g,
                                                                           dtype=torch.float64) * 10
    x[0, 0] = 0                                                      # an all-zero row: scale 1, codes 0
    codes, scale = quantize_sym(x.float(), 4)
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32 and codes.shape == shape
    assert int(codes.abs().max()) <= 7
    ref = x.abs().amax(-1) / 7                                       # the float64 scale
    ref = torch.where(ref > 0, ref, torch.ones_like(ref))
    assert torch.allclose(scale.double(), ref, rtol=1e-6)
    err = (codes.double() * scale.double()[..., None] - x).abs()
    # round-to-nearest of x / scale: |code - x / scale| <= 1/2, plus float32's rounding of x and of the scale
    assert (err <= scale.double()[..., None] * (0.5 + 1e-5) + 1e-6).all()
    assert torch.equal(codes[0, 0], torch.zeros_like(codes[0, 0])) and scale[0, 0] == 1


def test_eight_bit_symmetric_codes_are_the_int8_codec_s():
    x = torch.randn(11, 3, 64, generator=torch.Generator().manual_seed(1))
    a, b = quantize_sym(x, 8), quantize_int8(x)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("d", [0, 1, 2, 7, 64, 129])
def test_packing_two_codes_per_byte_is_exact(d):
    codes = torch.randint(-8, 8, (5, 3, d), generator=torch.Generator().manual_seed(d), dtype=torch.int8)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 3, -(-d // 2))
    assert torch.equal(unpack_int4(packed, d), codes)


def test_packing_rejects_bad_arguments():
    with pytest.raises(TypeError, match="codes must be int8"):
        pack_int4(torch.zeros(3, dtype=torch.int16))
    with pytest.raises(ValueError, match=r"codes must lie in \[-8, 7\]"):
        pack_int4(torch.tensor([9], dtype=torch.int8))
    with pytest.raises(ValueError, match="d must be an int"):
        unpack_int4(torch.zeros(3, dtype=torch.uint8), 7)
    with pytest.raises(TypeError, match="packed must be uint8"):
        unpack_int4(torch.zeros(3, dtype=torch.int8), 6)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        quantize_sym(torch.zeros(1, 1, 4), 3)
    with pytest.raises(ValueError, match="kv_bits must be 0"):
        sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=8, kv_bits=2)


@pytest.mark.parametrize("T", [1, 16, 203])
def test_an_int4_store_reads_back_its_codes_times_scales_and_counts_packed_bytes(T):
    c = sk.StoreConfig(num_layers=2, num_kv_heads=3, head_dim=64, block_size=16, num_blocks=32, kv_bits=4)
    assert CODECS[4] is Int4Codec and c.kv_row_bytes == 32 + 4
    store = sk.BlockStore(c)
    seq = store.new_sequence()
    k, v = torch.randn(2, T, 3, 64), torch.randn(2, T, 3, 64)
    store.append(seq, k, v)
    for layer in range(2):
        gk, gv = store.gather(seq, layer)
        for got, x in ((gk, k[layer]), (gv, v[layer])):
            codes, scale = quantize_sym(x, 4)
            assert torch.equal(got, codes.float() * scale[..., None])
    model = cache_bytes("lossless", layers=2, kv_heads=3, head_dim=64, tokens=T, block_size=16, kv_bits=4)
    assert model.read == 2 * 3 * 2 * T * (32 + 4)                  # packed nibbles plus a float32 scale per row


def test_routing_over_int4_blocks_decodes_near_the_exact_store():
    """A tiny random model: int4 K/V change the logits (they are lossy) but stay close, and int8 stays closer."""
    m = sk.Model(sk.ModelConfig.from_name("tiny"))
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    logits = {}
    for bits in (0, 8, 4):
        eng = sk.Engine(m, block_size=8, num_blocks=64, progress=False, kv_bits=bits)
        s = eng.new_sequence()
        eng.prefill(s, ids)
        eng.decode(s, 1)
        logits[bits] = eng.last_logits(s).double()
    d8, d4 = (logits[8] - logits[0]).abs().max(), (logits[4] - logits[0]).abs().max()
    assert 0 < d8 < d4 < logits[0].abs().max()


@pytest.mark.parametrize("kv_bits", [8, 4])
def test_a_hybrid_store_s_sliding_and_global_layers_read_back_their_own_codes(kv_bits):
    """Gemma 3's store (sliding layers beside global ones) over int codes, appended in odd pieces across window
    releases: every layer reads back exactly the codes times the scales of what it was given, over the tokens its
    window keeps. (Gemma 3 270M answers almost nothing over int4 blocks in the equal-bytes study, 2026-12-05: the
    loss is the codec's, not a read or write path's.)"""
    from sparsekv.storage.hybrid import HybridStore
    windows = (7, 0, 13, 7, 0)
    store = HybridStore(sk.StoreConfig(num_layers=5, num_kv_heads=2, head_dim=10, block_size=4, num_blocks=200,
                                       kv_bits=kv_bits), windows)
    seq = store.new_sequence()
    g = torch.Generator().manual_seed(7)
    ks, vs = [], []
    for n in (5, 1, 9, 3, 11):
        k, v = torch.randn(5, n, 2, 10, generator=g), torch.randn(5, n, 2, 10, generator=g)
        store.append(seq, k, v)
        ks.append(k), vs.append(v)
        store.trim(seq)
    K, V = torch.cat(ks, 1), torch.cat(vs, 1)
    for layer, w in enumerate(windows):
        start = store.view(seq, layer).seq.released * 4
        assert (w == 0) == (start == 0) and start <= max(0, K.shape[1] - w)
        gk, gv = store.gather(seq, layer, start)
        for got, x in ((gk, K[layer, start:]), (gv, V[layer, start:])):
            codes, scale = quantize_sym(x, 4) if kv_bits == 4 else quantize_int8(x)
            assert torch.equal(got, codes.float() * scale[..., None]), (kv_bits, layer)
