"""Many independent questions on one long document, every method on the same ids: the paired-question study.

A document of the task family (`analysis.tasks`) plants 20-30 facts at recorded depths and asks one question per
fact. Each method prefills the document once and answers every question on its own copy of the prefilled cache,
so no answer depends on another (no order or priming confound), and all methods answer the same questions:
their outcomes are paired, question by question.

    lossless  sparsekv's store (exact K/V in blocks) with a router; one prefill serves every router: each question is
              asked on a copy-on-write fork (`tasks.ask`).
    peers     transformers with a kvpress press (eviction at prefill) or an HQQ-quantised cache; one prefill per
              method, each question on a deep copy of the compressed cache (`peer_answers`).

The rule for the question (stated; every method gets the same one): "dense" feeds the question's tokens in one
dense pass over whatever the method holds (Quest's protocol, and the only one a press can follow: it has nothing
to route), then scores the answer teacher-forced, every answer step decoded by the method (routed for a router).
"routed" (routers only) routes the question's tokens too.

Correct means teacher-forced greedy (`observe.score_answer`): every answer token is the step's argmax. The peers'
logits come from transformers' float32 model of the same checkpoint; `check.dense_agreement` in the notebook
compares sparsekv's dense answers with transformers' dense answers question by question.

Bytes (`method_bytes`) are both kinds, per step and held, each as a fraction of a bf16 dense cache of the same
tokens (`core.traffic.cache_bytes`, the byte model notebook 09 checks against held tensors).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..analysis import peers, stats, tasks
from ..core.traffic import CacheBytes, cache_bytes, hybrid_cache_bytes
from ..routing.router import Router
from ..routing.scorers import SCORERS
from ..storage.summaries import summary_vectors
from . import equalbytes

RULES = ("dense", "routed")


@dataclass(frozen=True)
class Lossless:
    """A sparsekv method: a router (None: dense) over the engine's store."""

    name: str
    router: Router | None = None
    budget: int | None = None


def lossless_methods(scorers, budgets, seed: int = 0) -> list[Lossless]:
    """Dense, then every scorer at every token budget (named "scorer@budget")."""
    return [Lossless("dense")] + [Lossless(f"{s}@{b}", Router(s, token_budget=b, seed=seed), b)
                                  for s in scorers for b in budgets]


def peer_methods(presses, budgets, context_tokens: int, bits=(8, 4, 2)) -> list[peers.PeerMethod]:
    """transformers dense, each press at the ratio that keeps `budget` of `context_tokens`, and HQQ at `bits`:
    notebook 09's peers (`equalbytes.peer_methods`) without its question-aware variants, which would see a question
    here that the other methods are asked on their own copies."""
    return equalbytes.peer_methods(presses, budgets, context_tokens, bits, sees_question=())


def _row(doc: tasks.Document, i: int, method: str, family: str, correct: bool, steps: int) -> dict:
    q = doc.questions[i]
    return {"task": doc.task, "length": doc.length, "doc": doc.seed, "question": i, "method": method, "family": family,
            "correct": bool(correct), "answer_steps": steps, "depth": min(doc.facts[f].depth for f in q.facts)}


