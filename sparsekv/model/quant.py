"""A GGUF file's own quantised weights as a mode of `Model`: `load_model(path, weights="gguf")`.

Each quantised tensor of the file is read once into one layout the CPU kernel (`kernels/cpu/qlinear.cpp`)
multiplies in place: W [N, K] in groups of G consecutive weights along K,

    w[n, k] = fma(code[n, k], scale[n, k // G], offset[n, k // G])      (float32; code * scale without offset)

    bits 4: codes uint8 [N, K / 2], G = 32; byte j of a group holds element j in its low nibble and
            element j + 16 in its high nibble (the order of GGUF's Q4_0 and Q4_1)
    bits 8: codes int8 [N, K], G = 32 or 16

Every GGUF block format this suite's two models use maps onto it exactly (the same float32 value per weight
as ggml's dequantisation, `tests/test_quant.py` checks each against `gguf.quants.dequantize`):

    Q4_0   d (q - 8)            bits 4, scale d, offset -8 d
    Q4_1   d q + m              bits 4, scale d, offset m
    Q4_K   d sc_j q - dmin m_j  bits 4, scale d sc_j, offset -dmin m_j  (6-bit sc_j, m_j per 32 weights)
    Q5_0   d (q - 16)           bits 8, codes q - 16, scale d, no offset
    Q5_1   d q + m              bits 8, scale d, offset m
    Q8_0   d q                  bits 8, scale d, no offset
    Q6_K   d sc_j (q - 32)      bits 8, G = 16, codes q - 32, scale d sc_j, no offset (int8 sc_j per 16 weights)

The 5- and 6-bit formats are held as 8-bit codes: exact, at 8 bits per weight where the file spends 5.5 or
6.6 (`weight_bytes` counts what is held). Scales and offsets are float32 (the file's are float16, or products
of a float16 and a small integer that float16 cannot hold).

`QuantLinear` runs the kernel for up to `DECODE_ROWS` rows (a decode step, or a batch of them) and, for a
prefill chunk, dequantises the weight to float32 once per call and multiplies through MKL: prefill costs a
dequantisation per chunk (a few milliseconds), decode reads only the codes. The float32 mode
(`weights="float32"`) stays the parity reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DECODE_ROWS = 16          # at most this many rows of x go through the kernel; more are a prefill chunk (MKL)


@dataclass
class QuantWeight:
    """One weight matrix in the kernel's layout (module docstring). codes: bits 4 uint8 [N, K / 2], bits 8 int8
    [N, K]; scale float32 [N, K / group]; offset float32 [N, K / group], or empty [0] for a format without one."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    bits: int
    group: int
    source: str = ""           # the GGUF type it came from, e.g. "Q4_K"

    @property
    def shape(self) -> tuple[int, int]:
        n, kc = self.codes.shape
        return n, kc * 2 if self.bits == 4 else kc

    def rows(self, idx: torch.Tensor) -> "QuantWeight":
        """The rows `idx` [R] int64 (an output-row permutation or selection)."""
        offset = self.offset[idx].contiguous() if self.offset.numel() else self.offset
        return QuantWeight(self.codes[idx].contiguous(), self.scale[idx].contiguous(), offset, self.bits, self.group,
                           self.source)


def dequantize(w: QuantWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The plain-torch reference of the layout: W [N, K] in `dtype`, w = code * scale + offset computed in float64
    and rounded once (float32: the kernel's fma value; float64: the unrounded reference tests compare against)."""
    if w.bits == 4:
        n = w.codes.shape[0]
        lo, hi = (w.codes & 15).view(n, -1, 16), (w.codes >> 4).view(n, -1, 16)
        q = torch.cat((lo, hi), -1).reshape(n, -1)
    else:
        q = w.codes
    s = w.scale.double().repeat_interleave(w.group, 1)
    if not w.offset.numel():
        return (q.double() * s).to(dtype)
    return (q.double() * s + w.offset.double().repeat_interleave(w.group, 1)).to(dtype)


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
    return (q - 16).astype(np.int8).reshape(b.shape[0], -1), d, None, 8, 32


def _q8_0(b):
    d = _f16(b[..., 0:2])
    return np.ascontiguousarray(b[..., 2:34]).view(np.int8).reshape(b.shape[0], -1), d, None, 8, 32


def _q4_k(b):
    n, nb = b.shape[:2]
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])                                       # [N, nb]
    s = b[..., 4:16].astype(np.uint16)                                                   # [N, nb, 12]
    sc = np.empty((n, nb, 8), np.float32)
    mn = np.empty((n, nb, 8), np.float32)
    sc[..., :4], mn[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    qs = b[..., 16:144].reshape(n, nb, 4, 32)                     # chunk c: low nibbles group 2c, high 2c + 1
    q = np.stack((qs & 15, qs >> 4), 3).reshape(n, -1)            # [N, K] in element order
    return (_pack4(q), (d[..., None] * sc).reshape(n, -1), (-(dmin[..., None] * mn)).reshape(n, -1), 4, 32)


def _q6_k(b):
    n, nb = b.shape[:2]
    ql = b[..., 0:128].reshape(n, nb, 2, 64).astype(np.int16)     # two halves of 128 weights
    qh = b[..., 128:192].reshape(n, nb, 2, 32).astype(np.int16)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)         # [N, nb, 16]
    d = _f16(b[..., 208:210])
    q = np.empty((n, nb, 2, 128), np.int16)
    q[..., 0:32] = (ql[..., 0:32] & 15) | ((qh & 3) << 4)
    q[..., 32:64] = (ql[..., 32:64] & 15) | (((qh >> 2) & 3) << 4)
    q[..., 64:96] = (ql[..., 0:32] >> 4) | (((qh >> 4) & 3) << 4)
    q[..., 96:128] = (ql[..., 32:64] >> 4) | (((qh >> 6) & 3) << 4)
    scale = (d[..., None] * sc).reshape(n, -1)
    return (q - 32).astype(np.int8).reshape(n, -1), scale, None, 8, 16


