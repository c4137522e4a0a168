"""A GGUF file's own quantised weights as a mode of `Model`: `load_model(path, weights="gguf")`.

Each quantised tensor of the file is read once into one layout the CPU kernel (`kernels/cpu/qlinear.cpp`)
multiplies in place: W [N, K] in groups of G consecutive weights along K,

    w[n, k] = fma(code[n, k], scale[n, k // G], offset[n, k // G])      (float32; code * scale without offset)

    bits 4: codes uint8 [N, K / 2], G = 32; byte j of a group holds element j in its low nibble and
            element j + 16 in its high nibble (the order of GGUF's Q4_0 and Q4_1); code 0..15
    bits 5: codes uint8 [N, 5 K / 8], G = 32: per row the low nibbles as bits 4 lays them out, then the high
            bits, one little-endian uint16 per 16 elements (element i at bit i); code = nibble + 16 high - 16,
            in -16..15
    bits 6: codes uint8 [N, 3 K / 4], G = 16: per row the low nibbles as bits 4 lays them out, then the high
            2 bits, one little-endian uint32 per 16 elements (element i at bits 2i, 2i + 1); code = nibble +
            16 high - 32, in -32..31
    bits 8: codes int8 [N, K], G = 32 or 16

and scale (and offset, where there is one) in one of three forms: plain, float32 [N, K / G]; half, float16
[N, K / G] (the legacy formats' d and m, as the file stores them); or factored as the K-quants store them: uint8
[N, K / G + 4 K / 256], per row K / G int8 multipliers m then K / 256 float32 super-scales d (raw little-endian
bytes), scale = float32(d * m). Every GGUF block format this suite's two models use maps onto it exactly (the same
float32 value per weight as ggml's dequantisation, `tests/test_quant.py` checks each against
`gguf.quants.dequantize`):

    Q4_0   d (q - 8)            bits 4, scale d, offset -8 d (half)
    Q4_1   d q + m              bits 4, scale d, offset m (half)
    Q4_K   d sc_j q - dmin m_j  bits 4, factored scale (d, sc_j), factored offset (-dmin, m_j) (6-bit sc_j, m_j
                                per 32 weights)
    Q5_0   d (q - 16)           bits 5, scale d (half), no offset
    Q5_1   d q + m              bits 8, codes q, scale d, offset m (half)
    Q8_0   d q                  bits 8, scale d (half), no offset
    Q6_K   d sc_j (q - 32)      bits 6, G = 16, factored scale (d, sc_j), no offset (int8 sc_j per 16 weights)

The factored products are exact: d is a float16 (11 significant bits) and m an integer of at most 8 bits. A table
is held in float16 when every value is one exactly (`_narrow`), else float32. Held bits per weight (`weight_bytes`
counts them), against the file's: Q4_1, Q5_0, Q8_0 the same (5, 5.5, 8.5); Q4_0 5 (4.5: its -8 d is a table of
its own); Q4_K 4.75 (4.5) and Q6_K 6.625 (6.5625): the super-scales as float32. Q5_1 (no model here uses it) is
held as 8-bit codes, 9 bits (6).

`QuantLinear` runs the kernel for up to `DECODE_ROWS` rows (a decode step, or a batch of them) and, for a
prefill chunk, dequantises the weight to float32 once per call and multiplies through MKL: prefill costs a
dequantisation per chunk (a few milliseconds), decode reads only the codes. The float32 mode
(`weights="float32"`) stays the parity reference.

Activations (`load_model(..., activations="int8")`, `set_activations`): a decode row of x can be quantised to int8
per 32 values and multiplied in integers (`kernels/cpu/qlinear.cpp`'s qlinear_q8), as llama.cpp's dot products
always do; each output then moves by at most sum_k |w_k| d_k / 2 (d: the step of x's block), which
tests/test_quant.py checks on SmolLM2's own states.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core import cpu_paths
from ..core.checks import check_choice
from .families import of_gguf_arch

DECODE_ROWS = 16          # at most this many rows of x go through the kernel; more are a prefill chunk (MKL)
ACTIVATIONS = ("float32", "int8")   # what a decode row of x is multiplied as (QuantLinear.activations)
PREFILL = {"float32": torch.float32, "bfloat16": torch.bfloat16}   # a prefill chunk's matmul dtype (QuantLinear.prefill)
_EPOCH = [0]                        # bumped by every set_activations, so a fused step can rebind (activation_epoch)


def activation_epoch() -> int:
    """A count of QuantLinear.set_activations calls: a cached copy of the flags is stale when this moved."""
    return _EPOCH[0]


@dataclass
class QuantWeight:
    """One weight matrix in the kernel's layout (module docstring). codes: bits 4 uint8 [N, K / 2], bits 5 uint8
    [N, 5 K / 8], bits 6 uint8 [N, 3 K / 4], bits 8 int8 [N, K]; scale: float32 or float16 [N, K / group], or
    factored uint8 [N, K / group + 4 K / 256]; offset: the same forms, or empty [0] for a format without one."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    bits: int
    group: int
    source: str = ""           # the GGUF type it came from, e.g. "Q4_K"

    @property
    def shape(self) -> tuple[int, int]:
        n, kc = self.codes.shape
        return n, kc * 8 // self.bits

    def rows(self, idx: torch.Tensor) -> "QuantWeight":
        """The rows `idx` [R] int64 (an output-row permutation or selection)."""
        offset = self.offset[idx].contiguous() if self.offset.numel() else self.offset
        return QuantWeight(self.codes[idx].contiguous(), self.scale[idx].contiguous(), offset, self.bits, self.group,
                           self.source)


