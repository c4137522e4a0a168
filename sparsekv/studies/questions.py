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
from dataclasses import dataclass, field

import torch

from ..analysis import observe, peers, stats, tasks
from ..core.traffic import CacheBytes, cache_bytes, hybrid_cache_bytes
from ..routing.router import Router
from ..storage.summaries import summary_vectors

RULES = ("dense", "routed")


def other_rule(rule: str) -> str:
    """The question rule of `RULES` that is not `rule`."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    return next(r for r in RULES if r != rule)


@dataclass
class MethodsRun:
    """What every finished run over sparsekv's methods and the peers' holds (`paired.Study`, `tail_loss.TailStudy`
    add their own results): config: the run's config; model_name; windows: the model's per-layer sliding windows (None:
    all global); lossless: sparsekv's methods (`Lossless`), lossy: the peers' (`Lossy`); rows: one per measured
    (question or token, method); held_measured: peer method -> the bytes its cache held, measured; run_s: wall time of
    the run; nbytes: method -> `method_bytes`; model_vs_held: peer method -> measured held bytes over the byte
    model's."""

    config: object
    model_name: str
    windows: tuple | None
    lossless: list
    lossy: list
    rows: list = field(default_factory=list)
    held_measured: dict = field(default_factory=dict)
    run_s: float = 0.0
    nbytes: dict = field(default_factory=dict)
    model_vs_held: dict = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        """Every method's name, sparsekv's first."""
        return [m.name for m in self.lossless] + [m.name for m in self.lossy]


@dataclass(frozen=True)
class Lossless:
    """A sparsekv method: a router (None: dense) over the engine's store, whose K/V are exact (kv_bits 0) or int8
    codes with a scale per (token, kv head) (kv_bits 8: `Engine(kv_bits=8)`, routing over int8 blocks). rule: the
    question's rule for this method (`RULES`), None for the run's (a router answering under both is two methods)."""

    name: str
    router: Router | None = None
    budget: int | None = None
    kv_bits: int = 0
    rule: str | None = None

    def __post_init__(self):
        if self.rule is not None and (self.rule not in RULES or self.router is None):
            raise ValueError(f"rule must be None or, for a router, one of {RULES}, got {self.rule!r}")


def lossless_methods(scorers, budgets, seed: int = 0, int8_scorers=(), rule_scorers=(),
                     other_rule: str = "routed") -> list[Lossless]:
    """Dense, then every scorer at every token budget (named "scorer@budget"); with `int8_scorers`, "int8 dense" and
    each of them at every budget over int8 blocks ("int8 scorer@budget"); with `rule_scorers`, each of them at every
    budget again under the question rule `other_rule` ("scorer@budget, routed question")."""
    out = [Lossless("dense")] + [Lossless(f"{s}@{b}", Router(s, token_budget=b, seed=seed), b)
                                 for s in scorers for b in budgets]
    if int8_scorers:
        out += [Lossless("int8 dense", kv_bits=8)] + [
            Lossless(f"int8 {s}@{b}", Router(s, token_budget=b, seed=seed), b, kv_bits=8)
            for s in int8_scorers for b in budgets]
    out += [Lossless(rule_name(f"{s}@{b}", other_rule), Router(s, token_budget=b, seed=seed), b, rule=other_rule)
            for s in rule_scorers for b in budgets]
    return out


def rule_name(method: str, rule: str) -> str:
    """The name of `method` answering under the question rule `rule` beside the run's own."""
    return f"{method}, {rule} question"


def peer_methods(presses, budgets, context_tokens: int, bits=(8, 4, 2), sees_question=()) -> list[peers.PeerMethod]:
    """transformers dense, each press at the ratio that keeps `budget` of `context_tokens`, and HQQ at `bits`. The
    presses named in `sees_question` also get a question-aware variant ("SnapKV+q1@budget", compressing the context
    with the first question): none here, where each question is asked on its own copy of one compressed cache, so a
    press that saw one question would hold a cache shaped for it when asked the others (notebook 09's probes use it)."""
    out = [peers.PeerMethod("hf dense", "dense")]
    for p in presses:
        for b in budgets:
            ratio = round(1.0 - b / context_tokens, 4)
            out.append(peers.PeerMethod(f"{p.removesuffix('Press')}@{b}", "evict", p, ratio))
            if p in sees_question:
                out.append(peers.PeerMethod(f"{p.removesuffix('Press')}+q1@{b}", "evict", p, ratio, sees_question=True))
    out += [peers.PeerMethod(f"hqq{n}", "quant", bits=n) for n in bits]
    return out


