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

from dataclasses import dataclass

import torch

from ..analysis import peers, turns
from ..core.traffic import cache_bytes
from ..model.checkpoint import config_from_hf
from ..model.engine import Engine
from ..routing.router import Router
from ..storage.summaries import summary_vectors


@dataclass(frozen=True)
class Lossless:
    """A sparsekv method: an engine key ("fp32" or "int8") and a router (None: dense).

    dense_prompt: Quest's protocol instead of routing everything: the question tokens after the context
    are fed densely and only the steps that predict answer tokens are routed (a diagnostic: how much of a
    router's loss comes from routing the question itself).
    """

    name: str
    engine: str
    router: Router | None = None
    budget: int | None = None
    dense_prompt: bool = False


def lossless_methods(scorers, budgets, int8_scorers=("minmax",), seed: int = 0,
                     dense_prompt=()) -> list[Lossless]:
    """Dense and every (scorer, budget) on the float store; dense and `int8_scorers` on the int8 store;
    `dense_prompt` (scorer, budget) pairs also under Quest's protocol (named "scorer@budget qdense")."""
    out = [Lossless("dense", "fp32")]
    out += [Lossless(f"{s}@{b}", "fp32", Router(s, token_budget=b, seed=seed), b) for s in scorers for b in budgets]
    out += [Lossless(f"{s}@{b} qdense", "fp32", Router(s, token_budget=b, seed=seed), b, dense_prompt=True)
            for s, b in dense_prompt]
    out += [Lossless("int8 dense", "int8")]
    out += [Lossless(f"int8 {s}@{b}", "int8", Router(s, token_budget=b, seed=seed), b)
            for s in int8_scorers for b in budgets]
    return out


def peer_methods(presses, budgets, context_tokens: int, bits=(8, 4, 2), sees_question=("SnapKVPress",)) -> list:
    """Dense, each press at the ratio that keeps `budget` context tokens, query-aware variants, and HQQ bits."""
    out = [peers.PeerMethod("hf dense", "dense")]
    for p in presses:
        for b in budgets:
            ratio = round(1.0 - b / context_tokens, 4)
            out.append(peers.PeerMethod(f"{p.removesuffix('Press')}@{b}", "evict", p, ratio))
            if p in sees_question:
                out.append(peers.PeerMethod(f"{p.removesuffix('Press')}+q1@{b}", "evict", p, ratio, sees_question=True))
    out += [peers.PeerMethod(f"hqq{n}", "quant", bits=n) for n in bits]
    return out


def _score(probe: turns.TwoFacts, logits: torch.Tensor) -> dict:
    if probe.answers:
        c = turns.correct(probe, logits)
        return {"q1": int(c[0]), "q2": int(c[1])}
    return {"nll": turns.tail_loss(probe, logits)}


def lossless_rows(engines: dict[str, Engine], probe: turns.TwoFacts, methods: list[Lossless]) -> list[dict]:
    """Prefill `probe.context` once per engine; each method feeds `after[:-1]` on a fork."""
    rows = []
    for key, engine in engines.items():
        seq = engine.new_sequence()
        engine.prefill(seq, probe.context)
        c = engine.store.config
        geom = dict(layers=c.num_layers, kv_heads=c.num_kv_heads, head_dim=c.head_dim, itemsize=c.itemsize,
                    block_size=c.block_size, kv_bits=c.kv_bits, summaries_held=summary_vectors(c.summaries, c),
                    summary_itemsize=c.summary_itemsize)
        try:
            for m in (m for m in methods if m.engine == key):
                child = engine.fork(seq)
                try:
                    logits = _feed(engine, child, probe, m)
                    st = engine.stats(child)
                    read_vectors = m.router.scorer.vectors(c) if m.router is not None else 0
                    model = cache_bytes("lossless", tokens=child.num_tokens, budget=m.budget,
                                        summaries_read=read_vectors, **geom)
                    rows.append({"method": m.name, "family": "lossless" if key == "fp32" else "lossless int8",
                                 "budget": m.budget, **_score(probe, logits), "held": model.held, "read": model.read,
                                 "held_measured": engine.store.sequence_bytes(child),
                                 "step_s": sum(s.seconds for s in st.steps) / max(1, len(st.steps))})
                finally:
                    engine.finish(child)
        finally:
            engine.finish(seq)
    return rows


def _feed(engine: Engine, seq, probe: turns.TwoFacts, m: Lossless) -> torch.Tensor:
    """Logits of after[:-1] on `seq`: every step routed, or (dense_prompt) only the answer-predicting ones."""
    feed = probe.after[:-1]
    if not m.dense_prompt or m.router is None:
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
