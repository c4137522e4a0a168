"""The paired-question study run whole, for one model and one length: notebooks 14 (SmolLM2) and 15 (Gemma 3) are
its parameters, its narrative and its plots (drawn by `paired.report`). The protocol itself (one prefill per
method, each question on its own copy, one rule for the question, bytes against bf16 dense, Wilson cells, exact
McNemar) is `studies.questions`; this module strings it together and names what a notebook reports:

    run(cfg)            every method's answers to every question of `cfg.docs` documents per task -> Study
    against_dense(st)   every method's exact McNemar against its own engine's dense, and the best router's against
                        the best press and the best quantised cache
    metrics             the metrics JSON's numbers, kinds and headline

Its figures and checks are `paired.report`, beside it.

A hybrid model (sliding-window layers) is compared where the methods differ: routers route and presses compress its
global layers only, and every byte count includes the sliding layers' windows (`questions.method_bytes(windows=)`).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...analysis import peers, tasks
from ...methods import best
from ...routing.scorers import SCORERS, summaries_for
from .. import questions as qs

# sparsekv's prefill for a study -> load_model's keywords (the engine the routers and sparsekv's dense run on)
PREFILLS = {"float32": {}, "bfloat16": {"weights": "gguf", "prefill": "bfloat16"}}


@dataclass(frozen=True)
class StudyConfig:
    """One run's parameters (notebook 14's parameters cell).

    model_path: the GGUF file (its converted folder is transformers' model); length: document tokens; docs: documents
    per task, each with n_facts facts and one question per fact, seeded from seed0 upward (each an int for every task,
    or a dict giving every task its own: `docs_of`, `facts_of`); budget: the routers'
    tokens read per step and the presses' context tokens kept; bits: HQQ's; rule: `questions.RULES`; int8_scorers:
    routers run again over int8 blocks (`Engine(kv_bits=8)`), beside "int8 dense", as their own line (empty: none);
    dialogues: two-turn dialogues per document (`tasks.two_turn`, counterbalanced; 0: none, else even and at most
    n_facts // 2), asked beside the single questions on the same prefill, as the task "<task> 2-turn"; rule_scorers:
    routers answered again under the other question rule (`questions.rule_name`: "minmax@256, routed question"), each
    paired with itself under `rule` (empty: none); peer_docs: the documents per task (the first ones) that
    transformers' peers and dense answer as well (None: every one), so a length whose float32 transformers prefill
    does not fit the budget still gets every router on every document, its peers on fewer (their cells then have
    their own n, and a test against a peer pairs only the questions both answered); prefill: sparsekv's, "float32"
    (float32 weights, the parity reference) or "bfloat16" (the GGUF's own quantised weights with the bfloat16
    prefill kernel, `load_model(weights="gguf", prefill="bfloat16")`; decode steps stay float32). Every method is
    compared with its own engine's dense. dense_scorers: routers each tested against dense as a pre-stated pair
    ("halves vs dense", exact McNemar on every question; empty: only the oracle is)."""

    model_path: str
    length: int = 2048
    task_names: tuple = ("passkey", "multi-key", "fact-prose")
    docs: int | dict = 4
    n_facts: int | dict = 26
    seed0: int = 1000
    budget: int = 256
    scorers: tuple = ("minmax", "mean", "oracle")
    presses: tuple = peers.PRESSES
    bits: tuple = (8, 4, 2)
    rule: str = "dense"
    block_size: int = 16
    int8_scorers: tuple = ()
    dialogues: int = 0
    rule_scorers: tuple = ()
    peer_docs: int | None = None
    prefill: str = "float32"
    dense_scorers: tuple = ()

    def __post_init__(self):
        unknown = [t for t in self.task_names if t not in tasks.GENERATORS]
        if not self.task_names or unknown:
            raise ValueError(f"task_names must name tasks of {list(tasks.GENERATORS)}, got {list(self.task_names)!r}")
        object.__setattr__(self, "task_names", tuple(self.task_names))
        for name in ("length", "budget", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("docs", "n_facts"):            # an int for every task, or {task: int} naming every task
            v = getattr(self, name)
            per = v.values() if isinstance(v, dict) else [v]
            if any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in per) or \
                    (isinstance(v, dict) and set(v) != set(self.task_names)):
                raise ValueError(f"{name} must be a positive int, or a dict of one for each of task_names "
                                 f"{list(self.task_names)}, got {v!r}")
            if isinstance(v, dict):
                object.__setattr__(self, name, dict(v))
        for name in ("scorers", "int8_scorers", "rule_scorers", "dense_scorers"):
            if any(s not in SCORERS for s in getattr(self, name)):
                raise ValueError(f"{name} must name scorers of {list(SCORERS)}, got {list(getattr(self, name))!r}")
        if not isinstance(self.dialogues, int) or isinstance(self.dialogues, bool) or self.dialogues < 0 \
                or self.dialogues % 2 or 2 * self.dialogues > min(map(self.facts_of, self.task_names)):
            raise ValueError(f"dialogues must be 0 or an even int of at most n_facts // 2 = "
                             f"{min(map(self.facts_of, self.task_names)) // 2}, got "
                             f"{self.dialogues!r}")
        if self.peer_docs is not None and (not isinstance(self.peer_docs, int) or isinstance(self.peer_docs, bool)
                                           or not 1 <= self.peer_docs <= min(map(self.docs_of, self.task_names))):
            raise ValueError(f"peer_docs must be None or an int from 1 to docs = "
                             f"{min(map(self.docs_of, self.task_names))}, got {self.peer_docs!r}")
        if self.prefill not in PREFILLS:
            raise ValueError(f"prefill must be one of {tuple(PREFILLS)}, got {self.prefill!r}")
        if self.rule not in qs.RULES:
            raise ValueError(f"rule must be one of {qs.RULES}, got {self.rule!r}")
        if any(s not in self.scorers or s == "oracle" for s in self.dense_scorers):
            raise ValueError(f"dense_scorers must name scorers of the run other than the oracle (tested against dense "
                             f"already; scorers = {list(self.scorers)}), got {list(self.dense_scorers)!r}")
        if any(s not in self.scorers for s in self.rule_scorers):
            raise ValueError(f"rule_scorers must name scorers that also run under the run's rule (scorers = "
                             f"{list(self.scorers)}), got {list(self.rule_scorers)!r}")
        for name in ("task_names", "scorers", "presses", "bits", "int8_scorers", "rule_scorers", "dense_scorers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def docs_of(self, task: str) -> int:
        """The documents `task` gets."""
        return self.docs[task] if isinstance(self.docs, dict) else self.docs

    def facts_of(self, task: str) -> int:
        """The facts (and questions) per document of `task`."""
        return self.n_facts[task] if isinstance(self.n_facts, dict) else self.n_facts


@dataclass
class Study(qs.MethodsRun):
    """A finished run. rows: one per (question, method) (`questions.lossless_answers` / `peer_answers`); acc:
    (task, method) -> its Wilson cell; nbytes: method -> `method_bytes` at the document plus 16 tokens; tests:
    (task, pair name) -> McNemar; agree: task -> sparsekv dense against transformers dense; agreement: (task, method)
    -> the answer tokens' top-1 agreement and KL with its own engine's dense (`questions.agreement_cells`); kl_tests:
    (task, pair name) -> the paired bootstrap of the per-question KL difference (first method's minus second's);
    with dialogues, turn: (task, method) -> McNemar of the question alone against it asked second
    (`questions.turn_effect`), and order_acc: (2-turn task, order, method) -> its Wilson cell; rule_pairs: the names
    of `pairs` that set a router under the other question rule against itself under the run's; acc_peered: with
    `peer_docs` short of `docs`, (task, method) -> its Wilson cell on the questions the peers answered too, else None
    (`acc_shared` gives the one to read); vs_dense: (task, method) -> exact McNemar of every method but the two dense
    ones against its own engine's dense (a = the method), reported for every cell, never a hypothesis; best_tests:
    (task, "router vs press" | "router vs quantiser") -> exact McNemar of the best router (oracle aside, under the run's
    rule, exact blocks) against the best press or the best quantised cache on the questions both answered, with the
    two methods' names ("a", "b"; `best_of`)."""

    config: StudyConfig
    acc: dict = field(default_factory=dict)
    pairs: dict = field(default_factory=dict)
    tests: dict = field(default_factory=dict)
    agree: dict = field(default_factory=dict)
    agreement: dict = field(default_factory=dict)
    kl_tests: dict = field(default_factory=dict)
    turn: dict = field(default_factory=dict)
    order_acc: dict = field(default_factory=dict)
    rule_pairs: tuple = ()
    acc_peered: dict | None = None
    vs_dense: dict = field(default_factory=dict)
    best_tests: dict = field(default_factory=dict)

    @property
    def acc_shared(self) -> dict:
        """(task, method) -> accuracy cell on the questions every method answered: what a comparison of a router's
        accuracy with a peer's reads (`acc` unless the peers answered fewer documents)."""
        return self.acc if self.acc_peered is None else self.acc_peered

    @property
    def other_rule(self) -> str:
        """The question rule the config's `rule_scorers` answer under besides `config.rule`."""
        return qs.other_rule(self.config.rule)

    @property
    def tasks(self) -> list[str]:
        """The tasks answered: the config's, then each one's "<task> 2-turn" when the run asks dialogues."""
        return list(self.config.task_names) + ([f"{t} 2-turn" for t in self.config.task_names]
                                               if self.config.dialogues else [])

    def family(self, name: str) -> str:
        """The plotting family of a method: dense, a router's scorer, a press's name, or HQQ<bits>."""
        return qs.family(name, self.lossless, self.lossy)

    def best_of(self, task: str, kind: str) -> str | None:
        """The most accurate method of one kind on `task`, on the questions every method answered (`acc_shared`), or
        None when the run has none: "router" (a router under the run's rule over exact blocks, the oracle aside),
        "press" (a kvpress press) or "quantiser" (an HQQ cache). Ties go to the name last in alphabetical order
        (`methods.best`, the rule `studies.findings` words the best router and press by)."""
        kinds = {"router": [f"{s}@{self.config.budget}" for s in self.config.scorers if s != "oracle"],
                 "press": [m.name for m in self.lossy if m.family == "evict"],
                 "quantiser": [m.name for m in self.lossy if m.family == "quant"]}
        if kind not in kinds:
            raise ValueError(f"kind must be one of {list(kinds)}, got {kind!r}")
        names = [m for m in kinds[kind] if m in self.methods]
        return best({m: self.acc_shared[(task, m)]["accuracy"] for m in names}) if names else None

    def best(self, task: str) -> str:
        """The best method on `task` other than exact dense (both engines) and the oracle (under either question rule,
        over exact or int8 blocks), on the questions every method answered (`acc_shared`); ties go to the first
        listed."""
        skip, acc = ("dense", "oracle", "int8 oracle"), self.acc_shared
        return max((m for m in self.methods if self.family(m) not in skip), key=lambda m: acc[(task, m)]["accuracy"])


def load(model_path: str, prefill: str, block_size: int, length: int, scorers, int8: bool = False):
    """Both engines of a study on one GGUF file: (tok, hf, engines, windows). engines: {0: sparsekv's Engine over exact
    blocks, and 8: over int8 blocks when `int8`}, each with room for `length` tokens and the summaries `scorers` read,
    on the model `load_model` gives with `PREFILLS[prefill]`; hf: transformers' float32 model of the file's converted
    folder; windows: the model's per-layer windows, None when no layer slides."""
    import sparsekv as sk

    from ...model.checkpoint import converted_folder

    model = sk.load_model(model_path, **PREFILLS[prefill])
    tok = sk.load_tokenizer(model_path)
    hf = peers.hf_model(converted_folder(Path(model_path)))
    windows = model.config.layer_windows if any(model.config.layer_windows) else None
    store = dict(block_size=block_size, num_blocks=2 * (length // block_size + 16), progress=False,
                 summaries=summaries_for(tuple(scorers)))
    engines = {0: sk.Engine(model, **store)}
    if int8:
        engines[8] = sk.Engine(model, kv_bits=8, **store)
    return tok, hf, engines, windows


def run(cfg: StudyConfig, progress: bool = True) -> Study:
    """Load the model (sparsekv's store and transformers' float32 model of the same file), make and check every
    document, have every method answer every question, then count bytes and run the pre-stated paired tests."""
    from tqdm.auto import tqdm

    from ...model import fetch

    tok, hf, engines, windows = load(cfg.model_path, cfg.prefill, cfg.block_size, cfg.length,
                                     cfg.scorers + cfg.int8_scorers, bool(cfg.int8_scorers))
    engine = engines[0]
    st = Study(cfg, fetch.title(cfg.model_path), windows,
               qs.lossless_methods(cfg.scorers, [cfg.budget], int8_scorers=cfg.int8_scorers,
                                   rule_scorers=cfg.rule_scorers,
                                   other_rule=qs.other_rule(cfg.rule)),
               qs.peer_methods(cfg.presses, [cfg.budget], cfg.length, cfg.bits))
    documents = [tasks.make(t, tok, cfg.length, cfg.facts_of(t), seed=cfg.seed0 + d)
                 for t in cfg.task_names for d in range(cfg.docs_of(t))]
    for doc in documents:
        tasks.check(doc, tok)
    if cfg.dialogues:          # the second turns, asked on the same prefill as the single questions
        documents = [dataclasses.replace(d, questions=d.questions + tasks.two_turn(tok, d, cfg.dialogues, seed=d.seed))
                     for d in documents]

    def peered(seed: int) -> bool:                                          # the first peer_docs of each task
        return cfg.peer_docs is None or seed - cfg.seed0 < cfg.peer_docs

    t1 = time.perf_counter()
    total = sum(len(d.questions) * (len(st.lossless) + len(st.lossy) * peered(d.seed)) for d in documents)
    with tqdm(total=total, desc="answers", disable=not progress) as bar:
        for doc in documents:
            st.rows += qs.lossless_answers(engines, doc, st.lossless, cfg.rule,
                                           progress=lambda: bar.update(len(st.lossless)))
            if not peered(doc.seed):
                continue
            peer_rows, held = qs.peer_answers(hf, doc, st.lossy, progress=bar.update)
            st.rows += peer_rows
            for k, v in held.items():
                st.held_measured.setdefault(k, []).append(v)
    st.run_s = time.perf_counter() - t1
    st.acc = {(x["task"], x["method"]): x for x in qs.cells(st.rows)}
    if cfg.peer_docs is not None and any(cfg.peer_docs < cfg.docs_of(t) for t in cfg.task_names):
        st.acc_peered = {(x["task"], x["method"]): x for x in qs.cells([r for r in st.rows if peered(r["doc"])])}
    st.agreement = {(x["task"], x["method"]): x for x in qs.agreement_cells(st.rows)}

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
             "minmax vs hqq2": (f"minmax@{b}", "hqq2"), "halves vs minmax": (f"halves@{b}", f"minmax@{b}"),
             "int8 dense vs dense": ("int8 dense", "dense"),
             **{f"int8 {s} vs {s}": (f"int8 {s}@{b}", f"{s}@{b}") for s in cfg.int8_scorers},
             **{f"{s} vs dense": (f"{s}@{b}", "dense") for s in cfg.dense_scorers}}
    rule_pairs = {f"{s} {st.other_rule} question vs {cfg.rule}": (qs.rule_name(f"{s}@{b}", st.other_rule), f"{s}@{b}")
                  for s in cfg.rule_scorers}
    pairs.update(rule_pairs)
    st.rule_pairs = tuple(k for k in rule_pairs if all(m in st.methods for m in rule_pairs[k]))
    st.pairs = {k: v for k, v in pairs.items() if v[0] in st.methods and v[1] in st.methods}
    st.tests = {(t, k): qs.paired(st.rows, a, bb, task=t, length=cfg.length)
                for t in st.tasks for k, (a, bb) in st.pairs.items()}
    st.agree = {t: qs.paired(st.rows, "dense", "hf dense", task=t) for t in st.tasks}
    vs_dense_pairs = {"oracle vs dense"} | {f"{s} vs dense" for s in cfg.dense_scorers}    # KL(dense) is 0 there
    st.kl_tests = {(t, k): qs.paired_kl(st.rows, a, bb, task=t, length=cfg.length)
                   for t in st.tasks for k, (a, bb) in st.pairs.items() if k not in vs_dense_pairs}
    against_dense(st)
    if cfg.dialogues:
        st.turn = {(t, m): qs.turn_effect(st.rows, m, t) for t in cfg.task_names for m in st.methods}
        st.order_acc = {(x["task"], x["order"], x["method"]): x for x in qs.cells(
            [r for r in st.rows if "order" in r], keys=("task", "order", "method"))}
    return st


def against_dense(st: Study) -> None:
    """Fill `st.vs_dense` (every method but the two dense ones against its own engine's dense: sparsekv's against
    "dense", transformers' against "hf dense") and `st.best_tests` (the best router against the best press and the
    best quantised cache, `Study.best_of`) from `st.rows` and `st.acc`: exact McNemar on the questions both answered."""
    dense_of = {**{m.name: "dense" for m in st.lossless}, **{m.name: "hf dense" for m in st.lossy}}
    st.vs_dense = {(t, m): qs.paired(st.rows, m, dense_of[m], task=t)
                   for t in st.tasks for m in st.methods if m not in ("dense", "hf dense")}
    st.best_tests = {}
    for t in st.tasks:
        a = st.best_of(t, "router")
        for kind in ("press", "quantiser"):
            b = st.best_of(t, kind)
            if a is not None and b is not None:
                st.best_tests[(t, f"router vs {kind}")] = {**qs.paired(st.rows, a, b, task=t), "a": a, "b": b}


# -- metrics --------------------------------------------------------------------------------------

def metrics(st: Study) -> tuple[dict, dict, list]:
    """(metrics, kinds, headline) for `report.write_metrics`: every cell's accuracy with its interval
    (acc.<task>.<method>, .ci_lo, .ci_hi), the answer tokens' agreement with dense (agreement.<task>.<method>.top1,
    .kl, .kl.ci_lo, .kl.ci_hi), each test's p, every method's exact McNemar against its own engine's dense
    (vs_dense.<task>.<method>.p, .a_only: questions only the method answered, .b_only: only dense), the best router's
    against the best press and the best quantiser (best.<task>.router_vs_press.p, router_vs_quantiser; a_only: only the
    router), the engines' disagreements, each method's bytes."""
    cfg = st.config
    table = list(st.acc.values())
    m = {"questions_per_cell.min": min(v["n"] for v in table), "run_s": st.run_s, "document_tokens": cfg.length,
         "token_budget": cfg.budget, **{f"questions.{t}": st.acc[(t, "dense")]["n"] for t in st.tasks}}
    for v in table:
        key = f"acc.{v['task']}.{v['method']}"
        m[key], m[key + ".ci_lo"], m[key + ".ci_hi"] = v["accuracy"], v["lo"], v["hi"]
    if st.acc_peered is not None:                       # every method on the questions the peers answered too
        for (t, name), v in st.acc_peered.items():
            m[f"acc_peered.{t}.{name}"] = v["accuracy"]
        m.update({f"questions_peered.{t}": st.acc_peered[(t, "dense")]["n"] for t in st.tasks})
    for (t, name), v in st.agreement.items():         # the answer tokens against the method's own engine's dense
        key = f"agreement.{t}.{name}"
        m[key + ".top1"], m[key + ".kl"], m[key + ".kl.ci_lo"], m[key + ".kl.ci_hi"] = v["top1"], v["kl"], v["kl_lo"], \
            v["kl_hi"]
    for (t, k), r in st.tests.items():
        m[f"mcnemar.{t}.{k.replace(' ', '_')}.p"] = r["p"]
        if k in st.rule_pairs:                          # the discordant questions: only under the other rule, the run's
            m[f"mcnemar.{t}.{k.replace(' ', '_')}.a_only"] = r["a_only"]
            m[f"mcnemar.{t}.{k.replace(' ', '_')}.b_only"] = r["b_only"]
    for (t, name), r in st.vs_dense.items():            # every method against its own engine's dense
        key = f"vs_dense.{t}.{name}"
        m[key + ".p"], m[key + ".a_only"], m[key + ".b_only"] = r["p"], r["a_only"], r["b_only"]
    for (t, k), r in st.best_tests.items():             # the best router against the best press, the best quantiser
        key = f"best.{t}.{k.replace(' ', '_')}"
        m[key + ".p"], m[key + ".a_only"], m[key + ".b_only"] = r["p"], r["a_only"], r["b_only"]
    for (t, name), r in st.turn.items():
        key = f"turn.{t}.{name}"
        m[key + ".alone"], m[key + ".second"], m[key + ".p"] = r["acc_a"], r["acc_b"], r["p"]
    for (t, order, name), v in st.order_acc.items():
        m[f"acc_by_order.{t}.{order.replace(' ', '_')}.{name}"] = v["accuracy"]
        m[f"questions_by_order.{t}.{order.replace(' ', '_')}"] = v["n"]          # the same for every method
    for (t, k), r in st.kl_tests.items():
        key = f"kl_diff.{t}.{k.replace(' ', '_')}"
        m[key], m[key + ".ci_lo"], m[key + ".ci_hi"] = r["mean"], r["lo"], r["hi"]
    for t, r in st.agree.items():
        m[f"agreement.{t}.dense_vs_hf.disagree"] = r["a_only"] + r["b_only"]
    for name, v in st.nbytes.items():
        m[f"bytes.{name}.read"], m[f"bytes.{name}.held"] = v["read"], v["held"]
    kinds = {"run_s": "timing", "questions_per_cell.min": "exact", "document_tokens": "exact", "token_budget": "exact",
             **{f"questions.{t}": "exact" for t in st.tasks},
             **{k: "exact" for k in m if k.startswith("questions_peered.")},
             **{f"agreement.{t}.dense_vs_hf.disagree": "exact" for t in st.tasks},
             **{k: "exact" for k in m if k.startswith("questions_by_order.")},
             **{k: "exact" for k in m
                if k.startswith(("mcnemar.", "vs_dense.", "best.")) and k.endswith(("a_only", "b_only"))}}
    headline = [f"acc.{cfg.task_names[0]}.{x}" for x in ("dense", f"minmax@{cfg.budget}", f"SnapKV@{cfg.budget}", "hqq2")
                if x in st.methods]
    return m, kinds, headline


__all__ = ["StudyConfig", "Study", "load", "run", "against_dense", "metrics"]
