"""Block scoring from per-block key summaries: Quest's min/max bound and MoBA's mean, in one pass.

Algorithm, for B sequences, H kv heads with G query heads each, and nb logical blocks:

    grid = (B, H, cdiv(max_blocks, BLOCK_N))
    program (b, h, t):
        q      <- the G query heads of kv head h: [G_PAD, D] (padded rows masked, as in decode)
        phys   <- block_table[b, t * BLOCK_N : (t + 1) * BLOCK_N]      masked past nb[b]
        kmin, kmax, kmean <- summaries of (phys, h): [BLOCK_N, D] each
        minmax <- (max(q, 0) @ kmax^T + min(q, 0) @ kmin^T) * scale  # = sum_i max(q_i min_i, q_i max_i)
        mean   <- (q @ kmean^T) * scale
        store both [G, BLOCK_N] tiles

The summaries are read once for both scorers. The GQA aggregation (a softmax over each query
head's row of blocks, then the group's mean or max) needs each row's normaliser, so the
router applies it in torch to these [Hq, nb] logits, which are small next to the summaries.
Top-K uses torch.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .autotune import autotune_configs


@triton.autotune(configs=autotune_configs(), key=["G_PAD", "BLOCK_N", "HEAD_DIM"])
@triton.jit
def _block_score_kernel(
    # pointers
    Q, KMin, KMax, KMean, Table, NumBlocks, OutMinMax, OutMean,
    # sizes
    sm_scale,
    # strides
    stride_qb, stride_qh,
    stride_sn, stride_sh,            # summaries [NB, H, D] (shared by kmin, kmax, kmean)
    stride_tb,
    stride_ob, stride_oh,
    # meta-parameters
    G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    t = tl.program_id(2)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    nb = tl.load(NumBlocks + b)
    mask_g = offs_g < G
    mask_n = offs_n < nb
    mask_q = mask_g[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b * stride_qb + (h * G + offs_g)[:, None] * stride_qh + offs_d[None, :],
                mask=mask_q, other=0.0).to(tl.float32)
    phys = tl.load(Table + b * stride_tb + offs_n, mask=mask_n, other=0)
    base = phys[:, None] * stride_sn + h * stride_sh + offs_d[None, :]
    mask_s = mask_n[:, None] & (offs_d[None, :] < HEAD_DIM)
    kmin = tl.load(KMin + base, mask=mask_s, other=0.0).to(tl.float32)
    kmax = tl.load(KMax + base, mask=mask_s, other=0.0).to(tl.float32)
    kmean = tl.load(KMean + base, mask=mask_s, other=0.0).to(tl.float32)
    bound = (tl.dot(tl.maximum(q, 0.0), tl.trans(kmax), input_precision="ieee")
             + tl.dot(tl.minimum(q, 0.0), tl.trans(kmin), input_precision="ieee"))
    mean = tl.dot(q, tl.trans(kmean), input_precision="ieee")
    out = b * stride_ob + (h * G + offs_g)[:, None] * stride_oh + offs_n[None, :]
    mask_o = mask_g[:, None] & mask_n[None, :]
    tl.store(OutMinMax + out, bound * sm_scale, mask=mask_o)
    tl.store(OutMean + out, mean * sm_scale, mask=mask_o)


def block_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, kmean: torch.Tensor,
                 block_tables: torch.Tensor, num_blocks: torch.Tensor, block_n: int = 32,
                 poison: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """minmax and mean logits (q.k / sqrt(D) units) for every (query head, logical block).

    q            [B, Hq, D]
    kmin/kmax/kmean [NB, H, D]        one layer's summaries (same strides; unit stride on D)
    block_tables [B, max_blocks] int32
    num_blocks   [B] int32            logical blocks per sequence
    returns (minmax, mean), each [B, Hq, max_blocks] float32; entries past num_blocks[b] are 0
    (NaN with poison=True, which fills the outputs with NaN first so unwritten entries show)
    """
    B, Hq, D = q.shape
    NB, H, Ds = kmax.shape
    if Ds != D or Hq % H:
        raise ValueError(f"q [B, Hq, D] must match summaries [NB, H, D]; got {tuple(q.shape)} and {tuple(kmax.shape)}")
    if not (kmin.stride() == kmax.stride() == kmean.stride()) or kmax.stride(-1) != 1:
        raise ValueError("kmin, kmax and kmean must share strides, with unit stride on head_dim")
    G = Hq // H
    max_blocks = block_tables.shape[1]
    minmax = torch.full((B, Hq, max_blocks), float("nan") if poison else 0.0, dtype=torch.float32, device=q.device)
    mean = torch.full_like(minmax, float("nan") if poison else 0.0)
    block_tables = block_tables.to(torch.int32).contiguous()
    num_blocks = num_blocks.to(torch.int32).contiguous()
    grid = (B, H, triton.cdiv(max_blocks, block_n))
    _block_score_kernel[grid](
        q, kmin, kmax, kmean, block_tables, num_blocks, minmax, mean,
        1.0 / math.sqrt(D),
        q.stride(0), q.stride(1), kmax.stride(0), kmax.stride(1), block_tables.stride(0),
        minmax.stride(0), minmax.stride(1),
        G=G, G_PAD=max(16, triton.next_power_of_2(G)), BLOCK_N=block_n, HEAD_DIM=D,
    )
    return minmax, mean
