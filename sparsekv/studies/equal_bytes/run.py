"""One cell of the equal-bytes study: every method answers every question of a block of documents.

A cell is (model, length, task, split, first document, documents). Per document:

    sparsekv   one prefill per store (block size, K/V codes); every router and sparsekv's dense answers each question
               on its own copy-on-write fork (`analysis.tasks.ask`), under its question rule
    peers      transformers: one dense prefill gives every query-agnostic press's and every quantiser's cache
               (`analysis.peers.prefill_caches`); each question runs on a deep copy. A question-aware press prefills
               the document and the question together under the press, once per question

Every answer is scored teacher-forced (correct = every answer token is the step's argmax) and compared with its own
engine's dense on the same question: top-1 agreement and KL(dense || method) per answer step, mean over the answer.

Bytes (`studies.questions.method_bytes`, against a bf16 dense cache of the document plus 16 tokens):
    read   K/V and summaries a decode step reads
    held   what the method keeps per sequence; a router's store keeps only the summaries its own scorer reads (the
           engine's store keeps more, which changes no answer: the summaries a scorer does not read are never read;
           `tests/test_equal_bytes_study.py` proves it on a store holding only that scorer's summaries)

Dialogues: a task "two-turn-<task>" (DIALOGUE_TASKS) asks each question as the second turn of a dialogue
(`analysis.tasks.two_turn`): another question on the same document, its true answer (teacher-forced), then this
one. Every method holds the first turn's tokens as it holds the question's (prefilled densely, or routed under the
"routed" rule); the row is scored on the second answer. `questions` is then the dialogues per document (2 or 4; half
ask the later fact first), from a document of twice as many facts.

Seeds: document d of task t in split s has seed SPLITS[s] + 1000 * CELL_TASKS.index(t) + d, disjoint from every
earlier notebook's (seeds below 10,000), between the pilot and the study, and between a task and its dialogues.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from ...analysis import observe, peers, tasks
from ...methods import Method
from ...routing.router import Router
from ...routing.scorers import SCORERS, summaries_for
from .. import questions as qs

SPLITS = {"pilot": 900_000, "study": 500_000}       # first seed of each split (documents never shared)
MODELS = ("smollm2", "gemma3-270m")
TWO_TURN = "two-turn-"                              # a dialogue task's prefix
DIALOGUE_TASKS = tuple(TWO_TURN + t for t in ("passkey", "fact-prose", "fact-code", "multi-key"))   # one fact a question
CELL_TASKS = tasks.TASKS + DIALOGUE_TASKS           # a cell's tasks, in the seed blocks' order (TASKS' seeds unchanged)
COLUMNS = ("model", "length", "task", "split", "doc", "question", "method", "line", "family", "engine", "knob",
           "rule", "kv_bits", "block_size", "correct", "answer_steps", "top1", "kl", "read", "held", "read_bytes",
           "held_bytes")


@dataclass(frozen=True)
class Cell:
    """A block of documents of one (model, length, task): the unit a sweep runs and never reruns."""

    model: str
    length: int
    task: str
    split: str = "study"
    doc0: int = 0
    docs: int = 3
    questions: int = 4

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.task not in CELL_TASKS:
            raise ValueError(f"task must be one of {CELL_TASKS}, got {self.task!r}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {tuple(SPLITS)}, got {self.split!r}")
        for name, lo, hi in (("length", 64, 1 << 17), ("doc0", 0, 999), ("docs", 1, 1000), ("questions", 1, 4)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {v!r}")
        if self.doc0 + self.docs > 1000:
            raise ValueError(f"doc0 + docs must be at most 1000 (a task's seed block), got {self.doc0 + self.docs}")
        if self.turns == 2 and self.questions % 2:
            raise ValueError(f"questions must be 2 or 4 for a dialogue task (half of the dialogues ask the later fact "
                             f"first), got {self.questions}")

    @property
    def turns(self) -> int:
        """2 for a dialogue task (each question asked second), else 1."""
        return 2 if self.task.startswith(TWO_TURN) else 1

    @property
    def base_task(self) -> str:
        """The task (`analysis.tasks.TASKS`) whose documents and questions the cell's task uses."""
        return self.task.removeprefix(TWO_TURN)

    def seeds(self) -> list[int]:
        base = SPLITS[self.split] + 1000 * CELL_TASKS.index(self.task)
        return [base + d for d in range(self.doc0, self.doc0 + self.docs)]


def budget_tokens(m: Method, length: int) -> int:
    """A router's token budget: its share of the context, rounded, at least one block."""
    return max(m.block_size, round(m.share * length))


def _lossless(m: Method, length: int) -> qs.Lossless:
    router = None if m.family == "dense" else Router(m.scorer, token_budget=budget_tokens(m, length), seed=0)
    return qs.Lossless(m.name, router, None if router is None else budget_tokens(m, length), kv_bits=m.kv_bits,
                       rule=None if router is None else m.rule)


