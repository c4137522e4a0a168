"""The paired-question study run whole, for one model and one length: notebooks 14 (SmolLM2) and 15 (Gemma 3) are
its parameters, its narrative and its plots (drawn by `suite.paired_report`). The protocol itself (one prefill per
method, each question on its own copy, one rule for the question, bytes against bf16 dense, Wilson cells, exact
McNemar) is `studies.questions`; this module strings it together and names what a notebook reports:

    run(cfg)            every method's answers to every question of `cfg.docs` documents per task -> Study
    metrics             the metrics JSON's numbers, kinds and headline

Its figures and checks are `suite.paired_report` (the suite's layer: plots and the notebook's Checks).

A hybrid model (sliding-window layers) is compared where the methods differ: routers route and presses compress its
global layers only, and every byte count includes the sliding layers' windows (`questions.method_bytes(windows=)`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis import peers, tasks
from ..routing.scorers import SCORERS
from ..storage.summaries import DEFAULT_SUMMARIES
from . import questions as qs


@dataclass(frozen=True)
class StudyConfig:
    """One run's parameters (notebook 14's parameters cell).

    model_path: the GGUF file (its converted folder is transformers' model); length: document tokens; docs: documents
    per task, each with n_facts facts and one question per fact, seeded from seed0 upward; budget: the routers'
    tokens read per step and the presses' context tokens kept; bits: HQQ's; rule: `questions.RULES`."""

    model_path: str
    length: int = 2048
    task_names: tuple = ("passkey", "multi-key", "fact-prose")
    docs: int = 4
    n_facts: int = 26
    seed0: int = 1000
    budget: int = 256
    scorers: tuple = ("minmax", "mean", "oracle")
    presses: tuple = peers.PRESSES
    bits: tuple = (8, 4, 2)
    rule: str = "dense"
    block_size: int = 16

    def __post_init__(self):
        for name in ("length", "docs", "n_facts", "budget", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        unknown = [s for s in self.scorers if s not in SCORERS]
        if unknown:
            raise ValueError(f"scorers must name scorers of {list(SCORERS)}, got {list(self.scorers)!r}")
        if self.rule not in qs.RULES:
            raise ValueError(f"rule must be one of {qs.RULES}, got {self.rule!r}")
        unknown = [t for t in self.task_names if t not in tasks.GENERATORS]
        if not self.task_names or unknown:
            raise ValueError(f"task_names must name tasks of {list(tasks.GENERATORS)}, got {list(self.task_names)!r}")
        for name in ("task_names", "scorers", "presses", "bits"):
            object.__setattr__(self, name, tuple(getattr(self, name)))


@dataclass
class Study:
    """A finished run. rows: one per (question, method) (`questions.lossless_answers` / `peer_answers`); acc:
    (task, method) -> its Wilson cell; nbytes: method -> `method_bytes` at the document plus 16 tokens; tests:
    (task, pair name) -> McNemar; agree: task -> sparsekv dense against transformers dense."""

    config: StudyConfig
    model_name: str
    windows: tuple | None
    lossless: list
    lossy: list
    rows: list = field(default_factory=list)
    held_measured: dict = field(default_factory=dict)
    run_s: float = 0.0
    acc: dict = field(default_factory=dict)
    nbytes: dict = field(default_factory=dict)
    model_vs_held: dict = field(default_factory=dict)
    pairs: dict = field(default_factory=dict)
    tests: dict = field(default_factory=dict)
    agree: dict = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        return [m.name for m in self.lossless] + [m.name for m in self.lossy]

    def family(self, name: str) -> str:
        """The plotting family of a method: dense, a router's scorer, a press's name, or HQQ<bits>."""
        for m in self.lossless:
            if m.name == name:
                return "dense" if m.router is None else m.router.config.scorer
        m = next(m for m in self.lossy if m.name == name)
        if m.family == "dense":
            return "dense"
        return m.name.split("@")[0] if m.family == "evict" else f"HQQ{m.bits}"

    def best(self, task: str) -> str:
        """The best method on `task` other than dense (both engines) and the oracle; ties go to the first listed."""
        skip = ("dense", "hf dense", f"oracle@{self.config.budget}")
        return max((m for m in self.methods if m not in skip), key=lambda m: self.acc[(task, m)]["accuracy"])


def run(cfg: StudyConfig, progress: bool = True) -> Study:
    """Load the model (sparsekv's store and transformers' float32 model of the same file), make and check every
    document, have every method answer every question, then count bytes and run the pre-stated paired tests."""
    from tqdm.auto import tqdm

    import sparsekv as sk

    from ..model import fetch
    from ..model.checkpoint import converted_folder

    model, tok = sk.load_model(cfg.model_path), sk.load_tokenizer(cfg.model_path)
    hf = peers.hf_model(converted_folder(Path(cfg.model_path)))
    c = model.config
    windows = tuple(c.windows) if any(c.windows) else None
    reads = (r for s in cfg.scorers for r in SCORERS[s].reads)       # the summaries the scorers read, e.g. khalf
    engine = sk.Engine(model, block_size=cfg.block_size, num_blocks=2 * (cfg.length // cfg.block_size + 16),
                       progress=False, summaries=tuple(dict.fromkeys(DEFAULT_SUMMARIES + tuple(reads))))
    st = Study(cfg, fetch.title(cfg.model_path), windows, qs.lossless_methods(cfg.scorers, [cfg.budget]),
               qs.peer_methods(cfg.presses, [cfg.budget], cfg.length, cfg.bits))
    documents = [tasks.make(t, tok, cfg.length, cfg.n_facts, seed=cfg.seed0 + d)
                 for t in cfg.task_names for d in range(cfg.docs)]
    for doc in documents:
        tasks.check(doc, tok)
    n_q = sum(len(d.questions) for d in documents)
    t1 = time.perf_counter()
    with tqdm(total=n_q * (1 + len(st.lossy)), desc="questions", disable=not progress) as bar:
        for doc in documents:
            st.rows += qs.lossless_answers(engine, doc, st.lossless, cfg.rule, progress=bar.update)
            peer_rows, held = qs.peer_answers(hf, doc, st.lossy, progress=bar.update)
            st.rows += peer_rows
            for k, v in held.items():
                st.held_measured.setdefault(k, []).append(v)
    st.run_s = time.perf_counter() - t1
    st.acc = {(x["task"], x["method"]): x for x in qs.cells(st.rows)}

    sc = engine.store.config
    geom = dict(layers=sc.num_layers, kv_heads=sc.num_kv_heads, head_dim=sc.head_dim, block_size=cfg.block_size,
                store_config=sc, windows=windows)
    tokens = cfg.length + 16                # the document, the question and the answer (the byte model's point)
    st.nbytes = {m.name: qs.method_bytes(m, tokens, **geom) for m in st.lossless + st.lossy}
    # the byte model against what transformers' float32 caches held after the prefill (HQQ: every token quantised)
    st.model_vs_held = {m.name: max(st.held_measured[m.name]) / qs.method_bytes(
        m, cfg.length, itemsize=4, residual=0, layout="transformers", **geom)["held_bytes"] for m in st.lossy}

    b = cfg.budget
    pairs = {"oracle vs dense": (f"oracle@{b}", "dense"), "minmax vs SnapKV": (f"minmax@{b}", f"SnapKV@{b}"),
             "minmax vs hqq2": (f"minmax@{b}", "hqq2"), "halves vs minmax": (f"halves@{b}", f"minmax@{b}")}
    st.pairs = {k: v for k, v in pairs.items() if v[0] in st.methods and v[1] in st.methods}
    st.tests = {(t, k): qs.paired(st.rows, a, bb, task=t, length=cfg.length)
                for t in cfg.task_names for k, (a, bb) in st.pairs.items()}
    st.agree = {t: qs.paired(st.rows, "dense", "hf dense", task=t) for t in cfg.task_names}
    return st


# -- metrics --------------------------------------------------------------------------------------

def metrics(st: Study) -> tuple[dict, dict, list]:
    """(metrics, kinds, headline) for `report.write_metrics`: every cell's accuracy with its interval
    (acc.<task>.<method>, .ci_lo, .ci_hi), each test's p, the engines' disagreements, each method's bytes."""
    cfg = st.config
    table = list(st.acc.values())
    m = {"questions_per_cell.min": min(v["n"] for v in table), "run_s": st.run_s, "document_tokens": cfg.length,
         "token_budget": cfg.budget, **{f"questions.{t}": st.acc[(t, "dense")]["n"] for t in cfg.task_names}}
    for v in table:
        key = f"acc.{v['task']}.{v['method']}"
        m[key], m[key + ".ci_lo"], m[key + ".ci_hi"] = v["accuracy"], v["lo"], v["hi"]
    for (t, k), r in st.tests.items():
        m[f"mcnemar.{t}.{k.replace(' ', '_')}.p"] = r["p"]
    for t, r in st.agree.items():
        m[f"agreement.{t}.dense_vs_hf.disagree"] = r["a_only"] + r["b_only"]
    for name, v in st.nbytes.items():
        m[f"bytes.{name}.read"], m[f"bytes.{name}.held"] = v["read"], v["held"]
    kinds = {"run_s": "timing", "questions_per_cell.min": "exact", "document_tokens": "exact", "token_budget": "exact",
             **{f"questions.{t}": "exact" for t in cfg.task_names},
             **{f"agreement.{t}.dense_vs_hf.disagree": "exact" for t in cfg.task_names}}
    headline = [f"acc.{cfg.task_names[0]}.{x}" for x in ("dense", f"minmax@{cfg.budget}", f"SnapKV@{cfg.budget}", "hqq2")
                if x in st.methods]
    return m, kinds, headline


__all__ = ["StudyConfig", "Study", "run", "metrics"]
