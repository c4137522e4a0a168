"""Notebook 12: a hybrid model at long context (Gemma 3 270M: 15 sliding-window layers of 512 tokens, 3 global).

Three questions, each answered from the same prefills:
  * how far the model's own retrieval reaches (dense accuracy by length, passkey and a needle in real prose);
  * what routing the global layers keeps of it, at each budget, for every router (paired with dense on the same
    prompts: only where dense answers does a router have something to keep);
  * where routing still pays once sliding layers bound most of the cache (the byte model, checked against the
    store's own counts, projected to 128k and 1M tokens).

Each prompt is prefilled once (`observe.prefill_probe`); dense and every router answer it on copy-on-write forks.
Prompts of one task share their haystack up to the needle, and are taken deepest needle first, so with the
Engine's prefix cache each prefill reuses the blocks of the one before up to its own needle (the hybrid cache
needs each sliding group's window there too, which it keeps while the pool has room: `storage.hybrid_cache`).
Rows are flat dicts: {task, length, prompt, depth, method, correct}.
"""
from __future__ import annotations

import random
import time

from ..analysis import corpus, observe, prompts
from ..analysis.stats import mcnemar, wilson
from ..core.traffic import hybrid_cache_bytes
from ..model.engine import Engine
from ..routing.router import Router, RouterConfig
from .realmodel import Protocol, methods

TASKS = ("passkey", "prose")


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not progress, leave=False)


