"""The inference engine: a model, its own block store, and the two phases users know.

    engine = Engine(model, router=Router("minmax", token_budget=2048), block_size=16, num_blocks=4096)
    seq = engine.new_sequence()
    logits = engine.prefill(seq, prompt_ids)        # chunked; returns the last token's logits
    new_ids = engine.decode(seq, 32)                # greedy by default; routed unless router=None
    engine.stats(seq)                               # TTFT, time per output token, bytes per step

Decode attention per layer: the first `dense_layers` attention layers (counted in store layers, so
conv or linear layers do not count) are dense, as Quest keeps its first two; the others use the
router (per engine, or per `decode` call) and `sparse_attention`.
`router=None` means dense everywhere.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..attention.decode import batch_attention, prefill_attention
from ..attention.plan import plan_decode
from ..core.checks import check_int
from .model import Model
from ..routing.router import Router
from ..storage.block_pool import StoreFullError
from ..storage.store import BlockStore, Sequence, StoreConfig

_ENGINE_DEFAULT = object()


def _copy_state(state: dict) -> dict:
    return {k: (tuple(t.clone() for t in v) if isinstance(v, tuple) else v.clone()) for k, v in state.items()}


def greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


@dataclass
class StepStats:
    """One decode step, summed over layers."""

    seconds: float
    blocks_read: int       # (kv head, block) tiles read by attention
    kv_bytes: int          # K/V bytes read by attention
    route_bytes: int       # summary and index bytes read to route
    selections: dict | None = None   # layer -> [H, K] blocks read (Engine(record_selections=True))
    masses: dict | None = None       # layer -> [H, nb] the router's block distribution (record_selections)


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0         # prompt tokens served from the prefix cache
    computed_tokens: int = 0       # prompt tokens prefilled
    ttft_s: float = 0.0            # wall time of prefill (time to the first token's logits)
    steps: list[StepStats] = field(default_factory=list)

    @property
    def tpot_s(self) -> float:
        """Median time per output token."""
        return statistics.median(s.seconds for s in self.steps) if self.steps else float("nan")

    @property
    def bytes_per_step(self) -> float:
        return sum(s.kv_bytes + s.route_bytes for s in self.steps) / max(1, len(self.steps))

    @property
    def blocks_per_step(self) -> float:
        return sum(s.blocks_read for s in self.steps) / max(1, len(self.steps))


@dataclass
class _State:
    tokens: list[int] = field(default_factory=list)
    next_logits: torch.Tensor | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    namespace: object = None
    mixer_state: dict = field(default_factory=dict)    # conv / linear-attention state (model.initial_state)


@dataclass
class EngineConfig:
    """How an `Engine` lays out its store and runs its two phases."""

    block_size: int = 16                       # tokens per physical block
    num_blocks: int = 4096                     # blocks in the pool (the KV memory budget)
    chunk_size: int = 512                      # prefill chunk, tokens
    dense_layers: int = 0                      # leading attention layers decoded densely (Quest keeps 2)
    kv_dtype: torch.dtype | None = None        # K/V storage dtype; None: the model's dtype
    kv_bits: int = 0                           # 8: K/V held as int8 with per-token scales (StoreConfig.kv_bits)
    prefix_cache: bool = False                 # share full prompt blocks across sequences
    cache_policy: str = "lru"                  # eviction policy name (storage.eviction)
    cache_high_watermark: float | None = None  # with prefix_cache: evict down to the low watermark in
    cache_low_watermark: float | None = None   #   finish() once pool use passes the high one
    progress: bool = True                      # a progress bar on long prefills
    record_selections: bool = False            # keep each step's selected blocks (for rasters)
    cold_dir: str | None = None                # a cold tier for K/V tiles in this directory (StoreConfig.cold_dir)
    hot_blocks: int | None = None              # with cold_dir: K/V tiles per layer kept in memory
    placement: str = "lru"                     # with cold_dir: which hot tiles are demoted first
    prefetch: int = 0                          # with cold_dir and a router: after each routed layer, read ahead
                                               #   the `prefetch` blocks per kv head ranked next after the
                                               #   selection (by this step's mass): a guess at the next step's

    def __post_init__(self):
        check_int("prefetch", self.prefetch, lo=0)
        if self.prefetch and self.cold_dir is None:
            raise ValueError("prefetch reads ahead from a cold tier: set cold_dir (and hot_blocks) too")


class Engine:
    """Owns a `BlockStore` sized for `model`; see the module docstring.

    Engine(model, router, config=EngineConfig(...)) or, equivalently, the config's fields as keywords.
    """

    def __init__(self, model: Model, router: Router | None = None, config: EngineConfig | None = None, **kwargs):
        if config is not None and kwargs:
            raise ValueError(f"pass either config or keyword arguments, not both (got {sorted(kwargs)})")
        if config is not None and not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        try:
            cfg = config or EngineConfig(**kwargs)
        except TypeError as exc:
            raise TypeError(f"Engine got an unknown argument: {exc}") from None
        self.config = cfg
        block_size, num_blocks, chunk_size, dense_layers = cfg.block_size, cfg.num_blocks, cfg.chunk_size, cfg.dense_layers
        kv_dtype, prefix_cache, cache_policy = cfg.kv_dtype, cfg.prefix_cache, cfg.cache_policy
        progress, record_selections = cfg.progress, cfg.record_selections
        if not isinstance(model, Model):
            raise TypeError(f"model must be a sparsekv.Model, got {type(model).__name__}")
        if router is not None and not isinstance(router, Router):
            raise TypeError(f"router must be a Router or None, got {type(router).__name__}")
        check_int("chunk_size", chunk_size, lo=1)
        check_int("dense_layers", dense_layers, lo=0, hi=model.config.n_layers)
        c = model.config
        self.model, self.router = model, router
        self.chunk_size, self.dense_layers, self.progress = chunk_size, dense_layers, progress
        self.record_selections = record_selections
        self.store = BlockStore(StoreConfig(num_layers=max(1, len(c.attn_layers)), num_kv_heads=c.n_kv_heads, head_dim=c.head_dim,
                                            block_size=block_size, num_blocks=num_blocks,
                                            dtype=kv_dtype or model.dtype, kv_bits=cfg.kv_bits,
                                            cold_dir=cfg.cold_dir, hot_blocks=cfg.hot_blocks,
                                            placement=cfg.placement))
        self._states: dict[int, _State] = {}
        self.prefix_cache = None
        if prefix_cache:
            if set(c.mixers) != {"attn"}:
                raise ValueError("prefix_cache needs an all-attention model: conv and linear-attention state "
                                 f"is not cached, and this model's mixers are {c.mixers}")
            from ..storage.prefix_cache import PrefixCache
            self.prefix_cache = PrefixCache(self.store, policy=cache_policy, high_watermark=cfg.cache_high_watermark,
                                            low_watermark=cfg.cache_low_watermark)

    # -- sequences ------------------------------------------------------------------------
    def new_sequence(self) -> Sequence:
        seq = self.store.new_sequence()
        self._states[seq.seq_id] = _State(mixer_state=self.model.initial_state())
        return seq

    def fork(self, seq: Sequence) -> Sequence:
        """A child that shares every block and continues from the same next-token logits."""
        st = self._state(seq)
        child = self.store.fork(seq)
        self._states[child.seq_id] = _State(list(st.tokens), st.next_logits, RequestStats(), st.namespace,
                                            _copy_state(st.mixer_state))
        return child

    def last_logits(self, seq: Sequence) -> torch.Tensor:
        """The logits the next token will be sampled from ([vocab] float32)."""
        return self._state(seq).next_logits

    def tokens(self, seq: Sequence) -> list[int]:
        return list(self._state(seq).tokens)

    def stats(self, seq: Sequence) -> RequestStats:
        return self._state(seq).stats

    def finish(self, seq: Sequence) -> None:
        """Register the sequence's full blocks in the prefix cache (if any) and release it."""
        st = self._state(seq)
        if self.prefix_cache is not None:
            self.prefix_cache.insert(seq, st.tokens, namespace=st.namespace)
        self.store.free(seq)
        del self._states[seq.seq_id]
        if self.prefix_cache is not None:
            self.prefix_cache.maintain()

    def publish(self, seq: Sequence) -> int:
        """Register `seq`'s full blocks in the prefix cache now, without releasing it (a server does this once a
        prompt is in, so requests beside it share its blocks). Returns blocks newly cached (0 without a cache)."""
        st = self._state(seq)
        if self.prefix_cache is None:
            return 0
        return self.prefix_cache.insert(seq, st.tokens, namespace=st.namespace)

    def close(self) -> None:
        """Delete the store's cold file, if any (also done when the engine is collected)."""
        self.store.close()

    def warmup(self, name: str, token_ids, namespace=None) -> int:
        """Start-up warm-up: prefill `token_ids` once, cache its blocks and pin them under `name`
        (released with `prefix_cache.unpin(name)`). Returns the pinned blocks."""
        if self.prefix_cache is None:
            raise ValueError("warmup needs an Engine built with prefix_cache=True")
        seq = self.new_sequence()
        self.prefill(seq, token_ids, namespace=namespace)
        self.finish(seq)
        return self.prefix_cache.pin(name, token_ids, namespace=namespace)

    # -- prefill --------------------------------------------------------------------------
    def prefill(self, seq: Sequence, token_ids, namespace=None) -> torch.Tensor:
        """Append `token_ids` (a prompt, or a later turn) in chunks; returns the last token's logits [vocab].

        On an empty sequence with a prefix cache, the longest cached prefix is reused and only
        the rest is computed; `stats(seq)` reports cached against computed tokens.
        """
        st = self._state(seq)
        ids = self._as_ids(token_ids)
        t0 = time.perf_counter()
        cached = 0
        if self.prefix_cache is not None and seq.num_tokens == 0:
            st.namespace = namespace
            cached = self.prefix_cache.attach(seq, ids, namespace=namespace)
            st.tokens.extend(ids[:cached].tolist())
        todo = ids[cached:]
        chunks = [todo[i:i + self.chunk_size] for i in range(0, len(todo), self.chunk_size)]
        bar = None
        if self.progress and len(chunks) > 4:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(todo), desc="prefill", unit="tok", leave=False)
        logits = None
        for chunk in chunks:
            logits = self._forward(seq, chunk, attend=self._prefill_attend(seq))
            st.tokens.extend(chunk.tolist())
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        st.next_logits = logits[0]
        s = st.stats
        s.prompt_tokens += len(ids)
        s.cached_tokens += cached
        s.computed_tokens += len(todo)
        s.ttft_s = time.perf_counter() - t0
        return st.next_logits

    def fill_synthetic(self, seq: Sequence, n: int, seed: int = 0, chunk: int = 8192) -> None:
        """Append `n` tokens of random K/V (N(0, 1)) to every layer, without running the model.

        For decode timing and traffic at long contexts that would take minutes to prefill on a
        CPU. The cache content is meaningless: use it for speed and bytes, never for quality.
        Follow it with `prefill(seq, [token])` to get logits to decode from.
        """
        st = self._state(seq)
        check_int("n", n, lo=1)
        c = self.store.config
        g = torch.Generator().manual_seed(seed)
        for i in range(0, n, chunk):
            t = min(chunk, n - i)
            shape = (c.num_layers, t, c.num_kv_heads, c.head_dim)
            self.store.append(seq, torch.randn(shape, generator=g).to(c.dtype), torch.randn(shape, generator=g).to(c.dtype))
            st.tokens.extend(torch.randint(0, self.model.config.vocab_size, (t,), generator=g).tolist())

    # -- decode ---------------------------------------------------------------------------
    def decode(self, seq: Sequence, n: int, sampler: Callable[[torch.Tensor], int] = greedy,
               router=_ENGINE_DEFAULT) -> list[int]:
        """Generate `n` tokens (greedy by default). `router`: a Router, None (dense), or the engine's."""
        st = self._state(seq)
        check_int("n", n, lo=1)
        if st.next_logits is None:
            raise ValueError("seq has no logits to sample from; call prefill first")
        router = self.router if router is _ENGINE_DEFAULT else router
        out = []
        for _ in range(n):
            tok = int(sampler(st.next_logits))
            out.append(tok)
            self._step(seq, st, tok, router)
        return out

    def feed(self, seq: Sequence, token_ids, router=_ENGINE_DEFAULT,
             observer: Callable[[int, torch.Tensor], None] | None = None) -> torch.Tensor:
        """Teacher forcing: decode the given tokens one at a time (routed like `decode`) and return
        the logits after each, [n, vocab]. The last row becomes the sequence's next-token logits.

        observer: called as observer(store layer, q [Hq, D]) in every attention layer of every step,
        after the step's K/V are written and before attention reads them (for analysis: attention
        anatomy, routing recall); it must not modify q or the store.
        """
        st = self._state(seq)
        ids = self._as_ids(token_ids)
        router = self.router if router is _ENGINE_DEFAULT else router
        return torch.stack([self._step(seq, st, tok, router, observer) for tok in ids.tolist()])

    def decode_batch(self, seqs: list[Sequence], sampler: Callable[[torch.Tensor], int] = greedy,
                     router=_ENGINE_DEFAULT) -> list[int]:
        """One token for each of `seqs` in one batched forward (`Model.forward_decode_batch`); returns the tokens.

        Each sequence samples from its own next-token logits, is routed on its own (per layer, per sequence),
        and attention runs over all of them in one `batch_attention` call. Every sequence's stats get the step,
        with the batch's wall time. A sequence gets the tokens it would get decoded alone (to float rounding of
        the batched projections). Needs an all-attention model; a StoreFullError leaves every sequence as it was.
        """
        if not isinstance(seqs, (list, tuple)) or not seqs:
            raise TypeError("seqs must be a non-empty list of Sequence")
        if len({s.seq_id for s in seqs}) != len(seqs):
            raise ValueError("seqs must not repeat a sequence")
        states = [self._state(s) for s in seqs]
        for s, st in zip(seqs, states):
            if st.next_logits is None:
                raise ValueError(f"seq (id {s.seq_id}) has no logits to sample from; prefill it first")
        router = self.router if router is _ENGINE_DEFAULT else router
        needed = sum(self.store.blocks_needed(s, 1) for s in seqs)
        if needed > self.store.num_free_blocks:
            raise StoreFullError(needed, self.store.num_free_blocks, what=f"a decode batch of {len(seqs)}")
        toks = [int(sampler(st.next_logits)) for st in states]
        t0 = time.perf_counter()
        res = [self.store.reserve(s, 1) for s in seqs]
        for st, tok in zip(states, toks):
            st.tokens.append(tok)
        plans, steps = [None] * len(seqs), [StepStats(0.0, 0, 0, 0) for _ in seqs]

        def attend(layer: int, q: torch.Tensor, k=None, v=None) -> torch.Tensor:   # q [B, Hq, D]
            for b, s in enumerate(seqs):
                if plans[b] is None:
                    plans[b] = plan_decode(self.store, s, q.shape[1])
            if router is None or layer < self.dense_layers:
                out, _ = batch_attention(q, self.store, list(seqs), layer)
                for b, s in enumerate(seqs):
                    steps[b].blocks_read += s.num_blocks * self.store.config.num_kv_heads
                    steps[b].kv_bytes += plans[b].dense_bytes.kv_bytes
                return out
            sels = [plans[b].route(router, layer, q[b]) for b in range(len(seqs))]
            out, _ = batch_attention(q, self.store, list(seqs), layer, [sel.blocks for sel in sels])
            for b, sel in enumerate(sels):
                steps[b].blocks_read += int((sel.blocks >= 0).sum())
                steps[b].route_bytes += sel.traffic.total
            return out

        ids = torch.tensor(toks)
        positions = torch.tensor([r.start for r in res])
        logits = self.model.forward_decode_batch(ids, positions, self.store, res, attend)
        dt = time.perf_counter() - t0
        for st, step, row in zip(states, steps, logits):
            step.seconds = dt
            st.stats.steps.append(step)
            st.next_logits = row
        return toks

    def extend(self, seq: Sequence, token_ids) -> torch.Tensor:
        """Append `token_ids` to `seq` as one prefill chunk (no prefix-cache lookup); returns the last logits [vocab].
        What a scheduler calls to prefill a prompt a chunk at a time."""
        st = self._state(seq)
        ids = self._as_ids(token_ids)
        t0 = time.perf_counter()
        logits = self._forward(seq, ids, attend=self._prefill_attend(seq))
        st.tokens.extend(ids.tolist())
        st.next_logits = logits[0]
        st.stats.prompt_tokens += len(ids)
        st.stats.computed_tokens += len(ids)
        st.stats.ttft_s += time.perf_counter() - t0
        return st.next_logits

    def attach_prefix(self, seq: Sequence, token_ids, namespace=None) -> int:
        """Start empty `seq` on the prefix cache's longest hit for `token_ids` (0 without a cache); returns the
        cached tokens, which the caller then skips when it prefills the rest with `extend`."""
        st = self._state(seq)
        if seq.num_tokens:
            raise ValueError(f"seq must be empty to attach a cached prefix; it holds {seq.num_tokens} tokens")
        if self.prefix_cache is None:
            return 0
        ids = self._as_ids(token_ids)
        st.namespace = namespace
        cached = self.prefix_cache.attach(seq, ids, namespace=namespace)
        st.tokens.extend(ids[:cached].tolist())
        st.stats.prompt_tokens += cached
        st.stats.cached_tokens += cached
        return cached

    def _step(self, seq: Sequence, st: _State, tok: int, router, observer=None) -> torch.Tensor:
        """One decode step on token `tok`: forward, record its stats, return (and keep) its logits."""
        st.tokens.append(tok)
        step = StepStats(0.0, 0, 0, 0, *(({}, {}) if self.record_selections else (None, None)))
        t0 = time.perf_counter()
        logits = self._forward(seq, torch.tensor([tok]), attend=self._decode_attend(seq, router, step, observer))
        step.seconds = time.perf_counter() - t0
        st.stats.steps.append(step)
        st.next_logits = logits[0]
        return st.next_logits

    def _decode_attend(self, seq: Sequence, router: Router | None, step: StepStats, observer=None):
        """The per-layer attention of one decode step. The step is planned once, at its first
        layer (after the token's slot is reserved); every layer then runs the plan unchecked."""
        plan = None

        def attend(layer: int, q: torch.Tensor, k=None, v=None) -> torch.Tensor:   # q [1, Hq, D]; decode reads
            # its own token from the store, as stored (k, v unused)
            nonlocal plan
            if plan is None:
                plan = plan_decode(self.store, seq, q.shape[1])
            if observer is not None:
                observer(layer, q[0])
            if router is None or layer < self.dense_layers:
                out = plan.dense(layer, q[0])
                step.blocks_read += seq.num_blocks * self.store.config.num_kv_heads
                step.kv_bytes += plan.dense_bytes.kv_bytes
                step.route_bytes += plan.dense_bytes.index_bytes
                return out[None]
            sel = plan.route(router, layer, q[0])
            out, res = plan.sparse(layer, q[0], sel.blocks)
            if self.config.prefetch:
                self._prefetch(seq, layer, sel)
            step.blocks_read += res.blocks_read
            step.kv_bytes += res.kv_bytes
            if step.selections is not None:
                step.selections[layer] = sel.blocks.clone()
                step.masses[layer] = sel.mass.clone()
            step.route_bytes += res.traffic.index_bytes + sel.traffic.total
            return out[None]

        return attend

    # -- internals ------------------------------------------------------------------------
    def _prefill_attend(self, seq: Sequence):
        """Prefill attention for one chunk: the cached prefix from the store, the chunk's own K/V as computed
        (`prefill_attention(fresh=...)`: a quantised store's rounding applies to later reads only)."""
        return lambda layer, q, k, v: prefill_attention(q, self.store, seq, layer, fresh=(k, v))

    def _prefetch(self, seq: Sequence, layer: int, sel) -> None:
        """Read ahead, for the next step, the selection widened by `config.prefetch` blocks per kv head
        (the next ranked by this step's mass); only tiles in the cold tier are read."""
        K = sel.blocks.shape[1] + self.config.prefetch
        ranked = sel.mass.topk(min(K, sel.mass.shape[1]), dim=1).indices          # [H, K'] logical blocks
        ids = torch.unique(self.store.block_table(seq)[ranked.flatten()])
        self.store.prefetch(layer, ids.tolist())

    def _forward(self, seq: Sequence, ids: torch.Tensor, attend) -> torch.Tensor:
        res = self.store.reserve(seq, len(ids))
        positions = torch.arange(res.start, res.start + len(ids))
        return self.model(ids, positions, self.store, res, attend, state=self._states[seq.seq_id].mixer_state)

    def _state(self, seq: Sequence) -> _State:
        self.store.check_seq(seq)
        if seq.seq_id not in self._states:
            raise ValueError(f"seq (id {seq.seq_id}) was not created by this engine; use engine.new_sequence()")
        return self._states[seq.seq_id]

    def _as_ids(self, token_ids) -> torch.Tensor:
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        if ids.numel() == 0:
            raise ValueError("token_ids must hold at least one token")
        vocab = self.model.config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"token_ids must be in [0, {vocab}), got values in [{int(ids.min())}, {int(ids.max())}]")
        return ids
