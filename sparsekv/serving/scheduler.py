"""A scheduler that serves a trace of requests over one executor (the real engine or the simulator).

Each iteration, on a clock that starts at 0 and advances by what the executor reports (and jumps to the
next arrival when idle):

    1. arrivals join the waiting queue;
    2. admission (the policy's order): a request is started when a batch slot is free and the pool can hold
       its prompt beyond the cached prefix (`admit="prompt"`, as vLLM does; growth is met by preemption) or
       its whole prompt and output (`admit="full"`); static policies admit only into an empty batch;
    3. one decode token for every running request whose prompt is in (one batched step);
    4. prompt chunks: the whole remaining prompt of each prefilling request, or, for chunked policies, what
       is left of `batch_tokens` after the decode tokens (Sarathi-Serve's stall-free batching);
    5. finished requests are released.
A request's full prompt blocks enter the prefix cache as soon as each chunk is in (`publish`), as vLLM
caches each block once computed, so requests running beside it share them; its output's blocks enter
when it finishes.

Preemption: when a decode step or a chunk finds no free block, the most recently admitted request is
released (its blocks cached) and requeued at the head of the queue with its prompt extended by what it
generated; admission then pauses until a request finishes (so the victim is not re-admitted into the same
shortage); on re-admission it is prefilled again (recompute, shortened by whatever of it is still cached)
and continues. Greedy decoding gives it the tokens it would have generated alone.

Times: a token's time is the end of the iteration whose step produced it. TTFT = first token's time
minus arrival; TPOT = mean gap between a request's later tokens; ITL = every single gap (a stall from a
prefill in the same iteration shows in the ITL tail, while the request's mean TPOT averages it away).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..core.checks import check_int
from ..storage.block_pool import StoreFullError
from .executors import Executor
from .policies import make_policy
from .trace import ServeRequest


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "chunked"      # a name in SCHEDULING_POLICIES
    max_batch: int = 8           # running requests at most (decode batch size cap)
    batch_tokens: int = 256      # chunked policies: tokens per iteration, decode tokens included (vLLM's
                                 #   max_num_batched_tokens; not a router's token_budget, which is tokens read)
    prefill_chunk: int = 512     # unchunked policies: a prompt is appended in pieces of this many tokens
    admit: str = "prompt"        # "prompt": admit if the uncached prompt fits; "full": if prompt and output fit

    def __post_init__(self):
        make_policy(self.policy)
        check_int("max_batch", self.max_batch, lo=1)
        check_int("batch_tokens", self.batch_tokens, lo=2)
        check_int("prefill_chunk", self.prefill_chunk, lo=1)
        if self.admit not in ("prompt", "full"):
            raise ValueError(f"admit must be 'prompt' or 'full', got {self.admit!r}")


@dataclass(eq=False)                 # identity: the queues remove by `is`, not by comparing token lists
class _Active:
    req: ServeRequest
    tokens: np.ndarray           # [T] int64 to prefill: the prompt (plus the tokens generated before a preemption)
    done: int                    # tokens of `tokens` in the sequence (cached or prefilled)
    out: list[int]               # generated tokens
    handle: object
    order: int                   # admission counter (preemption takes the largest)
    times: list[float]           # clock at each generated token
    cached: int = 0
    preemptions: int = 0


@dataclass(frozen=True)
class RequestRecord:
    rid: int
    name: str
    arrival_s: float
    prompt_tokens: int
    cached_tokens: int           # prompt tokens served by the prefix cache at (first) admission
    tokens: list[int]
    times: list[float]
    preemptions: int

    @property
    def ttft_s(self) -> float:
        return self.times[0] - self.arrival_s

    @property
    def tpot_s(self) -> float:
        gaps = np.diff(self.times)
        return float(gaps.mean()) if len(gaps) else float("nan")

    @property
    def finish_s(self) -> float:
        return self.times[-1]


@dataclass(frozen=True)
class Iteration:
    start_s: float
    seconds: float
    decode_batch: int
    prefill_tokens: int
    used_blocks: int
    running: int
    waiting: int


@dataclass
class ServeResult:
    policy: str
    records: list[RequestRecord]
    iterations: list[Iteration]
    hit_rate: float
    preemptions: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def makespan_s(self) -> float:
        return max(r.finish_s for r in self.records) if self.records else 0.0

    @property
    def throughput(self) -> float:
        """Generated tokens per second over the makespan."""
        return sum(len(r.tokens) for r in self.records) / max(self.makespan_s, 1e-12)

    @property
    def peak_blocks(self) -> int:
        return max((i.used_blocks for i in self.iterations), default=0)

    def ttfts(self) -> np.ndarray:
        return np.array([r.ttft_s for r in self.records])

    def tpots(self) -> np.ndarray:
        return np.array([r.tpot_s for r in self.records if not math.isnan(r.tpot_s)])

    def gaps(self) -> np.ndarray:
        """Every inter-token gap of every request (seconds): where a stall shows, which a request's mean TPOT hides."""
        return np.concatenate([np.diff(r.times) for r in self.records] or [np.zeros(0)])

    def summary(self) -> dict:
        t, p, g = self.ttfts(), self.tpots(), self.gaps()
        return {"ttft_p50_s": float(np.median(t)), "ttft_p90_s": float(np.percentile(t, 90)),
                "tpot_p50_s": float(np.median(p)) if len(p) else float("nan"),
                "tpot_p90_s": float(np.percentile(p, 90)) if len(p) else float("nan"),
                "itl_p99_s": float(np.percentile(g, 99)) if len(g) else float("nan"),
                "throughput_tok_s": self.throughput, "makespan_s": self.makespan_s, "peak_blocks": self.peak_blocks,
                "hit_rate": self.hit_rate, "preemptions": self.preemptions}