def probe_set(tok, task: str, length: int, n: int, seed: int = 0, jitter: bool = False) -> list[prompts.PromptProbe]:
    """`n` prompts of `length` tokens for `task`, needles at depths spread over [0.05, 0.95], deepest first.
    `jitter`: each depth drawn uniformly within its own 1/n slot of that range instead (still deepest first), so
    a set with another seed holds new depths as well as new needles."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    rng = random.Random(seed * 1_000_003 + length)
    if jitter:
        depths = [0.05 + 0.9 * (i + rng.random()) / n for i in range(n)][::-1]
    else:
        depths = [0.05 + 0.9 * i / max(1, n - 1) for i in range(n)][::-1]
    if task == "passkey":
        filler = tok(prompts.PASSKEY_FILLER * (length // 8 + 16), add_special_tokens=False)["input_ids"]
        return [prompts.passkey(tok, length, d, rng.randrange(10000, 99999), filler) for d in depths]
    hay = tok(corpus.haystack("prose"), add_special_tokens=False)["input_ids"]
    return [prompts.text_needle(tok, hay, "prose", length, d, seed=rng.randrange(1 << 30)) for d in depths]


def answer_grid(engine: Engine, tok, lengths, n_prompts: int | dict[int, int], routers: dict,
                route_lengths=(), tasks=TASKS, seed: int = 0, progress: bool = True,
                jitter: bool = False) -> tuple[list[dict], dict]:
    """Every prompt answered densely, and by every router at the lengths in `route_lengths`. `n_prompts` is one
    count for every length, or {length: count} naming every length. `routers`: {name: None (dense), a Router, or
    a realmodel.Protocol (a router with its own dense layers)}. `jitter`: probe_set's.

    Returns (rows, seconds): rows {task, length, prompt, depth, method, correct, steps}; seconds per
    (task, length): {"prefill": ..., "answer": ...} wall time, for the run's own budget.
    """
    counts = prompt_counts(lengths, n_prompts)
    rows, secs = [], {}
    total = len(tasks) * sum(counts.values())
    bar = _bar(total, "prompts", progress)
    for task in tasks:
        for L in lengths:
            pre = ans = 0.0
            for i, probe in enumerate(probe_set(tok, task, L, counts[L], seed, jitter)):
                t0 = time.perf_counter()
                seq = observe.prefill_probe(engine, probe.ids)
                t1 = time.perf_counter()
                for name, r in routers.items():
                    if r is not None and L not in route_lengths:
                        continue
                    dense_layers = None
                    if isinstance(r, Protocol):
                        r, dense_layers = r.router, r.dense_layers
                    a = observe.score_answer(engine, seq, probe.ids[-1], probe.answer, r, dense_layers)
                    rows.append({"task": task, "length": L, "prompt": i, "depth": probe.depth, "method": name,
                                 "correct": bool(a.correct), "steps": a.steps})
                engine.finish(seq)
                pre, ans = pre + t1 - t0, ans + time.perf_counter() - t1
                bar.update()
            secs[task, L] = {"prefill": pre, "answer": ans}
    bar.close()
    return rows, secs


FORCED_BLOCKS = RouterConfig.sink_blocks + RouterConfig.local_blocks     # what every router here reads first


def block_size_grid(model, tok, length: int, n_prompts: int, block_sizes, scorers, budgets, tasks=("passkey",),
                    seed: int = 0, progress: bool = True, jitter: bool = False, **engine_kw) -> list[dict]:
    """`answer_grid` on one engine per block size, the same prompts (same seed) and token budgets on each.

    A budget runs at a block size only where it leaves at least one block to choose beyond the forced sink and
    local blocks (budget // block_size > FORCED_BLOCKS): at 64 tokens in 32-token blocks a router could only read
    the forced two. Dense runs at every block size (the store is exact, so its answers should not move with it).
    `engine_kw` go to each Engine (e.g. summaries=... for a scorer that reads one the default store lacks).
    Returns answer_grid's rows, each with its "block_size".
    """
    out = []
    for bs in block_sizes:
        engine = Engine(model, block_size=bs, num_blocks=3 * (length // bs + 64), prefix_cache=True, progress=False,
                        **engine_kw)
        routers = methods(scorers, [b for b in budgets if b // bs > FORCED_BLOCKS], seed)
        rows, _ = answer_grid(engine, tok, [length], n_prompts, routers, route_lengths=[length], tasks=tasks,
                              seed=seed, progress=progress, jitter=jitter)
        out += [{**r, "block_size": bs} for r in rows]
    return out


def prompt_counts(lengths, n_prompts: int | dict[int, int]) -> dict[int, int]:
    """{length: prompts} from one count or a dict (keys ints, or their strings as papermill passes them); a length
    the dict leaves out, or a count below 1, is refused."""
    if isinstance(n_prompts, dict):
        try:       # papermill's parameters arrive through JSON, whose keys are strings
            n_prompts = {int(k): v for k, v in n_prompts.items()}
        except (TypeError, ValueError):
            raise ValueError(f"n_prompts' keys must be token lengths, got {sorted(map(str, n_prompts))}") from None
        missing = [L for L in lengths if L not in n_prompts]
        if missing:
            raise ValueError(f"n_prompts must name every length; missing {missing}")
        counts = {L: n_prompts[L] for L in lengths}
    elif isinstance(n_prompts, int) and not isinstance(n_prompts, bool):
        counts = {L: n_prompts for L in lengths}
    else:
        raise TypeError(f"n_prompts must be an int or a dict {{length: int}}, got {type(n_prompts).__name__}")
    bad = {L: n for L, n in counts.items() if not isinstance(n, int) or n < 1}
    if bad:
        raise ValueError(f"n_prompts must be at least 1 per length, got {bad}")
    return counts


def accuracy(rows: list[dict]) -> list[dict]:
    """Per (task, length, method): correct k of n prompts, the accuracy and its Wilson 95% interval."""
    cells: dict[tuple, list[bool]] = {}
    for r in rows:
        cells.setdefault((r["task"], r["length"], r["method"]), []).append(r["correct"])
    out = []
    for (task, L, m), xs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "dense", kv[0][2])):
        lo, hi = wilson(sum(xs), len(xs))
        out.append({"task": task, "length": L, "method": m, "k": sum(xs), "n": len(xs), "acc": sum(xs) / len(xs),
                    "lo": lo, "hi": hi})
    return out


def versus_dense(rows: list[dict]) -> list[dict]:
    """Per (task, length, routed method): McNemar against dense on the same prompts, and `kept`, the share of the
    prompts dense answered that the method also answered (None where dense answered none)."""
    by = {(r["task"], r["length"], r["method"], r["prompt"]): r["correct"] for r in rows}
    out = []
    for task, L, m in sorted({(r["task"], r["length"], r["method"]) for r in rows if r["method"] != "dense"}):
        ids = sorted(p for (t, l, mm, p) in by if (t, l, mm) == (task, L, m))
        dense = [by[task, L, "dense", p] for p in ids]
        mine = [by[task, L, m, p] for p in ids]
        test = mcnemar(mine, dense)
        answered = [x for x, d in zip(mine, dense) if d]
        out.append({"task": task, "length": L, "method": m, **test, "dense_right": len(answered),
                    "kept": sum(answered) / len(answered) if answered else None})
    return out


def anatomy_at(engine: Engine, tok, length: int, steps: int, routers: dict[str, Router]) -> list[dict]:
    """Attention anatomy of the global layers at `length` tokens of real prose: `observe.anatomy` over the next
    `steps` tokens (sliding layers are skipped there)."""
    ids = [tok.bos_token_id] + corpus.take(tok, corpus.haystack("prose"), length + steps)
    seq = engine.new_sequence()
    engine.prefill(seq, ids[:length])
    try:
        return observe.anatomy(engine, seq, ids[length:length + steps], routers)
    finally:
        engine.finish(seq)


def byte_rows(cfg, contexts, budgets, layout) -> list[dict]:
    """The byte model at each context: held and per-step read bytes of one sequence, dense and routed at each budget,
    for this store (sliding layers bounded by their window) and a layout that keeps every layer's K/V. `layout`: a
    `serving.gpu.CacheLayout` (bf16 K/V and summaries by default); weights are not included."""
    from dataclasses import replace

    from ..serving.gpu import sequence_cache
    rows = []
    for n in contexts:
        for keep in (False, True):
            lay = replace(layout, keep_all=keep)
            for b in [None, *budgets]:
                c = sequence_cache(cfg, n, b, lay)
                rows.append({"context": n, "layout": "every layer kept" if keep else "sliding bounded",
                             "budget": b or 0, "method": "dense" if b is None else f"routed@{b}",
                             "held": c.held, "read": c.read})
    return rows


def measured_vs_model(engine: Engine, seq, num_q_heads: int) -> dict:
    """The store's own counts for `seq` against the byte model at the store's widths: bytes held (K/V and every
    summary it keeps, `store.sequence_bytes`) and the K/V bytes one dense decode step reads, as the step's plan
    counts them (`plan.dense_bytes` for each global layer, `plan.windows` for each sliding one)."""
    from ..attention.plan import plan_decode
    store, cfg = engine.store, engine.model.config
    main = store.stores[0]                       # the global group (LayerGroups), the store itself if flat
    c = main.config
    kv_block, summary_block = main.block_bytes()
    windows = cfg.store_windows
    n_global = sum(1 for w in windows if w == 0)
    s_item = torch_itemsize(c.summary_dtype)
    vectors = summary_block // (n_global * c.num_kv_heads * c.head_dim * s_item)
    model = hybrid_cache_bytes(windows, kv_heads=c.num_kv_heads, head_dim=c.head_dim, tokens=seq.num_tokens,
                               itemsize=c.itemsize, block_size=c.block_size, kv_bits=c.kv_bits, summaries_held=vectors,
                               summary_itemsize=s_item)
    plan = plan_decode(store, seq, num_q_heads, router=None)
    read = n_global * plan.dense_bytes[0].kv_bytes
    for gi, w in enumerate(store.group_windows):
        if w:
            read += len(store.groups[gi].layers) * plan.windows[gi][0][3].kv_bytes
    return {"tokens": seq.num_tokens, "held_store": store.sequence_bytes(seq), "held_model": model.held,
            "read_plan": read, "read_model": model.read}


def torch_itemsize(dtype) -> int:
    import torch
    return torch.empty((), dtype=dtype).element_size()


__all__ = ["TASKS", "probe_set", "answer_grid", "prompt_counts", "accuracy", "versus_dense", "anatomy_at", "byte_rows",
           "measured_vs_model"]
