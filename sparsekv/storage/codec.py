"""How K/V values are stored in the store's tiles: as they are (float), or as int8 or int4 codes with a scale per token.

A codec is bound once, by `StoreConfig.kv_bits`, when a `BlockStore` is built; the store never branches on it
again. Both allocate the same head-major layout and answer the same four questions:

    allocate(config, rows)              -> {"k": [L, R, H, bs, D], "v": ..., and for int8 "k_scale", "v_scale": [L, R, H, bs]}
    write(t, layer, rows, offset, k, v)    k, v [T, H, D] into rows `rows` [T] at offsets `offset` [T] of one layer
    values(codes, scale, dtype)         the stored values of tiles read back (codes * scale for int8)
    row_bytes(config)                   bytes one token's K (or V) occupies in one kv head, scales included

int8: symmetric, per (token, kv head): scale = max|x| / 127 over the head dim (1 for an all-zero row), codes =
round(x / scale) in [-127, 127], so |code * scale - x| <= scale / 2 elementwise.

int4: the same rule with 7 in place of 127: codes in [-7, 7], |code * scale - x| <= scale / 2 = max|x| / 14.
The codes live in int8 containers in memory, so every read path of the int8 codec serves both unchanged; the byte
model (`row_bytes`, `core.traffic.cache_bytes(kv_bits=4)`) counts them as the packed nibbles a kernel would read
(two codes per byte, `pack_int4` / `unpack_int4`: exact inverses, tested).
"""
from __future__ import annotations

import torch

SCALE_BYTES = 4        # one float32 scale per (token, kv head) and tensor when kv_bits == 8


def _tiles(config, rows: int, dtype: torch.dtype, extra: tuple = ()) -> torch.Tensor:
    """[L, R, H, bs, *extra] zeros, head-major in memory ([L, H, R, ...] contiguous)."""
    c = config
    return torch.zeros(c.num_layers, c.num_kv_heads, rows, c.block_size, *extra, dtype=dtype,
                       device=c.device).transpose(1, 2)


class FloatCodec:
    """K/V in the store's dtype, exactly as written."""

    name = "float"
    quantized = False

    def allocate(self, config, rows: int) -> dict[str, torch.Tensor]:
        return {"k": _tiles(config, rows, config.dtype, (config.head_dim,)),
                "v": _tiles(config, rows, config.dtype, (config.head_dim,))}

    def write(self, t: dict, layer: int, rows: torch.Tensor, offset: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        # Advanced indices separated by a slice: the indexed view is [T, H, D].
        t["k"][layer][rows, :, offset] = k
        t["v"][layer][rows, :, offset] = v

    def values(self, codes: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        return codes

    def row_bytes(self, config) -> int:
        return config.head_dim * config.itemsize


class Int8Codec(FloatCodec):
    """int8 codes with one float32 scale per (token, kv head)."""

    name = "int8"
    quantized = True

    def allocate(self, config, rows: int) -> dict[str, torch.Tensor]:
        out = {"k": _tiles(config, rows, torch.int8, (config.head_dim,)),
               "v": _tiles(config, rows, torch.int8, (config.head_dim,))}
        out.update(k_scale=_tiles(config, rows, torch.float32), v_scale=_tiles(config, rows, torch.float32))
        return out

    def write(self, t, layer, rows, offset, k, v):
        for name, x in (("k", k), ("v", v)):
            q, scale = quantize_int8(x)
            t[name][layer][rows, :, offset] = q
            t[f"{name}_scale"][layer][rows, :, offset] = scale

    def values(self, codes, scale, dtype):
        return (codes.float() * scale[..., None]).to(dtype)

    def row_bytes(self, config) -> int:
        return config.head_dim + SCALE_BYTES


class Int4Codec(Int8Codec):
    """int4 codes in [-7, 7] (in int8 containers) with one float32 scale per (token, kv head); counted packed."""

    name = "int4"

    def write(self, t, layer, rows, offset, k, v):
        for name, x in (("k", k), ("v", v)):
            q, scale = quantize_sym(x, 4)
            t[name][layer][rows, :, offset] = q
            t[f"{name}_scale"][layer][rows, :, offset] = scale

    def row_bytes(self, config) -> int:
        return -(-config.head_dim // 2) + SCALE_BYTES


def quantize_sym(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric `bits`-bit codes per (token, kv head): x [T, H, D] float -> (codes [T, H, D] int8, scale [T, H]
    float32). With m = 2**(bits - 1) - 1 (127 for 8 bits, 7 for 4): scale = max|x| / m over D (1 where a row is all
    zero), codes = round(x / scale) in [-m, m]; |code * scale - x| <= scale / 2 elementwise."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    m = float(2 ** (bits - 1) - 1)
    xf = x.float()
    scale = xf.abs().amax(-1) / m
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(xf / scale[..., None]).clamp_(-m, m).to(torch.int8)
    return codes, scale


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes [..., D] int8 in [-8, 7] -> [..., ceil(D / 2)] uint8, two codes per byte (low nibble first)."""
    if codes.dtype != torch.int8:
        raise TypeError(f"codes must be int8, got {codes.dtype}")
    if codes.numel() and (int(codes.min()) < -8 or int(codes.max()) > 7):
        raise ValueError(f"codes must lie in [-8, 7], got [{int(codes.min())}, {int(codes.max())}]")
    u = (codes.to(torch.int16) & 0xF).to(torch.uint8)
    if u.shape[-1] % 2:
        u = torch.cat([u, torch.zeros_like(u[..., :1])], -1)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor, d: int) -> torch.Tensor:
    """The inverse of `pack_int4`: [..., ceil(d / 2)] uint8 -> [..., d] int8 codes in [-8, 7]."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {packed.dtype}")
    if not isinstance(d, int) or isinstance(d, bool) or d < 0 or packed.shape[-1] != -(-d // 2):
        raise ValueError(f"d must be an int with ceil(d / 2) = {packed.shape[-1]} (packed's last size), got {d!r}")
    lo, hi = (packed & 0xF).to(torch.int16), (packed >> 4).to(torch.int16)
    u = torch.stack([lo, hi], -1).flatten(-2)[..., :d]
    return torch.where(u > 7, u - 16, u).to(torch.int8)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per (token, kv head): x [T, H, D] float -> (codes [T, H, D] int8, scale [T, H] float32).

    scale = max|x| / 127 over D (1 where a row is all zero), codes = round(x / scale) in [-127, 127];
    |code * scale - x| <= scale / 2 elementwise.
    """
    xf = x.float()
    scale = xf.abs().amax(-1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(xf / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return codes, scale


CODECS = {0: FloatCodec, 8: Int8Codec, 4: Int4Codec}       # by StoreConfig.kv_bits


__all__ = ["FloatCodec", "Int8Codec", "Int4Codec", "CODECS", "quantize_int8", "quantize_sym", "pack_int4",
           "unpack_int4", "SCALE_BYTES"]