# name -> (bytes per block, weights per block, decoder of raw blocks [N, nb, bytes])
FORMATS = {
    "Q4_0": (18, 32, _q4_0), "Q4_1": (20, 32, _q4_1), "Q5_0": (22, 32, lambda b: _q5(b, False)),
    "Q5_1": (24, 32, lambda b: _q5(b, True)), "Q8_0": (34, 32, _q8_0), "Q4_K": (144, 256, _q4_k),
    "Q6_K": (210, 256, _q6_k),
}


def from_gguf_bytes(raw: np.ndarray, kind: str) -> QuantWeight:
    """A QuantWeight from one GGUF tensor's raw rows `raw` [N, row bytes] uint8 of block format `kind`."""
    if kind not in FORMATS:
        raise ValueError(f"kind must be one of {sorted(FORMATS)}, got {kind!r}")
    size, per, decode = FORMATS[kind]
    raw = np.asarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] % size:
        raise ValueError(f"raw must be [N, row bytes] with row bytes a multiple of {size} for {kind}, got {raw.shape}")
    codes, scale, offset, bits, group = decode(raw.reshape(raw.shape[0], -1, size))
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=a.dtype))            # noqa: E731
    offset = torch.zeros(0) if offset is None else t(offset.astype(np.float32))
    return QuantWeight(t(codes), t(scale.astype(np.float32)), offset, bits, group, kind)


# ---- modules ----------------------------------------------------------------------------------------------------

class QuantLinear(nn.Module):
    """y = x W^T (+ bias) with W a `QuantWeight` held as buffers. x [..., K] float32 -> [..., N] float32.

    Rows of x up to DECODE_ROWS: the kernel (`kernels.cpu_decode.qlinear`, reads the codes in place); more: W
    dequantised once (`qdequant`) and torch's matmul. Without the compiled kernels, both run on `dequantize`.
    """

    def __init__(self, w: QuantWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = w.shape
        self.bits, self.group, self.source = w.bits, w.group, w.source
        self.register_buffer("codes", w.codes)
        self.register_buffer("scale", w.scale)
        self.register_buffer("offset", w.offset)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)
        from ..kernels import cpu_decode
        ok = cpu_decode.available()
        self._op = torch.ops.sparsekv_cpu.qlinear if ok else None          # bound once: no lookup per call
        self._dequant = torch.ops.sparsekv_cpu.qdequant if ok else None

    @property
    def weight_q(self) -> QuantWeight:
        return QuantWeight(self.codes, self.scale, self.offset, self.bits, self.group, self.source)

    def dequantized(self) -> torch.Tensor:
        """W [N, K] float32."""
        if self._dequant is None:
            return dequantize(self.weight_q)
        return self._dequant(self.codes, self.scale, self.offset, self.bits, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"x must be float32 (the gguf weights mode runs in float32), got {x.dtype}")
        x2 = x.reshape(-1, self.in_features)                  # a view: decode's x is [B, K] already
        if x2.shape[0] <= DECODE_ROWS and self._op is not None:                  # a decode step: the kernel
            y = self._op(x2, self.codes, self.scale, self.offset, self.bits, self.group)
            y = y if self.bias is None else y + self.bias
        else:                                                                    # a prefill chunk: MKL
            y = F.linear(x2, self.dequantized(), self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.source} as {self.bits}-bit codes, group {self.group}"


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
    key = lambda p: (p.in_features, p.bits, p.group, p.offset.numel() > 0, p.bias is None)   # noqa: E731
    if any(key(p) != key(first) for p in parts) or first.bias is not None:
        return None
    offset = torch.cat([p.offset for p in parts]) if first.offset.numel() else torch.zeros(0)
    fused = QuantLinear(QuantWeight(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]), offset,
                                    first.bits, first.group, "+".join(p.source for p in parts)))
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
    import gguf
    reader = gguf.GGUFReader(str(gguf_path))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    cfg = model.config
    mods = dict(model.named_modules())
    for t in reader.tensors:
        kind = t.tensor_type.name
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
        w = from_gguf_bytes(t.data, kind)
        if arch == "llama" and part in ("attn_q", "attn_k"):
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
