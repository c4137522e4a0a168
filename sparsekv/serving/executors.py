"""What a scheduler drives: the real `Engine` (timed by the clock) or a cost model (the simulator).

Both expose the same five operations and report the seconds each took, so the scheduler's logic is
one piece of code and the simulator's error comes from its costs alone:

    session()                -> context manager            around one `Scheduler.run` (the engine holds its weights)
    start(tokens, namespace) -> (handle, cached tokens)    a new sequence on the longest cached prefix
    prefill(handle, tokens)  -> seconds                    append one prompt chunk
    decode(handles)          -> (tokens, seconds)          one token for each (raises StoreFullError, changing nothing)
    publish(handle)          -> None                       cache its full blocks now (its prompt is in)
    finish(handle)           -> None                       cache its full blocks and release it
    free_blocks(), blocks_needed(handle, n), cached(tokens, namespace)   the pool, for admission

`EngineExecutor` logs every operation's shape and time (`ops`); `CostModel.fit` turns that log into
coefficients, and `SimExecutor` replays the same scheduling with them, without a model.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..model.engine import Engine
from ..routing.router import Router
from ..storage.block_pool import StoreFullError
from ..storage.block_table import BlockTable
from ..storage.prefix_cache import PrefixCache


@runtime_checkable
class Executor(Protocol):
    """What a `Scheduler` drives (the module docstring says what each call means). `EngineExecutor` and
    `SimExecutor` satisfy it (tests/test_serving.py checks both), so the scheduler is one piece of code."""

    block_size: int

    def session(self) -> contextlib.AbstractContextManager: ...
    def start(self, tokens, namespace=None) -> tuple[object, int]: ...
    def prefill(self, handle, tokens) -> float: ...
    def decode(self, handles: list) -> tuple[list[int], float]: ...
    def publish(self, handle) -> None: ...
    def finish(self, handle) -> None: ...
    def free_blocks(self) -> int: ...
    def used_blocks(self) -> int: ...
    def blocks_needed(self, handle, n: int) -> int: ...
    def cached(self, tokens, namespace=None) -> int: ...

    @property
    def hit_rate(self) -> float: ...


@dataclass(frozen=True)
class Op:
    """One timed operation: a prefill chunk (`tokens` new on top of `context`) or a decode step (`tokens`
    sequences, `context` their summed lengths, `read` the summed tokens attention reads)."""

    kind: str
    tokens: int
    context: int
    read: int
    seconds: float


def _read_tokens(context: int, budget: int | None) -> int:
    return context if budget is None else min(context, budget)


class EngineExecutor:
    """The real engine. `router`: the decode router (None: dense); `budget`: its token budget, for the cost log."""

    def __init__(self, engine: Engine, router: Router | None = None, budget: int | None = None):
        if not isinstance(engine, Engine):
            raise TypeError(f"engine must be an Engine, got {type(engine).__name__}")
        self.engine, self.router, self.budget = engine, router, budget
        self.block_size = engine.store.config.block_size
        self.ops: list[Op] = []

    def session(self) -> contextlib.AbstractContextManager:
        """Around one `Scheduler.run`: the engine dequantises a GGUF model's weights once for the whole run rather
        than at every prompt chunk and every decode batch wider than `quant.DECODE_ROWS` (`Engine.holding_weights`;
        nothing with `hold_weights=False`). The run's first such op pays for it, so the op log (`ops`) a `CostModel`
        is fitted on has that one op slower than the rest."""
        return self.engine.holding_weights()

    def start(self, tokens: list[int], namespace=None):
        seq = self.engine.new_sequence()
        return seq, self.engine.attach_prefix(seq, tokens, namespace)

    def prefill(self, seq, tokens: list[int]) -> float:
        ctx = seq.num_tokens
        t0 = time.perf_counter()
        self.engine.extend(seq, tokens)
        dt = time.perf_counter() - t0
        self.ops.append(Op("prefill", len(tokens), ctx, ctx + len(tokens), dt))
        return dt

    def decode(self, seqs: list) -> tuple[list[int], float]:
        ctx = sum(s.num_tokens + 1 for s in seqs)
        read = sum(_read_tokens(s.num_tokens + 1, self.budget if self.router is not None else None) for s in seqs)
        t0 = time.perf_counter()
        toks = self.engine.decode_batch(list(seqs), router=self.router)
        dt = time.perf_counter() - t0
        self.ops.append(Op("decode", len(seqs), ctx, read, dt))
        return toks, dt

    def publish(self, seq) -> None:
        """Register `seq`'s full blocks in the prefix cache now (its prompt is in), so requests running beside it
        share them before it finishes, as vLLM and SGLang do."""
        self.engine.publish(seq)

    def finish(self, seq) -> None:
        self.engine.finish(seq)

    def free_blocks(self) -> int:
        return self.engine.store.num_free_blocks

    def used_blocks(self) -> int:
        return self.engine.store.pool.num_used

    def blocks_needed(self, seq, n: int) -> int:
        return self.engine.store.blocks_needed(seq, n)

    def cached(self, tokens: list[int], namespace=None) -> int:
        pc = self.engine.prefix_cache
        return 0 if pc is None else pc.peek(tokens, namespace)

    @property
    def hit_rate(self) -> float:
        pc = self.engine.prefix_cache
        return float("nan") if pc is None else pc.stats.hit_rate


@dataclass
class CostModel:
    """Seconds per operation, linear in what each reads and computes:

        prefill(n new tokens on c cached) = p0 + p1 * n + p2 * n * (c + n / 2)     (projections; attention)
        decode(B sequences reading r tokens in all) = d0 + d1 * B + d2 * r          (per step; per row; KV read)
    """

    p: tuple[float, float, float] = (0.0, 0.0, 0.0)
    d: tuple[float, float, float] = (0.0, 0.0, 0.0)
    source: str = ""

    def prefill_s(self, n: int, context: int) -> float:
        return self.p[0] + self.p[1] * n + self.p[2] * n * (context + n / 2)

    def decode_s(self, batch: int, read: int) -> float:
        return self.d[0] + self.d[1] * batch + self.d[2] * read

    @classmethod
    def fit(cls, ops: list[Op], source: str = "fitted") -> "CostModel":
        """Least squares (non-negative, by clipping and refitting) on an `EngineExecutor.ops` log."""
        def solve(X, y):
            X, y = np.asarray(X, float), np.asarray(y, float)
            keep = np.ones(X.shape[1], bool)
            coef = np.zeros(X.shape[1])
            for _ in range(X.shape[1]):
                c, *_ = np.linalg.lstsq(X[:, keep], y, rcond=None)
                coef[:] = 0
                coef[keep] = c
                if (coef >= 0).all():
                    break
                keep &= coef > 0
            return tuple(float(max(0.0, c)) for c in coef)

        pre = [o for o in ops if o.kind == "prefill"]
        dec = [o for o in ops if o.kind == "decode"]
        if len(pre) < 3 or len(dec) < 3:
            raise ValueError(f"ops must hold at least 3 prefill and 3 decode operations, got {len(pre)} and {len(dec)}")
        p = solve([[1, o.tokens, o.tokens * (o.context + o.tokens / 2)] for o in pre], [o.seconds for o in pre])
        d = solve([[1, o.tokens, o.read] for o in dec], [o.seconds for o in dec])
        return cls(p, d, source)


class SimExecutor:
    """The scheduler's operations on a cost model: block accounting and prefix hits are real (a `BlockTable` and a
    `PrefixCache` of the same block size and pool: the engine's bookkeeping without its tensors), time is `cost`,
    tokens are placeholders."""

    def __init__(self, cost: CostModel, block_size: int, num_blocks: int, prefix_cache: bool = True,
                 budget: int | None = None):
        self.cost, self.budget, self.block_size = cost, budget, block_size
        self.store = BlockTable(block_size, num_blocks)
        self.cache = PrefixCache(self.store) if prefix_cache else None
        self._tokens: dict[int, list[int]] = {}
        self._ns: dict[int, object] = {}
        # Decode tokens not yet reserved in the store, per sequence: reserved in one call when a token needs a
        # new block (or at a prefill or finish), so the pool's counts are exact at every step at a tenth the cost.
        self._lag: dict[int, int] = {}

    def session(self) -> contextlib.AbstractContextManager:
        """Around one `Scheduler.run`: nothing to hold (no model)."""
        return contextlib.nullcontext()

    def start(self, tokens, namespace=None):
        seq = self.store.new_sequence()
        cached = 0
        if self.cache is not None:
            cached = self.cache.attach(seq, tokens, namespace)
        self._tokens[seq.seq_id] = [np.asarray(tokens[:cached], dtype=np.int64)]      # pieces, joined when cached
        self._ns[seq.seq_id] = namespace
        self._lag[seq.seq_id] = 0
        return seq, cached

    def _flush(self, seq) -> None:
        if self._lag[seq.seq_id]:
            self.store.reserve(seq, self._lag[seq.seq_id])
            self._lag[seq.seq_id] = 0

    def prefill(self, seq, tokens) -> float:
        self._flush(seq)
        ctx = seq.num_tokens
        self.store.reserve(seq, len(tokens))
        self._tokens[seq.seq_id].append(np.asarray(tokens, dtype=np.int64))
        return self.cost.prefill_s(len(tokens), ctx)

    def decode(self, seqs) -> tuple[list[int], float]:
        bs = self.block_size
        grow = [s for s in seqs if s.num_tokens + self._lag[s.seq_id] + 1 > s.num_blocks * bs]   # a new block each
        if len(grow) > self.store.num_free_blocks:
            raise StoreFullError(len(grow), self.store.num_free_blocks, what=f"a decode batch of {len(seqs)}")
        read = 0
        for s in seqs:
            self._lag[s.seq_id] += 1
            self._tokens[s.seq_id].append(np.zeros(1, dtype=np.int64))
            read += _read_tokens(s.num_tokens + self._lag[s.seq_id], self.budget)
        for s in grow:
            self._flush(s)
        return [0] * len(seqs), self.cost.decode_s(len(seqs), read)

    def publish(self, seq) -> None:
        if self.cache is not None:
            self._flush(seq)
            self.cache.insert(seq, self._joined(seq), self._ns[seq.seq_id])

    def _joined(self, seq) -> np.ndarray:
        parts = self._tokens[seq.seq_id]
        if len(parts) > 1:
            parts[:] = [np.concatenate(parts)]
        return parts[0]

    def finish(self, seq) -> None:
        self._flush(seq)
        del self._lag[seq.seq_id]
        toks = self._joined(seq)
        del self._tokens[seq.seq_id]
        ns = self._ns.pop(seq.seq_id)
        if self.cache is not None:
            self.cache.insert(seq, toks, ns)
        self.store.free(seq)

    def free_blocks(self) -> int:
        return self.store.num_free_blocks

    def used_blocks(self) -> int:
        return self.store.pool.num_used

    def blocks_needed(self, seq, n: int) -> int:
        return self.store.blocks_needed(seq, self._lag[seq.seq_id] + n)

    def cached(self, tokens, namespace=None) -> int:
        return 0 if self.cache is None else self.cache.peek(tokens, namespace)

    @property
    def hit_rate(self) -> float:
        return float("nan") if self.cache is None else self.cache.stats.hit_rate