def factor(mult: np.ndarray, sup: np.ndarray) -> np.ndarray:
    """The factored table of int8 multipliers `mult` [N, K / G] and float32 super-scales `sup` [N, K / 256]:
    uint8 [N, K / G + 4 K / 256] (module docstring)."""
    m = np.ascontiguousarray(mult, dtype=np.int8).view(np.uint8)
    d = np.ascontiguousarray(sup, dtype="<f4").view(np.uint8).reshape(sup.shape[0], -1)
    return np.concatenate((m, d), 1)


def table(t: torch.Tensor, K: int, group: int) -> torch.Tensor:
    """A scale or offset table as float32 [N, K / group] (a float16 one widened; a factored one multiplied out in
    float32, as the kernel does: exact for the K-quants' values)."""
    if t.dtype in (torch.float32, torch.float16):
        return t.float()
    ng = K // group
    m = t[:, :ng].contiguous().view(torch.int8).float()
    d = t[:, ng:].contiguous().view(torch.float32)                          # [N, K / 256]
    return d.repeat_interleave(256 // group, 1) * m


def dequantize(w: QuantWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The plain-torch reference of the layout: W [N, K] in `dtype`, w = code * scale + offset computed in float64
    and rounded once (float32: the kernel's fma value; float64: the unrounded reference tests compare against)."""
    n, K = w.shape
    if w.bits in (4, 5, 6):
        nib = w.codes[:, : K // 2]
        lo, hi = (nib & 15).view(n, -1, 16), (nib >> 4).view(n, -1, 16)
        q = torch.cat((lo, hi), -1).reshape(n, -1).to(torch.int16)
        if w.bits > 4:
            width = w.bits - 4                                   # high bits per element, 16 elements per word
            word = {1: torch.int16, 2: torch.int32}[width]
            words = w.codes[:, K // 2:].contiguous().view(word).to(torch.int64) & ((1 << 16 * width) - 1)
            high = (words[..., None] >> (width * torch.arange(16))) & ((1 << width) - 1)  # [N, K / 16, 16]
            q = q + 16 * high.reshape(n, K).to(torch.int16) - (1 << (w.bits - 1))
    else:
        q = w.codes
    s = table(w.scale, K, w.group).double().repeat_interleave(w.group, 1)
    if not w.offset.numel():
        return (q.double() * s).to(dtype)
    return (q.double() * s + table(w.offset, K, w.group).double().repeat_interleave(w.group, 1)).to(dtype)


# ---- GGUF block formats -> QuantWeight (numpy, one tensor at a time) ------------------------------------------

def _f16(b: np.ndarray) -> np.ndarray:
    """float32 of little-endian float16 fields b [..., 2] uint8."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _pack4(q: np.ndarray) -> np.ndarray:
    """q [N, K] integers in 0..15 -> uint8 [N, K / 2] in the kernel's nibble order (per 32: j low, j + 16 high)."""
    n = q.shape[0]
    g = q.reshape(n, -1, 2, 16).astype(np.uint8)
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(n, -1)


def _q4_0(b):
    d = _f16(b[..., 0:2])
    return b[..., 2:18].reshape(b.shape[0], -1), d, -8.0 * d, 4, 32


def _q4_1(b):
    return b[..., 4:20].reshape(b.shape[0], -1), _f16(b[..., 0:2]), _f16(b[..., 2:4]), 4, 32


def _q5(b, with_min: bool):
    start = 4 if with_min else 2
    qh = np.ascontiguousarray(b[..., start:start + 4]).view("<u4")[..., 0]              # [N, nb]
    qs = b[..., start + 4:start + 20]                                                    # [N, nb, 16]
    bit = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16)       # [N, nb, 32]
    q = np.concatenate((qs & 15, qs >> 4), -1).astype(np.int16) | (bit << 4)
    d = _f16(b[..., 0:2])
    if with_min:
        return q.astype(np.int8).reshape(b.shape[0], -1), d, _f16(b[..., 2:4]), 8, 32
    return _pack_high(q.reshape(b.shape[0], -1), 5), d, None, 5, 32


def _q8_0(b):
    d = _f16(b[..., 0:2])
    return np.ascontiguousarray(b[..., 2:34]).view(np.int8).reshape(b.shape[0], -1), d, None, 8, 32


def _pack_high(q: np.ndarray, bits: int) -> np.ndarray:
    """q [N, K] integers in 0..2^bits - 1 (bits 5 or 6) -> uint8 [N, bits K / 8]: the low nibbles as `_pack4`,
    then the high bits - 4 bits of each element, a little-endian word of 16 fields per 16 elements (element i at
    bits (bits - 4) i and up)."""
    n, width = q.shape[0], bits - 4
    hi = (q.reshape(n, -1, 16).astype(np.uint32) >> 4) << (width * np.arange(16, dtype=np.uint32))
    words = np.bitwise_or.reduce(hi, axis=-1).astype("<u2" if width == 1 else "<u4")      # [N, K / 16]
    return np.concatenate((_pack4(q & 15), words.view(np.uint8).reshape(n, -1)), 1)


def _q4_k(b):
    n, nb = b.shape[:2]
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])                                       # [N, nb]
    s = b[..., 4:16].astype(np.uint16)                                                   # [N, nb, 12]
    sc = np.empty((n, nb, 8), np.int8)
    mn = np.empty((n, nb, 8), np.int8)
    sc[..., :4], mn[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    qs = b[..., 16:144].reshape(n, nb, 4, 32)                     # chunk c: low nibbles group 2c, high 2c + 1
    q = np.stack((qs & 15, qs >> 4), 3).reshape(n, -1)            # [N, K] in element order
    return _pack4(q), factor(sc.reshape(n, -1), d), factor(mn.reshape(n, -1), -dmin), 4, 32


def _q6_k(b):
    n, nb = b.shape[:2]
    ql = b[..., 0:128].reshape(n, nb, 2, 64).astype(np.int16)     # two halves of 128 weights
    qh = b[..., 128:192].reshape(n, nb, 2, 32).astype(np.int16)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8)                             # [N, nb, 16]
    d = _f16(b[..., 208:210])
    q = np.empty((n, nb, 2, 128), np.int16)
    q[..., 0:32] = (ql[..., 0:32] & 15) | ((qh & 3) << 4)
    q[..., 32:64] = (ql[..., 32:64] & 15) | (((qh >> 2) & 3) << 4)
    q[..., 64:96] = (ql[..., 0:32] >> 4) | (((qh >> 4) & 3) << 4)
    q[..., 96:128] = (ql[..., 32:64] >> 4) | (((qh >> 6) & 3) << 4)
    return _pack_high(q.reshape(n, -1), 6), factor(sc.reshape(n, -1), d), None, 6, 16


# name -> (bytes per block, weights per block, decoder of raw blocks [N, nb, bytes])
FORMATS = {
    "Q4_0": (18, 32, _q4_0), "Q4_1": (20, 32, _q4_1), "Q5_0": (22, 32, lambda b: _q5(b, False)),
    "Q5_1": (24, 32, lambda b: _q5(b, True)), "Q8_0": (34, 32, _q8_0), "Q4_K": (144, 256, _q4_k),
    "Q6_K": (210, 256, _q6_k),
}


def _narrow(a: np.ndarray) -> np.ndarray:
    """A plain table as float16 where every value is one exactly (the legacy formats' d, m and -8 d), else
    float32."""
    a = a.astype(np.float32)
    with np.errstate(over="ignore"):
        h = a.astype(np.float16)
    return h if np.array_equal(h.astype(np.float32), a) else a


def from_gguf_bytes(raw: np.ndarray, kind: str) -> QuantWeight:
    """A QuantWeight from one GGUF tensor's raw rows `raw` [N, row bytes] uint8 of block format `kind`."""
    if kind not in FORMATS:
        raise ValueError(f"kind must be one of {sorted(FORMATS)}, got {kind!r}")
    size, per, decode = FORMATS[kind]
    raw = np.asarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] % size:
        raise ValueError(f"raw must be [N, row bytes] with row bytes a multiple of {size} for {kind}, got {raw.shape}")
    codes, scale, offset, bits, group = decode(raw.reshape(raw.shape[0], -1, size))
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a if a.dtype == np.uint8 else _narrow(a)))  # noqa: E731
    offset = torch.zeros(0) if offset is None else t(offset)
    return QuantWeight(torch.from_numpy(np.ascontiguousarray(codes)), t(scale), offset, bits, group, kind)


