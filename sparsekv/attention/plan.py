"""A decode plan: one step of B >= 1 sequences, validated and laid out once (FlashInfer's plan/run split).

    plan = plan_decode(store, seqs, num_q_heads, router=r, dense_layers=2)  # once per step, after its slots are reserved
    out = plan.run(layer, q)               # per layer: q [B, Hq, D] -> [B, Hq, D], dense or routed as planned
    plan.traffic[b], plan.blocks_read[b]   # what sequence b's step read, summed over the layers run so far

`plan_decode` checks the store, the sequences and the query-head count once, and builds each sequence's
block table, physical runs and dense byte count once, in every layer group of the store (a hybrid model's global
and sliding-window layers live in separate groups: `storage.hybrid`). A sliding-window layer reads its window
(the blocks from N - window on, earlier rows of the first one weighing 0); only global layers are routed, and
`dense_layers` counts among them. Per layer nothing is re-checked: q has the model's
shape, and a selection from `Router` is sorted, unique and in range by construction. `run` is the one place a
decode step's bytes are counted, at the stored width (int8 codes and their scales), for `Engine.decode`,
`Engine.decode_batch` and `Engine.feed` alike; `metrics.evaluate` and `recall.hf` count with the same function
(`step_traffic`). A routed layer's host reads do not grow with B: routing and attention read back nothing, and
the byte count is taken on the host from the selection's numpy view.

The per-layer primitives the plan runs are public too, for benchmarks and studies that time one of them:
`plan.dense(layer, q, b)`, `plan.route(router, layer, q, b)`, `plan.sparse(layer, q, blocks, b)` (b: which
sequence; q [Hq, D]). `plan.sparse` checks q and `blocks` as `sparse_attention` does (a selection from elsewhere
than `plan.route` may be anything); `run` calls its unchecked core. Use the checked entry points
(`dense_attention`, `sparse_attention`, `Router.select`) for anything else.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.backend import cpp_available
from ..core.checks import check_int
from ..core.traffic import INDEX_BYTES, StepTraffic, attention_traffic, dense_traffic
from ..core.window import first_visible
from ..routing.router import Router, Selection
from ..storage.store import BlockStore, Sequence, check_layer_groups
from .decode import IMPLEMENTATIONS, AttentionResult, check_sparse_args


def step_traffic(store: BlockStore, seq: Sequence, num_q_heads: int, blocks: torch.Tensor | None = None,
                 selection: Selection | None = None) -> StepTraffic:
    """What one layer of one decode step reads, at the stored width: every row and one table entry per block when
    `blocks` is None (dense); else the selection's rows and indices plus what routing read to choose it."""
    c = store.config
    if blocks is None:
        return dense_traffic(seq.num_tokens, c.num_kv_heads, c.block_size, c.head_dim, c.itemsize, num_q_heads,
                             c.kv_row_bytes)
    t = attention_traffic(blocks, seq.num_tokens, c.block_size, c.head_dim, c.itemsize, num_q_heads, c.kv_row_bytes)
    return t if selection is None else t + selection.traffic


