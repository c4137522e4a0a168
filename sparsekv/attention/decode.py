"""Decode and chunked-prefill attention over a `BlockStore`, with a backend dispatcher.

Backends (forced with `backend=`, chosen by `"auto"` otherwise):
    "reference"  plain torch, one kv head at a time: the readable definition.
    "torch"      the vectorised CPU/GPU fast path: one indexed read per selected tile, GQA
                 groups share each K/V read, float32 softmax.
    "triton"     the paged split-K kernel of `sparsekv.kernels` (CUDA, or TRITON_INTERPRET=1).
    "cpp"        the fused C++/OpenMP kernel (`sparsekv.kernels.cpu_decode`): each selected K/V
                 row read once in place, online softmax, split-K across threads; float32 queries
                 over float32 or bfloat16 storage (anything else takes the torch path).
"auto" picks "triton" for CUDA tensors or under the interpreter, else "cpp" on the CPU when the
kernel builds, else "torch" (core.backend).

Shapes (H = num_kv_heads, G = query heads per kv head, Hq = H * G, D = head_dim):
    q       [Hq, D]        any float dtype; query head h reads kv head h // G
    blocks  [H, K] int64   logical block indices per kv head, padded with -1
    out     [Hq, D]        q.dtype
    lse     [Hq]           float32 natural-log sum of exp(q.k / sqrt(D)) over the tokens read
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..core import cpu_paths
from ..core.backend import BACKENDS, resolve
from ..core.checks import check_choice, check_int, check_tensor
from ..core.traffic import StepTraffic, attention_traffic
from ..core.window import first_visible
from ..storage.store import BlockStore, Sequence, check_decode_query


@dataclass(frozen=True)
class AttentionResult:
    """What a sparse decode step computed besides its output."""

    lse: torch.Tensor        # [Hq] float32 log-sum-exp over the tokens read
    blocks_read: int         # selected (kv head, block) tiles
    traffic: StepTraffic     # bytes the step read

    @property
    def kv_bytes(self) -> int:
        return self.traffic.kv_bytes

    @property
    def meta_bytes(self) -> int:
        return self.traffic.meta_bytes


# -- public entry points --------------------------------------------------------------------

def dense_attention(q: torch.Tensor, store: BlockStore, seq: Sequence, layer: int,
                    backend: str = "auto") -> torch.Tensor:
    """Exact decode attention of one new token over every cached token of `seq` in `layer`."""
    _check_decode_args(q, store, seq, layer)
    return _implementation("dense", backend, q, store)(q, store, seq, layer)[0]


def sparse_attention(q: torch.Tensor, store: BlockStore, seq: Sequence, layer: int,
                     blocks: torch.Tensor, backend: str = "auto", min_token: int = 0) -> tuple[torch.Tensor, AttentionResult]:
    """Decode attention over the selected logical blocks only.

    With every block selected it equals `dense_attention` to rounding. Returns the output
    `[Hq, D]` and an `AttentionResult` with the log-sum-exp and the bytes read. `min_token`: the first
    token attended (a sliding window's start, N - window); rows of the selected blocks before it weigh 0.
    """
    check_sparse_args(q, store, seq, layer, blocks, min_token)
    out, lse = _implementation("sparse", backend, q, store)(q, store, seq, layer, blocks, min_token)
    c = store.config
    traffic = attention_traffic(blocks, seq.num_tokens, c.block_size, c.head_dim, c.itemsize, q.shape[0], c.kv_row_bytes)
    return out, AttentionResult(lse, int((blocks >= 0).sum()), traffic)


def batch_attention(q: torch.Tensor, store: BlockStore, seqs: list[Sequence], layer: int,
                    blocks: list[torch.Tensor] | None = None, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention for B sequences of different lengths in one call.

    q: [B, Hq, D]; seqs: B live sequences; blocks: None (dense) or B selections [H, K_b].
    Returns out [B, Hq, D] (q.dtype) and lse [B, Hq] (float32). With `backend="torch"` the
    sparse case gathers every sequence's tiles with one indexed read and runs one batched
    product over all B * H groups; the dense case reads each sequence in place.
    """
    if not isinstance(seqs, (list, tuple)) or not seqs:
        raise TypeError("seqs must be a non-empty list of Sequence")
    check_tensor("q", q, (len(seqs), None, store.config.head_dim), device=store.config.device, finite=True)
    if blocks is not None and len(blocks) != len(seqs):
        raise ValueError(f"blocks must hold one selection per sequence ({len(seqs)}), got {len(blocks)}")
    for b, seq in enumerate(seqs):
        _check_decode_args(q[b], store, seq, layer)
        if blocks is not None:
            _check_blocks(blocks[b], store, seq)
    return _implementation("batch", backend, q, store)(q, store, seqs, layer, blocks)


def all_blocks(store: BlockStore, seq: Sequence) -> torch.Tensor:
    """The selection of every logical block for every kv head: [H, num_blocks]."""
    H = store.config.num_kv_heads
    return torch.arange(seq.num_blocks, device=store.config.device).expand(H, -1).contiguous()


def prefill_attention(q: torch.Tensor, store, seq: Sequence, layer: int,
                      backend: str = "auto", fresh: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention of the last T tokens of `seq` over the cached prefix plus themselves.

    q: [T, Hq, D], the queries of tokens [num_tokens - T, num_tokens), whose K/V are already
    written. Returns [T, Hq, D] in q.dtype. "reference" computes the full score matrix in
    float32 (float64 if q is float64); "torch" (the default) runs SDPA with GQA and the
    causal offset of the cached prefix, so it never forms the [Hq, T, N] scores on the CPU's
    flash path.

    fresh: the chunk's own K and V ([T, H, D] each, as the model computed them). When given, the chunk
    attends to itself at that precision and reads only the prefix [0, num_tokens - T) from the store,
    as a quantised KV cache is used in vLLM and transformers: storage precision applies to what later
    steps read. For a store in the model's dtype this is the same values; for int8 (or a narrower
    dtype) it keeps a prompt's rounding from feeding back through the layers of its own prefill,
    which otherwise turns rounding-level differences between CPUs into different codes (measured:
    11% of layer-17 codes after a 368-token prefill, from a handful of ties at layer 2).

    A sliding-window layer (`store.view(seq, layer).window` w > 0: a hybrid model's) reads only the keys its
    queries can see, [N - T - w + 1, N), and masks each query's to 0 <= i - j < w: O(T * (T + w)) per chunk.

    "auto" on the CPU: a float32 chunk takes the extension's float32 kernel (the same bits on every CPU); a bfloat16
    chunk takes SDPA where oneDNN runs AMX tiles (`_amx_sdpa`), else the extension's prefill kernel for this CPU
    (`_prefill_kernel`), else SDPA; `auto_prefill_path` names the choice.
    """
    v = store.view(seq, layer)
    if backend == "auto" and _amx_sdpa(q, v.store):
        backend = "torch"
    return _implementation("prefill", backend, q, v.store)(q, v.store, v.seq, v.layer, fresh, v.window)


def _amx_sdpa(q: torch.Tensor, store) -> bool:
    """Whether "auto" sends this chunk to SDPA ahead of the extension's kernels: a bfloat16 chunk on a CPU whose oneDNN
    runs AMX tiles (`core.cpu_paths.amx_bf16`), where SDPA's flash attention beat both of the extension's kernels on
    every case measured (benchmarks/results/prefill_native_xeon.json). An explicit backend="cpp" still takes the
    kernel."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu" and not store.quantized and cpu_paths.amx_bf16()


def auto_prefill_path(q: torch.Tensor, store) -> str:
    """What backend "auto" runs for a prefill chunk like `q` over `store` on this CPU (a name for results):
    "sdpa_amx" (SDPA on AMX tiles), "bf16_prefill_kernel" or "bf16_prefill_f32_kernel" (the extension's, for a
    bfloat16 chunk), "f32_prefill_kernel" (prefill_attn_f32 for a float32 chunk), or "sdpa"."""
    if _amx_sdpa(q, store):
        return "sdpa_amx"
    if resolve("auto", q) == "cpp":
        kernel = _prefill_kernel(q, store)
        if kernel is not None:
            return kernel[0] or "f32_prefill_kernel"
    return "sdpa"


def _prefill_kv(q, store, seq, layer, fresh, start: int = 0, dtype: torch.dtype | None = None):
    """K, V [N - start, H, D] the chunk attends to: the store's from token `start`, the last T rows replaced by
    `fresh` if given; in `dtype` if given, else the store's and fresh's promoted dtype."""
    k, v = store.gather(seq, layer, start)                                # [N - start, H, D]
    if fresh is None:
        return (k, v) if dtype is None else (k.to(dtype), v.to(dtype))
    fk, fv = fresh
    T = q.shape[0]
    check_tensor("fresh[0]", fk, (T, store.config.num_kv_heads, store.config.head_dim), device=store.config.device)
    check_tensor("fresh[1]", fv, (T, store.config.num_kv_heads, store.config.head_dim), device=store.config.device)
    cd = dtype or torch.promote_types(k.dtype, fk.dtype)
    return torch.cat([k[:len(k) - T].to(cd), fk.to(cd)]), torch.cat([v[:len(v) - T].to(cd), fv.to(cd)])


def _prefill_start(N: int, T: int, window: int) -> int:
    """The first key position a chunk of the last T of N tokens can see: its first query's (0 without a window)."""
    return first_visible(N - T, window)


def _prefill_window(q, seq, window: int) -> tuple[int, torch.Tensor | None]:
    """The first key a chunk of T queries can see and the mask [T, N - start] (None: plain causal over all N)."""
    T, N = q.shape[0], seq.num_tokens
    start = _prefill_start(N, T, window)
    if not window and T == N:
        return 0, None
    i = torch.arange(N - T, N, device=q.device)[:, None]
    j = torch.arange(start, N, device=q.device)[None, :]
    mask = j <= i
    if window:
        mask &= (i - j) < window
    return start, mask


def _prefill_sdpa(q, store, seq, layer, fresh=None, window: int = 0):
    _check_prefill_args(q, store, seq, layer)
    start, mask = _prefill_window(q, seq, window)
    k, v = _prefill_kv(q, store, seq, layer, fresh, start)               # [N - start, H, D]
    cd = torch.float32 if q.dtype == torch.float32 else q.dtype
    if cd == torch.bfloat16:
        cpu_paths.take("bf16_prefill_sdpa")                                # its bits depend on the CPU
    qh = q.to(cd).permute(1, 0, 2)[None]                                  # [1, Hq, T, D]
    kh, vh = k.to(cd).permute(1, 0, 2)[None], v.to(cd).permute(1, 0, 2)[None]
    if mask is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
    return out[0].permute(1, 0, 2).to(q.dtype)


def _check_prefill_args(q, store, seq, layer):
    c = store.config
    store.check_seq(seq)
    check_int("layer", layer, lo=0, hi=c.num_layers - 1)
    check_tensor("q", q, (None, None, c.head_dim), device=c.device, finite=True)
    T, Hq, D = q.shape
    if Hq % c.num_kv_heads:
        raise ValueError(f"q must have a multiple of num_kv_heads={c.num_kv_heads} heads, got {Hq}")
    if not 1 <= T <= seq.num_tokens:
        raise ValueError(f"q must hold between 1 and seq.num_tokens={seq.num_tokens} queries, got {T}")


def _prefill_reference(q, store, seq, layer, fresh=None, window: int = 0):
    """The definition: the full score matrix over the keys the chunk can see, causal (and within the window)."""
    c = store.config
    _check_prefill_args(q, store, seq, layer)
    T, Hq, D = q.shape
    G, N = Hq // c.num_kv_heads, seq.num_tokens
    start = _prefill_start(N, T, window)
    k, v = _prefill_kv(q, store, seq, layer, fresh, start)               # [N - start, H, D]
    cd = _compute_dtype(q)
    qh = q.to(cd).view(T, c.num_kv_heads, G, D).permute(1, 2, 0, 3)       # [H, G, T, D]
    s = qh @ k.to(cd).permute(1, 2, 0)[:, None] / math.sqrt(D)           # [H, G, T, N - start]
    qpos = torch.arange(N - T, N, device=c.device)[:, None]
    kpos = torch.arange(start, N, device=c.device)[None, :]
    s = s.masked_fill((kpos > qpos) | ((qpos - kpos >= window) if window else False), -torch.inf)
    out = s.softmax(-1) @ v.to(cd).permute(1, 0, 2)[:, None]             # [H, G, T, D]
    return out.permute(2, 0, 1, 3).reshape(T, Hq, D).to(q.dtype)


# -- checks ---------------------------------------------------------------------------------

def _check_decode_args(q, store, seq, layer) -> None:
    check_decode_query(store, q, seq, layer)


def check_sparse_args(q, store, seq, layer, blocks, min_token: int = 0) -> None:
    """What a sparse decode reads checked before anything is read: q [Hq, D] against `seq` at `layer`, `blocks`
    [H, K] int64 of logical blocks in [0, seq.num_blocks) or -1, each row selecting one block at least and none
    twice, and `min_token` in [0, N). `sparse_attention` and `DecodePlan.sparse` run it."""
    _check_decode_args(q, store, seq, layer)
    _check_blocks(blocks, store, seq)
    check_int("min_token", min_token, lo=0, hi=seq.num_tokens - 1)
    if min_token and int(blocks[blocks >= 0].min()) < seq.released:
        raise ValueError(f"blocks must not select blocks a sliding window released (before {seq.released})")


def _check_blocks(blocks, store, seq) -> None:
    H = store.config.num_kv_heads
    check_tensor("blocks", blocks, (H, None), dtype=torch.long, device=store.config.device)
    if blocks.numel() == 0:
        raise ValueError("blocks must select at least one block per kv head, got K = 0")
    if int(blocks.min()) < -1 or int(blocks.max()) >= seq.num_blocks:
        raise ValueError(f"blocks must hold logical indices in [0, {seq.num_blocks}) or -1 padding, "
                         f"got values in [{int(blocks.min())}, {int(blocks.max())}]")
    if bool((blocks < 0).all(dim=1).any()):
        raise ValueError("blocks must select at least one block for every kv head (a row is all -1)")
    srt = blocks.sort(dim=1).values
    if bool(((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any()):
        raise ValueError("blocks must not select the same block twice for one kv head")


# -- backends -------------------------------------------------------------------------------

def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _sparse_reference(q, store, seq, layer, blocks, min_token: int = 0):
    """One kv head at a time: gather the selected rows (from `min_token` on), softmax, weighted sum."""
    c = store.config
    H, D = c.num_kv_heads, c.head_dim
    G, cd = q.shape[0] // H, _compute_dtype(q)
    table = seq.block_ids
    outs, lses = [], []
    for h in range(H):
        ks, vs = [], []
        for j in blocks[h].tolist():
            if j < 0:
                continue
            n = min(c.block_size, seq.num_tokens - j * c.block_size)   # valid rows of block j
            r0 = max(0, min(n, min_token - j * c.block_size))          # rows before the window
            idx = torch.tensor([table[j]], device=q.device)
            ks.append(store.tiles("k", layer, idx)[0, h, r0:n])
            vs.append(store.tiles("v", layer, idx)[0, h, r0:n])
        k, v = torch.cat(ks).to(cd), torch.cat(vs).to(cd)                 # [n_sel, D]
        s = q[h * G:(h + 1) * G].to(cd) @ k.T / math.sqrt(D)              # [G, n_sel]
        lses.append(torch.logsumexp(s, -1))
        outs.append(s.softmax(-1) @ v)
    return torch.cat(outs).to(q.dtype), torch.cat(lses).float()


def _sparse_torch(q, store, seq, layer, blocks, min_token: int = 0):
    """One sequence through the batched fast path (one indexed read, GQA groups share each tile)."""
    out, lse = _sparse_torch_batch(q[None], store, [seq], layer, [blocks], min_token)
    return out[0], lse[0]


def _sparse_torch_batch(q, store, seqs, layer, blocks, min_token: int = 0):
    """All sequences' selected tiles in one index_select, one bmm over B * H groups."""
    c = store.config
    B, H, D, bs = len(seqs), c.num_kv_heads, c.head_dim, c.block_size
    G, cd = q.shape[1] // H, _compute_dtype(q)
    K = max(b.shape[1] for b in blocks)
    sel = torch.full((B, H, K), -1, dtype=torch.long, device=q.device)
    phys = torch.zeros((B, H, K), dtype=torch.long, device=q.device)
    ntok = torch.tensor([s.num_tokens for s in seqs], device=q.device)
    kv = store.layer_kv(layer, seqs, blocks)           # rows of the tiles read (hot ones with a cold tier)
    for b, (seq, blk) in enumerate(zip(seqs, blocks)):                      # per sequence, not per block
        sel[b, :, :blk.shape[1]] = blk
        phys[b] = kv.tables[b][sel[b].clamp(min=0)].clamp(min=0)          # padding reads row 0, then is masked
    R = kv.k.shape[0]
    rows = (phys + torch.arange(H, device=q.device)[None, :, None] * R).view(-1)
    ws = store.workspace
    kt = torch.index_select(_rows_view(kv.k, c), 0, rows, out=ws.take("k", (B * H * K, bs, D), kv.k.dtype))
    vt = torch.index_select(_rows_view(kv.v, c), 0, rows, out=ws.take("v", (B * H * K, bs, D), kv.v.dtype))
    if store.quantized:                                  # int8 codes times their per-token scales
        ks = torch.index_select(kv.k_scale.transpose(0, 1).reshape(-1, bs), 0, rows)
        vs = torch.index_select(kv.v_scale.transpose(0, 1).reshape(-1, bs), 0, rows)
        kt, vt = kt.to(cd) * ks[..., None], vt.to(cd) * vs[..., None]
    kt, vt = kt.view(B * H, K * bs, D), vt.view(B * H, K * bs, D)
    pos = sel.clamp(min=0)[..., None] * bs + torch.arange(bs, device=q.device)      # [B, H, K, bs]
    ok = ((pos < ntok[:, None, None, None]) & (pos >= min_token) & (sel[..., None] >= 0)).view(B * H, 1, K * bs)
    qg = q.reshape(B * H, G, D).to(cd)
    s = torch.bmm(qg, kt.to(cd).transpose(1, 2)).mul_(1.0 / math.sqrt(D)).masked_fill_(~ok, -torch.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    out = torch.bmm(s.sub_(lse).exp_(), vt.to(cd))
    return out.view(B, H * G, D).to(q.dtype), lse.view(B, H * G).float()


def _rows_view(t: torch.Tensor, c) -> torch.Tensor:
    """A head-major K or V layer [R, H, bs, D] as [H * R, bs, D] (a view: no copy)."""
    return t.transpose(0, 1).reshape(-1, c.block_size, c.head_dim)


CONVERT_CHUNK_BYTES = 4 << 20   # float32 scratch per piece when storage is not float32


def _pieces(runs, convert: bool, H: int, bs: int, D: int):
    """Runs as they are for float32 storage; otherwise split so each converted piece fits
    CONVERT_CHUNK_BYTES, so bf16/fp16 decode never converts the whole cache at once."""
    if not convert:
        yield from runs
        return
    step = max(1, CONVERT_CHUNK_BYTES // (H * bs * D * 4))
    for first, p0, n in runs:
        for i in range(0, n, step):
            yield first + i, p0 + i, min(step, n - i)


def _dense_torch(q, store, seq, layer):
    """Dense decode without copying the cache: one bmm per run of consecutive physical blocks.

    Per run, K and V of every kv head are contiguous [n * bs, D] matrices (head-major
    layout), so the products read the cache in place. Runs are merged with their
    log-sum-exp (flash-decoding's split merge); the partial last block is masked.
    """
    c = store.config
    H, D, bs, N = c.num_kv_heads, c.head_dim, c.block_size, seq.num_tokens
    G, cd = q.shape[0] // H, _compute_dtype(q)
    qg = q.view(H, G, D).to(cd)
    kv = store.layer_kv(layer, [seq])
    kh, vh = kv.k.transpose(0, 1), kv.v.transpose(0, 1)                   # [H, R, bs, D] views
    outs, lses = [], []
    convert = kv.k.dtype != cd
    for first, p0, n in _pieces(store.runs(seq, kv.tables[0]), convert=convert, H=H, bs=bs, D=D):
        k = kh[:, p0:p0 + n].reshape(H, n * bs, D)                        # views: contiguous per head
        v = vh[:, p0:p0 + n].reshape(H, n * bs, D)
        valid = min(n * bs, N - first * bs)                                # only the last run is partial
        k, v = k[:, :valid], v[:, :valid]
        if store.quantized:                                                # int8 codes times per-token scales
            ks = kv.k_scale.transpose(0, 1)[:, p0:p0 + n].reshape(H, n * bs)[:, :valid]
            vs = kv.v_scale.transpose(0, 1)[:, p0:p0 + n].reshape(H, n * bs)[:, :valid]
            k, v = k.to(cd) * ks[..., None], v.to(cd) * vs[..., None]
        s = torch.bmm(qg, k.to(cd).transpose(1, 2), out=store.workspace.take("s", (H, G, valid), cd))
        s.mul_(1.0 / math.sqrt(D))
        lse = torch.logsumexp(s, -1, keepdim=True)                         # [H, G, 1]
        outs.append(torch.bmm(s.sub_(lse).exp_(), v.to(cd)))               # [H, G, D]
        lses.append(lse)
    if len(outs) == 1:
        out, lse = outs[0], lses[0]
    else:
        L = torch.stack(lses)                                              # [R, H, G, 1]
        lse = torch.logsumexp(L, 0)
        out = ((L - lse).exp() * torch.stack(outs)).sum(0)
    return out.view(H * G, D).to(q.dtype), lse.view(H * G).float()


def _sparse_triton(q, store, seq, layer, blocks, min_token: int = 0):
    if min_token:
        raise ValueError("backend 'triton' has no sliding-window decode yet (min_token > 0): use 'torch' or 'cpp'")
    out, lse = _batch_triton(q[None], store, [seq], layer, [blocks])
    return out[0], lse[0]


def _batch_triton(q, store, seqs, layer, blocks, poison: bool = False):
    """Pack block tables and selections for the paged split-K kernel and launch it."""
    from ..kernels.paged_decode import paged_decode
    dev, H = q.device, store.config.num_kv_heads
    width = max(s.num_blocks for s in seqs)
    sel = [all_blocks(store, s) for s in seqs] if blocks is None else blocks
    kv = store.layer_kv(layer, seqs, None if blocks is None else sel)
    tables = torch.zeros(len(seqs), width, dtype=torch.int32, device=dev)
    for b, s in enumerate(seqs):
        tables[b, :s.num_blocks] = kv.tables[b].clamp(min=0)              # unread blocks' rows are never used
    K = max(x.shape[1] for x in sel)
    selection = torch.full((len(seqs), H, K), -1, dtype=torch.int32, device=dev)
    for b, x in enumerate(sel):
        selection[b, :, :x.shape[1]] = x
    lens = torch.tensor([s.num_tokens for s in seqs], dtype=torch.int32, device=dev)
    return paged_decode(q, kv.k, kv.v, tables, lens, selection, poison=poison)


def _batch_reference(q, store, seqs, layer, blocks):
    sel = [all_blocks(store, s) for s in seqs] if blocks is None else blocks
    pairs = [_sparse_reference(q[b], store, s, layer, sel[b]) for b, s in enumerate(seqs)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _batch_torch(q, store, seqs, layer, blocks):
    if blocks is not None:
        return _sparse_torch_batch(q, store, seqs, layer, blocks)
    pairs = [_dense_torch(q[b], store, s, layer) for b, s in enumerate(seqs)]      # in place, per sequence
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _prefill_torch(q, store, seq, layer, fresh=None, window: int = 0):
    if q.dtype == torch.float64:
        return _prefill_reference(q, store, seq, layer, fresh, window)
    return _prefill_sdpa(q, store, seq, layer, fresh, window)


def _prefill_kernel(q, store):
    """The extension's kernel for this prefill chunk on this CPU, as (gated path or None, op), or None (the torch path).

    A float32 chunk over float32 or bfloat16 storage with a head dim a multiple of 16 takes prefill_attn_f32 on every
    CPU: it computes the same bits on every instruction set and at every thread count (tests/test_cpu_kernel.py), so
    it is no gated path (None) and a smoke baseline may rest on it. It is the fast path wherever the build has AVX2 +
    FMA (every CPU measured: benchmarks/results/prefill_avx2.json, prefill_native_xeon.json); a plain x86-64 build
    runs it in slow loops, still the same bits.

    A bfloat16 chunk (gated: its kernel depends on the CPU, `core.cpu_paths`):
    1. prefill_attn_bf16 where it is built (AVX512-BF16 pair products) and the head dim is a multiple of 32;
    2. else prefill_attn_f32 where it is vectorised (AVX2 + FMA or AVX-512) and the head dim a multiple of 16;
    3. else SDPA.
    A float64 chunk (the reference's) and int8 storage never take a kernel."""
    from ..kernels import cpu_decode
    if q.device.type != "cpu" or store.quantized:
        return None
    D = q.shape[-1]
    if q.dtype == torch.float32:
        ok = D % 16 == 0 and store.k.dtype in (torch.float32, torch.bfloat16)      # read as stored: no fp16 in it
        return (None, cpu_decode.prefill_attn_f32) if ok else None
    if q.dtype != torch.bfloat16:
        return None
    if D % 32 == 0 and cpu_decode.bf16_prefill_available():
        return "bf16_prefill_kernel", cpu_decode.prefill_attn_bf16
    if D % 16 == 0 and cpu_decode.f32_prefill_vectorized():
        return "bf16_prefill_f32_kernel", cpu_decode.prefill_attn_f32
    return None


def _prefill_cpp(q, store, seq, layer, fresh=None, window: int = 0):
    """A float32 or bfloat16 chunk through the extension's prefill kernel for this CPU (`_prefill_kernel`: GQA folded
    into the rows, float32 scores and sums, only the keys in the causal and window ranges read); every other call
    takes the torch path. A float32 chunk reads the stored K/V as they are (bf16 widened exactly in the kernel, as
    SDPA's path widens them) and its own fresh K/V in float32."""
    kernel = _prefill_kernel(q, store)
    if kernel is None:
        return _prefill_torch(q, store, seq, layer, fresh, window)
    path, op = kernel
    _check_prefill_args(q, store, seq, layer)
    if path is not None:
        cpu_paths.take(path)
    T, N = q.shape[0], seq.num_tokens
    start = _prefill_start(N, T, window)
    k, v = _prefill_kv(q, store, seq, layer, fresh, start, dtype=torch.bfloat16 if q.dtype == torch.bfloat16 else None)
    if k.dtype not in (torch.float32, torch.bfloat16):         # fresh K/V in another dtype: promoted as SDPA's path
        k, v = k.float(), v.float()
    out = op(q, k, v, N - T, start, window, 1.0 / math.sqrt(q.shape[-1]))      # [T, Hq, D] float32
    return out.to(q.dtype)


def _over_all_blocks(sparse_fn):
    return lambda q, store, seq, layer: sparse_fn(q, store, seq, layer, all_blocks(store, seq))


def cpp_applies(q: torch.Tensor, store: BlockStore) -> bool:
    """Whether the fused CPU kernel handles this call: a float32 or bf16 query on the CPU over float32 or
    bf16 storage (float64 queries, the reference's, and int8 or fp16 storage take the torch path)."""
    return (q.dtype in (torch.float32, torch.bfloat16) and q.device.type == "cpu" and not store.quantized
            and store.k.dtype in (torch.float32, torch.bfloat16))


def _sparse_cpp(q, store, seq, layer, blocks, min_token: int = 0):
    """The fused kernel over `blocks` (padding -1 skipped); the torch path where it does not apply."""
    if not cpp_applies(q, store):
        return _sparse_torch(q, store, seq, layer, blocks, min_token)
    from ..kernels.cpu_decode import paged_decode
    kv = store.layer_kv(layer, [seq], [blocks])
    k, v = kv.k.transpose(0, 1), kv.v.transpose(0, 1)                              # [H, R, bs, D], contiguous
    table = kv.tables[0].clamp(min=0) if kv.partial or seq.released else kv.tables[0]   # -1 rows are never read
    out, lse = paged_decode(q.float().contiguous(), k, v, table, blocks.contiguous(), seq.num_tokens, min_token=min_token)
    return out.to(q.dtype), lse


def _dense_cpp(q, store, seq, layer):
    if not cpp_applies(q, store):
        return _dense_torch(q, store, seq, layer)
    return _sparse_cpp(q, store, seq, layer, all_blocks(store, seq))     # [H, nb] ids: a few KiB


def _batch_cpp(q, store, seqs, layer, blocks):
    pairs = [(_dense_cpp(q[b], store, s, layer) if blocks is None else _sparse_cpp(q[b], store, s, layer, blocks[b]))
             for b, s in enumerate(seqs)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


# The one dispatch table: backend -> phase -> implementation (None: the backend has no such path).
# Every entry point resolves its backend once (core.backend) and looks the implementation up here.
IMPLEMENTATIONS: dict[str, dict[str, Callable | None]] = {
    "reference": {"dense": _over_all_blocks(_sparse_reference), "sparse": _sparse_reference,
                  "batch": _batch_reference, "prefill": _prefill_reference},
    "torch": {"dense": _dense_torch, "sparse": _sparse_torch, "batch": _batch_torch, "prefill": _prefill_torch},
    "triton": {"dense": _over_all_blocks(_sparse_triton), "sparse": _sparse_triton, "batch": _batch_triton,
               "prefill": None},
    "cpp": {"dense": _dense_cpp, "sparse": _sparse_cpp, "batch": _batch_cpp, "prefill": _prefill_cpp},
}


def _implementation(phase: str, backend: str, x: torch.Tensor, store: BlockStore | None = None) -> Callable:
    """The implementation of `phase` for `backend`. An explicit backend without that phase is an error;
    "auto" takes the torch path wherever the backend it resolves to has none (prefill on triton, and
    every phase on an int8 store: the Triton kernels read float K/V)."""
    check_choice("backend", backend, BACKENDS)
    quantized = store is not None and store.quantized
    if backend == "triton" and quantized:
        raise ValueError("backend 'triton' reads float K/V; this store holds int8 (kv_bits=8): use 'torch' or 'reference'")
    if backend != "auto" and IMPLEMENTATIONS[backend][phase] is None:
        raise ValueError(f"backend {backend!r} has no {phase} kernel yet; use 'auto', 'torch' or 'reference'")
    resolved = "torch" if backend == "auto" and quantized else resolve(backend, x)
    return IMPLEMENTATIONS[resolved][phase] or IMPLEMENTATIONS["torch"][phase]