# ---- modules ----------------------------------------------------------------------------------------------------

class QuantLinear(nn.Module):
    """y = x W^T (+ bias) with W a `QuantWeight` held as buffers. x [..., K] float32 -> [..., N] float32.

    Rows of x up to DECODE_ROWS: the kernel (`kernels.cpu_decode.qlinear`, reads the codes in place); more: W
    dequantised once (`qdequant`) and torch's matmul. Without the compiled kernels, both run on `dequantize`.
    activations "int8": a decode row of x is quantised to int8 per 32 values and multiplied in integers
    (`cpu_decode.qlinear_q8`), as llama.cpp's dot products are, for every layout but 8-bit codes in groups of 16 or
    with an offset (no GGUF format here makes them); those, prefill chunks and a build without the kernels keep
    float32 activations.
    prefill "bfloat16": a prefill chunk's x and dequantised W are rounded to bfloat16 and multiplied by torch's
    bfloat16 matmul (float32 accumulation; the result returned in float32), where a CPU with bfloat16 dot products
    (AVX512_BF16, AMX) runs several times float32's rate; "float32" (the default) keeps the parity reference.
    """

    def __init__(self, w: QuantWeight, bias: torch.Tensor | None = None, activations: str = "float32"):
        super().__init__()
        self.out_features, self.in_features = w.shape
        self.bits, self.group, self.source = w.bits, w.group, w.source
        self.register_buffer("codes", w.codes)
        self.register_buffer("scale", w.scale)
        self.register_buffer("offset", w.offset)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        from ..kernels import cpu_decode
        self._kernels = cpu_decode.available()                              # checked once per module
        self._dequant = torch.ops.sparsekv_cpu.qdequant if self._kernels else None
        self._hold = False                     # whether a prefill holds W across its chunks (`held_weights`)
        self._held: torch.Tensor | None = None   # W [N, K] in the prefill dtype, while held
        self.set_activations(activations)
        self.set_prefill("float32")

    def set_prefill(self, prefill: str) -> None:
        """Bind a prefill chunk's matmul dtype once: "float32" or "bfloat16" (class docstring)."""
        check_choice("prefill", prefill, PREFILL)
        self.prefill, self._prefill_dtype = prefill, PREFILL[prefill]
        self._held = None                      # held in the old dtype: the next chunk dequantises anew

    def set_activations(self, activations: str) -> None:
        """Bind the decode rows' kernel once: int8 activations where this layout has them (class docstring)."""
        check_choice("activations", activations, ACTIVATIONS)
        self.activations = activations
        fits = self.bits != 8 or (self.group == 32 and self.offset.numel() == 0)      # 8 bits: Q8_0's layout only
        q8 = self._kernels and activations == "int8" and fits
        self.int8_activations = q8
        ops = torch.ops.sparsekv_cpu
        self._op = (ops.qlinear_q8 if q8 else ops.qlinear) if self._kernels else None
        _EPOCH[0] += 1

    @property
    def weight_q(self) -> QuantWeight:
        return QuantWeight(self.codes, self.scale, self.offset, self.bits, self.group, self.source)

    def dequantized(self) -> torch.Tensor:
        """W [N, K] float32."""
        if self._dequant is None:
            return dequantize(self.weight_q)
        return self._dequant(self.codes, self.scale, self.offset, self.bits, self.group)

    def prefill_weight(self) -> torch.Tensor:
        """W [N, K] in the prefill dtype (float32, or rounded to bfloat16): dequantised for this chunk, or once for a
        whole prefill while `held_weights` holds it (the same bits either way)."""
        w = self._held
        if w is None:
            w = self.dequantized()
            if self._prefill_dtype is not torch.float32:
                w = w.to(self._prefill_dtype)
            if self._hold:
                self._held = w
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"x must be float32 (the gguf weights mode runs in float32), got {x.dtype}")
        x2 = x.reshape(-1, self.in_features)                  # a view: decode's x is [B, K] already
        if x2.shape[0] <= DECODE_ROWS and self._op is not None:                  # a decode step: the kernel
            y = self.codes_matmul(x2)
        elif self._prefill_dtype is torch.float32:                             # a prefill chunk: MKL
            y = F.linear(x2, self.prefill_weight(), self.bias)
        else:                                                                    # ... or a bfloat16 matmul
            cpu_paths.take("bf16_matmul")                                        # its bits depend on the CPU
            y = F.linear(x2.to(self._prefill_dtype), self.prefill_weight()).float()
            y = y if self.bias is None else y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def codes_matmul(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [R, K] float32 -> [R, N] float32 through the kernel that reads the codes in place (int8 activations where
        bound: `set_activations`), for any R: what `forward` runs for up to DECODE_ROWS rows.
        benchmarks/bench_decode_rows.py times it against a held W to place that threshold."""
        if self._op is None:
            raise RuntimeError("QuantLinear.codes_matmul: the CPU extension is unavailable (kernels.cpu_decode.reason())")
        y = self._op(x2, self.codes, self.scale, self.offset, self.bits, self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        act = (", int8 activations" if self.int8_activations else "") + (f", {self.prefill} prefill" if self.prefill != "float32" else "")
        return (f"{self.in_features} -> {self.out_features}, {self.source} as {self.bits}-bit codes, group "
                f"{self.group}{act}")


class QuantEmbedding(nn.Module):
    """Embedding rows read from a QuantLinear's codes (a tied lm_head's): ids [...] -> [..., K] float32."""

    def __init__(self, table: QuantLinear):
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        rows = self.table.weight_q.rows(flat)
        return dequantize(rows).reshape(*ids.shape, self.embedding_dim)


def fuse(parts: list[QuantLinear]) -> QuantLinear | None:
    """One QuantLinear over the rows of `parts` (same input, same layout, no bias), whose rows are the parts' in
    order; each part is re-pointed at its row slice of the fused buffers, so one copy is held and both stay
    usable. None when the layouts differ (then nothing changes)."""
    first = parts[0]
    key = lambda p: (p.in_features, p.bits, p.group, p.scale.dtype, p.offset.numel() > 0, p.offset.dtype,  # noqa
                     p.bias is None, p.activations)
    if any(key(p) != key(first) for p in parts) or first.bias is not None:
        return None
    offset = torch.cat([p.offset for p in parts]) if first.offset.numel() else torch.zeros(0)
    fused = QuantLinear(QuantWeight(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]), offset,
                                    first.bits, first.group, "+".join(p.source for p in parts)),
                        activations=first.activations)
    start = 0
    for p in parts:
        rows = slice(start, start + p.out_features)
        p.codes, p.scale = fused.codes[rows], fused.scale[rows]
        if first.offset.numel():
            p.offset = fused.offset[rows]
        start += p.out_features
    return fused


# ---- a Model in gguf mode ---------------------------------------------------------------------------------------

_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


def _unpermute_rows(n_rows: int, n_head: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's q/k permutation for HF's rotate-half rotary (transformers'
    `_reverse_permute_weights`): rows viewed as [n_head, D / 2, 2] are read back as [n_head, 2, D / 2]."""
    half = n_rows // n_head // 2
    return torch.arange(n_rows).view(n_head, half, 2).transpose(1, 2).reshape(-1)


