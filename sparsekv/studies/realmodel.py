"""Grids for notebook 08: the real model under every router and budget, one prefill per prompt.

Each prompt is prefilled once; every method then decodes on a copy-on-write fork
(`Engine.fork`), so a grid costs decode steps rather than prefills. Methods are named
"dense" or "<scorer>@<token budget>" and bound once in `methods()`.
Rows are flat dicts, ready for `study.mean_of` / `study.pivot`.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..analysis import corpus, observe
from ..analysis import prompts as probe_text  # not `prompts`: passkey_grid's count is called that
from ..model.engine import Engine
from ..routing.router import Router


def methods(scorers, budgets, seed: int = 0, union=()) -> dict[str, Router | None]:
    """{"dense": None, "minmax@128": Router(...), ...}: the routers of a grid, built once. Each scorer in `union`
    also as "minmax+union@128": chosen per query head at the same K/V bytes (Router's gqa="union")."""
    out: dict[str, Router | None] = {"dense": None}
    out.update({f"{s}@{b}": Router(s, token_budget=b, seed=seed) for s in scorers for b in budgets})
    out.update({f"{s}+union@{b}": Router(s, token_budget=b, seed=seed, gqa="union") for s in union for b in budgets})
    return out


@dataclass(frozen=True)
class Protocol:
    """A router and the decode protocol around it, as one method of a grid: `dense_layers` leading attention
    layers read densely (None: the engine's own), the rest routed by `router`."""

    router: Router
    dense_layers: int | None = None


QUEST_DENSE_LAYERS = 2      # Quest's passkey script decodes layers 0 and 1 densely


def quest_methods(scorers, budgets, seed: int = 0) -> dict[str, Protocol]:
    """{"minmax+quest@64": Protocol(...), ...}: each scorer under Quest's passkey protocol. No sink block is
    forced, only the block being written (it holds the current token), and the first QUEST_DENSE_LAYERS layers
    are read densely, so a step reads those layers' whole K/V on top of the budget's."""
    return {f"{s}+quest@{b}": Protocol(Router(s, token_budget=b, sink_blocks=0, local_blocks=1, seed=seed),
                                       QUEST_DENSE_LAYERS) for s in scorers for b in budgets}


def step_bytes(method, store_config, num_q_heads: int, num_tokens: int):
    """The bytes one decode step reads over every layer (core.traffic's model, a StepTraffic) for a grid's method:
    None (dense), a Router with a token budget, or a Protocol (its dense layers read like dense). The oracle is
    charged every key it scores; any other scorer its summary vectors under `store_config` (a StoreConfig)."""
    from ..core import traffic
    c = store_config
    geo = dict(num_kv_heads=c.num_kv_heads, block_size=c.block_size, head_dim=c.head_dim, itemsize=c.itemsize,
               num_q_heads=num_q_heads)
    dense = traffic.dense_traffic(num_tokens, **geo)
    router, n_dense = (method.router, method.dense_layers or 0) if isinstance(method, Protocol) else (method, 0)
    if router is None:
        return sum([dense] * c.num_layers, traffic.StepTraffic())
    if router.token_budget is None:
        raise ValueError(f"step_bytes needs a dense method or a token_budget router, got {router!r}")
    routed = traffic.routed_traffic(num_tokens, router.token_budget, summary_vectors=0, **geo)
    if router.scorer.name == "oracle":
        routed = routed + traffic.key_traffic(num_tokens, c.num_kv_heads, c.head_dim, c.summary_itemsize)
    else:
        vectors = router.scorer.vectors(c)
        routed = routed + traffic.summary_traffic(-(-num_tokens // c.block_size) * c.num_kv_heads, vectors,
                                                  c.head_dim, c.summary_itemsize)
    return sum([dense] * n_dense + [routed] * (c.num_layers - n_dense), traffic.StepTraffic())


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not progress, leave=False)


def passkey_grid(engine: Engine, tok, lengths, prompts: int, routers: dict, seed: int = 0,
                 progress: bool = True) -> list[dict]:
    """Passkey at each length, `prompts` depths spread over [0.05, 0.95], every method.

    The prompts of one length share their filler up to the needle. With an engine built with
    `prefix_cache=True`, they are taken deepest needle first, so each prompt's prefill reuses the
    cached blocks of the one before up to its own needle (the cache is the suite's own, and the
    answers are the same: the blocks are exact).
    Returns rows {length, depth, method, correct, steps, step_s}. (Prefill times are not returned: with
    cached prefixes they measure the cache, not prefill; notebook 08 times prefill on its own.)
    """
    import random
    rng = random.Random(seed)
    filler = tok(probe_text.PASSKEY_FILLER * (max(lengths) // 8 + 16), add_special_tokens=False)["input_ids"]
    depths = [0.05 + 0.9 * i / max(1, prompts - 1) for i in range(prompts)][::-1]      # deepest first
    rows = []
    bar = _bar(len(lengths) * prompts, "passkey prompts", progress)
    for L in lengths:
        for d in depths:
            probe = probe_text.passkey(tok, L, d, rng.randrange(10000, 99999), filler)
            seq = observe.prefill_probe(engine, probe.ids)
            for name, r in routers.items():
                a = observe.score_answer(engine, seq, probe.ids[-1], probe.answer, r)
                rows.append({"length": L, "depth": d, "method": name, "correct": float(a.correct), "steps": a.steps,
                             "step_s": statistics.median(a.step_seconds)})
            engine.finish(seq)
            bar.update()
    bar.close()
    return rows


def needle_grid(engine: Engine, tok, kinds, length: int, depths, routers: dict, progress: bool = True) -> list[dict]:
    """A fact planted in real prose and real code at each depth; every method answers it."""
    rows = []
    bar = _bar(len(kinds) * len(depths), "needles in real text", progress)
    for kind in kinds:
        hay = tok(corpus.haystack(kind), add_special_tokens=False)["input_ids"]
        for i, d in enumerate(depths):
            probe = probe_text.text_needle(tok, hay, kind, length, d, seed=i)
            seq = observe.prefill_probe(engine, probe.ids)
            for name, r in routers.items():
                a = observe.score_answer(engine, seq, probe.ids[-1], probe.answer, r)
                rows.append({"kind": kind, "depth": d, "method": name, "correct": float(a.correct)})
            engine.finish(seq)
            bar.update()
    bar.close()
    return rows


def document_grid(engine: Engine, tok, kinds, length: int, tail: int, routers: dict, dense_layers,
                  anatomy_steps: int, anatomy_routers: dict, progress: bool = True) -> tuple[list[dict], list[dict]]:
    """Long real documents: next-token loss over the last `tail` tokens under every method and
    number of dense leading layers, and the attention anatomy of the first `anatomy_steps` tail tokens.

    Returns (loss rows {kind, method, dense_layers, nll, step_s}, anatomy rows {kind, step, layer, ...}).
    """
    loss_rows, anat_rows = [], []
    runs = [("dense", None, 0)] + [(n, r, dl) for dl in dense_layers for n, r in routers.items() if r is not None]
    bar = _bar(len(kinds) * len(runs), "long documents", progress)
    try:
        for kind in kinds:
            ids = corpus.take(tok, corpus.haystack(kind), length)
            seq = engine.new_sequence()
            engine.prefill(seq, ids[:length - tail - 1])
            for row in observe.anatomy(engine, seq, ids[length - tail - 1:][:anatomy_steps], anatomy_routers):
                anat_rows.append({"kind": kind, **row})
            for name, r, dl in runs:
                nll, secs = observe.tail_nll(engine, seq, ids[length - tail - 1:], r, dense_layers=dl)
                loss_rows.append({"kind": kind, "method": name, "dense_layers": dl, "nll": nll,
                                  "step_s": statistics.median(secs)})
                bar.update()
            engine.finish(seq)
    finally:
        bar.close()
    return loss_rows, anat_rows
