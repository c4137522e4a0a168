"""Paged block-sparse decode attention: split-K (flash-decoding) over a block table.

Algorithm, for B sequences, H kv heads with G query heads each, and a selection of K logical
blocks per (sequence, kv head), padded with -1:

    grid = (B, H, S)                               S splits of the selection
    program (b, h, s):
        q    <- the G query heads of kv head h, as one [G_PAD, D] tile (rows >= G are padding)
        m, l, acc <- -inf, 0, 0                    online-softmax state, float32
        for j in split s's share of selection[b, h]:
            logical <- selection[b, h, j]           (-1: padding, every row masked)
            phys    <- block_table[b, logical]
            K, V    <- tile (phys, h): [BLOCK_SIZE, D], rows past seq_len[b] masked
            scores  <- q @ K^T * scale              [G_PAD, BLOCK_SIZE]
            m_new   <- max(m, rowmax(scores));  p <- exp(scores - m_new)
            l       <- l * exp(m - m_new) + rowsum(p);  acc <- acc * exp(m - m_new) + p @ V
        write acc / l and lse = m + log(l) for split s
    merge (b, query head): lse = logsumexp_s(lse_s); out = sum_s exp(lse_s - lse) * out_s

Each K/V tile is read once; the G query heads of a group share it. Groups smaller than a
matrix tile are **padded**: the q tile has G_PAD = max(16, next_power_of_2(G)) rows (tl.dot
needs 16 on the GPU), and padded rows are masked on load and never stored. Dense decode is
the same kernel with every block selected.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .autotune import autotune_configs


def blocks_per_split_for(max_sel: int, target_splits: int = 8) -> int:
    """Blocks per split: enough splits to fill the machine, each with at least 4 blocks."""
    return max(4, -(-max_sel // target_splits))


@triton.autotune(configs=autotune_configs(), key=["G_PAD", "BLOCK_SIZE", "HEAD_DIM"])
@triton.jit
def _decode_split_kernel(
    # pointers
    Q, K, V, Table, Sel, SeqLens, OutP, LseP,
    # sizes
    max_sel, blocks_per_split, sm_scale,
    # strides
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt,
    stride_tb, stride_sb, stride_sh,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh, stride_ls,
    # meta-parameters
    G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_t = tl.arange(0, BLOCK_SIZE)
    mask_g = offs_g < G
    mask_q = mask_g[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b * stride_qb + (h * G + offs_g)[:, None] * stride_qh + offs_d[None, :],
                mask=mask_q, other=0.0).to(tl.float32)
    seq_len = tl.load(SeqLens + b)
    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], dtype=tl.float32)
    start = s * blocks_per_split
    for j in range(start, tl.minimum(start + blocks_per_split, max_sel)):
        logical = tl.load(Sel + b * stride_sb + h * stride_sh + j)
        safe = tl.maximum(logical, 0)
        phys = tl.load(Table + b * stride_tb + safe)
        tok = safe * BLOCK_SIZE + offs_t
        mask_t = (tok < seq_len) & (tl.zeros([BLOCK_SIZE], dtype=tl.int32) + logical >= 0)
        mask_kv = mask_t[:, None] & (offs_d[None, :] < HEAD_DIM)          # full [BLOCK_SIZE, D] mask
        k = tl.load(K + phys * stride_kb + h * stride_kh + offs_t[:, None] * stride_kt + offs_d[None, :],
                    mask=mask_kv, other=0.0).to(tl.float32)
        v = tl.load(V + phys * stride_vb + h * stride_vh + offs_t[:, None] * stride_vt + offs_d[None, :],
                    mask=mask_kv, other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        scores = tl.where(mask_t[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)      # all-masked so far: avoid inf - inf
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(scores - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
    row = h * G + offs_g
    tl.store(OutP + b * stride_ob + row[:, None] * stride_oh + s * stride_os + offs_d[None, :], out,
             mask=mask_q)
    tl.store(LseP + b * stride_lb + row * stride_lh + s * stride_ls, lse, mask=mask_g)


@triton.jit
def _merge_splits_kernel(
    # pointers
    OutP, LseP, Out, Lse,
    # sizes
    num_splits,
    # strides
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh, stride_ls,
    stride_ob, stride_oh, stride_xb, stride_xh,
    # meta-parameters
    S_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    b = tl.program_id(0)
    qh = tl.program_id(1)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_s = offs_s < num_splits
    lse = tl.load(LseP + b * stride_lb + qh * stride_lh + offs_s * stride_ls, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(lse == float("-inf"), 0.0, tl.exp(lse - m))
    part = tl.load(OutP + b * stride_pb + qh * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
                   mask=mask_s[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / total
    tl.store(Out + b * stride_ob + qh * stride_oh + offs_d, out.to(Out.dtype.element_ty))
    tl.store(Lse + b * stride_xb + qh * stride_xh, m + tl.log(total))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, selection: torch.Tensor, blocks_per_split: int | None = None,
                 poison: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K paged decode over a block selection.

    q            [B, Hq, D]            any float dtype
    k_cache      [NB, H, bs, D]        one layer of the store (any strides, unit stride on D)
    v_cache      [NB, H, bs, D]
    block_tables [B, max_blocks] int32 physical ids in logical order
    seq_lens     [B] int32             tokens per sequence
    selection    [B, H, K] int32       logical blocks per kv head, -1 padded
    returns out [B, Hq, D] (q.dtype) and lse [B, Hq] float32
    poison: fill every buffer with NaN before launch (tests: an unwritten element shows)
    """
    B, Hq, D = q.shape
    NB, H, bs, Dk = k_cache.shape
    if Dk != D or Hq % H:
        raise ValueError(f"q [B, Hq, D] must match k_cache [NB, H, bs, D] with Hq a multiple of H; "
                         f"got {tuple(q.shape)} and {tuple(k_cache.shape)}")
    if D & (D - 1) or bs & (bs - 1):
        raise ValueError(f"head_dim and block_size must be powers of two, got {D} and {bs}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("q, k_cache and v_cache need unit stride on head_dim")
    G = Hq // H
    K = selection.shape[2]
    bps = blocks_per_split or blocks_per_split_for(K)
    S = max(1, -(-K // bps))
    alloc = (lambda *shape, dtype: torch.full(shape, float("nan"), dtype=dtype, device=q.device)) if poison else \
        (lambda *shape, dtype: torch.empty(shape, dtype=dtype, device=q.device))
    out_p = alloc(B, Hq, S, D, dtype=torch.float32)
    lse_p = alloc(B, Hq, S, dtype=torch.float32)
    block_tables = block_tables.to(torch.int32).contiguous()
    selection = selection.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    _decode_split_kernel[(B, H, S)](
        q, k_cache, v_cache, block_tables, selection, seq_lens, out_p, lse_p,
        K, bps, 1.0 / math.sqrt(D),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), selection.stride(0), selection.stride(1),
        out_p.stride(0), out_p.stride(1), out_p.stride(2),
        lse_p.stride(0), lse_p.stride(1), lse_p.stride(2),
        G=G, G_PAD=max(16, triton.next_power_of_2(G)), BLOCK_SIZE=bs, HEAD_DIM=D,
    )
    out = alloc(B, Hq, D, dtype=q.dtype)
    lse = alloc(B, Hq, dtype=torch.float32)
    _merge_splits_kernel[(B, Hq)](
        out_p, lse_p, out, lse, S,
        out_p.stride(0), out_p.stride(1), out_p.stride(2),
        lse_p.stride(0), lse_p.stride(1), lse_p.stride(2),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        S_PAD=max(2, triton.next_power_of_2(S)), HEAD_DIM=D,
    )
    return out, lse