def quantize_from_gguf(model: nn.Module, gguf_path: str | Path) -> nn.Module:
    """Replace `model`'s projections, MLP, lm_head and embedding (a loaded float32 `Model` of the same file) with
    the file's own quantised tensors, in place. Tensors stored as F32/F16 in the file stay float modules. Returns
    the model."""
    from .gguf_file import read_header
    header = read_header(gguf_path)
    family = of_gguf_arch(header.string("general.architecture"))
    permuted = family is not None and family.permuted_qk        # llama.cpp's q/k row order (`families`)
    cfg = model.config
    mods = dict(model.named_modules())
    for t in header.tensors:
        kind = t.kind
        if kind not in FORMATS:
            continue
        name, part = t.name.removesuffix(".weight"), None
        if name == "token_embd":
            target = "lm_head" if cfg.tie_embeddings else "embed_tokens"
        elif name == "output":
            target = "lm_head"
        else:
            blk, i, part = name.split(".", 2)
            if blk != "blk" or part not in _NAMES:
                raise ValueError(f"unexpected quantised tensor {t.name!r} in {gguf_path}")
            target = f"layers.{i}.{_NAMES[part]}"
        w = from_gguf_bytes(t.rows(), kind)
        if permuted and part in ("attn_q", "attn_k"):
            heads = cfg.n_heads if part == "attn_q" else cfg.n_kv_heads
            w = w.rows(_unpermute_rows(w.shape[0], heads))
        if target == "embed_tokens":
            model.embed_tokens = QuantEmbedding(QuantLinear(w))
            continue
        old = mods[target]
        if tuple(old.weight.shape) != w.shape:
            raise ValueError(f"{t.name}: the file's shape {w.shape} does not match {target} {tuple(old.weight.shape)}")
        parent, attr = target.rsplit(".", 1) if "." in target else ("", target)
        setattr(mods[parent] if parent else model, attr, QuantLinear(w, getattr(old, "bias", None)))
    if cfg.tie_embeddings and isinstance(model.lm_head, QuantLinear):
        model.embed_tokens = QuantEmbedding(model.lm_head)              # one copy of the codes, read both ways
    for layer in model.layers:                  # one kernel call for q, k, v and one for gate, up, where layouts match
        attn, mlp = layer.mix, layer.mlp
        if all(isinstance(getattr(attn, n, None), QuantLinear) for n in ("q_proj", "k_proj", "v_proj")):
            attn.qkv_proj = fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        if isinstance(mlp.gate_proj, QuantLinear) and isinstance(mlp.up_proj, QuantLinear):
            mlp.gate_up_proj = fuse([mlp.gate_proj, mlp.up_proj])
    return model


