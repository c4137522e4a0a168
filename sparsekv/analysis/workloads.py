"""Seeded token-level traces that stand for agent traffic, and ways to replay them.

Content is random token ids (ids >= 4) in named segments: a system prompt, tool schemas, a
code snapshot, per-agent histories, questions. What matters for a prefix cache is which
segments repeat, in which order. Every trace knows its *theoretical* hit tokens: for each
request, the longest prefix it shares with any earlier request of the same namespace
(capped to leave one token to compute), which no cache can beat.

    replay(engine, trace)                      through a real Engine (TTFT, logits)
    compare_ttft(make_engine, trace)           replayed without and with a treatment (the cache, a warm-up),
                                               interleaved, repeated, after an untimed warm-up: paired ratios
    simulate(trace, block_size, num_blocks)    through a store and cache only (no model):
                                               hit rates for block-size and capacity sweeps
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..serving.trace import Request, Trace  # noqa: F401  (defined with the serving trace; kept here too)
from ..storage.block_table import BlockTable
from ..storage.prefix_cache import PrefixCache


class _Text:
    """Seeded random segments."""

    def __init__(self, seed: int, vocab: int):
        self.g = torch.Generator().manual_seed(seed)
        self.vocab = vocab

    def __call__(self, n: int) -> torch.Tensor:
        return torch.randint(4, self.vocab, (n,), generator=self.g)


def multi_agent_build(agents: int = 4, turns: int = 5, system: int = 1024, tools: int = 8, tool_len: int = 96,
                      snapshot: int = 2048, growth: int = 384, message: int = 96, tool_result: int = 192,
                      vocab: int = 4096, seed: int = 0, decode_tokens: int = 16) -> Trace:
    """Agents building a game lobby and its games share a system prompt, tool schemas and a
    growing code snapshot; each keeps its own history of messages and tool results.

    Prompt of agent a at turn t: system | tools | snapshot_t | history_a | new message. The
    snapshot is append-only (snapshot_t extends snapshot_{t-1}), so consecutive turns share
    system, tools and the old snapshot; the agent's own history sits after the snapshot.
    """
    text = _Text(seed, vocab)
    sys_p, tool_p = text(system), torch.cat([text(tool_len) for _ in range(tools)])
    snap = text(snapshot)
    history = [torch.empty(0, dtype=torch.long) for _ in range(agents)]
    reqs = []
    for t in range(turns):
        if t:
            snap = torch.cat([snap, text(growth)])
        for a in range(agents):
            msg = text(message)
            prompt = torch.cat([sys_p, tool_p, snap, history[a], msg])
            reqs.append(Request(f"agent{a}/turn{t}", prompt, decode_tokens=decode_tokens))
            history[a] = torch.cat([history[a], msg, text(tool_result)])
    return Trace("multi_agent_build", reqs, "system | tools | growing snapshot | own history | message")


def repo_qa(snapshot: int = 16384, questions: int = 16, system: int = 512, q_len: tuple[int, int] = (32, 256),
            vocab: int = 4096, seed: int = 1, decode_tokens: int = 16) -> Trace:
    """One large static code snapshot followed by many short questions."""
    text = _Text(seed, vocab)
    sys_p, repo = text(system), text(snapshot)
    lens = torch.randint(q_len[0], q_len[1] + 1, (questions,), generator=text.g).tolist()
    reqs = [Request(f"q{i}", torch.cat([sys_p, repo, text(n)]), decode_tokens=decode_tokens) for i, n in enumerate(lens)]
    return Trace("repo_qa", reqs, "system | snapshot | question")


def multi_project_qa(projects: int = 8, requests: int = 64, zipf_s: float = 1.2, system: int = 512,
                     snapshot: int = 3072, q_len: tuple[int, int] = (32, 128), vocab: int = 4096, seed: int = 5,
                     decode_tokens: int = 8) -> Trace:
    """Questions about several code bases, chosen with Zipf popularity (project k with weight
    1 / (k + 1)^zipf_s): a working set larger than a small cache, where the eviction policy matters."""
    text = _Text(seed, vocab)
    sys_p = text(system)
    snaps = [text(snapshot) for _ in range(projects)]
    w = torch.tensor([1.0 / (k + 1) ** zipf_s for k in range(projects)])
    picks = torch.multinomial(w, requests, replacement=True, generator=text.g).tolist()
    lens = torch.randint(q_len[0], q_len[1] + 1, (requests,), generator=text.g).tolist()
    reqs = [Request(f"p{p}/q{i}", torch.cat([sys_p, snaps[p], text(n)]), decode_tokens=decode_tokens)
            for i, (p, n) in enumerate(zip(picks, lens))]
    return Trace("multi_project_qa", reqs, "system | project snapshot (Zipf popularity) | question")


def layout_ablation(requests: int = 8, system: int = 512, tools: int = 1024, docs: int = 4096, dynamic: int = 48,
                    question: int = 96, vocab: int = 4096, seed: int = 2, decode_tokens: int = 16) -> dict[str, Trace]:
    """The same content in two orders: cacheable parts first, or dynamic content (a user
    profile, a timestamp) early. Returns {"cacheable_first": ..., "dynamic_early": ...}."""
    text = _Text(seed, vocab)
    sys_p, tool_p, doc_p = text(system), text(tools), text(docs)
    dyn = [text(dynamic) for _ in range(requests)]
    qs = [text(question) for _ in range(requests)]
    first = [Request(f"r{i}", torch.cat([sys_p, tool_p, doc_p, dyn[i], qs[i]]), decode_tokens=decode_tokens)
             for i in range(requests)]
    early = [Request(f"r{i}", torch.cat([sys_p, dyn[i], tool_p, doc_p, qs[i]]), decode_tokens=decode_tokens)
             for i in range(requests)]
    return {"cacheable_first": Trace("cacheable_first", first, "system | tools | docs | dynamic | question"),
            "dynamic_early": Trace("dynamic_early", early, "system | dynamic | tools | docs | question")}


def perturbations(system: int = 1024, tools: int = 8, tool_len: int = 128, docs: int = 2048, question: int = 64,
                  header: int = 16, vocab: int = 4096, seed: int = 3, decode_tokens: int = 8) -> dict[str, Trace]:
    """A base request, then the same request after one small change that breaks the prefix.

    Variants: `system_token` (one token of the system prompt changed, at its middle),
    `tool_order` (two tool schemas swapped), `timestamp` (a header of `header` tokens that
    changes per request, placed first). Each trace is [base, variant]; `timestamp`'s base
    has its own header too.
    """
    text = _Text(seed, vocab)
    sys_p = text(system)
    tool_list = [text(tool_len) for _ in range(tools)]
    doc_p, q = text(docs), text(question)
    base = torch.cat([sys_p, *tool_list, doc_p, q])
    sys2 = sys_p.clone()
    sys2[system // 2] = (sys2[system // 2] + 1 - 4) % (vocab - 4) + 4
    swapped = list(tool_list)
    swapped[1], swapped[tools - 2] = swapped[tools - 2], swapped[1]
    h1, h2 = text(header), text(header)
    mk = lambda name, a, b: Trace(name, [Request("base", a, decode_tokens=decode_tokens),
                                         Request("variant", b, decode_tokens=decode_tokens)])
    return {
        "system_token": mk("system_token", base, torch.cat([sys2, *tool_list, doc_p, q])),
        "tool_order": mk("tool_order", base, torch.cat([sys_p, *swapped, doc_p, q])),
        "timestamp": mk("timestamp", torch.cat([h1, base]), torch.cat([h2, base])),
    }


def cold_start(requests: int = 6, shared: int = 4096, private: int = 256, vocab: int = 4096, seed: int = 4,
               decode_tokens: int = 8) -> tuple[torch.Tensor, Trace]:
    """A shared prefix (system, tools, docs) that a server can warm up and pin at start-up,
    and a trace of requests that each extend it. Returns (prefix, trace)."""
    text = _Text(seed, vocab)
    prefix = text(shared)
    reqs = [Request(f"r{i}", torch.cat([prefix, text(private)]), decode_tokens=decode_tokens) for i in range(requests)]
    return prefix, Trace("cold_start", reqs, "shared prefix | private")


# -- replaying --------------------------------------------------------------------------------

@dataclass
class RequestResult:
    name: str
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    ttft_s: float
    theoretical_hit: int


def replay(engine, trace: Trace, decode_tokens: int | None = None) -> list[RequestResult]:
    """Run each request through `engine`: prefill (with its namespace), decode, finish."""
    theory = trace.theoretical_hits()
    out = []
    for r, th in zip(trace.requests, theory):
        seq = engine.new_sequence()
        engine.prefill(seq, r.token_ids, namespace=r.namespace)
        n = r.decode_tokens if decode_tokens is None else decode_tokens
        if n:
            engine.decode(seq, n)
        st = engine.stats(seq)
        out.append(RequestResult(r.name, st.prompt_tokens, st.cached_tokens, st.computed_tokens, st.ttft_s, th))
        engine.finish(seq)
    return out


@dataclass(frozen=True)
class TTFTComparison:
    """One trace replayed `repeats` times without (`off`) and with (`on`) a treatment, each replay on a fresh engine.

    off_s, on_s: [repeats][requests] each request's TTFT in seconds, replay by replay (off and on interleaved, so
    repeat r's pair ran back to back). off, on: per request, the counts of the replays (identical in every repeat:
    checked) and the median TTFT over the repeats. warmup_requests: how many of the trace's first requests one
    untimed replay of each ran before them (0: none). engines: (off, on), the engines of the last repeat, to read
    their stores and caches after the run, when `compare_ttft(keep_engines=True)` (else (None, None): an engine holds
    its whole K/V pool, so a kept comparison keeps two pools alive; not compared, not printed).
    """
    off_s: tuple[tuple[float, ...], ...]
    on_s: tuple[tuple[float, ...], ...]
    off: list[RequestResult]
    on: list[RequestResult]
    warmup_requests: int
    engines: tuple[object, object] = field(default=(None, None), compare=False, repr=False)

    @property
    def warmup(self) -> bool:
        return self.warmup_requests > 0

    @property
    def repeats(self) -> int:
        return len(self.off_s)

    def without_engines(self) -> "TTFTComparison":
        """This comparison with its kept engines dropped (`engines` (None, None)), so their K/V pools can go once read."""
        return replace(self, engines=(None, None))

    def ratios(self, requests: slice | None = None) -> list[float]:
        """Per repeat, off's summed TTFT over on's, over `requests` (default: all): a paired ratio per repeat."""
        if requests is not None and not isinstance(requests, slice):
            raise TypeError(f"requests must be a slice of the trace's requests or None, got {type(requests).__name__}")
        sl = requests if requests is not None else slice(None)
        if not self.off_s[0][sl]:
            raise ValueError(f"requests must select at least one of the {len(self.off_s[0])} requests, got {sl}")
        return [sum(a[sl]) / sum(b[sl]) for a, b in zip(self.off_s, self.on_s)]

    def speedup(self, requests: slice | None = None) -> tuple[float, float, float]:
        """(median, lowest, highest) of the paired per-repeat ratios `ratios(requests)`: how many times lower the
        treated TTFT is, with the spread over the repeats."""
        r = self.ratios(requests)
        return statistics.median(r), min(r), max(r)


def compare_ttft(make_engine: Callable[[bool], object], trace: Trace, repeats: int = 3, warmup: bool = True,
                 decode_tokens: int | None = None, warmup_requests: int | None = 2,
                 keep_engines: bool = False) -> TTFTComparison:
    """Replay `trace` on `make_engine(False)` and `make_engine(True)` (a fresh engine per replay), interleaved
    off, on, off, on, ... `repeats` times. A timing claim reads the median of the paired per-repeat ratios
    (`TTFTComparison.speedup`), never one replay.

    warmup: first, one untimed replay of the trace's first `warmup_requests` requests (None: all of them) on an
    engine of each kind, so that lazy imports, first calls and the allocator's first growth fall outside the
    timings. Two requests are the default: the second meets the first's blocks, so the cache's hit path is warmed
    too, at a fraction of a whole replay's cost.
    keep_engines: return the last repeat's two engines (`TTFTComparison.engines`) to read their caches and stores;
    off by default, since each holds its K/V pool for as long as the comparison lives.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int):
        raise TypeError(f"repeats must be an int, got {type(repeats).__name__}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not isinstance(warmup, bool):
        raise TypeError(f"warmup must be a bool, got {type(warmup).__name__}")
    if not isinstance(keep_engines, bool):
        raise TypeError(f"keep_engines must be a bool, got {type(keep_engines).__name__}")
    if warmup_requests is not None:
        if isinstance(warmup_requests, bool) or not isinstance(warmup_requests, int):
            raise TypeError(f"warmup_requests must be an int or None, got {type(warmup_requests).__name__}")
        if warmup_requests < 1:
            raise ValueError(f"warmup_requests must be at least 1 (or None: the whole trace), got {warmup_requests}")
    if not callable(make_engine):
        raise TypeError(f"make_engine must be callable (bool -> Engine), got {type(make_engine).__name__}")
    n_warm = 0
    if warmup:
        head = Trace(trace.name, trace.requests[:warmup_requests], trace.notes)
        n_warm = len(head.requests)
        for treated in (False, True):
            replay(make_engine(treated), head, decode_tokens)
    runs: dict[bool, list[list[RequestResult]]] = {False: [], True: []}
    last: dict[bool, object] = {}
    for _ in range(repeats):
        for treated in (False, True):
            last[treated] = make_engine(treated)
            runs[treated].append(replay(last[treated], trace, decode_tokens))

    def summarise(rs: list[list[RequestResult]]) -> list[RequestResult]:
        counts = [[(r.prompt_tokens, r.cached_tokens, r.computed_tokens) for r in run] for run in rs]
        if any(c != counts[0] for c in counts):
            raise RuntimeError("the replays of one trace served different token counts: the engine is not "
                               "deterministic in what it caches, so their TTFTs are not comparable")
        return [replace(r, ttft_s=statistics.median(run[i].ttft_s for run in rs)) for i, r in enumerate(rs[0])]

    times = {k: tuple(tuple(r.ttft_s for r in run) for run in v) for k, v in runs.items()}
    engines = (last[False], last[True]) if keep_engines else (None, None)
    return TTFTComparison(times[False], times[True], summarise(runs[False]), summarise(runs[True]), n_warm, engines)


@dataclass
class SimResult:
    block_size: int
    num_blocks: int
    policy: str
    hit_tokens: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    evictions: int = 0
    seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        return sum(self.hit_tokens) / sum(self.prompt_tokens)


def model_free_cache(block_size: int = 16, num_blocks: int = 4096, policy: str = "lru") -> PrefixCache:
    """A prefix cache over a bare `BlockTable` (slots reserved, no K/V): what the cache would hit, without a model."""
    return PrefixCache(BlockTable(block_size, num_blocks), policy=policy)


def cache_prompt(cache: PrefixCache, token_ids: torch.Tensor, namespace=None, generated: torch.Tensor | None = None) -> int:
    """Serve one request model-free: attach its cached prefix, reserve the rest (and `generated`),
    insert prompt + generated tokens, release. Returns the prompt tokens that hit."""
    store = cache.table
    seq = store.new_sequence()
    hit = cache.attach(seq, token_ids, namespace)
    extra = 0 if generated is None else len(generated)
    store.reserve(seq, len(token_ids) - hit + extra)
    cache.insert(seq, token_ids if generated is None else torch.cat([token_ids, generated]), namespace)
    store.free(seq)
    return hit


def simulate(trace: Trace, block_size: int = 16, num_blocks: int = 4096, policy: str = "lru", seed: int = 0,
             pin: torch.Tensor | None = None) -> SimResult:
    """Replay `trace` through a block store and prefix cache without a model.

    Slots are reserved but no K/V is written, so it measures what the cache would hit, fast.
    Generated tokens are random ids (they enter the cache with the sequence, as real ones
    would). `pin`: a prefix to cache and pin before the first request.
    """
    cache = model_free_cache(block_size, num_blocks, policy)
    g = torch.Generator().manual_seed(seed)
    res = SimResult(block_size, num_blocks, policy)
    t0 = time.perf_counter()
    if pin is not None:
        cache_prompt(cache, pin)
        cache.pin("warmup", pin)
    for r in trace.requests:
        gen = torch.randint(4, 1 << 20, (r.decode_tokens,), generator=g)
        res.hit_tokens.append(cache_prompt(cache, r.token_ids, r.namespace, gen))
        res.prompt_tokens.append(len(r.token_ids))
    res.evictions = cache.stats.evictions
    res.seconds = time.perf_counter() - t0
    return res
