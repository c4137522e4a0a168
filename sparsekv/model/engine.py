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

import contextlib
import statistics
import time
from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch

from ..attention.decode import prefill_attention
from ..attention.plan import plan_decode
from ..core.checks import check_choice, check_int
from ..core.traffic import StepTraffic
from ..routing.router import Router
from ..routing.selectors import ranked_blocks
from ..storage.hybrid import make_store
from ..storage.store import Sequence, StoreConfig
from .model import Model
from .quant import held_weights

_ENGINE_DEFAULT = object()


def _copy_state(state: dict) -> dict:
    return {k: (tuple(t.clone() for t in v) if isinstance(v, tuple) else v.clone()) for k, v in state.items()}


def greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


@dataclass
class StepStats:
    """One decode step, summed over layers (from the step's `attention.plan`)."""

    seconds: float
    blocks_read: int       # (kv head, block) tiles read by attention
    kv_bytes: int          # K/V bytes read by attention, at the stored width (int8 codes and scales)
    route_bytes: int       # everything else read: summaries and indices (StepTraffic.meta_bytes; dense: the table)
    selections: dict | None = None   # layer -> [H, K] blocks read (Engine(record_selections=True))
    masses: dict | None = None       # layer -> [H, nb] the router's block distribution (record_selections)
    traffic: StepTraffic | None = None   # the step's bytes by kind, q and o included


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


_STORE_FIELDS = {f.name for f in fields(StoreConfig)} - {"num_layers", "num_kv_heads", "head_dim"}
_STORE_ALIASES = {"kv_dtype": "dtype"}          # the Engine's old keyword for the store's dtype