def step_projections(layer: nn.Module) -> tuple[list[nn.Module], list[nn.Module]]:
    """The input projections a forward step of `layer` runs: its attention's ([qkv_proj] where the gguf mode fused
    q, k and v, else [q_proj, k_proj, v_proj]) and its MLP's ([gate_up_proj], else [gate_proj, up_proj]). A fused
    layer keeps its parts as modules too (`fuse`), so walking `model.modules()` would count them twice."""
    a, m = layer.mix, layer.mlp
    return ([a.qkv_proj] if a.qkv_proj is not None else [a.q_proj, a.k_proj, a.v_proj],
            [m.gate_up_proj] if m.gate_up_proj is not None else [m.gate_proj, m.up_proj])


def step_linears(model: nn.Module) -> list[nn.Module]:
    """Every linear map one forward step of `model` runs, in order: per layer its q, k, v (`step_projections`), o,
    gate, up and down projections, then the lm_head."""
    out = []
    for layer in model.layers:
        qkv, gu = step_projections(layer)
        out += qkv + [layer.mix.o_proj] + gu + [layer.mlp.down_proj]
    return out + [model.lm_head]


def set_activations(model: nn.Module, activations: str) -> nn.Module:
    """Every QuantLinear of `model` multiplies its decode rows as `activations` ("float32" or "int8": see
    QuantLinear). Returns the model."""
    check_choice("activations", activations, ACTIVATIONS)
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.set_activations(activations)
    return model


