"""int8 K/V blocks in the store (StoreConfig.kv_bits=8): exact against a float64 reference of the
dequantised values, bounded against the float store, and every store invariant kept (scales copied on
copy-on-write, summaries of the stored values, bytes of what is held)."""
import pytest
import torch

import sparsekv as sk
from sparsekv.storage.store import quantize_int8


def _pair(H, D, T, bs=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = dict(num_layers=2, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=2 * (-(-T // bs)) + 4)
    f, q8 = sk.BlockStore(sk.StoreConfig(**cfg)), sk.BlockStore(sk.StoreConfig(**cfg, kv_bits=8))
    k, v = torch.randn(2, T, H, D, generator=g), torch.randn(2, T, H, D, generator=g)
    sf, sq = f.new_sequence(), q8.new_sequence()
    f.append(sf, k, v)
    q8.append(sq, k, v)
    return f, sf, q8, sq, k, v


def _ref(q, k, v):
    """float64 attention of q [Hq, D] over k, v [N, H, D]."""
    H, D = k.shape[1], k.shape[2]
    G = q.shape[0] // H
    s = q.double().view(H, G, D) @ k.double().permute(1, 2, 0) / D ** 0.5
    return (s.softmax(-1) @ v.double().permute(1, 0, 2)).reshape(-1, D)


def test_quantize_int8_bounds_the_error_by_half_a_scale():
    x = torch.randn(37, 3, 64) * torch.rand(37, 3, 1) * 10
    x[5, 1] = 0.0                                                   # an all-zero row keeps scale 1, codes 0
    codes, scale = quantize_int8(x)
    assert codes.dtype == torch.int8 and scale.shape == (37, 3) and codes.abs().max() <= 127
    err = (codes.float() * scale[..., None] - x).abs()
    assert (err <= scale[..., None] / 2 + 1e-6).all()
    assert torch.equal(codes[5, 1], torch.zeros(64, dtype=torch.int8)) and scale[5, 1] == 1


@pytest.mark.parametrize("G", [1, 2, 3, 8])
@pytest.mark.parametrize("D", [64, 128])
def test_int8_decode_matches_float64_of_the_stored_values(G, D):
    H, T = 2, 16 * 7 + 5                                            # a partial last block
    f, sf, q8, sq, k, v = _pair(H, D, T, seed=G * D)
    q = torch.randn(H * G, D)
    kd, vd = q8.gather(sq, 1)
    assert (kd - k[1]).abs().max() <= k[1].abs().amax(-1).max() / 254 + 1e-6      # lossy, by at most half a step
    want = _ref(q, kd, vd)
    for backend in ("reference", "torch"):
        out = sk.dense_attention(q, q8, sq, 1, backend=backend)
        assert (out.double() - want).abs().max() < 1e-5, backend
    blocks = torch.tensor([[0, 2, 7], [1, 4, 7]][:H])
    sel_k = torch.cat([torch.arange(j * 16, min(T, j * 16 + 16)) for j in [0, 2, 7]])
    out, res = sk.sparse_attention(q, q8, sq, 1, blocks, backend="torch")
    ref_out, _ = sk.sparse_attention(q, q8, sq, 1, blocks, backend="reference")
    assert (out - ref_out).abs().max() < 1e-5
    want0 = _ref(q[:G], kd[sel_k][:, :1], vd[sel_k][:, :1])          # kv head 0 over its selected rows
    assert (out[:G].double() - want0).abs().max() < 1e-5
    # against the float store: the int8 error stays small on unit-variance data
    assert (sk.dense_attention(q, q8, sq, 1) - sk.dense_attention(q, f, sf, 1)).abs().max() < 0.05


def test_int8_store_keeps_its_invariants():
    f, sf, q8, sq, k, v = _pair(3, 64, 16 * 3 + 9)
    child = q8.fork(sq)
    before = q8.gather(sq, 0)
    q8.append(child, torch.randn(2, 4, 3, 64), torch.randn(2, 4, 3, 64))          # copy-on-write of the partial block
    after = q8.gather(sq, 0)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])   # the parent is untouched
    assert torch.equal(q8.gather(child, 0)[0][:sq.num_tokens], before[0])          # scales travelled with the copy
    # summaries describe the stored (dequantised) keys
    kd, _ = q8.gather(sq, 0)
    b0 = q8.block_table(sq)[0]
    assert torch.equal(q8.kmax[0, b0], kd[:16].amax(0)) and torch.equal(q8.kmin[0, b0], kd[:16].amin(0))
    # bytes: a quarter of the float K/V plus a float32 scale per (token, kv head)
    c = q8.config
    assert q8.kv_bytes() == 2 * c.num_layers * c.num_blocks * c.num_kv_heads * c.block_size * (c.head_dim + 4)
    per_tile = (3 + c.repr_keys) * c.head_dim * 4
    assert q8.sequence_bytes(sq) == c.num_layers * sq.num_blocks * c.num_kv_heads * (2 * c.block_size * (64 + 4) + per_tile)


def test_int8_store_rejects_what_it_cannot_do():
    with pytest.raises(ValueError, match="kv_bits must be 0"):
        sk.StoreConfig(num_layers=1, num_kv_heads=1, head_dim=8, kv_bits=2)   # 0, 8 and 4 (Int4Codec) exist
    f, sf, q8, sq, k, v = _pair(2, 64, 40)
    with pytest.raises(ValueError, match="int8"):
        sk.dense_attention(torch.randn(2, 64), q8, sq, 0, backend="triton")