@dataclass
class DecodePlan:
    """One decode step of `seqs`: what every layer shares, and what the step has read so far.

    Invariants:
    1. Built after the step's tokens are reserved, so each sequence's length includes its new token, and valid
       until a sequence next changes (the next step builds a new plan).
    2. `tables[b]` is the store's cached block table of `seqs[b]`, its physical runs built once.
    3. After `run` over the model's layers, `traffic[b]` is the sum over layers of `step_traffic` for sequence b:
       dense layers (`layer < dense_layers`, or no router) count every row, routed ones their selection and the
       routing that chose it.
    """

    store: BlockStore                         # or a HybridStore: each group's layers read its own store
    seqs: tuple[Sequence, ...]
    num_q_heads: int
    tables: tuple[torch.Tensor, ...]          # per sequence, [nb] physical block ids in logical order (global group)
    dense_bytes: tuple[StepTraffic, ...]      # per sequence, what one dense layer reads this step (global group)
    backend: str = "torch"                    # "cpp" (the fused CPU kernels) or "torch", chosen once per step
    router: Router | None = None              # None: every layer dense
    dense_layers: int = 0                     # leading store layers read densely even with a router (Quest keeps 2)
    record: bool = False                      # keep each routed layer's selection and mass (rasters, traces)
    traffic: list[StepTraffic] = field(default_factory=list)
    blocks_read: list[int] = field(default_factory=list)      # (kv head, block) tiles read, per sequence
    selections: list[dict] = field(default_factory=list)      # per sequence, layer -> [H, K] blocks (record)
    masses: list[dict] = field(default_factory=list)          # per sequence, layer -> [H, nb] router mass (record)
    on_route: object = None                   # called as on_route(b, layer, selection) after each routed layer
    windows: dict = field(default_factory=dict)   # sliding group -> per sequence (handle, blocks [H, K], first token,
                                                  #   traffic): what a window layer reads this step

    # -- the step ---------------------------------------------------------------------------------
    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of every sequence at `layer`: q [B, Hq, D] -> [B, Hq, D], counted into `traffic`."""
        gi, j = self.store.group_of(layer)
        if gi:                                                      # a sliding-window layer: its window, densely
            sub = self.store.stores[gi]
            outs = []
            for b, (seq, blocks, first, t) in enumerate(self.windows[gi]):
                outs.append(IMPLEMENTATIONS[self.backend]["sparse"](q[b], sub, seq, j, blocks, first)[0])
                self._count(b, t, t.index_bytes // (2 * INDEX_BYTES))
            return torch.stack(outs)
        routed = self.router is not None and j >= self.dense_layers
        outs = []
        for b, seq in enumerate(self.seqs):
            if not routed:
                outs.append(self.dense(layer, q[b], b))
                self._count(b, self.dense_bytes[b], seq.num_blocks * self.store.config.num_kv_heads)
                continue
            sel = self.route(self.router, layer, q[b], b)
            out, res = self._sparse(j, q[b], sel.blocks, b)
            outs.append(out)
            self._count(b, res.traffic + sel.traffic, res.blocks_read)
            if self.record:
                self.selections[b][layer] = sel.blocks.clone()
                self.masses[b][layer] = sel.mass.clone()
            if self.on_route is not None:
                self.on_route(b, layer, sel)
        return torch.stack(outs)

    # -- the primitives (one sequence, one layer) ---------------------------------------------------
    def dense(self, layer: int, q: torch.Tensor, b: int = 0) -> torch.Tensor:
        """Exact attention over every cached token of sequence b, in place: [Hq, D] (a global layer)."""
        return IMPLEMENTATIONS[self.backend]["dense"](q, self.store.stores[0], self.seqs[b], self._local(layer))[0]

    def route(self, router: Router, layer: int, q: torch.Tensor, b: int = 0) -> Selection:
        return router.select_planned(q, self.store.stores[0], self.seqs[b], self._local(layer), self.tables[b])

    def sparse(self, layer: int, q: torch.Tensor, blocks: torch.Tensor, b: int = 0) -> tuple[torch.Tensor, AttentionResult]:
        """Attention of sequence b over a selection `blocks` [H, K]: output [Hq, D] and what it read. q and `blocks`
        are checked as `sparse_attention` checks them (`check_sparse_args`): logical blocks of the sequence or -1."""
        check_int("b", b, lo=0, hi=len(self.seqs) - 1)
        j = self._local(layer)
        check_sparse_args(q, self.store.stores[0], self.seqs[b], j, blocks)
        return self._sparse(j, q, blocks, b)

    def _sparse(self, j: int, q: torch.Tensor, blocks: torch.Tensor, b: int) -> tuple[torch.Tensor, AttentionResult]:
        """`sparse` without its checks, at global layer j, for `run`: a Router's selection is sorted, unique and in
        range by construction."""
        seq, main = self.seqs[b], self.store.stores[0]
        out, lse = IMPLEMENTATIONS[self.backend]["sparse"](q, main, seq, j, blocks)
        traffic = step_traffic(main, seq, self.num_q_heads, blocks)
        return out, AttentionResult(lse, traffic.index_bytes // (2 * INDEX_BYTES), traffic)

    def _local(self, layer: int) -> int:
        """A global layer's index in the global group's store."""
        gi, j = self.store.group_of(layer)
        if gi:
            raise ValueError(f"layer {layer} is a sliding-window layer: only global layers are routed or read densely")
        return j

    @property
    def num_tokens(self) -> int:
        """The first sequence's length (its new token included): what a one-sequence plan's callers read."""
        return self.seqs[0].num_tokens

    def _count(self, b: int, traffic: StepTraffic, tiles: int) -> None:
        self.traffic[b] = self.traffic[b] + traffic
        self.blocks_read[b] += tiles


def plan_decode(store, seqs: Sequence | list[Sequence], num_q_heads: int, backend: str = "auto",
                router: Router | None = None, dense_layers: int = 0, record: bool = False,
                on_route=None) -> DecodePlan:
    """Validate one decode step of `seqs` (one Sequence, or a list of B distinct ones) and lay it out."""
    check_layer_groups(store)
    seqs = [seqs] if isinstance(seqs, Sequence) else list(seqs)
    if not seqs:
        raise ValueError("seqs must hold at least one Sequence")
    if len({id(s) for s in seqs}) != len(seqs):
        raise ValueError("seqs must not repeat a sequence")
    c = store.config
    check_int("num_q_heads", num_q_heads, lo=c.num_kv_heads)
    if num_q_heads % c.num_kv_heads:
        raise ValueError(f"num_q_heads must be a multiple of num_kv_heads={c.num_kv_heads}, got {num_q_heads}")
    if router is not None and not isinstance(router, Router):
        raise TypeError(f"router must be a Router or None, got {type(router).__name__}")
    check_int("dense_layers", dense_layers, lo=0)
    if backend not in ("auto", "torch", "cpp"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'cpp' for a decode plan, got {backend!r}")
    for s in seqs:
        store.check_seq(s, name="seqs[i]")
        if s.num_tokens == 0:
            raise ValueError("seqs[i] holds no tokens; reserve the step's slot before planning it")
    if backend == "auto":
        backend = "cpp" if c.device.type == "cpu" and not store.quantized and cpp_available() else "torch"
    main = store.stores[0]
    for s in seqs:
        main.physical_runs(s)                # built once here, cached for every layer's dense path
    windows = {}
    for gi, w in enumerate(store.group_windows):
        if not w:
            continue
        sub, H = store.stores[gi], c.num_kv_heads
        rows = []
        for s in seqs:
            p = store.parts(s)[gi]
            first = first_visible(p.num_tokens - 1, w)              # the new token is the query at N - 1
            blocks = torch.arange(first // sub.config.block_size, p.num_blocks).expand(H, -1).contiguous()
            rows.append((p, blocks, first, step_traffic(sub, p, num_q_heads, blocks)))
        windows[gi] = rows
    B = len(seqs)
    return DecodePlan(store, tuple(seqs), num_q_heads, tuple(main.block_table(s) for s in seqs),
                      tuple(step_traffic(main, s, num_q_heads) for s in seqs), backend, router, dense_layers, record,
                      [StepTraffic() for _ in range(B)], [0] * B, [{} for _ in range(B)], [{} for _ in range(B)],
                      on_route, windows)