@dataclass
class _State:
    """Where a run stands: the queues, the clock and what has been recorded."""

    pending: deque                                  # requests not yet arrived, by arrival time
    waiting: deque = field(default_factory=deque)   # arrived, not admitted (preempted ones at the head)
    running: list = field(default_factory=list)
    records: list = field(default_factory=list)
    iterations: list = field(default_factory=list)
    clock: float = 0.0
    admitted: int = 0
    preemptions: int = 0
    hold: bool = False       # after a preemption, admit nothing until a request finishes (no thrashing)

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.waiting or self.running)


@dataclass(frozen=True)
class Decision:
    """What one iteration does, decided before anything runs (`Scheduler.schedule`).

    admit     waiting requests to start, in the policy's order (each on its cached prefix)
    decode    running requests whose prompt is in: one token each, in one batched step
    prefill   (request, tokens) prompt chunks, in admission order, within the iteration's token budget
    """

    admit: tuple[_Active, ...]
    decode: tuple[_Active, ...]
    prefill: tuple[tuple[_Active, int], ...]


class Scheduler:
    """Serves requests over `executor` (an `Executor`: `serving.executors`) with the policy of `config`, bound once.

    `run` is the loop, inside the executor's `session`: arrivals join the queue, `schedule` decides an iteration
    (`Decision`), `step` executes it (preempting on a full pool) and advances the clock; an idle scheduler jumps to
    the next arrival.
    """

    def __init__(self, executor, config: SchedulerConfig | None = None):
        if not isinstance(executor, Executor):
            raise TypeError(f"executor must be an Executor (serving.executors: EngineExecutor, SimExecutor), got "
                            f"{type(executor).__name__}")
        self.ex = executor
        self.config = config or SchedulerConfig()
        self.policy = make_policy(self.config.policy)

    def run(self, requests: list[ServeRequest], progress: bool = False) -> ServeResult:
        state = _State(deque(sorted(requests, key=lambda r: (r.arrival_s, r.rid))))
        self._limit = 10 * len(requests) + 10       # preemptions beyond this mean the pool cannot hold the batch
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(requests), desc=f"serving ({self.config.policy})", leave=False)
        with self.ex.session():                     # the engine holds its dequantised weights for the run
            while state.busy:
                while state.pending and state.pending[0].arrival_s <= state.clock:
                    r = state.pending.popleft()
                    state.waiting.append(_Active(r, r.prompt.numpy(), 0, [], None, -1, []))
                if not state.running and not state.waiting:
                    state.clock = state.pending[0].arrival_s
                    continue
                done = self.step(state, self.schedule(state))
                if bar is not None:
                    bar.update(done)
        if bar is not None:
            bar.close()
        state.records.sort(key=lambda r: r.rid)
        return ServeResult(self.config.policy, state.records, state.iterations, self.ex.hit_rate, state.preemptions)

    # -- decide ---------------------------------------------------------------------------------
    def schedule(self, state: _State) -> Decision:
        """Admission (the policy's order; a request is admitted when a slot is free and the pool holds its prompt
        beyond the cached prefix, with headroom for the running requests), then the iteration's work: a decode
        token for each request whose prompt is in, and prompt chunks within the token budget. Changes nothing."""
        c, ex, pol = self.config, self.ex, self.policy
        admit = []
        if (not pol.static or not state.running) and not (state.hold and state.running):
            slots = c.max_batch - len(state.running)
            reserve, free = self._reserved(state.running), ex.free_blocks()
            for w in pol.order(list(state.waiting), lambda a: ex.cached(a.tokens, a.req.namespace)):
                if len(admit) >= slots:
                    break
                need = self._need(w)
                if need > free - reserve:
                    if state.running or admit:
                        break                      # head of line waits for blocks to free up
                    raise RuntimeError(f"request {w.req.name!r} needs {need} blocks but the pool has "
                                       f"{free} free with nothing running: raise num_blocks")
                admit.append(w)
                reserve += need + 1                # it holds its prompt now, and grows like the others
        decode = tuple(a for a in state.running if a.done == len(a.tokens))
        budget = c.batch_tokens - len(decode) if pol.chunked else math.inf
        chunks = []
        # running requests in admission order, then the ones admitted now in the order they start (a request not
        # started has no handle; it starts on its cached prefix)
        prefilling = sorted((a for a in state.running if a.done < len(a.tokens)), key=lambda a: a.order) + admit
        for a in prefilling:
            left = len(a.tokens) - (a.done if a.handle is not None else ex.cached(a.tokens, a.req.namespace))
            n = min(left, budget)
            if n <= 0:
                break
            chunks.append((a, n))
            budget -= n
        return Decision(tuple(admit), decode, tuple(chunks))

    # -- execute --------------------------------------------------------------------------------
    def step(self, state: _State, d: Decision) -> int:
        """Run one iteration as decided: start the admitted requests, the decode step, the prompt chunks (in pieces
        of `prefill_chunk` for unchunked policies, each published to the prefix cache), then release what finished.
        A full pool preempts the newest request: a failed decode skips the rest of the iteration, a failed chunk
        the chunks after it. Returns the requests that finished."""
        c, ex = self.config, self.ex
        for i, w in enumerate(d.admit):
            # re-checked with the pool as it is now: a start before this one may have taken cached (evictable) blocks
            if i and self._need(w) > ex.free_blocks() - self._reserved(state.running):
                break
            w.handle, w.done = ex.start(w.tokens, w.req.namespace)
            if w.preemptions == 0:
                w.cached = w.done
            w.order, state.admitted = state.admitted, state.admitted + 1
            state.running.append(w)
            state.waiting.remove(w)
        dur, ntok = 0.0, 0
        if d.decode:
            try:
                toks, dt = ex.decode([a.handle for a in d.decode])
            except StoreFullError:
                self._preempt(state)
                return 0
            dur += dt
            for a, t in zip(d.decode, toks):
                a.out.append(int(t))
        for a, n in d.prefill:
            if a.handle is None:                  # a proposed admission that did not fit after all
                break
            step = n if self.policy.chunked else c.prefill_chunk
            try:
                for i in range(0, n, step):
                    m = min(step, n - i)
                    dur += ex.prefill(a.handle, a.tokens[a.done:a.done + m])
                    a.done += m
                    ntok += m
                    ex.publish(a.handle)          # its full blocks are shareable from now on
            except StoreFullError:
                self._preempt(state)
                break
        end = state.clock + dur
        for a in d.decode:
            if a in state.running:
                a.times.append(end)
        state.iterations.append(Iteration(state.clock, dur, len(d.decode), ntok, ex.used_blocks(), len(state.running),
                                          len(state.waiting)))
        state.clock = end
        finished = [a for a in state.running if len(a.out) >= a.req.max_new_tokens]
        for a in finished:
            state.hold = False
            state.running.remove(a)
            ex.finish(a.handle)
            r = a.req
            state.records.append(RequestRecord(r.rid, r.name, r.arrival_s, len(r.prompt), a.cached, a.out, a.times,
                                               a.preemptions))
        return len(finished)

    def _need(self, w: _Active) -> int:
        """Blocks a waiting request needs to start: its prompt beyond the cached prefix, and one token to grow into
        (or its whole output, with admit="full"). A hit is whole blocks, so new blocks start at a boundary."""
        c = self.config
        hit = self.ex.cached(w.tokens, w.req.namespace)
        grow = len(w.tokens) - hit + (w.req.max_new_tokens - len(w.out) if c.admit == "full" else 1)
        return math.ceil(grow / self.ex.block_size)

    def _reserved(self, running: list[_Active]) -> int:
        """Blocks held back for the running requests: their remaining prompts, plus one block each to grow into."""
        return sum(self.ex.blocks_needed(a.handle, len(a.tokens) - a.done + 1) + 1 for a in running)

    def _preempt(self, state: _State) -> None:
        """Release the most recently admitted request (its blocks cached) and requeue it at the head, its prompt
        extended by what it generated; admission pauses until a request finishes."""
        state.hold = True
        if state.preemptions > self._limit:
            raise RuntimeError(f"{state.preemptions} preemptions: the pool is too small for "
                               f"max_batch={self.config.max_batch}; raise num_blocks or lower max_batch")
        victim = max(state.running, key=lambda a: a.order)
        state.running.remove(victim)
        self.ex.finish(victim.handle)
        victim.tokens = np.concatenate([victim.req.prompt.numpy(), np.asarray(victim.out, dtype=np.int64)])
        victim.done, victim.handle = 0, None
        victim.preemptions += 1
        state.preemptions += 1
        state.waiting.appendleft(victim)


def solo_tokens(engine, request: ServeRequest) -> list[int]:
    """The tokens `request` gets alone on `engine` (prefill, then greedy decode), for parity checks."""
    seq = engine.new_sequence()
    engine.prefill(seq, request.prompt, namespace=request.namespace)
    out = engine.decode(seq, request.max_new_tokens)
    engine.finish(seq)
    return out


__all__ = ["Scheduler", "SchedulerConfig", "ServeResult", "RequestRecord", "Iteration", "solo_tokens"]