@contextlib.contextmanager
def held_weights(model: nn.Module):
    """Within: every QuantLinear of `model` dequantises W at its first prefill chunk and keeps it, in the prefill
    dtype, until the block exits (then it is freed, whatever raised). A prompt of C chunks dequantises each W once
    rather than C times. The cost is memory while it runs: the layers' W in the prefill dtype (`held_bytes`; Gemma 3
    270M: 191 MiB in bfloat16, 382 MiB in float32), freed after. Measured (benchmarks/bench_held_weights.py): it pays
    for a bfloat16 prefill, where each chunk also rounded W, and ties for a float32 one, so the Engine's prefill
    holds only for a bfloat16 one (`EngineConfig.hold_weights`); a scheduler's run, whose decode batches wider than
    DECODE_ROWS rows multiply by a dequantised W too, measured a gain in both and holds in either
    (`Engine.holding_weights`). A decode row through the kernel never dequantises, so it holds nothing. Nested
    blocks keep the outer one's hold."""
    mods = [m for m in model.modules() if isinstance(m, QuantLinear)]
    before = [m._hold for m in mods]
    for m in mods:
        m._hold = True
    try:
        yield
    finally:
        for m, held in zip(mods, before):
            m._hold = held
            if not held:
                m._held = None


def held_bytes(model: nn.Module) -> int:
    """Bytes the QuantLinears of `model` hold now as dequantised W (`held_weights`; 0 outside one)."""
    return sum(m._held.nbytes for m in model.modules() if isinstance(m, QuantLinear) and m._held is not None)


def set_prefill(model: nn.Module, prefill: str) -> nn.Module:
    """Every QuantLinear of `model` multiplies its prefill chunks in `prefill` ("float32" or "bfloat16": see
    QuantLinear), and the model's prefill attention runs in the same dtype (`Model.prefill_dtype`, which the Engine
    reads). Returns the model."""
    check_choice("prefill", prefill, PREFILL)
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.set_prefill(prefill)
    model.prefill_dtype = PREFILL[prefill]
    return model


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes the model's weights hold: {"quantised": codes, scales and offsets; "float": every other parameter and
    persistent buffer; "total"}, each shared tensor counted once."""
    seen, quant, flt = set(), 0, 0                 # by storage: a fused layer's parts are slices of one buffer
    for mod in model.modules():
        if isinstance(mod, QuantLinear):
            for t in (mod.codes, mod.scale, mod.offset):
                st = t.untyped_storage()
                if st.data_ptr() not in seen:
                    seen.add(st.data_ptr())
                    quant += st.nbytes()
    for p in model.parameters():
        st = p.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            flt += st.nbytes()
    return {"quantised": quant, "float": flt, "total": quant + flt}