def _row(doc: tasks.Document, i: int, method: str, family: str, correct: bool, steps: int) -> dict:
    """One answer. A dialogue's second turn (`tasks.two_turn`) is its own task, "<task> 2-turn", with the depth of
    the fact asked first and the order ("earlier first" or "later first"); "text" matches it with the same question
    asked alone (`turn_effect`)."""
    q = doc.questions[i]
    depth = min(doc.facts[f].depth for f in q.facts)
    row = {"task": doc.task, "length": doc.length, "doc": doc.seed, "question": i, "text": q.text, "method": method,
           "family": family, "correct": bool(correct), "answer_steps": steps, "depth": depth, "top1": None,
           "kl": None}
    if q.first is not None:
        first = min(doc.facts[f].depth for f in q.first.facts)
        row.update(task=f"{doc.task} 2-turn", first_depth=first,
                   order="later first" if first > depth else "earlier first")
    return row


def _agree(rows: list[dict], logprobs: dict, reference: str | None) -> None:
    """Give each of one question's rows its answer steps' agreement with `reference`'s (`observe.answer_agreement`):
    "top1" and "kl" (nats, mean over the answer's steps). Without a reference among the methods they stay None."""
    if reference is None:
        return
    for r in rows:
        a = observe.answer_agreement(logprobs[reference], logprobs[r["method"]])
        r["top1"], r["kl"] = a["top1"], a["kl"]


