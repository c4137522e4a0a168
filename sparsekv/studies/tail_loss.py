"""Tail loss on real text for every method family: sparsekv's routers (exact and int8 blocks), kvpress's presses and
HQQ's quantised caches, each against its own engine's dense, per token, with paired bootstrap intervals. Notebook 22
runs it; issue 29 asks for it ("tail loss over at least 4 documents per kind, with per-token bootstrap intervals").

The protocol, per document (tokens [d * length, (d + 1) * length) of a kind's real text, BOS first; `corpus`):

    prefix  the first P = length - tail - 1 tokens, prefilled once per engine: sparsekv's store once for every router
            (each scores on its own fork), transformers once for every press and quantised cache
            (`peers.prefill_caches`: the caches one prefill per method would leave)
    tail    tokens P .. length - 2 fed after it, teacher-forced; step j predicts token P + 1 + j, so every method
            scores the same `tail` next tokens (the last `tail` tokens of the document)

A router routes every tail step (`observe.tail_token_nll`: the step's own token and the blocks it chooses, within
`budget` tokens); a press compressed the prefix to `budget` tokens at prefill and keeps every tail token it is fed
(kvpress's decoding: nothing is evicted after the prefill); an HQQ cache quantised the prefix and holds the tail in
its full-precision residual (`tail` <= its 128 residual tokens). This is the decode protocol each method runs in
serving; it is not the same number of tokens read: a press also reads the tail tokens already fed, a router reads
them only when it routes to them. The bytes (`questions.method_bytes`, against a bf16 dense cache) are counted at the
document's length.

Statistics (nothing pooled over kinds or models): each method's mean per-token loss, its excess over its own
engine's dense (sparsekv's methods over sparsekv dense, transformers' over transformers dense) with a paired
per-token bootstrap 95% interval (`stats.paired_bootstrap`), and the same interval for the best router (lowest mean
loss, the oracle aside, exact blocks) against the best press and the best quantised cache, on the same tokens.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from ..analysis import corpus, observe, peers, stats
from ..methods import best
from ..routing.router import Router
from ..routing.scorers import SCORERS
from . import questions as qs
from .paired import PREFILLS, load


@dataclass(frozen=True)
class TailConfig:
    """One model's run (a notebook's parameters).

    model_path: the GGUF file (its converted folder is transformers' model); kinds: `corpus.HAYSTACKS` names; docs:
    documents per kind (consecutive, non-overlapping windows of the kind's text); length: tokens per document;
    tail: tokens scored at its end; budget: the routers' tokens read per step and the presses' prefix tokens kept
    (a hybrid model: per global layer, its sliding layers untouched); scorers: routers over exact blocks;
    int8_scorers: routers again over int8 blocks (`Engine(kv_bits=8)`), beside "int8 dense"; presses:
    `peers.PRESSES` names; bits: HQQ's; block_size: the store's tokens per block; prefill: sparsekv's (`PREFILLS`)."""

    model_path: str
    kinds: tuple = ("prose", "code")
    docs: int = 8                   # documents per kind; issue 29 asks for at least 4
    length: int = 2048              # tokens per document, BOS included
    tail: int = 128                 # tokens scored; at most HQQ's 128 residual tokens, so the tail is never quantised
    budget: int = 256               # tokens read per step (routers) or kept from the prefix (presses)
    scorers: tuple = ("halves", "minmax", "oracle")
    int8_scorers: tuple = ("halves",)
    presses: tuple = peers.PRESSES
    bits: tuple = (8, 4, 2)
    block_size: int = 16
    prefill: str = "float32"

    def __post_init__(self):
        if not self.kinds or any(k not in corpus.HAYSTACKS for k in self.kinds):
            raise ValueError(f"kinds must name kinds of {sorted(corpus.HAYSTACKS)}, got {list(self.kinds)!r}")
        for name in ("docs", "length", "tail", "budget", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not 1 <= self.tail <= 128 or self.tail + 2 > self.length:
            raise ValueError(f"tail must be from 1 to min(128, length - 2) = {min(128, self.length - 2)} (HQQ keeps "
                             f"128 tokens in full precision), got {self.tail!r}")
        if self.budget >= self.length - self.tail - 1:
            raise ValueError(f"budget must be below the prefix's {self.length - self.tail - 1} tokens, got "
                             f"{self.budget!r}")
        for name in ("scorers", "int8_scorers"):
            if any(s not in SCORERS for s in getattr(self, name)):
                raise ValueError(f"{name} must name scorers of {list(SCORERS)}, got {list(getattr(self, name))!r}")
        if any(p not in peers.PRESSES for p in self.presses):
            raise ValueError(f"presses must name presses of {list(peers.PRESSES)}, got {list(self.presses)!r}")
        if any(b not in (2, 4, 8) for b in self.bits):
            raise ValueError(f"bits must be among (2, 4, 8), got {list(self.bits)!r}")
        if self.prefill not in PREFILLS:
            raise ValueError(f"prefill must be one of {tuple(PREFILLS)}, got {self.prefill!r}")
        for name in ("kinds", "scorers", "int8_scorers", "presses", "bits"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def prefix(self) -> int:
        """Tokens prefilled before the tail is fed: length - tail - 1."""
        return self.length - self.tail - 1


def document(tok, kind: str, d: int, length: int) -> list[int]:
    """Document `d` of `kind`: BOS, then tokens [d * length, (d + 1) * length - 1) of the kind's text."""
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    return bos + corpus.take(tok, corpus.haystack(kind), length - len(bos), offset=d * length)


def lossless_losses(engines: dict, ids: list[int], prefix: int, methods: list[qs.Lossless]) -> dict[str, torch.Tensor]:
    """Each sparsekv method's per-token loss ([len(ids) - prefix - 1] float32, nats) on the last tokens of `ids`: one
    prefill of ids[:prefix] per store (engines: kv_bits -> Engine), each method on its own fork."""
    out, seqs = {}, {}
    try:
        for bits in sorted({m.kv_bits for m in methods}):
            seqs[bits] = engines[bits].new_sequence()
            engines[bits].prefill(seqs[bits], ids[:prefix])
        for m in methods:
            out[m.name] = observe.tail_token_nll(engines[m.kv_bits], seqs[m.kv_bits], ids[prefix:], m.router)[0]
    finally:
        for bits, seq in seqs.items():
            engines[bits].finish(seq)
    return out


@torch.no_grad()
def peer_losses(hf, ids: list[int], prefix: int, methods: list[peers.PeerMethod]) -> tuple[dict, dict]:
    """Each transformers method's per-token loss on the last tokens of `ids` (as `lossless_losses`): its cache from one
    shared prefill of ids[:prefix] (`peers.prefill_caches`), then ids[prefix:-1] fed causally over a copy of it at
    positions prefix.. (`peers.feed`, as kvpress continues them). Returns (losses, held): held[name] is the bytes the cache holds
    after the prefill (`peers.held_bytes`)."""
    caches = peers.prefill_caches(hf, ids[:prefix], methods)
    held = {m.name: peers.held_bytes(caches[m.name])[0] for m in methods}
    target = torch.tensor(ids[prefix + 1:])
    out = {}
    for m in methods:
        logits = peers.feed(hf, copy.deepcopy(caches[m.name]), ids[prefix:-1], prefix)
        out[m.name] = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none")
    return out, held


@dataclass
class TailStudy:
    """A finished run. rows: one per (kind, doc, method, token) with its loss "nll" (nats); summary: (kind, method) ->
    {"n" tokens, "nll" (mean), "delta" (the mean excess over the method's own engine's dense), "lo", "hi" (its paired
    per-token bootstrap 95% interval), "docs_worse" (documents whose mean loss is above dense's)}; best: (kind,
    "router vs press" | "router vs quantiser") -> the paired bootstrap of the best router's loss minus the other's
    on the same tokens, with their names "a", "b"; agree: kind -> sparsekv dense minus transformers dense (paired
    bootstrap; the engines' own difference); nbytes: method -> `questions.method_bytes` at `length`; model_vs_held:
    transformers method -> measured held bytes over the byte model's (float32 tensors, every HQQ token quantised)."""

    config: TailConfig
    model_name: str
    windows: tuple | None
    lossless: list
    lossy: list
    rows: list = field(default_factory=list)
    held_measured: dict = field(default_factory=dict)
    run_s: float = 0.0
    summary: dict = field(default_factory=dict)
    best: dict = field(default_factory=dict)
    agree: dict = field(default_factory=dict)
    nbytes: dict = field(default_factory=dict)
    model_vs_held: dict = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        return [m.name for m in self.lossless] + [m.name for m in self.lossy]

    def dense_of(self, name: str) -> str:
        """The dense a method is compared with: its own engine's ("dense" for sparsekv's, "hf dense" for transformers')."""
        return "dense" if name in {m.name for m in self.lossless} else "hf dense"

    def family(self, name: str) -> str:
        """The plotting family of a method (`questions.family`)."""
        return qs.family(name, self.lossless, self.lossy)

    def best_of(self, kind: str, what: str) -> str | None:
        """The method of one kind with the lowest mean loss on `kind` of text, or None when the run has none: "router"
        (over exact blocks, the oracle aside), "press" or "quantiser". Ties go to the name last in alphabetical
        order (`methods.best`; the first until 2026-12-05, which no committed run's losses ever tied on)."""
        groups = {"router": [m.name for m in self.lossless if m.router is not None and m.kv_bits == 0
                             and m.router.scorer.name != "oracle"],
                  "press": [m.name for m in self.lossy if m.family == "evict"],
                  "quantiser": [m.name for m in self.lossy if m.family == "quant"]}
        if what not in groups:
            raise ValueError(f"what must be one of {list(groups)}, got {what!r}")
        names = groups[what]
        return best({m: self.summary[(kind, m)]["nll"] for m in names}, higher=False) if names else None


def _tokens(rows: list[dict], kind: str, method: str) -> dict[tuple, float]:
    return {(r["doc"], r["token"]): r["nll"] for r in rows if r["kind"] == kind and r["method"] == method}


def paired_delta(rows: list[dict], kind: str, a: str, b: str, seed: int = 0) -> dict:
    """The paired per-token bootstrap of method a's loss minus b's on `kind`, over the tokens both scored
    (`stats.paired_bootstrap`: {"n", "mean", "lo", "hi"}); ValueError when they share none."""
    ta, tb = _tokens(rows, kind, a), _tokens(rows, kind, b)
    common = sorted(set(ta) & set(tb))
    if not common:
        raise ValueError(f"methods {a!r} and {b!r} scored no common token of kind {kind!r}")
    return stats.paired_bootstrap([ta[k] for k in common], [tb[k] for k in common], seed=seed)


def summarize(st: TailStudy, seed: int = 0) -> None:
    """Fill `st.summary`, `st.best` and `st.agree` from `st.rows` (see `TailStudy`)."""
    for kind in st.config.kinds:
        for m in st.methods:
            dense = st.dense_of(m)
            mine, ref = _tokens(st.rows, kind, m), _tokens(st.rows, kind, dense)
            b = paired_delta(st.rows, kind, m, dense, seed)
            docs = sorted({d for d, _ in mine})
            worse = sum(sum(mine[k] for k in mine if k[0] == d) > sum(ref[k] for k in ref if k[0] == d) for d in docs)
            st.summary[(kind, m)] = {"n": b["n"], "nll": sum(mine.values()) / len(mine), "delta": b["mean"],
                                     "lo": b["lo"], "hi": b["hi"], "docs_worse": worse, "docs": len(docs)}
        st.agree[kind] = paired_delta(st.rows, kind, "dense", "hf dense", seed)
        a = st.best_of(kind, "router")
        for what in ("press", "quantiser"):
            b = st.best_of(kind, what)
            if a is not None and b is not None:
                st.best[(kind, f"router vs {what}")] = {**paired_delta(st.rows, kind, a, b, seed), "a": a, "b": b}


def run(cfg: TailConfig, progress: bool = True) -> TailStudy:
    """Load the model (sparsekv's store and transformers' float32 model of the same file), score every method's tail
    on every document, then count bytes and summarise (`summarize`)."""
    from tqdm.auto import tqdm

    from ..model import fetch

    tok, hf, engines, windows = load(cfg.model_path, cfg.prefill, cfg.block_size, cfg.length,
                                     cfg.scorers + cfg.int8_scorers, bool(cfg.int8_scorers))
    lossless = [qs.Lossless("dense")] + [qs.Lossless(f"{s}@{cfg.budget}", Router(s, token_budget=cfg.budget),
                                                     cfg.budget) for s in cfg.scorers]
    if cfg.int8_scorers:
        lossless += [qs.Lossless("int8 dense", kv_bits=8)] + [
            qs.Lossless(f"int8 {s}@{cfg.budget}", Router(s, token_budget=cfg.budget), cfg.budget, kv_bits=8)
            for s in cfg.int8_scorers]
    st = TailStudy(cfg, fetch.title(cfg.model_path), windows, lossless,
                   qs.peer_methods(cfg.presses, [cfg.budget], cfg.prefix, cfg.bits))
    t0 = time.perf_counter()
    with tqdm(total=len(cfg.kinds) * cfg.docs, desc="documents", disable=not progress) as bar:
        for kind in cfg.kinds:
            for d in range(cfg.docs):
                ids = document(tok, kind, d, cfg.length)
                losses = lossless_losses(engines, ids, cfg.prefix, st.lossless)
                peer, held = peer_losses(hf, ids, cfg.prefix, st.lossy)
                losses.update(peer)
                for k, v in held.items():
                    st.held_measured.setdefault(k, []).append(v)
                st.rows += [{"kind": kind, "doc": d, "method": name, "token": t, "nll": float(x)}
                            for name, xs in losses.items() for t, x in enumerate(xs.tolist())]
                bar.update()
    st.run_s = time.perf_counter() - t0
    sc = engines[0].store.config
    geom = dict(layers=sc.num_layers, kv_heads=sc.num_kv_heads, head_dim=sc.head_dim, block_size=cfg.block_size,
                store_config=sc, windows=windows)
    st.nbytes = {m.name: qs.method_bytes(m, cfg.length, **geom) for m in st.lossless + st.lossy}
    # the byte model against what transformers' float32 caches held after the prefill (HQQ: every token quantised)
    st.model_vs_held = {m.name: max(st.held_measured[m.name]) / qs.method_bytes(
        m, cfg.prefix, itemsize=4, residual=0, layout="transformers", **geom)["held_bytes"] for m in st.lossy}
    summarize(st)
    return st


def metrics(st: TailStudy, tag: str) -> tuple[dict, dict]:
    """(metrics, kinds) under `tag` (a model and length, e.g. "smollm2_2k"): loss.<tag>.<kind>.<method>.nll, .delta,
    .ci_lo, .ci_hi, .docs_worse; best.<tag>.<kind>.router_vs_press (and _quantiser) with .ci_lo, .ci_hi;
    dense_vs_hf.<tag>.<kind> likewise; bytes.<tag>.<method>.read and .held (over bf16 dense); held_model.<tag>.<method>
    (measured over modelled); run_s.<tag>; the run's size: tokens.<tag> (scored per kind), docs.<tag>, length.<tag>,
    tail.<tag>, budget.<tag>."""
    cfg = st.config
    m = {f"run_s.{tag}": st.run_s, f"tokens.{tag}": st.summary[(cfg.kinds[0], "dense")]["n"], f"docs.{tag}": cfg.docs,
         f"length.{tag}": cfg.length, f"tail.{tag}": cfg.tail, f"budget.{tag}": cfg.budget}
    kinds = {k: "exact" for k in m}
    kinds[f"run_s.{tag}"] = "timing"
    for (kind, name), s in st.summary.items():
        key = f"loss.{tag}.{kind}.{name}"
        m[key + ".nll"], m[key + ".delta"], m[key + ".ci_lo"], m[key + ".ci_hi"] = s["nll"], s["delta"], s["lo"], s["hi"]
        m[key + ".docs_worse"] = s["docs_worse"]
        kinds[key + ".docs_worse"] = "exact"
    for (kind, what), b in st.best.items():
        key = f"best.{tag}.{kind}.{what.replace(' ', '_')}"
        m[key], m[key + ".ci_lo"], m[key + ".ci_hi"] = b["mean"], b["lo"], b["hi"]
    for kind, b in st.agree.items():
        key = f"dense_vs_hf.{tag}.{kind}"
        m[key], m[key + ".ci_lo"], m[key + ".ci_hi"] = b["mean"], b["lo"], b["hi"]
    for name, v in st.nbytes.items():
        m[f"bytes.{tag}.{name}.read"], m[f"bytes.{tag}.{name}.held"] = v["read"], v["held"]
    for name, v in st.model_vs_held.items():
        m[f"held_model.{tag}.{name}"] = v
    return m, kinds


__all__ = ["TailConfig", "TailStudy", "document", "lossless_losses", "peer_losses", "paired_delta", "summarize", "run",
           "metrics"]
