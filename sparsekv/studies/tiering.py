"""Tiered KV measured (notebook 10): hot-tier hit rates on routing traces, decode with a small hot tier,
and reloading a spilled prefix against recomputing it.

    trace = record_trace(engine, token_ids, prompt_len)          # a routed decode's selections and masses
    replay_trace(trace, hot_blocks=32, depth=4, cold_dir=d)      # the real TierTable over that trace
    decode_runs(model, router, prompt, steps, [TierSetting("all hot"), TierSetting("hot 32", 32, 4)], cold_dir=d)
    ttft_reload(model, prompt, prefix_len, cold_dir=d)           # recompute vs hot hit vs reload from disk

`replay_trace` drives a `BlockStore` whose tiles are one element wide through the trace: its writes, placement,
prefetch and accounting are the store's own tiered residency (`storage.residency`, `storage.tiers`), which is
what is measured, so it is a real store and not a bare `BlockTable`; only the tile contents are dummies, since
hit rates depend on which blocks are read, not on what they hold. Between steps it waits for prefetches to
finish, i.e. it assumes a step's compute hides one prefetch; `decode_runs` measures on the real model
whether it does (the stall that remains).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..model.engine import Engine
from ..model.model import Model
from ..routing.router import Router
from ..routing.selectors import ranked_blocks
from ..storage.store import BlockStore, StoreConfig
from ..storage.tiers import HOT


@dataclass(frozen=True)
class RoutingTrace:
    """Routed decode steps of one sequence: per step, per store layer, the blocks read and the router's mass.

    steps[t][layer] = (blocks [H, K] int64 logical, -1 padded; mass [H, nb_t] float32), nb_t the step's blocks.
    """

    name: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    prompt_tokens: int
    steps: list[dict[int, tuple[np.ndarray, np.ndarray]]]

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def mean_selected(self) -> float:
        """Distinct blocks a step reads per layer (the union over kv heads), averaged."""
        return float(np.mean([len(np.unique(b[b >= 0])) for s in self.steps for b, _ in s.values()]))


def record_trace(engine: Engine, token_ids, prompt_len: int, name: str = "") -> RoutingTrace:
    """Prefill `token_ids[:prompt_len]`, then feed the rest one token at a time through the engine's router,
    recording each step's selection and mass. The engine must have `record_selections=True` and a router."""
    if not engine.config.record_selections or engine.router is None:
        raise ValueError("engine must be built with a router and record_selections=True to record a trace")
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    if not 1 <= prompt_len < len(ids):
        raise ValueError(f"prompt_len must be in [1, {len(ids)}), got {prompt_len}")
    seq = engine.new_sequence()
    engine.prefill(seq, ids[:prompt_len])
    engine.feed(seq, ids[prompt_len:], logits="last")            # the trace is the routing, not the logits
    steps = [{layer: (s.selections[layer].numpy(), s.masses[layer].numpy()) for layer in s.selections}
             for s in engine.stats(seq).steps]
    engine.finish(seq)
    c = engine.store.config
    return RoutingTrace(name, c.block_size, c.num_layers, c.num_kv_heads, prompt_len, steps)


@dataclass(frozen=True)
class ReplayResult:
    hot_blocks: int
    depth: int
    placement: str
    hit_rate: float            # routed tile reads served hot or by a prefetch
    misses_per_step: float     # routed tile reads that waited for the disk, per step (all layers)
    prefetch_reads_per_step: float
    wasted_per_step: float     # prefetched tiles never read
    reads_per_step: float      # routed tile reads per step (all layers)


def predicted(blocks: np.ndarray, mass: np.ndarray, depth: int) -> np.ndarray:
    """The logical blocks to read ahead: per kv head the K selected plus the `depth` ranked next by mass (the
    engine's own choice, `routing.selectors.ranked_blocks`, on the recorded selection and mass)."""
    ranked = ranked_blocks(torch.from_numpy(np.ascontiguousarray(mass)), blocks.shape[1] + depth)
    return np.unique(ranked.numpy())


