"""A decode step with no per-layer Python: each decoder layer is one call of the CPU operator `decode_layer`
(`kernels/cpu/decode_layer.cpp`), its arguments laid out once per engine.

    fused = build(model, store)                 # a FusedDecode, or None with `why_not(model, store)` saying why
    fused.applies(router, dense_layers, ...)    # whether this step is in its scope
    logits, traffic, tiles = fused.step(token, res, seq, router, dense_layers)

The general path (`Model.forward_decode_batch` with a `DecodePlan` as every layer's attention) runs a layer as
some forty torch calls from Python, with a plan lookup, casts and a byte count each: 386 us per layer of SmolLM2
on the CPU (torch.profiler, benchmarks/results/vs_llamacpp.json), against about 380 us of kernels. Here a layer is
one call; the step's bytes are counted once, from the selections the calls return, with the same functions
(`core.traffic`) the plan uses, so `RequestStats` reads the same numbers either way.

Scope, checked by `why_not` (and `applies` per step); everything else takes the general path:
- weights="gguf" (every projection a `QuantLinear`, no bias), every layer attention (global or sliding-window);
- a `BlockStore` (or a `HybridStore` of them, for sliding layers) with float32 or bfloat16 K/V, no cold tier, and
  summaries among kmin and kmax;
- one sequence, no observer, no recorded selections, no prefetch; no router, or a fusable minmax router (gqa
  "shared", agg "sum", a top-k or token budget: `Router.fusable`).

Invariants: the K/V rows and summaries it writes are those `BlockStore.write` would write for the same k and v
(tests/test_fused.py compares the store's tensors bit for bit with a recomputation); its logits match the
general path to float32 rounding, and both match a float64 reference of the layer.
"""
from __future__ import annotations

import torch

from ..attention.plan import step_traffic
from ..core.backend import resolve
from ..core.traffic import INDEX_BYTES, StepTraffic, attention_traffic
from ..core.window import first_visible
from ..kernels.cpu_decode import splits_for
from ..storage.store import BlockStore, LayerGroups, Sequence
from . import quant
from .model import Model

_ACT = {"silu": 0, "gelu_tanh": 1}
_KINDS = {"kmin": 0, "kmax": 1}


def why_not(model: Model, store) -> str | None:
    """None when `build` can fuse `model`'s decode over `store`; else the first reason it cannot."""
    from ..kernels import cpu_decode
    from .quant import QuantLinear
    c = model.config
    if not cpu_decode.available() or not hasattr(torch.ops.sparsekv_cpu, "decode_layer"):
        return f"the CPU kernels are unavailable ({cpu_decode.reason()})"
    if any(m != "attn" for m in c.layer_mixers):
        return "every layer must be attention (no conv or linear mixer)"
    if c.positions == "none" or c.attention_bias or c.hidden_act not in _ACT:
        return "the model needs RoPE, no attention bias and a silu or tanh-GELU MLP"
    for layer in model.layers:
        qkv, gu = quant.step_projections(layer)
        projs = qkv + [layer.mix.o_proj] + gu + [layer.mlp.down_proj]
        if not all(isinstance(p, QuantLinear) and p.bias is None for p in projs):
            return "the weights must be the gguf mode's (load_model(..., weights='gguf'))"
    if not isinstance(store, LayerGroups) or not all(type(sub) is BlockStore for sub in store.stores):
        return f"the store must be a BlockStore or a HybridStore of them (got {type(store).__name__})"
    for sub in store.stores:
        sc = sub.config
        if sub.quantized or sc.dtype not in (torch.float32, torch.bfloat16) or sc.device.type != "cpu":
            return "the store must hold float32 or bfloat16 K/V on the CPU"
        if sc.summaries and sc.summary_dtype not in (torch.float32, torch.bfloat16):
            return f"the summaries must be float32 or bfloat16, got {sc.summary_dtype}"
        if type(sub.residency).__name__ != "AllHot":
            return "the store must have no cold tier"
        if not set(sc.summaries) <= set(_KINDS):
            return f"the store's summaries must be among {sorted(_KINDS)}, got {sorted(sc.summaries)}"
    return None