def lossless_answers(engine, doc: tasks.Document, methods: list[Lossless], rule: str = "dense",
                     progress=None) -> list[dict]:
    """Prefill `doc.ids` once; every method answers every question on its own fork. One row per (question, method).

    progress: an optional callable run after each question (a progress bar's update)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    seq = engine.new_sequence()
    rows = []
    try:
        engine.prefill(seq, doc.ids)
        for i, q in enumerate(doc.questions):
            for m in methods:
                a = tasks.ask(engine, seq, q, m.router, "dense" if m.router is None else rule)
                rows.append(_row(doc, i, m.name, "lossless", a.correct, a.steps))
            if progress is not None:
                progress()
    finally:
        engine.finish(seq)
    return rows


@torch.no_grad()
def peer_answers(hf, doc: tasks.Document, methods: list[peers.PeerMethod], progress=None,
                 shared: bool = True) -> tuple[list[dict], dict]:
    """Each method's cache holds `doc.ids` after a prefill with its press or quantised cache; every question then runs
    on a deep copy of that cache: the question and the answer's first len(answer) - 1 tokens in one forward pass, at
    the positions after the document (as kvpress continues them), scored teacher-forced. Returns (rows, held) where
    held[name] is the bytes the compressed cache holds after the prefill (`peers.held_bytes`).

    shared: every method's cache from one dense prefill (`peers.prefill_caches`: the same tensors, one forward instead
    of len(methods)); False prefills once per method, the reference path.
    progress: an optional callable run after each (method, question)."""
    rows, held = [], {}
    n = len(doc.ids)
    caches = peers.prefill_caches(hf, doc.ids, methods) if shared else {}
    for m in methods:
        if shared:
            cache = caches.pop(m.name)
        else:
            cache = peers.make_cache(hf, m)
            with peers.compressing(hf, m):
                hf.model(input_ids=torch.tensor([doc.ids]), past_key_values=cache, use_cache=True)
        held[m.name] = peers.held_bytes(cache)[0]
        for i, q in enumerate(doc.questions):
            feed = q.ids + q.answer[:-1]
            pos = torch.arange(n, n + len(feed))[None]
            logits = hf(input_ids=torch.tensor([feed]), past_key_values=copy.deepcopy(cache), position_ids=pos,
                        use_cache=True).logits[0]
            pred = logits[len(q.ids) - 1:].argmax(-1).tolist()
            wrong = next((j for j, (p, t) in enumerate(zip(pred, q.answer)) if p != t), None)
            rows.append(_row(doc, i, m.name, m.family, wrong is None, len(q.answer) if wrong is None else wrong + 1))
            if progress is not None:
                progress()
    return rows, held


# -- bytes ------------------------------------------------------------------------------------------

def method_bytes(method, tokens: int, *, layers: int, kv_heads: int, head_dim: int, block_size: int = 16,
                 store_config=None, itemsize: int = 2, residual: int | None = None, windows=None,
                 layout: str = "study") -> dict:
    """A decode step's K/V bytes read and the bytes held at `tokens`: {"read", "held"} as fractions of a dense cache
    of `itemsize`-byte elements (2: bf16, the study's reference; dense is 1.0 for both), and "read_bytes",
    "held_bytes" in bytes. `method`: a `Lossless` (its store at `itemsize`, summaries as `store_config` keeps them)
    or a `peers.PeerMethod` (kept tokens from its ratio; HQQ with scales and zero-points of `itemsize` bytes and
    `residual` full-precision tokens, default the method's own, capped at `tokens`).

    windows: a hybrid model's per-layer windows (0: global; `ModelConfig.windows`), or None (every layer global).
    Then only the global layers differ between methods: the store routes them (`core.traffic.hybrid_cache_bytes`)
    and a press compresses them (`peers.compressing`); a sliding layer holds and reads its last min(window, tokens)
    tokens at `itemsize` (the store: whole blocks, `window_cache_bytes`), and the dense reference is the same. HQQ's
    sliding layers: layout "study" counts them quantised over the window (what a hybrid-aware quantised cache
    would hold, the generous count); "transformers" counts what its QuantizedCache holds, every token quantised,
    and a press's sliding layers as transformers' DynamicSlidingWindowLayer holds them (window - 1 tokens)."""
    if layout not in ("study", "transformers"):
        raise ValueError(f"layout must be 'study' or 'transformers', got {layout!r}")
    if windows is not None:
        windows = tuple(int(w) for w in windows)
        if len(windows) != layers or not all(w >= 0 for w in windows):
            raise ValueError(f"windows must give one window >= 0 per layer ({layers}), got {windows!r}")
        if not any(windows):
            windows = None
    geom = dict(kv_heads=kv_heads, head_dim=head_dim, tokens=tokens, itemsize=itemsize)
    n_glob = layers if windows is None else windows.count(0)
    slide = () if windows is None else sorted(set(windows) - {0})

    def per(family, n_layers, **kw):
        return cache_bytes(family, layers=n_layers, **geom, **kw) if n_layers else CacheBytes(0, 0)

    def window(w, family="dense", **kw):       # one sliding group's contiguous cache of its last tokens
        t = min(w - (layout == "transformers"), tokens)
        return cache_bytes(family, layers=windows.count(w), kv_heads=kv_heads, head_dim=head_dim, tokens=t,
                           itemsize=itemsize, **kw)

    def total(glob, slid):
        return CacheBytes(glob.held + sum(x.held for x in slid), glob.read + sum(x.read for x in slid))

    ref = total(per("dense", n_glob), [window(w) for w in slide])
    if isinstance(method, Lossless):
        c = store_config
        held_vectors = summary_vectors(c.summaries, c) if c is not None else 0
        read_vectors = SCORERS[method.router.config.scorer]().vectors(c) if method.router is not None and c else 0
        lay = dict(block_size=block_size, summaries_held=held_vectors, summaries_read=read_vectors)
        if windows is None:
            b = cache_bytes("lossless", layers=layers, budget=method.budget, **lay, **geom)
        else:
            b = hybrid_cache_bytes(windows, kv_heads=kv_heads, head_dim=head_dim, tokens=tokens, budget=method.budget,
                                   itemsize=itemsize, **lay)
    elif method.family == "dense":
        b = ref
    elif method.family == "evict":
        b = total(per("evict", n_glob, kept=max(1, round(tokens * (1 - method.ratio)))), [window(w) for w in slide])
    else:
        res = method.residual if residual is None else residual
        q = dict(bits=method.bits, group=method.group, scale_itemsize=itemsize)
        if layout == "transformers":
            b = per("quant", layers, residual=min(tokens, res), **q)
        else:
            b = total(per("quant", n_glob, residual=min(tokens, res), **q),
                      [window(w, "quant", residual=min(tokens, w, res), **q) for w in slide])
    return {"read": b.read / ref.read, "held": b.held / ref.held, "read_bytes": b.read, "held_bytes": b.held}


# -- statistics --------------------------------------------------------------------------------------

def cells(rows: list[dict], keys=("task", "length", "method")) -> list[dict]:
    """Accuracy per cell (by `keys`): n questions, k correct, accuracy and its Wilson 95% interval."""
    groups: dict[tuple, list[bool]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r["correct"])
    out = []
    for key, vals in groups.items():
        lo, hi = stats.wilson(sum(vals), len(vals))
        out.append({**dict(zip(keys, key)), "n": len(vals), "k": sum(vals), "accuracy": sum(vals) / len(vals),
                    "lo": lo, "hi": hi})
    return out


def paired(rows: list[dict], a: str, b: str, task: str | None = None, length: int | None = None) -> dict:
    """Exact McNemar between methods `a` and `b` on the questions both answered (matched by task, length, document
    and question), within one task and length when given. Returns stats.mcnemar's dict plus acc_a, acc_b."""
    def outcomes(name):
        return {(r["task"], r["length"], r["doc"], r["question"]): r["correct"] for r in rows
                if r["method"] == name and (task is None or r["task"] == task)
                and (length is None or r["length"] == length)}
    oa, ob = outcomes(a), outcomes(b)
    common = sorted(set(oa) & set(ob))
    if not common:
        raise ValueError(f"methods {a!r} and {b!r} answered no common question"
                         + (f" of task {task!r}" if task else "") + (f" at length {length}" if length else ""))
    x, y = [oa[k] for k in common], [ob[k] for k in common]
    return {**stats.mcnemar(x, y), "acc_a": sum(x) / len(x), "acc_b": sum(y) / len(y)}


__all__ = ["RULES", "Lossless", "lossless_methods", "peer_methods", "lossless_answers", "peer_answers",
           "method_bytes", "cells", "paired"]