@dataclass
class EngineConfig:
    """How an `Engine` lays out its store and runs its two phases.

    `store` is the store's layout without the model's geometry (which the Engine fills from its model: layers,
    kv heads, head dim, and the dtype where `store.dtype` is None). `Engine(model, **kw)` takes the fields of
    both as keywords (`block_size=16, kv_bits=8, cold_dir=...`), and `kv_dtype` for the store's dtype.
    """

    store: StoreConfig = field(default_factory=lambda: StoreConfig(block_size=16, num_blocks=4096, dtype=None))
    chunk_size: int = 512                      # prefill chunk, tokens
    dense_layers: int = 0                      # leading attention layers decoded densely (Quest keeps 2)
    prefix_cache: bool = False                 # share full prompt blocks across sequences
    cache_policy: str = "lru"                  # eviction policy name (storage.eviction)
    cache_high_watermark: float | None = None  # with prefix_cache: evict down to the low watermark in
    cache_low_watermark: float | None = None   #   finish() once pool use passes the high one
    progress: bool = True                      # a progress bar on long prefills
    record_selections: bool = False            # keep each step's selected blocks (for rasters)
    prefetch: int = 0                          # with a cold tier and a router: after each routed layer, read ahead
                                               #   the `prefetch` blocks per kv head ranked next after the
                                               #   selection (by this step's mass): a guess at the next step's
                                               #   selection
    fused_decode: bool = True                  # a one-sequence decode step as one operator call per layer where
                                               #   it applies (`model.fused`: gguf weights, a plain store); False:
                                               #   always the general path (the per-layer reference)
    prefill_backend: str = "auto"              # a prefill chunk's attention (`attention.decode.prefill_attention`):
                                               #   "auto": a float32 chunk takes the extension's float32
                                               #   kernel; a bf16 chunk (gguf weights' bfloat16 prefill) SDPA
                                               #   where oneDNN has AMX tiles, else the extension's kernel for
                                               #   this CPU; "cpp" always a kernel, "torch" always SDPA
    hold_weights: bool = True                  # a bfloat16 prefill of several chunks dequantises gguf weights
                                               #   once and holds them for the call (`quant.held_weights`: the
                                               #   layers' W in bfloat16, freed after); a float32 prefill does
                                               #   not (measured a tie at twice the bytes). A scheduler's run
                                               #   holds in either dtype (`Engine.holding_weights`: measured a
                                               #   gain in both). False: never (benchmarks/bench_held_weights.py)

    def __post_init__(self):
        if not isinstance(self.store, StoreConfig):
            raise TypeError(f"store must be a StoreConfig, got {type(self.store).__name__}")
        check_int("chunk_size", self.chunk_size, lo=1)
        check_int("dense_layers", self.dense_layers, lo=0)
        check_int("prefetch", self.prefetch, lo=0)
        check_choice("prefill_backend", self.prefill_backend, ("auto", "torch", "reference", "cpp"))
        for name in ("fused_decode", "hold_weights"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if self.prefetch and not self.store.tiered:
            raise ValueError("prefetch reads ahead from a cold tier: set cold_dir (and hot_blocks) too")

    @classmethod
    def of(cls, **kwargs) -> "EngineConfig":
        """An EngineConfig from keywords of either config (`EngineConfig.of(block_size=16, chunk_size=256)`)."""
        store = {_STORE_ALIASES.get(k, k): kwargs.pop(k) for k in list(kwargs) if _STORE_ALIASES.get(k, k) in _STORE_FIELDS}
        own = {f.name for f in fields(cls)} - {"store"}
        unknown = sorted(set(kwargs) - own)
        if unknown:
            raise TypeError(f"Engine got an unknown argument: {unknown} (EngineConfig: {sorted(own)}; "
                            f"StoreConfig: {sorted(_STORE_FIELDS)})")
        base = replace(cls().store, **store)
        return cls(store=base, **kwargs)


class Engine:
    """Owns a `BlockStore` sized for `model`; see the module docstring.

    Engine(model, router, config=EngineConfig(...)) or, equivalently, the fields of EngineConfig and
    StoreConfig as keywords. Every setting is read from `self.config`; nothing is copied into an attribute.

    The calls that append tokens, and how each counts time (`stats(seq)`):
        prefill(seq, ids)      a prompt or a later turn, in chunks; on an empty sequence with a prefix cache the
                               cached prefix is reused. Starts a turn: `ttft_s` is this call's time.
        attach_prefix(seq, ids) + extend(seq, chunk)...   the same turn as a scheduler runs it, a chunk at a time:
                               attach starts the turn (ttft_s = 0), each extend adds its time.
        decode(seq, n)         n sampled tokens, one decode step each (`stats(seq).steps`).
        feed(seq, ids)         given tokens, one decode step each (teacher forcing): steps, as decode.
        decode_batch(seqs)     one sampled token for each of several sequences in one step: one entry in each
                               sequence's steps, with the batch's wall time.
    decode, feed and decode_batch run the same step (`_decode_step`: one `attention.plan` per step), so a sequence
    decoded alone or in a batch reads the same blocks and counts the same bytes.
    """

    def __init__(self, model: Model, router: Router | None = None, config: EngineConfig | None = None, **kwargs):
        if config is not None and kwargs:
            raise ValueError(f"pass either config or keyword arguments, not both (got {sorted(kwargs)})")
        if config is not None and not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        if not isinstance(model, Model):
            raise TypeError(f"model must be a sparsekv.Model, got {type(model).__name__}")
        if router is not None and not isinstance(router, Router):
            raise TypeError(f"router must be a Router or None, got {type(router).__name__}")
        cfg = config or EngineConfig.of(**kwargs)
        c = model.config
        check_int("dense_layers", cfg.dense_layers, lo=0, hi=c.n_layers)
        self.config, self.model, self.router = cfg, model, router
        store_cfg = cfg.store.for_model(max(1, len(c.attn_layers)), c.n_kv_heads, c.head_dim, model.dtype)
        windows = c.store_windows if c.attn_layers else None
        if windows and any(windows) and store_cfg.window_blocks is None:
            # a sliding group's pool: room for 16 sequences, each holding its window and one prefill chunk
            per = -(-(max(windows) + cfg.chunk_size) // store_cfg.block_size) + 2
            store_cfg = replace(store_cfg, window_blocks=min(store_cfg.num_blocks, 16 * per))
        self.store = make_store(store_cfg, windows)          # a HybridStore when some layers slide (storage.hybrid)
        self._states: dict[int, _State] = {}
        self._fused = None                                   # model.fused's step, built on the first decode
        self.prefix_cache = None
        if cfg.prefix_cache:
            if set(c.layer_mixers) != {"attn"}:
                raise ValueError("prefix_cache needs an all-attention model: conv and linear-attention state "
                                 f"is not cached, and this model's mixers are {c.layer_mixers}")
            from ..storage.hybrid_cache import make_prefix_cache
            self.prefix_cache = make_prefix_cache(self.store, policy=cfg.cache_policy,
                                                  high_watermark=cfg.cache_high_watermark,
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
        the rest is computed; `stats(seq)` reports cached against computed tokens. Starts a turn:
        `stats(seq).ttft_s` is this call's wall time. A bfloat16 prefill of several chunks dequantises a GGUF model's
        weights once, holding them for this call (`quant.held_weights`), rather than once per chunk
        (`config.hold_weights`).
        """
        st = self._state(seq)
        ids = self._as_ids(token_ids)
        t0 = time.perf_counter()
        cached = 0
        if self.prefix_cache is not None and seq.num_tokens == 0:
            cached = self.prefix_cache.attach(seq, ids, namespace=namespace)     # a bad namespace raises here
            st.namespace = namespace
            st.tokens.extend(ids[:cached].tolist())
        todo = ids[cached:]
        size = self.config.chunk_size
        chunks = [todo[i:i + size] for i in range(0, len(todo), size)]
        bar = None
        if self.config.progress and len(chunks) > 4:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(todo), desc="prefill", unit="tok", leave=False)
        logits = None
        hold = len(chunks) > 1 and self.model.prefill_dtype is not torch.float32      # where it measured a gain
        with self.holding_weights() if hold else contextlib.nullcontext():             # W dequantised once
            for chunk in chunks:
                logits = self._forward(seq, chunk, attend=self._prefill_attend(seq))
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

    def holding_weights(self):
        """A context within which a GGUF model dequantises each weight once, at the first prefill chunk or decode
        batch wider than `quant.DECODE_ROWS` rows that multiplies by it, and keeps it in the prefill dtype
        (`quant.held_weights`), across any number of `prefill`, `extend` and `decode_batch` calls; freed on exit
        (whatever raised). What a caller that prefills a chunk at a time wraps around its loop: `Scheduler.run`
        does, through `EngineExecutor.session`. Nothing is held with `config.hold_weights` False.

        Unlike `prefill`'s own hold (a bfloat16 prefill only), this holds for a float32 prefill too: a served run
        measured faster held in both dtypes, mostly in its wide decode batches (benchmarks/results/
        held_weights_serving.json, Gemma 3 270M, 24 requests in one batch: the run 0.60x in bfloat16 and 0.83x in
        float32 of its time without the hold). The cost is the W those ops multiply by, while it is open
        (`quant.held_bytes`; there 511 MiB in bfloat16 and 1,022 MiB in float32, the lm_head included)."""
        return held_weights(self.model) if self.config.hold_weights else contextlib.nullcontext()

    def extend(self, seq: Sequence, token_ids) -> torch.Tensor:
        """Append `token_ids` to `seq` as one prefill chunk (no prefix-cache lookup); returns the last logits [vocab].
        What a scheduler calls to prefill a prompt a chunk at a time: its time adds to the turn's `ttft_s`. Each call
        dequantises a GGUF model's weights anew unless the caller holds them (`holding_weights`)."""
        st = self._state(seq)
        ids = self._as_ids(token_ids)
        t0 = time.perf_counter()
        logits = self._forward(seq, ids, attend=self._prefill_attend(seq))
        st.next_logits = logits[0]
        st.stats.prompt_tokens += len(ids)
        st.stats.computed_tokens += len(ids)
        st.stats.ttft_s += time.perf_counter() - t0
        return st.next_logits

    def attach_prefix(self, seq: Sequence, token_ids, namespace=None) -> int:
        """Start empty `seq` on the prefix cache's longest hit for `token_ids` (0 without a cache); returns the
        cached tokens, which the caller then skips when it prefills the rest with `extend`. Starts a turn
        (`ttft_s` = 0, to which each `extend` adds)."""
        st = self._state(seq)
        if seq.num_tokens:
            raise ValueError(f"seq must be empty to attach a cached prefix; it holds {seq.num_tokens} tokens")
        st.stats.ttft_s = 0.0
        if self.prefix_cache is None:
            return 0
        ids = self._as_ids(token_ids)
        cached = self.prefix_cache.attach(seq, ids, namespace=namespace)         # a bad namespace raises here
        st.namespace = namespace
        st.tokens.extend(ids[:cached].tolist())
        st.stats.prompt_tokens += cached
        st.stats.cached_tokens += cached
        return cached

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
            self.store.trim(seq)
            st.tokens.extend(torch.randint(0, self.model.config.vocab_size, (t,), generator=g).tolist())

    # -- decode ---------------------------------------------------------------------------
    def decode(self, seq: Sequence, n: int, sampler: Callable[[torch.Tensor], int] = greedy,
               router=_ENGINE_DEFAULT, dense_layers: int | None = None) -> list[int]:
        """Generate `n` tokens (greedy by default). `router`: a Router, None (dense), or the engine's;
        `dense_layers`: this call's leading dense layers (None: the config's)."""
        st = self._state(seq)
        check_int("n", n, lo=1)
        if st.next_logits is None:
            raise ValueError("seq has no logits to sample from; call prefill first")
        router = self.router if router is _ENGINE_DEFAULT else router
        out = []
        for _ in range(n):
            tok = int(sampler(st.next_logits))
            out.append(tok)
            self._decode_step([seq], [st], [tok], router, dense_layers)
        return out

    def feed(self, seq: Sequence, token_ids, router=_ENGINE_DEFAULT,
             observer: Callable[[int, torch.Tensor], None] | None = None, dense_layers: int | None = None,
             logits: str = "all") -> torch.Tensor:
        """Teacher forcing: decode the given tokens one at a time (routed like `decode`) and return
        the logits after each, [n, vocab] float32. The last row becomes the sequence's next-token logits.

        logits: "all" (every row), or "last" (only the last token's, [1, vocab]: the other steps skip the output
        head, which on a large vocabulary is most of a step's work; every K/V, summary, routing decision and the
        next-token logits are what "all" gives, bit for bit). If a step fails part-way under "last" (running out
        of blocks), the sequence keeps the tokens fed so far and has no next-token logits.

        observer: called as observer(store layer, q [Hq, D]) in every attention layer of every step,
        after the step's K/V are written and before attention reads them (for analysis: attention
        anatomy, routing recall); it must not modify q or the store.
        """
        if logits not in ("all", "last"):
            raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
        st = self._state(seq)
        ids = self._as_ids(token_ids).tolist()
        router = self.router if router is _ENGINE_DEFAULT else router
        rows = [self._decode_step([seq], [st], [tok], router, dense_layers, observer,
                                  head=logits == "all" or i == len(ids) - 1) for i, tok in enumerate(ids)]
        return torch.cat([r for r in rows if r is not None])

    def decode_batch(self, seqs: list[Sequence], sampler: Callable[[torch.Tensor], int] = greedy,
                     router=_ENGINE_DEFAULT, dense_layers: int | None = None) -> list[int]:
        """One token for each of `seqs` in one batched step; returns the tokens.

        Each sequence samples from its own next-token logits and is routed on its own (per layer, per sequence);
        the projections and MLPs run once over the batch (`Model.forward_decode_batch`). Every sequence's stats
        get the step, with the batch's wall time. A sequence gets the tokens and the step traffic it would get
        decoded alone (to float rounding of the batched projections). Needs an all-attention model; a
        StoreFullError leaves every sequence as it was.
        """
        if not isinstance(seqs, (list, tuple)) or not seqs:
            raise TypeError("seqs must be a non-empty list of Sequence")
        if len({s.seq_id for s in seqs}) != len(seqs):
            raise ValueError("seqs must not repeat a sequence")
        states = [self._state(s) for s in seqs]
        for s, st in zip(seqs, states):
            if st.next_logits is None:
                raise ValueError(f"seq (id {s.seq_id}) has no logits to sample from; prefill it first")
        if len(seqs) > 1 and any(kind != "attn" for kind in self.model.config.layer_mixers):
            raise ValueError(f"batched decode needs an all-attention model; this one's mixers are "
                             f"{self.model.config.layer_mixers}")
        router = self.router if router is _ENGINE_DEFAULT else router
        toks = [int(sampler(st.next_logits)) for st in states]
        self._decode_step(list(seqs), states, toks, router, dense_layers)
        return toks

    # -- internals ------------------------------------------------------------------------
    def _decode_step(self, seqs: list[Sequence], states: list[_State], toks: list[int], router: Router | None,
                     dense_layers: int | None = None, observer=None, head: bool = True) -> torch.Tensor | None:
        """One decode step of `seqs` on tokens `toks`: reserve a slot each, plan the step once, run the model with
        the plan as every layer's attention, record each sequence's stats; returns the logits [B, vocab], or None
        without `head` (the output head skipped; each sequence's next-token logits become None).
        Running out of blocks raises StoreFullError before anything changes."""
        store, cfg = self.store, self.config
        store.check_room(seqs, 1)                    # StoreFullError here changes nothing (every layer group counted)
        t0 = time.perf_counter()
        res = [store.reserve(s, 1) for s in seqs]
        for st, tok in zip(states, toks):
            st.tokens.append(tok)
        dense = cfg.dense_layers if dense_layers is None else dense_layers
        fused = self._fused_step(router, dense, len(seqs), observer)
        if fused is not None:                        # one operator call per layer (`model.fused`)
            logits, traffic, tiles = fused.step(toks[0], res[0], seqs[0], router, dense, head=head)
            traffics, tiles, selections, masses = [traffic], [tiles], [None], [None]
        else:
            plan = plan_decode(store, seqs, self.model.config.n_heads, router=router, dense_layers=dense,
                               record=cfg.record_selections, on_route=self._read_ahead(seqs) if cfg.prefetch else None)

            def attend(layer: int, q: torch.Tensor, k=None, v=None) -> torch.Tensor:      # q [B, Hq, D]
                if observer is not None:
                    observer(layer, q[0])
                return plan.run(layer, q)  # a decode step reads its own token from the store, as stored (k, v unused)

            ids, positions = torch.tensor(toks), torch.tensor([r.start for r in res])
            if all(kind == "attn" for kind in self.model.config.layer_mixers):
                logits = self.model.forward_decode_batch(ids, positions, store, res, attend, head=head)
            else:                              # conv and linear mixers keep per-sequence state: one sequence here
                logits = self.model(ids, positions, store, res[0], attend, state=states[0].mixer_state, head=head)
            traffics, tiles = plan.traffic, plan.blocks_read
            selections = plan.selections if cfg.record_selections else [None] * len(seqs)
            masses = plan.masses if cfg.record_selections else [None] * len(seqs)
        for s, st in zip(seqs, states):
            self._release_window(s, st)
        dt = time.perf_counter() - t0
        for b, st in enumerate(states):
            t = traffics[b]
            st.stats.steps.append(StepStats(dt, tiles[b], t.kv_bytes, t.meta_bytes, selections[b], masses[b], t))
            st.next_logits = logits[b] if logits is not None else None
        return logits

    def _fused_step(self, router, dense_layers: int, batch: int, observer):
        """The one-call-per-layer decode step (`model.fused`) when this step is in its scope and
        `config.fused_decode` is on; None for the general path."""
        if not self.config.fused_decode or observer is not None:
            return None
        if self._fused is None:
            from . import fused
            self._fused = fused.build(self.model, self.store) or False
        ok = self._fused and self._fused.applies(router, dense_layers, batch, self.config.record_selections,
                                                 self.config.prefetch)
        return self._fused if ok else None

    def _read_ahead(self, seqs: list[Sequence]):
        """After each routed layer, start reading the tiles the next step may want from the cold tier: each kv head's
        selection widened by `config.prefetch` blocks, the next ranked by this step's mass (`ranked_blocks`)."""
        def on_route(b: int, layer: int, sel) -> None:
            ranked = ranked_blocks(sel.mass, sel.blocks.shape[1] + self.config.prefetch)     # [H, K'] logical blocks
            self.store.prefetch(layer, torch.unique(self.store.block_table(seqs[b])[ranked.flatten()]).tolist())
        return on_route

    def _prefill_attend(self, seq: Sequence):
        """Prefill attention for one chunk: the cached prefix from the store, the chunk's own K/V as computed
        (`prefill_attention(fresh=...)`: a quantised store's rounding applies to later reads only)."""
        dt = self.model.prefill_dtype                     # float32, or bfloat16 (`quant.set_prefill`)
        be = self.config.prefill_backend
        if dt is torch.float32:
            return lambda layer, q, k, v: prefill_attention(q, self.store, seq, layer, be, fresh=(k, v))
        return lambda layer, q, k, v: prefill_attention(q.to(dt), self.store, seq, layer, be, fresh=(k, v))

    def _forward(self, seq: Sequence, ids: torch.Tensor, attend) -> torch.Tensor:
        """Append `ids` to `seq` as one chunk (its tokens included); returns the logits of its last token [1, vocab]."""
        st = self._states[seq.seq_id]
        res = self.store.reserve(seq, len(ids))
        positions = torch.arange(res.start, res.start + len(ids))
        logits = self.model(ids, positions, self.store, res, attend, state=st.mixer_state)
        st.tokens.extend(ids.tolist())
        self._release_window(seq, st)
        return logits

    def _release_window(self, seq: Sequence, st: _State) -> None:
        """Give a sliding window's blocks that no later query reaches back to their pool (`HybridStore.trim`), after
        registering them with a hybrid prefix cache, so that they stay cached until an allocation needs them."""
        if self.prefix_cache is not None:                   # a flat PrefixCache retains nothing (its retain is 0)
            self.prefix_cache.retain(seq, st.tokens, namespace=st.namespace)
        self.store.trim(seq)

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