def lossless_answers(engine, doc: tasks.Document, methods: list[Lossless], rule: str = "dense",
                     progress=None) -> list[dict]:
    """Prefill `doc.ids` once per store; every method answers every question on its own fork. One row per
    (question, method), with the answer steps' top-1 agreement and KL against exact dense's (when it is among
    `methods`: every step is then run teacher-forced, also after a wrong one).

    engine: an Engine, or {kv_bits: Engine} when `methods` route over int8 blocks too (e.g. {0: float, 8: int8}).
    progress: an optional callable run after each question (a progress bar's update)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    engines = engine if isinstance(engine, dict) else {0: engine}
    missing = sorted({m.kv_bits for m in methods} - set(engines))
    if missing:
        raise ValueError(f"engine must give an Engine for every method's kv_bits {missing}, got kv_bits "
                         f"{sorted(engines)}")
    reference = next((m.name for m in methods if m.router is None and m.kv_bits == 0), None)
    seqs, rows = {}, []
    try:
        for bits in sorted({m.kv_bits for m in methods}):
            seqs[bits] = engines[bits].new_sequence()
            engines[bits].prefill(seqs[bits], doc.ids)
        for i, q in enumerate(doc.questions):
            mine, logprobs = [], {}
            for m in methods:
                a = tasks.ask(engines[m.kv_bits], seqs[m.kv_bits], q, m.router,
                              "dense" if m.router is None else m.rule or rule,
                              keep_logprobs=reference is not None)
                mine.append(_row(doc, i, m.name, "lossless", a.correct, a.steps))
                logprobs[m.name] = a.logprobs
            _agree(mine, logprobs, reference)
            rows += mine
            if progress is not None:
                progress()
    finally:
        for bits, seq in seqs.items():
            engines[bits].finish(seq)
    return rows


@torch.no_grad()
def peer_answers(hf, doc: tasks.Document, methods: list[peers.PeerMethod], progress=None,
                 shared: bool = True) -> tuple[list[dict], dict]:
    """Each method's cache holds `doc.ids` after a prefill with its press or quantised cache; every question then runs
    on a deep copy of that cache: the question and the answer's first len(answer) - 1 tokens fed causally at the
    positions after the document (`peers.feed`: one forward pass; over a hybrid model's press cache, with per-layer-type
    masks, without which the pass would let each token see the later ones), scored teacher-forced, with the answer steps'
    top-1 agreement and KL against transformers dense's (the method of family "dense", when among `methods`).
    Returns (rows, held) where held[name] is the bytes the compressed cache holds after the prefill
    (`peers.held_bytes`).

    shared: every method's cache from one dense prefill (`peers.prefill_caches`: the same tensors, one forward instead
    of len(methods)); False prefills once per method, the reference path.
    progress: an optional callable run after each (method, question)."""
    rows = []
    n = len(doc.ids)
    if shared:
        caches = peers.prefill_caches(hf, doc.ids, methods)
    else:
        caches = {}
        for m in methods:
            caches[m.name] = peers.make_cache(hf, m)
            with peers.compressing(hf, m):
                hf.model(input_ids=torch.tensor([doc.ids]), past_key_values=caches[m.name], use_cache=True)
    held = {m.name: peers.held_bytes(caches[m.name])[0] for m in methods}
    reference = next((m.name for m in methods if m.family == "dense"), None)
    for i, q in enumerate(doc.questions):
        mine, logprobs = [], {}
        feed = q.ids + q.answer[:-1]
        for m in methods:
            logits = peers.feed(hf, copy.deepcopy(caches[m.name]), feed, n)[len(q.ids) - 1:]   # [len(answer), vocab]
            pred = logits.argmax(-1).tolist()
            wrong = next((j for j, (p, t) in enumerate(zip(pred, q.answer)) if p != t), None)
            mine.append(_row(doc, i, m.name, m.family, wrong is None, len(q.answer) if wrong is None else wrong + 1))
            logprobs[m.name] = torch.log_softmax(logits.float(), -1)
            if progress is not None:
                progress()
        _agree(mine, logprobs, reference)
        rows += mine
    return rows, held


def family(name: str, lossless: list[Lossless], lossy: list[peers.PeerMethod]) -> str:
    """The plotting family of method `name` among a study's methods (`viz.method_style`): dense, a router's scorer
    ("int8 " before it over int8 blocks), a press's name, or HQQ<bits>."""
    for m in lossless:
        if m.name == name:
            return ("int8 " if m.kv_bits else "") + ("dense" if m.router is None else m.router.scorer.name)
    m = next((m for m in lossy if m.name == name), None)
    if m is None:
        raise ValueError(f"name must be one of the study's methods, got {name!r}")
    if m.family == "dense":
        return "dense"
    return m.name.split("@")[0] if m.family == "evict" else f"HQQ{m.bits}"


# -- bytes ------------------------------------------------------------------------------------------