def replay_trace(trace: RoutingTrace, hot_blocks: int, depth: int = 0, placement: str = "lru", cold_dir=None) -> ReplayResult:
    """Replay `trace` through a tiered store holding `hot_blocks` tiles per layer (see the module docstring)."""
    own = None
    if cold_dir is None:
        own = tempfile.TemporaryDirectory()
        cold_dir = own.name
    bs, L = trace.block_size, trace.num_layers
    total = trace.prompt_tokens + trace.num_steps
    store = BlockStore(StoreConfig(num_layers=L, num_kv_heads=1, head_dim=1, block_size=bs,
                                   num_blocks=max(-(-total // bs) + 1, hot_blocks), summaries=(), repr_keys=0,
                                   cold_dir=cold_dir, hot_blocks=hot_blocks, placement=placement))
    try:
        seq = store.new_sequence()
        store.append(seq, torch.zeros(L, trace.prompt_tokens, 1, 1), torch.zeros(L, trace.prompt_tokens, 1, 1))
        t = store.tiers
        reads = hits = misses = 0
        prefetched0 = t.cold.stats.prefetched
        wasted0 = t.stats.prefetch_wasted
        for step in trace.steps:
            store.append(seq, torch.zeros(L, 1, 1, 1), torch.zeros(L, 1, 1, 1))
            table = np.asarray(seq.block_ids)
            for layer, (blocks, mass) in step.items():
                before = (t.stats.hits, t.stats.prefetch_hits, t.stats.late_prefetches, t.stats.misses)
                ids = table[np.unique(blocks[blocks >= 0])]
                if not t.acquire(layer, ids):           # wider than the tier: every cold tile is read now
                    t.stage(layer, ids)
                    cold = int((t.state[layer, ids] != HOT).sum())
                    hits += len(ids) - cold
                    misses += cold
                    reads += len(ids)
                else:
                    d = [a - b for a, b in zip((t.stats.hits, t.stats.prefetch_hits, t.stats.late_prefetches,
                                                t.stats.misses), before)]
                    hits += d[0] + d[1]
                    misses += d[2] + d[3]
                    reads += sum(d)
                if depth:
                    t.prefetch(layer, table[predicted(blocks, mass, depth)])
            t.wait_prefetches()                          # a step's compute hides one prefetch (see above)
        n = max(1, trace.num_steps)
        return ReplayResult(hot_blocks, depth, placement, hits / reads if reads else float("nan"), misses / n,
                            (t.cold.stats.prefetched - prefetched0) / n, (t.stats.prefetch_wasted - wasted0) / n,
                            reads / n)
    finally:
        store.close()
        if own is not None:
            own.cleanup()


@dataclass(frozen=True)
class DecodeRun:
    """A routed decode of `steps` tokens after a prompt, with or without a cold tier."""

    label: str
    hot_blocks: int | None     # None: all hot (no cold tier)
    prefetch: int
    tokens: list[int]
    step_s: list[float]        # wall seconds per decode step
    stall_s_per_token: float   # waiting for cold reads, per token
    read_bytes_per_token: float    # cold-tier bytes read (sync and prefetch), per token
    written_bytes_per_token: float
    hit_rate: float            # routed tile reads served hot or by a prefetch in time
    io_mode: str
    prefill_s: float

    @property
    def tpot_s(self) -> float:
        return statistics.median(self.step_s)


@dataclass(frozen=True)
class TierSetting:
    """One store layout for `decode_runs`: all hot (`hot_blocks=None`) or a cold tier with `hot_blocks` tiles per layer."""

    label: str
    hot_blocks: int | None = None
    prefetch: int = 0


def decode_runs(model: Model, router: Router, prompt, steps: int, settings: list[TierSetting], block_size: int = 16,
                cold_dir=None, rounds: int = 4, warmup: int = 2) -> list[DecodeRun]:
    """Decode `steps` greedy tokens after `prompt` under every setting, interleaved so drift hits all alike.

    Each setting gets its own engine and prefill, then `warmup` untimed steps. The timed steps run in
    `rounds` rounds; in each, every setting decodes steps // rounds tokens in turn (the order rotates per
    round). Before switching engines, reads still in flight are waited for, so one setting's prefetch never
    runs during another's steps. The cold tiers' counters start after the warm-up.
    """
    if rounds < 1 or steps % rounds:
        raise ValueError(f"steps must be a positive multiple of rounds={rounds}, got {steps}")
    ids = torch.as_tensor(prompt, dtype=torch.long)
    nblk = -(-(len(ids) + warmup + steps) // block_size) + 4
    runs = []
    try:
        for s in settings:
            kw = {} if s.hot_blocks is None else dict(cold_dir=str(cold_dir), hot_blocks=s.hot_blocks, prefetch=s.prefetch)
            engine = Engine(model, router=router, block_size=block_size, num_blocks=nblk, progress=False, **kw)
            seq = engine.new_sequence()
            t0 = time.perf_counter()
            engine.prefill(seq, ids)
            prefill_s = time.perf_counter() - t0
            tokens = engine.decode(seq, warmup)
            if engine.store.tiers is not None:
                engine.store.tiers.wait_prefetches()
                engine.store.tiers.reset_stats()
            runs.append((s, engine, seq, tokens, prefill_s))
        per = steps // rounds
        for r in range(rounds):
            for i in range(len(runs)):
                s, engine, seq, tokens, _ = runs[(i + r) % len(runs)]
                tokens += engine.decode(seq, per)
                if engine.store.tiers is not None:
                    engine.store.tiers.wait_prefetches()
        out = []
        for s, engine, seq, tokens, prefill_s in runs:
            step_s = [st.seconds for st in engine.stats(seq).steps[warmup:]]
            t = engine.store.tiers
            if t is None:
                out.append(DecodeRun(s.label, None, 0, tokens, step_s, 0.0, 0.0, 0.0, 1.0, "all hot", prefill_s))
            else:
                cs = t.cold.stats
                out.append(DecodeRun(s.label, s.hot_blocks, s.prefetch, tokens, step_s, t.stats.stall_s / steps,
                                     cs.bytes_read / steps, cs.bytes_written / steps, t.stats.hit_rate, t.cold.io_mode,
                                     prefill_s))
        return out
    finally:
        for _, engine, *_ in runs:
            engine.close()


@dataclass(frozen=True)
class TTFTResult:
    """Time to the first token of a request whose prefix of `prefix_tokens` was seen before."""

    prefix_tokens: int
    recompute_s: float         # no cache: prefill the whole prompt
    hot_hit_s: float           # prefix cache hit, blocks still in memory
    reload_s: float            # prefix cache hit, blocks spilled to the cold tier and read back
    reload_bytes: int          # cold-tier bytes read for the reload
    reload_read_s: float       # of reload_s, seconds spent in those reads
    max_dlogit: float          # largest |logit difference| of the cached runs' first token against recompute
    same_token: bool           # every run's first greedy token is the same


def ttft_reload(model: Model, prefix, suffix, cold_dir, block_size: int = 16, repeats: int = 3) -> TTFTResult:
    """TTFT of `prefix + suffix` three ways (median of `repeats` each); see `TTFTResult`.

    The prefix is first prefilled with a different suffix and finished (cached). For the reload case it
    is then spilled (`PrefixCache.spill`), so every prefix tile is read back from the cold file; with
    O_DIRECT (the default where the file system allows it) those reads bypass the OS page cache.
    """
    prefix, suffix = torch.as_tensor(prefix, dtype=torch.long), torch.as_tensor(suffix, dtype=torch.long)
    prompt = torch.cat([prefix, suffix])
    other = torch.cat([prefix, suffix.flip(0)])
    nblk = 2 * (-(-len(prompt) // block_size) + 4)
    common = dict(block_size=block_size, num_blocks=nblk, progress=False, chunk_size=len(prompt))

    def once(kind: str) -> tuple[float, torch.Tensor, int, float]:
        if kind == "recompute":
            engine = Engine(model, **common)
        else:
            engine = Engine(model, prefix_cache=True, cold_dir=str(cold_dir), hot_blocks=nblk, **common)
        try:
            if kind != "recompute":
                first = engine.new_sequence()
                engine.prefill(first, other)
                engine.finish(first)                    # finish() spills the released blocks (maintain)
                if kind == "hot":
                    t = engine.store.tiers
                    for layer in range(engine.store.config.num_layers):   # bring them back: a hit in memory
                        t.acquire(layer, [b for b in range(nblk) if engine.prefix_cache.is_cached(b)])
                engine.store.tiers.reset_stats()
                engine.store.tiers.cold.drop_cache()
            seq = engine.new_sequence()
            t0 = time.perf_counter()
            logits = engine.prefill(seq, prompt)
            dt = time.perf_counter() - t0
            cs = None if kind == "recompute" else engine.store.tiers.cold.stats
            return dt, logits, (0 if cs is None else cs.bytes_read), (0.0 if cs is None else cs.read_s)
        finally:
            engine.close()

    runs = {k: [once(k) for _ in range(repeats)] for k in ("recompute", "hot", "reload")}
    med = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
    ref = runs["recompute"][0][1]
    dl = max(float((r[1] - ref).abs().max()) for v in runs.values() for r in v)
    same = all(int(r[1].argmax()) == int(ref.argmax()) for v in runs.values() for r in v)
    reload = sorted(runs["reload"], key=lambda r: r[0])[len(runs["reload"]) // 2]      # the median run
    return TTFTResult(len(prefix), med["recompute"], med["hot"], med["reload"], reload[2], reload[3], dl, same)


def crossover_words(crossover: int | None, lengths: list[int]) -> str:
    """Where reloading a spilled prefix starts to beat recomputing it, in words: `crossover` is the shortest
    prefix from which reload is faster at every longer length measured (None or -1: never)."""
    if crossover is None or crossover < 0:
        return "at no prefix length measured"
    lengths = sorted(lengths)
    return (f"at every prefix length measured ({lengths[0]:,} to {lengths[-1]:,} tokens)" if crossover == lengths[0]
            else f"from {int(crossover):,} tokens on")