def _peer(m: Method) -> peers.PeerMethod:
    if m.family == "dense":
        return peers.PeerMethod(m.name, "dense")
    if m.family == "press":
        return peers.PeerMethod(m.name, "evict", press=m.press, ratio=1.0 - m.share)
    return peers.PeerMethod(m.name, "quant", bits=m.bits)


def _check_methods(methods: list[Method]) -> None:
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"methods must have distinct names, got repeats {sorted({n for n in names if names.count(n) > 1})}")
    for m in methods:
        if not isinstance(m, Method):
            raise TypeError(f"methods must be methods.Method values, got {type(m).__name__}")
    engines = {m.engine for m in methods}
    for e in engines:
        if not any(m.family == "dense" and m.engine == e and m.kv_bits == 0 for m in methods):
            raise ValueError(f"methods must include {e}'s exact dense (every method is compared with its own "
                             f"engine's dense)")


def method_bytes(m: Method, tokens: int, store_config, windows) -> dict:
    """`questions.method_bytes` for a Method: a router's store holds only the summaries its scorer reads; sparsekv's
    dense holds none."""
    sc = store_config
    if m.engine == "sparsekv":
        reads = SCORERS[m.scorer].reads if m.family == "router" else ()
        cfg = dataclasses.replace(sc, summaries=tuple(reads), block_size=m.block_size, kv_bits=m.kv_bits)
        lossless = qs.Lossless(m.name, None if m.family == "dense" else Router(m.scorer, token_budget=budget_tokens(
            m, tokens - 16), seed=0), None if m.family == "dense" else budget_tokens(m, tokens - 16), kv_bits=m.kv_bits)
        return qs.method_bytes(lossless, tokens, layers=sc.num_layers, kv_heads=sc.num_kv_heads, head_dim=sc.head_dim,
                               block_size=m.block_size, store_config=cfg, windows=windows)
    return qs.method_bytes(_peer(m), tokens, layers=sc.num_layers, kv_heads=sc.num_kv_heads, head_dim=sc.head_dim,
                           store_config=sc, windows=windows)


@dataclass
class Loaded:
    """A model loaded once for many cells: tokenizer, transformers' float32 model (None if no peer runs), sparsekv
    engines by (block size, kv_bits), the per-layer windows (None: every layer global)."""

    name: str
    tok: object
    hf: object
    engines: dict
    windows: tuple | None


