"""The paired-question study run whole, for one model and one length: notebooks 14 (SmolLM2) and 15 (Gemma 3) are
its parameters, its narrative and the figures drawn here. The protocol itself (one prefill per method, each question
on its own copy, one rule for the question, bytes against bf16 dense, Wilson cells, exact McNemar) is
`studies.questions`; this module strings it together and names what a notebook reports:

    run(cfg)            every method's answers to every question of `cfg.docs` documents per task -> Study
    accuracy_figure     accuracy per method and task, Wilson 95% intervals
    bytes_figure        accuracy against K/V bytes read per step and held, against bf16 dense
    checks              the invariants, gated findings and hypotheses stated before the run
    metrics             the metrics JSON's numbers, kinds and headline

A hybrid model (sliding-window layers) is compared where the methods differ: routers route and presses compress its
global layers only, and every byte count includes the sliding layers' windows (`questions.method_bytes(windows=)`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis import peers, tasks
from ..suite.report import Checks
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
    engine = sk.Engine(model, block_size=cfg.block_size, num_blocks=2 * (cfg.length // cfg.block_size + 16),
                       progress=False)
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
             "minmax vs hqq2": (f"minmax@{b}", "hqq2")}
    st.pairs = {k: v for k, v in pairs.items() if v[0] in st.methods and v[1] in st.methods}
    st.tests = {(t, k): qs.paired(st.rows, a, bb, task=t, length=cfg.length)
                for t in cfg.task_names for k, (a, bb) in st.pairs.items()}
    st.agree = {t: qs.paired(st.rows, "dense", "hf dense", task=t) for t in cfg.task_names}
    return st


# -- figures -----------------------------------------------------------------------------------------

def _errorbar(ax, x, cell, style, **kw):
    ax.errorbar([x], [cell["accuracy"]], yerr=[[cell["accuracy"] - cell["lo"]], [cell["hi"] - cell["accuracy"]]],
                fmt=style["marker"], color=style["color"], **kw)


def accuracy_figure(st: Study, path: str | Path | None = None):
    """One panel per task: every method's accuracy with its Wilson 95% interval; sparsekv's methods left of the
    rule, transformers' right (hollow star: transformers dense)."""
    import matplotlib.pyplot as plt

    from ..suite import viz
    tn, methods = st.config.task_names, st.methods
    fig, axes = plt.subplots(1, len(tn), figsize=(max(7.0, 4.2 * len(tn)), 4.8), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], tn):
        for x, m in enumerate(methods):
            st_ = viz.method_style(st.family(m))
            _errorbar(ax, x, st.acc[(t, m)], st_, capsize=3, ms=7, mfc="white" if m == "hf dense" else st_["color"])
        ax.axvline(len(st.lossless) - 0.5, color="0.7", lw=0.8)
        ax.set_xticks(range(len(methods)), methods, rotation=60, ha="right", fontsize=8)
        ax.set(title=f"{t} (n = {st.acc[(t, methods[0])]['n']} per method)", ylim=(-0.03, 1.03))
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("questions answered (Wilson 95% CI)")
    fig.suptitle(f"{st.model_name}, {st.config.length}-token documents, budget {st.config.budget}; best non-oracle "
                 "method: " + ", ".join(f"{t} {st.best(t)}" for t in tn), fontsize=10, wrap=True)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def bytes_figure(st: Study, path: str | Path | None = None):
    """The first task's accuracy against bytes read per decode step (left) and held (right), both over bf16 dense.
    Methods at the same x (the presses, which hold what they read) are spread by 4% per coincident method (log
    axis) so none hides another; the tables and metrics give the exact counts."""
    import matplotlib.pyplot as plt

    from ..suite import viz
    t = st.config.task_names[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for ax, kind in zip(axes, ("read", "held")):
        seen: dict[float, int] = {}
        for m in st.methods:
            x = st.nbytes[m][kind]
            j = seen.get(round(x, 4), 0)
            seen[round(x, 4)] = j + 1
            style = viz.method_style(st.family(m))
            _errorbar(ax, x * 1.04 ** j, st.acc[(t, m)], style, capsize=2, ms=7, label=m,
                      mfc="white" if m == "hf dense" else style["color"])
        ax.set_xscale("log")
        viz.log_axis_plain(ax)
        ax.set(xlabel=f"K/V bytes {'read per decode step' if kind == 'read' else 'held'} / bf16 dense (log)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{t}: questions answered (95% CI)")
    viz.legend_outside(axes[1], ncol=1)
    r = st.nbytes[f"{st.config.scorers[0]}@{st.config.budget}"]
    scope = "; sliding layers identical" if st.windows else ""
    fig.suptitle(f"{st.model_name}, {t} at {st.config.length} tokens: routers read {r['read']:.2f} of dense per step "
                 f"and hold {r['held']:.2f}; presses hold what they read{scope}", fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


# -- checks and metrics ------------------------------------------------------------------------------

def checks(st: Study, min_questions: int, gated: bool = True, dense_half: bool = True) -> Checks:
    """The study's claims on the first task (the headline) and per task.

    Invariants: every cell has `min_questions` paired questions; sparsekv dense and transformers dense disagree on at
    most 5%; the byte model is within 10% of what transformers' caches held. The two claims "the best router (oracle
    aside) answers at least as many as the best press at equal bytes read" and "HQQ-2 answers at most 5%" are gated
    findings (`gated`) or, where a run states them for the first time on a model, hypotheses. Hypotheses: the oracle
    within 5 points of dense, and each pre-stated pair not significantly worse (McNemar p < 0.05); with `dense_half`,
    dense answering at least half (a hypothesis since notebook 14's first run rejected it)."""
    cfg, acc = st.config, st.acc
    out = Checks()
    for t in cfg.task_names:
        out.invariant(f"{t}: every method answered at least min_questions paired questions",
                      min(acc[(t, m)]["n"] for m in st.methods), ">=", min_questions)
        a = st.agree[t]
        out.invariant(f"{t}: sparsekv dense and transformers dense disagree on at most 5% of questions",
                      (a["a_only"] + a["b_only"]) / a["n"], "<=", 0.05)
    t0 = cfg.task_names[0]
    routers = [f"{s}@{cfg.budget}" for s in cfg.scorers if s != "oracle"]
    presses = [m.name for m in st.lossy if m.family == "evict"]
    claim = out.finding if gated else out.hypothesis
    if routers and presses:
        claim(f"{t0}: at equal bytes read the best router (oracle aside) answers at least as many questions as the "
              "best press", max(acc[(t0, m)]["accuracy"] for m in routers)
              - max(acc[(t0, m)]["accuracy"] for m in presses), ">=", 0.0)
    if "hqq2" in st.methods:
        claim(f"{t0}: HQQ at 2 bits answers at most 5% of questions", acc[(t0, "hqq2")]["accuracy"], "<=", 0.05)
    if dense_half:
        out.hypothesis(f"{t0}: dense answers at least half the questions at {cfg.length} tokens",
                       acc[(t0, "dense")]["accuracy"], ">=", 0.5)
    out.invariant("the byte model matches the bytes transformers' compressed caches held (within 10%)",
                  max(abs(v - 1) for v in st.model_vs_held.values()) if st.model_vs_held else 0.0, "<=", 0.10)
    for (t, k), r in st.tests.items():
        a, b = st.pairs[k]
        if k == "oracle vs dense":
            out.hypothesis(f"{t}: {a} answers within 5 points of dense", r["acc_a"] - r["acc_b"], ">=", -0.05)
        else:
            worse = r["acc_a"] < r["acc_b"] and r["p"] < 0.05
            out.hypothesis(f"{t}: {a} is not significantly worse than {b} (McNemar p < 0.05)", float(worse), "==", 0.0)
    return out


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


__all__ = ["StudyConfig", "Study", "run", "accuracy_figure", "bytes_figure", "checks", "metrics"]
