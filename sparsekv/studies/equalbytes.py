"""Lossless routing against lossy caches at equal bytes: the grid behind notebook 09.

Every method sees the same probe (`turns.TwoFacts`: the same context and follow-up token ids) and is
scored by the same functions (`turns.correct`, `turns.tail_loss`). Bytes come from one function,
`core.traffic.cache_bytes`; each row also carries the bytes the method's tensors actually held, so the
byte model is checked against reality on every run.

sparsekv methods prefill the context once per engine (float32 store, and int8 store) and run each router
on a copy-on-write fork: every token after the context is a routed decode step (questions included), so a
router never reads more than its budget after the context. The peers (`peers.run`) prefill per method,
since a press compresses during prefill.
"""
from __future__ import annotations

import torch

from ..analysis import peers, turns
from ..core.traffic import cache_bytes
from ..model.checkpoint import config_from_hf
from ..model.engine import Engine
from ..routing.router import Router
from ..storage.summaries import summary_vectors
from . import questions as qs


def lossless_methods(scorers, budgets, int8_scorers=("minmax",), seed: int = 0,
                     dense_prompt=()) -> list[qs.Lossless]:
    """Dense and every (scorer, budget) on the float store, dense and `int8_scorers` on the int8 store
    (`questions.lossless_methods`: this grid routes every step after the context, so their rule None means
    "routed" here); `dense_prompt` (scorer, budget) pairs also under Quest's protocol, the question's tokens dense
    and only the answer-predicting steps routed (rule "dense", named "scorer@budget qdense")."""
    return qs.lossless_methods(scorers, budgets, seed, int8_scorers) + [
        qs.Lossless(f"{s}@{b} qdense", Router(s, token_budget=b, seed=seed), b, rule="dense") for s, b in dense_prompt]


def peer_methods(presses, budgets, context_tokens: int, bits=(8, 4, 2), sees_question=("SnapKVPress",)) -> list:
    """`questions.peer_methods` with the question-aware variants of `sees_question`: a probe here asks its questions
    once, in one feed, so a press may compress the context together with the first question."""
    return qs.peer_methods(presses, budgets, context_tokens, bits, sees_question)


def _score(probe: turns.TwoFacts, logits: torch.Tensor) -> dict:
    if probe.answers:
        c = turns.correct(probe, logits)
        return {"q1": int(c[0]), "q2": int(c[1])}
    return {"nll": turns.tail_loss(probe, logits)}


def lossless_rows(engines: dict[int, Engine], probe: turns.TwoFacts, methods: list[qs.Lossless]) -> list[dict]:
    """Prefill `probe.context` once per engine ({kv_bits: Engine}, e.g. {0: float, 8: int8}); each method feeds
    `after[:-1]` on a fork of its store's engine."""
    missing = sorted({m.kv_bits for m in methods} - set(engines))
    if missing:
        raise ValueError(f"engines must hold an Engine for every method's kv_bits, missing {missing}")
    rows = []
    for key, engine in engines.items():
        seq = engine.new_sequence()
        engine.prefill(seq, probe.context)
        c = engine.store.config
        geom = dict(layers=c.num_layers, kv_heads=c.num_kv_heads, head_dim=c.head_dim, itemsize=c.itemsize,
                    block_size=c.block_size, kv_bits=c.kv_bits, summaries_held=summary_vectors(c.summaries, c),
                    summary_itemsize=c.summary_itemsize)
        try:
            for m in (m for m in methods if m.kv_bits == key):
                child = engine.fork(seq)
                try:
                    logits = _feed(engine, child, probe, m)
                    st = engine.stats(child)
                    read_vectors = m.router.scorer.vectors(c) if m.router is not None else 0
                    model = cache_bytes("lossless", tokens=child.num_tokens, budget=m.budget,
                                        summaries_read=read_vectors, **geom)
                    rows.append({"method": m.name, "family": "lossless int8" if key else "lossless",
                                 "budget": m.budget, **_score(probe, logits), "held": model.held, "read": model.read,
                                 "held_measured": engine.store.sequence_bytes(child),
                                 "step_s": sum(s.seconds for s in st.steps) / max(1, len(st.steps))})
                finally:
                    engine.finish(child)
        finally:
            engine.finish(seq)
    return rows


def _feed(engine: Engine, seq, probe: turns.TwoFacts, m: qs.Lossless) -> torch.Tensor:
    """Logits of after[:-1] on `seq`: every step routed (rule None or "routed"), or (rule "dense") only the
    answer-predicting ones."""
    feed = probe.after[:-1]
    if m.rule != "dense" or m.router is None:
        return engine.feed(seq, feed, router=m.router)
    routed = {p - 1 for pos in probe.answers for p in pos}          # row p - 1 predicts answer token p
    parts, i = [], 0
    while i < len(feed):
        j = i
        while j < len(feed) and ((j in routed) == (i in routed)):
            j += 1
        parts.append(engine.feed(seq, feed[i:j], router=m.router if i in routed else None))
        i = j
    return torch.cat(parts)


def peer_rows(hf, probe: turns.TwoFacts, methods: list) -> list[dict]:
    """Each peer method on `probe` (one prefill each)."""
    cfg = config_from_hf(hf.config)                   # head_dim as the loader resolves it (ModelConfig, invariant 1)
    geom = dict(layers=cfg.n_layers, kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, itemsize=4)
    rows = []
    for m in methods:
        run = peers.run(hf, probe, m)
        tokens = len(probe.context) + len(probe.after) - 1
        if m.family == "dense":
            model = cache_bytes("dense", tokens=tokens, **geom)
        elif m.family == "evict":
            model = cache_bytes("evict", tokens=tokens, kept=run.cached_tokens, **geom)
        else:
            model = cache_bytes("quant", tokens=tokens, bits=m.bits, group=m.group,
                                residual=peers.residual_tokens(probe, m), **geom)
        rows.append({"method": m.name, "family": m.family, "budget": None, "ratio": m.ratio, "bits": m.bits,
                     **_score(probe, run.logits), "held": model.held, "read": model.read,
                     "held_measured": run.held_bytes, "kept_tokens": run.cached_tokens, "seconds": run.seconds})
    return rows
