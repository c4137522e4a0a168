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

from .window import first_visible

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


def _selection_counts(blocks: torch.Tensor, num_tokens: int, block_size: int) -> tuple[int, int]:
    """(valid tokens covered, blocks picked) by a selection [num_kv_heads, K], summed over heads,
    read back from the device in one transfer."""
    last = (num_tokens - 1) // block_size
    partial = num_tokens - last * block_size
    if blocks.device.type == "cpu":          # numpy: a few microseconds, where each torch op costs several
        b = blocks.numpy()
        picked, last_hits = int((b >= 0).sum()), int((b == last).sum())
        full_hits = picked - last_hits
    else:
        valid = blocks >= 0
        counts = torch.stack([(valid & (blocks != last)).sum(), (blocks == last).sum(), valid.sum()]).tolist()
        full_hits, last_hits, picked = counts
    return full_hits * block_size + last_hits * partial, picked


def attention_traffic(blocks: torch.Tensor, num_tokens: int, block_size: int, head_dim: int,
                      itemsize: int, num_q_heads: int, row_bytes: int | None = None) -> StepTraffic:
    """Bytes that attention over the selection `blocks` reads (no scoring). One host read.

    row_bytes: one token's K (or V) in one kv head as stored (`StoreConfig.kv_row_bytes`: int8 codes plus their
    scale); None is head_dim * itemsize. q and o are counted at `itemsize`.
    """
    rows, picked = _selection_counts(blocks, num_tokens, block_size)
    return StepTraffic(
        kv_bytes=2 * rows * (head_dim * itemsize if row_bytes is None else row_bytes),
        index_bytes=2 * picked * INDEX_BYTES,      # a selection index and a table entry each
        qo_bytes=2 * num_q_heads * head_dim * itemsize,
    )