def load(model: str, length: int, methods: list[Method], root: str | Path = "..") -> Loaded:
    """Load `model` (a key of `model.fetch.MODELS`) with one sparsekv engine per store the methods use, each keeping
    the summaries of the scorers routed over it and room for `length` tokens plus a question and its answer."""
    import sparsekv as sk

    from ...model import fetch
    from ...model.checkpoint import converted_folder
    path = fetch.model_path(fetch.MODELS[model], root)
    net = sk.load_model(str(path))
    tok = sk.load_tokenizer(str(path))
    hf = peers.hf_model(converted_folder(Path(path))) if any(m.engine == "transformers" for m in methods) else None
    engines = {}
    stores = sorted({(m.block_size, m.kv_bits) for m in methods if m.engine == "sparsekv"})
    for bs, bits in stores:
        scorers = sorted({m.scorer for m in methods if m.family == "router" and (m.block_size, m.kv_bits) == (bs, bits)})
        engines[(bs, bits)] = sk.Engine(net, block_size=bs, num_blocks=2 * (length // bs + 64), progress=False,
                                        kv_bits=bits, summaries=summaries_for(tuple(scorers)))
    windows = net.config.layer_windows if any(net.config.layer_windows) else None
    return Loaded(fetch.title(str(path)), tok, hf, engines, windows)


def documents(cell: Cell, tok) -> list[tasks.Document]:
    """The cell's documents, each checked (`tasks.check`), with its first `cell.questions` questions; for a dialogue
    task, `cell.questions` second turns (`tasks.two_turn`, drawn by the document's seed) from 2 * questions facts."""
    out = []
    for seed in cell.seeds():
        if cell.turns == 2:
            doc = tasks.make(cell.base_task, tok, cell.length, 2 * cell.questions, seed=seed)
            tasks.check(doc, tok)
            out.append(dataclasses.replace(doc, questions=tasks.two_turn(tok, doc, cell.questions, seed=seed)))
            continue
        n = {"common-words": min(cell.questions, 3),           # its 3 ranks
             "multi-value": 3 * cell.questions}.get(cell.task, cell.questions)   # 3 numbers per key, a key a question
        doc = tasks.make(cell.task, tok, cell.length, n, seed=seed)
        tasks.check(doc, tok)
        out.append(dataclasses.replace(doc, questions=doc.questions[:cell.questions]))
    return out


@torch.no_grad()
def _peer_rows(hf, doc, methods: list[Method]) -> list[tuple]:
    """(question index, method, correct, steps, logprobs) for every transformers method."""
    agnostic = [m for m in methods if not m.question_aware]
    aware = [m for m in methods if m.question_aware]
    out = []
    n = len(doc.ids)
    caches = peers.prefill_caches(hf, doc.ids, [_peer(m) for m in agnostic])
    for i, q in enumerate(doc.questions):
        feed = q.ids + q.answer[:-1]
        for m in agnostic:
            logits = peers.feed(hf, copy.deepcopy(caches[m.name]), feed, n)[len(q.ids) - 1:]
            out.append((i, m, *_score(logits, q.answer)))
        for m in aware:                    # the press sees the question: one compression per question
            pm = _peer(m)
            cache = peers.make_cache(hf, pm)
            with peers.compressing(hf, pm):
                hf.model(input_ids=torch.tensor([doc.ids + q.ids[:-1]]), past_key_values=cache, use_cache=True)
            logits = peers.feed(hf, cache, [q.ids[-1]] + q.answer[:-1], n + len(q.ids) - 1)
            out.append((i, m, *_score(logits, q.answer)))
    return out


def _score(logits: torch.Tensor, answer: list[int]) -> tuple[bool, int, torch.Tensor]:
    pred = logits.argmax(-1).tolist()
    wrong = next((j for j, (p, t) in enumerate(zip(pred, answer)) if p != t), None)
    return wrong is None, len(answer) if wrong is None else wrong + 1, torch.log_softmax(logits.float(), -1)


def run_cell(cell: Cell, methods: list[Method], loaded: Loaded | None = None, root: str | Path = "..",
             progress=None) -> list[dict]:
    """Every method's answer to every question of the cell's documents: one row per (document, question, method)
    with the columns COLUMNS. `loaded`: a model loaded for these methods (`load`), else loaded here. progress: an
    optional callable run after each document."""
    _check_methods(methods)
    lm = loaded or load(cell.model, cell.length, methods, root)
    ours = [m for m in methods if m.engine == "sparsekv"]
    theirs = [m for m in methods if m.engine == "transformers"]
    ref = {"sparsekv": next((m.name for m in ours if m.family == "dense" and m.kv_bits == 0 and m.block_size == 16),
                            next((m.name for m in ours if m.family == "dense" and m.kv_bits == 0), None)),
           "transformers": next((m.name for m in theirs if m.family == "dense"), None)}
    sc = next(iter(lm.engines.values())).store.config if lm.engines else None
    if sc is None:
        raise ValueError("methods must include at least one sparsekv method (its store gives the byte model's shape)")
    nbytes = {m.name: method_bytes(m, cell.length + 16, sc, lm.windows) for m in methods}
    rows = []
    for doc in documents(cell, lm.tok):
        answers = []                                   # (question, method, correct, steps, logprobs)
        seqs = {}
        try:
            for key, eng in lm.engines.items():
                seqs[key] = eng.new_sequence()
                eng.prefill(seqs[key], doc.ids)
            for i, q in enumerate(doc.questions):
                for m in ours:
                    key = (m.block_size, m.kv_bits)
                    lo = _lossless(m, cell.length)
                    a = tasks.ask(lm.engines[key], seqs[key], q, lo.router, m.rule, keep_logprobs=True)
                    answers.append((i, m, a.correct, a.steps, a.logprobs))
        finally:
            for key, seq in seqs.items():
                lm.engines[key].finish(seq)
        if theirs:
            answers += _peer_rows(lm.hf, doc, theirs)
        for i in range(len(doc.questions)):
            mine = [a for a in answers if a[0] == i]
            logprobs = {a[1].name: a[4] for a in mine}
            qrows = [_row(cell, lm.name, doc, i, m, correct, steps, nbytes[m.name]) for _, m, correct, steps, _ in mine]
            for r in qrows:
                a = observe.answer_agreement(logprobs[ref[r["engine"]]], logprobs[r["method"]])
                r["top1"], r["kl"] = a["top1"], a["kl"]
            rows += qrows
        if progress is not None:
            progress()
    return rows


def _row(cell: Cell, model_name: str, doc, i: int, m: Method, correct: bool, steps: int, b: dict) -> dict:
    return {"model": model_name, "length": cell.length, "task": cell.task, "split": cell.split, "doc": doc.seed,
            "question": i, "method": m.name, "line": m.line, "family": m.family, "engine": m.engine,
            "knob": m.knob, "rule": m.rule, "kv_bits": m.kv_bits, "block_size": m.block_size,
            "correct": bool(correct), "answer_steps": steps, "top1": None, "kl": None, "read": b["read"],
            "held": b["held"], "read_bytes": b["read_bytes"], "held_bytes": b["held_bytes"]}


def write_rows(rows: list[dict], path: str | Path) -> Path:
    """The rows as CSV with the columns COLUMNS (the study's tidy, committed format)."""
    import pandas as pd
    path = Path(path)
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(path, index=False, float_format="%.6g")
    return path


__all__ = ["SPLITS", "MODELS", "TWO_TURN", "DIALOGUE_TASKS", "CELL_TASKS", "COLUMNS", "Cell", "Loaded", "load",
           "documents", "run_cell", "method_bytes", "budget_tokens", "write_rows"]