def build(model: Model, store) -> "FusedDecode | None":
    """The fused step for `model` over `store`, or None where `why_not` gives a reason."""
    return None if why_not(model, store) is not None else FusedDecode(model, store)


class FusedDecode:
    """`model`'s decode step over `store`, one `decode_layer` call per layer; built once (`build`).

    A hybrid store's layers keep their group: a sliding layer writes into its group's pool and attends to its window
    (the blocks from N - window on, earlier rows weighing 0: `plan_decode`'s windows); global layers are the ones
    routed, `dense_layers` counting among them."""

    def __init__(self, model: Model, store):
        self.model, self.store = model, store
        c = model.config
        self._op = torch.ops.sparsekv_cpu.decode_layer
        self._subs = store.stores                          # one BlockStore per layer group (LayerGroups)
        self._windows = store.group_windows
        self._layers = []
        self._int8 = []                         # (meta, index of a linear's int8 flag, its QuantLinear): _rebind
        empty = torch.zeros(0)
        for j, layer in enumerate(model.layers):
            gi, jj = store.group_of(j)
            sub = self._subs[gi]
            a, m = layer.mix, layer.mlp
            norms = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                     layer.pre_feedforward_layernorm.weight if layer.sandwich else empty,
                     layer.post_feedforward_layernorm.weight if layer.sandwich else empty,
                     a.q_norm.weight if c.qk_norm else empty, a.k_norm.weight if c.qk_norm else empty]
            qkv, gu = quant.step_projections(layer)
            w = [t.detach().float().contiguous() for t in norms]
            meta = [c.n_heads, c.n_kv_heads, c.head_dim, len(qkv), len(gu), int(layer.sandwich), _ACT[c.hidden_act]]
            for p in qkv + [a.o_proj] + gu + [m.down_proj]:
                w += [p.codes, p.scale, p.offset]
                meta += [p.bits, p.group, int(p.int8_activations)]
                self._int8.append((meta, len(meta) - 1, p))
            fmeta = [float(c.norm_eps), float(c.norm_offset), float(a.q_gain) if a.q_gain is not None else 0.0]
            names = list(sub.config.summaries)
            pools = (sub.k[jj].transpose(0, 1), sub.v[jj].transpose(0, 1))              # [H, NB, bs, D] views
            sums = [sub.summary(n)[jj].transpose(0, 1) for n in names]                  # [H, NB, D] views
            if not all(t.is_contiguous() for t in (*pools, *sums)):
                raise ValueError("the store's pools and summaries must be head-major (BlockStore's layout)")
            self._layers.append((w, meta, fmeta, *pools, sums, [_KINDS[n] for n in names], gi, jj))
        self._per_group = [sum(1 for lay in self._layers if lay[-2] == gi) for gi in range(len(self._subs))]
        self._n_global = self._per_group[0]
        self._has_minmax = {"kmin", "kmax"} <= set(self._subs[0].config.summaries)
        self._epoch = quant.activation_epoch()

    def _rebind(self) -> None:
        """Each linear's int8 flag from its QuantLinear again (after a `quant.set_activations`)."""
        for meta, i, p in self._int8:
            meta[i] = int(p.int8_activations)
        self._epoch = quant.activation_epoch()

    def applies(self, router, dense_layers: int, batch: int, record: bool, prefetch: int) -> bool:
        """Whether a step with these settings is in scope (see the module docstring)."""
        if batch != 1 or record or prefetch:
            return False
        if router is None or dense_layers >= self._n_global:
            return True
        # the backend as the general path resolves it (`Router.select_planned`): "auto" can mean Triton's interpreter
        return bool(router.fusable and router.scorer.name == "minmax" and self._has_minmax
                    and resolve(router.backend, torch.empty(0)) == "cpp")

    @torch.inference_mode()
    def step(self, token: int, res, seq: Sequence, router, dense_layers: int, head: bool = True):
        """One decode step of `seq` on `token`, whose slot `res` is reserved: writes every layer's K/V and
        summaries, attends (dense, windowed, or routed from global layer `dense_layers` on), and returns
        (logits [1, vocab] float32, or None when `head` is False, the step's StepTraffic summed over layers, the
        (kv head, block) tiles read)."""
        model = self.model
        if quant.activation_epoch() != self._epoch:
            self._rebind()
        Hq = model.config.n_heads
        x = model.embed(torch.tensor([token]))                                          # [1, dim]
        pos = torch.tensor([res.start])
        rot = [t[0].contiguous() for t in model.rotary(pos)]
        rot_local = [t[0].contiguous() for t in model.rotary(pos, local=True)] if model.local_rope else rot
        groups = self._groups(res, seq, Hq)
        routing = router is not None and dense_layers < self._n_global       # else every layer dense: no selector read
        top_k = router.selector.budget_blocks(self._subs[0].config.block_size) if routing else 1
        sink, local = (router.sink_blocks, router.local_blocks) if routing else (0, 1)
        split_routed = splits_for(self._subs[0].config.num_kv_heads, min(top_k, seq.num_blocks))
        picked = []
        for w, meta, fmeta, kp, vp, sums, kinds, gi, jj in self._layers:
            block, row, table, n, blocks, first, splits, _ = groups[gi]
            routed = gi == 0 and routing and jj >= dense_layers
            cos, sin = rot_local if gi else rot
            x, sel = self._op(x, w, meta, fmeta, cos, sin, kp, vp, sums, kinds, table, blocks, block, row, n, first,
                              split_routed if routed else splits, 0 if routed else -1, top_k, sink, local)
            if routed:
                picked.append(sel)
        logits = model.lm_head(model.norm(x)).float() if head else None
        return (logits, *self._traffic(router, seq, picked, groups, Hq))

    # -- internals ------------------------------------------------------------------------
    def _groups(self, res, seq: Sequence, num_q_heads: int) -> list[tuple]:
        """Per layer group, what its layers share this step: (physical block and row of the new token, the block
        table, tokens, the blocks read when not routed [H, K], the first token attended, splits, their traffic)."""
        out = []
        for sub, part, window, r in zip(self._subs, self.store.parts(seq), self._windows, res.groups):
            sc = sub.config
            first = first_visible(part.num_tokens - 1, window)           # the new token is the query at N - 1
            blocks = torch.arange(first // sc.block_size, part.num_blocks).expand(sc.num_kv_heads, -1).contiguous()
            table = sub.block_table(part)
            table = table.clamp(min=0) if part.released else table        # released rows are never read
            traffic = step_traffic(sub, part, num_q_heads, blocks if window else None)
            out.append((int(r.block[0]), int(r.offset[0]), table, part.num_tokens, blocks, first,
                        splits_for(sc.num_kv_heads, blocks.shape[1]), traffic))
        return out

    def _traffic(self, router, seq: Sequence, picked: list[torch.Tensor], groups: list[tuple],
                 num_q_heads: int) -> tuple[StepTraffic, int]:
        """The step's bytes and tiles, as `DecodePlan.run` counts them layer by layer: dense and window layers their
        group's rows and table entries (`step_traffic`), routed ones their selection (`attention_traffic`) and the
        summaries and table entries routing read (`Selection.traffic`)."""
        total, tiles = StepTraffic(), 0
        for gi, g in enumerate(groups):
            n = self._per_group[gi] - (len(picked) if gi == 0 else 0)          # this group's layers not routed
            if n:
                t = g[-1]
                total = total + StepTraffic(n * t.kv_bytes, n * t.summary_bytes, n * t.index_bytes, n * t.qo_bytes)
                part_blocks = (seq.num_blocks if gi == 0 else g[4].shape[1])
                tiles += n * part_blocks * self._subs[gi].config.num_kv_heads
        if picked:
            c, L = self._subs[0].config, len(picked)
            a = attention_traffic(torch.cat(picked), seq.num_tokens, c.block_size, c.head_dim, c.itemsize,
                                  num_q_heads, c.kv_row_bytes)                     # rows and indices, all layers
            score = router.scorer.score_bytes(self._subs[0], seq)
            total = total + StepTraffic(a.kv_bytes, L * score, a.index_bytes + L * seq.num_blocks * INDEX_BYTES,
                                        L * a.qo_bytes)
            tiles += a.index_bytes // (2 * INDEX_BYTES)
        return total, tiles
