"""Traffic accounting: the bytes one decode step must read, by kind.

The model is that of a kernel that reads each selected K/V row once (masked rows of a
partial block are not read), the block-table entries it maps through, the selection
indices, the per-block summaries a router scores, and the query/output vectors.
Indices are counted at `INDEX_BYTES` (int32, as GPU kernels store them).

All figures are per layer and per sequence; multiply by layers for a whole step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

INDEX_BYTES = 4


@dataclass(frozen=True)
class StepTraffic:
    """Bytes read by one decode step of one layer."""

    kv_bytes: int = 0        # K and V rows read
    summary_bytes: int = 0   # per-block summaries read to score blocks
    index_bytes: int = 0     # block-table entries and selection indices
    qo_bytes: int = 0        # query read and output written

    @property
    def meta_bytes(self) -> int:
        """Everything that is not K/V: summaries plus indices."""
        return self.summary_bytes + self.index_bytes

    @property
    def total(self) -> int:
        return self.kv_bytes + self.summary_bytes + self.index_bytes + self.qo_bytes

    def __add__(self, other: "StepTraffic") -> "StepTraffic":
        return StepTraffic(self.kv_bytes + other.kv_bytes, self.summary_bytes + other.summary_bytes,
                           self.index_bytes + other.index_bytes, self.qo_bytes + other.qo_bytes)


def valid_tokens_selected(blocks: torch.Tensor, num_tokens: int, block_size: int) -> int:
    """Valid tokens covered by a selection `blocks` ([num_kv_heads, K], -1 padded), summed over heads."""
    valid = blocks >= 0
    last = (num_tokens - 1) // block_size
    partial = num_tokens - last * block_size
    full_hits = int((valid & (blocks != last)).sum())
    last_hits = int((blocks == last).sum())
    return full_hits * block_size + last_hits * partial


def attention_traffic(blocks: torch.Tensor, num_tokens: int, block_size: int, head_dim: int,
                      itemsize: int, num_q_heads: int) -> StepTraffic:
    """Bytes that attention over the selection `blocks` reads (no scoring)."""
    rows = valid_tokens_selected(blocks, num_tokens, block_size)
    picked = int((blocks >= 0).sum())
    return StepTraffic(
        kv_bytes=2 * rows * head_dim * itemsize,
        index_bytes=2 * picked * INDEX_BYTES,      # a selection index and a table entry each
        qo_bytes=2 * num_q_heads * head_dim * itemsize,
    )


def dense_traffic(num_tokens: int, num_kv_heads: int, block_size: int, head_dim: int,
                  itemsize: int, num_q_heads: int) -> StepTraffic:
    """Bytes dense decode reads: every K/V row, plus one table entry per block."""
    nb = -(-num_tokens // block_size)
    return StepTraffic(
        kv_bytes=2 * num_tokens * num_kv_heads * head_dim * itemsize,
        index_bytes=nb * INDEX_BYTES,
        qo_bytes=2 * num_q_heads * head_dim * itemsize,
    )


def summary_traffic(num_scored_tiles: int, vectors_per_tile: int, head_dim: int, itemsize: int) -> StepTraffic:
    """Bytes a scorer reads: `vectors_per_tile` summary vectors for each scored (kv head, block)."""
    return StepTraffic(summary_bytes=num_scored_tiles * vectors_per_tile * head_dim * itemsize)