def dense_traffic(num_tokens: int, num_kv_heads: int, block_size: int, head_dim: int,
                  itemsize: int, num_q_heads: int, row_bytes: int | None = None) -> StepTraffic:
    """Bytes dense decode reads: every K/V row (at `row_bytes` each when given), plus one table entry per block."""
    nb = -(-num_tokens // block_size)
    return StepTraffic(
        kv_bytes=2 * num_tokens * num_kv_heads * (head_dim * itemsize if row_bytes is None else row_bytes),
        index_bytes=nb * INDEX_BYTES,
        qo_bytes=2 * num_q_heads * head_dim * itemsize,
    )


def summary_traffic(num_scored_tiles: int, vectors_per_tile: int, head_dim: int, itemsize: int) -> StepTraffic:
    """Bytes a scorer reads: `vectors_per_tile` summary vectors for each scored (kv head, block)."""
    return StepTraffic(summary_bytes=num_scored_tiles * vectors_per_tile * head_dim * itemsize)


def hierarchical_vectors(num_tokens: int, block_size: int, group: int, keep: int, vectors: int = 2) -> int:
    """head_dim summary vectors one hierarchical routing step reads per kv head (`routing.hierarchy`) over a sequence
    of `num_tokens`: the coarse summaries of its complete groups (`group` full blocks each), then the fine ones of the
    `keep` groups refined and of every block after the last complete group (the partial block among them);
    `vectors` per summary (2 for min/max). With group 1 the coarse summaries are the fine ones and nothing is read
    twice: vectors * num_blocks, as flat routing reads."""
    nb = -(-num_tokens // block_size)
    if group == 1:
        return vectors * nb
    ng = (num_tokens // block_size) // group
    return vectors * (ng + min(keep, ng) * group + nb - ng * group)


def key_traffic(num_tokens: int, num_kv_heads: int, head_dim: int, itemsize: int) -> StepTraffic:
    """Bytes a scorer reads when it scores from the keys themselves (the oracle): every K row."""
    return StepTraffic(summary_bytes=num_tokens * num_kv_heads * head_dim * itemsize)


def routed_traffic(num_tokens: int, budget_tokens: int, num_kv_heads: int, block_size: int, head_dim: int,
                   itemsize: int, num_q_heads: int, summary_vectors: int) -> StepTraffic:
    """Bytes of one routed decode step of one layer under a token budget, before any selection is made.

    K blocks per kv head (K = budget // block_size, at least the sink and the local block), the
    K/V rows they hold, `summary_vectors` head_dim vectors per (kv head, block) scored, the block
    table, a selection index and a table entry per picked tile, and q and o. This is the formula the
    notebooks' traffic figures and the benchmarks use; `attention_traffic` is its measured
    counterpart for an actual selection.
    """
    nb = -(-num_tokens // block_size)
    k = min(nb, max(2, budget_tokens // block_size))
    partial = num_tokens - (nb - 1) * block_size                # rows of the last block, always selected
    rows = (k - 1) * block_size + partial
    return StepTraffic(
        kv_bytes=2 * rows * num_kv_heads * head_dim * itemsize,
        summary_bytes=nb * num_kv_heads * summary_vectors * head_dim * itemsize,
        index_bytes=(nb + 2 * k * num_kv_heads) * INDEX_BYTES,
        qo_bytes=2 * num_q_heads * head_dim * itemsize,
    )


# -- equal bytes across cache families ------------------------------------------------------------

@dataclass(frozen=True)
class CacheBytes:
    """What a cache costs for one sequence, over all layers.

    held: bytes kept in memory (K/V or their codes, scales and zero-points, summaries);
    read: bytes one decode step reads (the same parts, for what the step touches). Indices and q/o are
    left out on every side: they are the same for every method and small.
    """

    held: int
    read: int


FAMILIES = ("dense", "evict", "quant", "lossless")


def cache_bytes(family: str, *, layers: int, kv_heads: int, head_dim: int, tokens: int, itemsize: int = 4,
                kept: int | None = None, bits: int | None = None, group: int = 64, residual: int = 0,
                block_size: int = 16, kv_bits: int = 0, budget: int | None = None, summaries_held: int = 0,
                summaries_read: int = 0, scale_itemsize: int = 4, summary_itemsize: int | None = None) -> CacheBytes:
    """The one byte model for comparing caches at equal bytes (notebook 09's x-axes).

    family:
      "dense"    a contiguous cache of all `tokens` (transformers' DynamicCache): every row held and read.
      "evict"    an eviction press kept `kept` tokens (context survivors plus everything fed after): held = read.
      "quant"    `tokens - residual` tokens as `bits`-bit codes with a scale and a zero-point per `group`
                 channels (transformers' QuantizedCache, HQQ), the last `residual` in full precision;
                 held = read (dequantising reads every code, scale and zero-point).
      "lossless" sparsekv's store: whole blocks of `block_size` tokens (a partial last block holds a full
                 tile), K/V in `itemsize` bytes or, with kv_bits=8 (4), int8 codes (packed int4 nibbles)
                 plus a float scale per (token, kv head); `summaries_held` head_dim vectors per (block, kv head) kept. A step reads
                 every row (budget None) or the rows of K = max(2, budget // block_size) blocks (the sink,
                 the local block and the best others, as `Router` selects), plus `summaries_read` vectors
                 per (block, kv head) to score them; summaries are `summary_itemsize` bytes per element
                 (default `itemsize`).
    Each count is per (layer, kv head) and multiplied by `layers * kv_heads`.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    for name, x in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim), ("tokens", tokens)):
        if not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    lh, D = layers * kv_heads, head_dim
    if family == "dense":
        b = lh * 2 * tokens * D * itemsize
        return CacheBytes(b, b)
    if family == "evict":
        if kept is None or not 0 < kept <= tokens:
            raise ValueError(f"kept must be in [1, tokens={tokens}] for 'evict', got {kept!r}")
        b = lh * 2 * kept * D * itemsize
        return CacheBytes(b, b)
    if family == "quant":
        if bits not in (1, 2, 3, 4, 8) or not 0 <= residual <= tokens or D % group:
            raise ValueError(f"'quant' needs bits in (1, 2, 3, 4, 8), 0 <= residual <= tokens and group dividing "
                             f"head_dim; got bits={bits!r}, residual={residual}, group={group}")
        nq = tokens - residual
        per = -(-nq * D * bits // 8) + (nq * D // group) * 2 * scale_itemsize + residual * D * itemsize
        b = lh * 2 * per
        return CacheBytes(b, b)
    if kv_bits not in (0, 8, 4):
        raise ValueError(f"kv_bits must be 0, 8 or 4, got {kv_bits!r}")
    row = D * itemsize if not kv_bits else -(-D * kv_bits // 8) + scale_itemsize
    si = itemsize if summary_itemsize is None else summary_itemsize
    nb = -(-tokens // block_size)
    held = lh * nb * (2 * block_size * row + summaries_held * D * si)
    if budget is None:
        return CacheBytes(held, lh * 2 * tokens * row)
    k = min(nb, max(2, budget // block_size))
    rows = (k - 1) * block_size + tokens - (nb - 1) * block_size      # the last (local) block is partial
    return CacheBytes(held, lh * (2 * rows * row + nb * summaries_read * D * si))


def window_cache_bytes(window: int, *, layers: int, kv_heads: int, head_dim: int, tokens: int, itemsize: int = 4,
                       block_size: int = 16, kv_bits: int = 0, scale_itemsize: int = 4,
                       keep_all: bool = False) -> CacheBytes:
    """Sliding-window layers (a query at i sees keys j with 0 <= i - j < `window`) in sparsekv's store, at `tokens`.

    held: the blocks the next query can still reach, nb - (tokens - window + 1) // block_size of them (at most
    ceil(window / block_size) + 1; `storage.hybrid`), or all nb with `keep_all` (a cache that keeps every layer's
    K/V, as one without a hybrid allocator does). read: the rows of the blocks the window touches, from block
    (tokens - window) // block_size on (the first block's rows before the window are read and weigh 0, as the
    decode kernels do), at most window + block_size - 1 rows; no summaries (sliding layers are not routed). Rows
    as in `cache_bytes("lossless")`."""
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    full = cache_bytes("lossless", layers=layers, kv_heads=kv_heads, head_dim=head_dim, tokens=tokens,
                       itemsize=itemsize, block_size=block_size, kv_bits=kv_bits, scale_itemsize=scale_itemsize)
    nb = -(-tokens // block_size)
    kept = nb if keep_all else nb - first_visible(tokens, window) // block_size      # the next query's window
    row_bytes = full.read // (layers * kv_heads * 2 * tokens)          # one K or V row, codes and scale
    rows = tokens - first_visible(tokens - 1, window) // block_size * block_size    # the last token's window
    return CacheBytes(full.held // nb * kept, layers * kv_heads * 2 * rows * row_bytes)


def hybrid_cache_bytes(windows, *, kv_heads: int, head_dim: int, tokens: int, budget: int | None = None,
                       keep_all: bool = False, **lossless) -> CacheBytes:
    """A model whose attention layers have these `windows` (0: global), in sparsekv's store: the global layers as
    `cache_bytes("lossless", budget=...)` (only they are routed; their summaries held and read), each sliding
    group as `window_cache_bytes` (dense over its window). `lossless`: cache_bytes' layout keywords (itemsize,
    block_size, kv_bits, summaries_held, summaries_read, summary_itemsize, scale_itemsize)."""
    windows = tuple(int(w) for w in windows)
    n_global = sum(1 for w in windows if w == 0)
    held = read = 0
    if n_global:
        g = cache_bytes("lossless", layers=n_global, kv_heads=kv_heads, head_dim=head_dim, tokens=tokens,
                        budget=budget, **lossless)
        held, read = g.held, g.read
    plain = {k: v for k, v in lossless.items() if k in ("itemsize", "block_size", "kv_bits", "scale_itemsize")}
    for w in sorted(set(windows) - {0}):
        s = window_cache_bytes(w, layers=windows.count(w), kv_heads=kv_heads, head_dim=head_dim, tokens=tokens,
                               keep_all=keep_all, **plain)
        held, read = held + s.held, read + s.read
    return CacheBytes(held, read)


def roofline_bound(intensity: float, ridge: float, tol: float = 0.05) -> str:
    """Which roofline bound a kernel at `intensity` flop/byte meets on a machine whose ridge is `ridge` flop/byte:
    "memory-bound" or "compute-bound", or "at the ridge" within `tol` of it (both floors then matter)."""
    if abs(intensity - ridge) <= tol * ridge:
        return "at the ridge"
    return "memory-bound" if intensity < ridge else "compute-bound"