def method_bytes(method, tokens: int, *, layers: int, kv_heads: int, head_dim: int, block_size: int = 16,
                 store_config=None, itemsize: int = 2, residual: int | None = None, windows=None,
                 layout: str = "study") -> dict:
    """A decode step's K/V bytes read and the bytes held at `tokens`: {"read", "held"} as fractions of a dense cache
    of `itemsize`-byte elements (2: bf16, the study's reference; dense is 1.0 for both), and "read_bytes",
    "held_bytes" in bytes. `method`: a `Lossless` (its store at `itemsize`, or int8 codes with an `itemsize` scale per row
    when its kv_bits is 8; summaries as `store_config` keeps them)
    or a `peers.PeerMethod` (kept tokens from its ratio; HQQ with scales and zero-points of `itemsize` bytes and
    `residual` full-precision tokens, default the method's own, capped at `tokens`).

    windows: a hybrid model's per-layer windows (0: global; `ModelConfig.layer_windows`), or None (every layer global).
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
        read_vectors = method.router.scorer.vectors(c) if method.router is not None and c else 0
        lay = dict(block_size=block_size, summaries_held=held_vectors, summaries_read=read_vectors,
                   kv_bits=method.kv_bits, scale_itemsize=itemsize)
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


def agreement_cells(rows: list[dict], keys=("task", "length", "method")) -> list[dict]:
    """Agreement with the method's own engine's dense on the answer tokens, per cell (by `keys`), over the rows that
    have it: n questions, "top1" (the mean over questions of the fraction of answer steps whose argmax agrees with
    dense's) and "kl" (the mean over questions of the mean KL(dense || method) per answer step, nats), each with a
    seeded percentile-bootstrap 95% interval over questions ("top1_lo", "top1_hi", "kl_lo", "kl_hi")."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("kl") is not None:
            groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, rs in groups.items():
        cell = {**dict(zip(keys, key)), "n": len(rs)}
        for name in ("top1", "kl"):
            b = stats.paired_bootstrap([r[name] for r in rs], [0.0] * len(rs))
            cell[name], cell[name + "_lo"], cell[name + "_hi"] = b["mean"], b["lo"], b["hi"]
        out.append(cell)
    return out


def _matched(rows: list[dict], a: str, b: str, field: str, task: str | None, length: int | None) -> tuple[list, list]:
    """Methods `a`'s and `b`'s `field` on the questions both have it for (matched by task, length, document and
    question; within one task and length when given), in question order. ValueError when they share none."""
    def values(name):
        return {(r["task"], r["length"], r["doc"], r["question"]): r[field] for r in rows
                if r["method"] == name and r.get(field) is not None and (task is None or r["task"] == task)
                and (length is None or r["length"] == length)}
    va, vb = values(a), values(b)
    common = sorted(set(va) & set(vb))
    if not common:
        what = {"correct": "an answer", "kl": "a KL to dense"}.get(field, f"a {field!r}")
        raise ValueError(f"methods {a!r} and {b!r} have no common question with {what}"
                         + (f" of task {task!r}" if task else "") + (f" at length {length}" if length else ""))
    return [va[k] for k in common], [vb[k] for k in common]


def paired_kl(rows: list[dict], a: str, b: str, task: str | None = None, length: int | None = None) -> dict:
    """The paired bootstrap (`stats.paired_bootstrap`) of KL(a) - KL(b) on the answer tokens, each method's KL to its
    own engine's dense, over the questions both have it for (matched as in `paired`): {"n", "mean", "lo", "hi"}; a
    negative interval says `a` departs less from dense than `b` does on the same questions."""
    return stats.paired_bootstrap(*_matched(rows, a, b, "kl", task, length))


def turn_effect(rows: list[dict], method: str, task: str) -> dict:
    """Does a first turn change `method`'s answer? Exact McNemar between the question asked alone (task `task`) and
    the same question asked second in a dialogue (task "<task> 2-turn"), matched by document and question text:
    stats.mcnemar's dict with a = alone, b = second turn, plus acc_a and acc_b."""
    def outcomes(t):
        return {(r["length"], r["doc"], r["text"]): r["correct"] for r in rows if r["method"] == method
                and r["task"] == t}
    alone, turn = outcomes(task), outcomes(f"{task} 2-turn")
    common = sorted(set(alone) & set(turn))
    if not common:
        raise ValueError(f"method {method!r} has no question of task {task!r} asked both alone and in a dialogue")
    x, y = [alone[k] for k in common], [turn[k] for k in common]
    return {**stats.mcnemar(x, y), "acc_a": sum(x) / len(x), "acc_b": sum(y) / len(y)}


def paired(rows: list[dict], a: str, b: str, task: str | None = None, length: int | None = None) -> dict:
    """Exact McNemar between methods `a` and `b` on the questions both answered (matched by task, length, document
    and question), within one task and length when given. Returns stats.mcnemar's dict plus acc_a, acc_b."""
    x, y = _matched(rows, a, b, "correct", task, length)
    return {**stats.mcnemar(x, y), "acc_a": sum(x) / len(x), "acc_b": sum(y) / len(y)}


__all__ = ["RULES", "Lossless", "lossless_methods", "peer_methods", "lossless_answers", "peer_answers", "family",
           "method_bytes", "cells", "agreement_cells", "turn_effect", "paired", "paired_kl"]
