"""A scheduler that serves a trace of requests over one executor (the real engine or the simulator).

Each iteration, on a clock that starts at 0 and advances by what the executor reports (and jumps to the
next arrival when idle):

    1. arrivals join the waiting queue;
    2. admission (the policy's order): a request is started when a batch slot is free and the pool can hold
       its prompt beyond the cached prefix (`admit="prompt"`, as vLLM does; growth is met by preemption) or
       its whole prompt and output (`admit="full"`); static policies admit only into an empty batch;
    3. one decode token for every running request whose prompt is in (one batched step);
    4. prompt chunks: the whole remaining prompt of each prefilling request, or, for chunked policies, what
       is left of `token_budget` after the decode tokens (Sarathi-Serve's stall-free batching);
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
from .policies import make_policy
from .trace import ServeRequest


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "chunked"      # a name in SCHEDULING_POLICIES
    max_batch: int = 8           # running requests at most (decode batch size cap)
    token_budget: int = 256      # chunked policies: tokens per iteration, decode tokens included
    prefill_chunk: int = 512     # unchunked policies: a prompt is appended in pieces of this many tokens
    admit: str = "prompt"        # "prompt": admit if the uncached prompt fits; "full": if prompt and output fit

    def __post_init__(self):
        make_policy(self.policy)
        check_int("max_batch", self.max_batch, lo=1)
        check_int("token_budget", self.token_budget, lo=2)
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


class Scheduler:
    """Serves requests over `executor` (`serving.executors`) with the policy of `config`, bound once."""

    def __init__(self, executor, config: SchedulerConfig | None = None):
        self.ex = executor
        self.config = config or SchedulerConfig()
        self.policy = make_policy(self.config.policy)

    def run(self, requests: list[ServeRequest], progress: bool = False) -> ServeResult:
        c, ex, pol = self.config, self.ex, self.policy
        pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.rid)))
        waiting: deque[_Active] = deque()
        running: list[_Active] = []
        records, iterations = [], []
        clock, admitted, preemptions = 0.0, 0, 0
        bs = ex.block_size
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(requests), desc=f"serving ({c.policy})", leave=False)

        hold = False         # after a preemption, admit nothing until a request finishes (no thrashing)

        def preempt(victim: _Active) -> None:
            nonlocal preemptions, hold
            hold = True
            if preemptions > 10 * len(requests) + 10:
                raise RuntimeError(f"{preemptions} preemptions for {len(requests)} requests: the pool is too small "
                                   f"for max_batch={c.max_batch}; raise num_blocks or lower max_batch")
            running.remove(victim)
            ex.finish(victim.handle)
            victim.tokens = np.concatenate([victim.req.prompt.numpy(), np.asarray(victim.out, dtype=np.int64)])
            victim.done, victim.handle = 0, None
            victim.preemptions += 1
            preemptions += 1
            waiting.appendleft(victim)

        while pending or waiting or running:
            while pending and pending[0].arrival_s <= clock:
                r = pending.popleft()
                waiting.append(_Active(r, r.prompt.numpy(), 0, [], None, -1, []))
            if not running and not waiting:
                clock = pending[0].arrival_s
                continue
            # -- admission ----------------------------------------------------------------
            if (not pol.static or not running) and not (hold and running):
                for w in pol.order(list(waiting), lambda a: ex.cached(a.tokens, a.req.namespace)):
                    if len(running) >= c.max_batch:
                        break
                    hit = ex.cached(w.tokens, w.req.namespace)
                    grow = len(w.tokens) - hit + (w.req.max_new_tokens - len(w.out) if c.admit == "full" else 1)
                    need = math.ceil(grow / bs)            # a hit is whole blocks, so new blocks start at a boundary
                    # the running requests' remaining prompts, plus one block each of headroom to grow into
                    reserve = sum(ex.blocks_needed(a.handle, len(a.tokens) - a.done + 1) + 1 for a in running)
                    if need > ex.free_blocks() - reserve:
                        if running:
                            break                      # head of line waits for blocks to free up
                        raise RuntimeError(f"request {w.req.name!r} needs {need} blocks but the pool has "
                                           f"{ex.free_blocks()} free with nothing running: raise num_blocks")
                    w.handle, w.done = ex.start(w.tokens, w.req.namespace)
                    if w.preemptions == 0:
                        w.cached = w.done
                    w.order, admitted = admitted, admitted + 1
                    running.append(w)
                    waiting.remove(w)
            # -- one iteration of work ------------------------------------------------------
            dur, ntok = 0.0, 0
            decoders = [a for a in running if a.done == len(a.tokens)]
            if decoders:
                try:
                    toks, dt = ex.decode([a.handle for a in decoders])
                except StoreFullError:
                    preempt(max(running, key=lambda a: a.order))
                    continue
                dur += dt
                for a, t in zip(decoders, toks):
                    a.out.append(int(t))
            budget = c.token_budget - len(decoders) if pol.chunked else math.inf
            for a in sorted((a for a in running if a.done < len(a.tokens)), key=lambda a: a.order):
                left = len(a.tokens) - a.done
                n = min(left, budget)
                if n <= 0:
                    break
                step = n if pol.chunked else c.prefill_chunk
                try:
                    for i in range(0, n, step):
                        m = min(step, n - i)
                        dur += ex.prefill(a.handle, a.tokens[a.done:a.done + m])
                        a.done += m
                        ntok += m
                        ex.publish(a.handle)          # its full blocks are shareable from now on
                except StoreFullError:
                    preempt(max(running, key=lambda a: a.order))
                    break
                budget -= n
            end = clock + dur
            for a in decoders:
                if a in running:
                    a.times.append(end)
            iterations.append(Iteration(clock, dur, len(decoders), ntok, ex.used_blocks(), len(running), len(waiting)))
            clock = end
            for a in [a for a in running if len(a.out) >= a.req.max_new_tokens]:
                hold = False
                running.remove(a)
                ex.finish(a.handle)
                r = a.req
                records.append(RequestRecord(r.rid, r.name, r.arrival_s, len(r.prompt), a.cached, a.out, a.times,
                                             a.preemptions))
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        records.sort(key=lambda r: r.rid)
        return ServeResult(c.policy, records, iterations, ex.hit_rate, preemptions)


def solo_tokens(engine, request: ServeRequest) -> list[int]:
    """The tokens `request` gets alone on `engine` (prefill, then greedy decode), for parity checks."""
    seq = engine.new_sequence()
    engine.prefill(seq, request.prompt, namespace=request.namespace)
    out = engine.decode(seq, request.max_new_tokens)
    engine.finish(seq)
    return out


__all__ = ["Scheduler", "SchedulerConfig", "ServeResult", "RequestRecord", "Iteration", "solo_tokens"]
