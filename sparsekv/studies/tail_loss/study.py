"""The tail-loss study's run. Tail loss on real text for every method family: sparsekv's routers (exact and int8 blocks), kvpress's presses and
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

Statistics (nothing pooled over kinds or models; the document is the unit of replication, since the tokens of one
document share its difficulty): each method's mean per-token loss and its excess over its own engine's dense
(sparsekv's methods over sparsekv dense, transformers' over transformers dense), with a paired cluster-bootstrap 95%
interval that resamples documents (`analysis.clustered.paired_difference`). The comparisons are declared before the
run from the configuration alone (`plan`): the named router (`TailConfig.router`, never a "best" picked on these
losses) against every press and against HQQ 8- and 4-bit, the oracle against `minmax`, HQQ 2-bit against 8-bit (the
gated finding), and the named router over int8 blocks no worse than over exact blocks within `TailConfig.margin`
nats (non-inferiority); one Holm family over both kinds (`clustered.ContrastPlan`), raw and adjusted p reported.
Before 2026-12-05 the intervals resampled tokens and the router and press compared were the best on the same losses.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...analysis import clustered, corpus, observe, peers
from ...routing.router import Router
from ...routing.scorers import SCORERS
from .. import questions as qs
from ..paired.study import PREFILLS, load


@dataclass(frozen=True)
class TailConfig:
    """One model's run (a notebook's parameters).

    model_path: the GGUF file (its converted folder is transformers' model); kinds: `corpus.HAYSTACKS` names; docs:
    documents per kind (consecutive, non-overlapping windows of the kind's text); length: tokens per document;
    tail: tokens scored at its end; budget: the routers' tokens read per step and the presses' prefix tokens kept
    (a hybrid model: per global layer, its sliding layers untouched); scorers: routers over exact blocks;
    int8_scorers: routers again over int8 blocks (`Engine(kv_bits=8)`), beside "int8 dense"; presses:
    `peers.PRESSES` names; bits: HQQ's; block_size: the store's tokens per block; prefill: sparsekv's (`PREFILLS`);
    doc0: the first document's window (documents doc0 .. doc0 + docs - 1 of each kind); router: the router the
    declared contrasts compare with every peer, named before the run (one of `scorers`); margin: the
    non-inferiority margin (nats per token) for that router over int8 blocks against exact blocks."""

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
    doc0: int = 0
    router: str = "halves"
    margin: float = 0.02

    def __post_init__(self):
        if not self.kinds or any(k not in corpus.HAYSTACKS for k in self.kinds):
            raise ValueError(f"kinds must name kinds of {sorted(corpus.HAYSTACKS)}, got {list(self.kinds)!r}")
        for name in ("docs", "length", "tail", "budget", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(self.doc0, int) or isinstance(self.doc0, bool) or self.doc0 < 0:
            raise ValueError(f"doc0 must be an int >= 0, got {self.doc0!r}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not 0 < self.margin < 1:
            raise ValueError(f"margin must be in (0, 1) nats per token, got {self.margin!r}")
        if not 1 <= self.tail <= 128 or self.tail + 2 > self.length:
            raise ValueError(f"tail must be from 1 to min(128, length - 2) = {min(128, self.length - 2)} (HQQ keeps "
                             f"128 tokens in full precision), got {self.tail!r}")
        if self.budget >= self.length - self.tail - 1:
            raise ValueError(f"budget must be below the prefix's {self.length - self.tail - 1} tokens, got "
                             f"{self.budget!r}")
        for name in ("scorers", "int8_scorers"):
            if any(s not in SCORERS for s in getattr(self, name)):
                raise ValueError(f"{name} must name scorers of {list(SCORERS)}, got {list(getattr(self, name))!r}")
        if self.router not in self.scorers:
            raise ValueError(f"router must be one of scorers {list(self.scorers)}, got {self.router!r}")
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
class TailStudy(qs.MethodsRun):
    """A finished run. rows: one per (kind, doc, method, token) with its loss "nll" (nats); summary: (kind, method) ->
    {"n" tokens, "docs", "nll" (mean), "delta" (the mean excess over the method's own engine's dense), "lo", "hi"
    (its paired cluster-bootstrap 95% interval over documents), "p" (its clustered t-test, raw: descriptive),
    "docs_worse" (documents whose mean loss is above dense's)}; contrasts: the declared comparisons (`plan`) as one
    evaluated Holm family (`clustered.ContrastTable`); agree: kind -> sparsekv dense minus transformers dense
    ({"n", "docs", "mean", "lo", "hi", "p"}: the engines' own difference); nbytes: method -> `questions.method_bytes`
    at `length`; model_vs_held: transformers method -> measured held bytes over the byte model's (float32 tensors,
    every HQQ token quantised), held_modelled the latter."""

    config: TailConfig
    summary: dict = field(default_factory=dict)
    contrasts: clustered.ContrastTable | None = None
    agree: dict = field(default_factory=dict)
    held_modelled: dict = field(default_factory=dict)

    def dense_of(self, name: str) -> str:
        """The dense a method is compared with: its own engine's ("dense" for sparsekv's, "hf dense" for transformers')."""
        return "dense" if name in {m.name for m in self.lossless} else "hf dense"

    def family(self, name: str) -> str:
        """The plotting family of a method (`questions.family`)."""
        return qs.family(name, self.lossless, self.lossy)

    def contrast(self, kind: str, what: str) -> clustered.ContrastRow | None:
        """The declared contrast `what` on `kind` of text (a name from `plan`, without its "<kind>: "), None when the
        run's methods did not declare it."""
        name = f"{kind}: {what}"
        return self.contrasts[name] if self.contrasts is not None and name in self.contrasts.plan.names else None


def plan(st: TailStudy, seed: int = 0) -> clustered.ContrastPlan | None:
    """The declared comparisons of a run, from its configuration alone (`st.lossless` and `st.lossy` follow from it;
    no loss is read): per kind of text, in this order,

        "hqq2 vs hqq8"                            HQQ 2-bit against 8-bit (the gated finding)
        "oracle@B vs minmax@B"                    the oracle against `minmax`
        "R@B vs <press>@B", one per press         the named router against every press (never a "best" press)
        "R@B vs hqq8", "R@B vs hqq4"              against HQQ 8- and 4-bit
        "int8 R@B no worse than R@B"              non-inferiority within `margin` nats per token (lower is better)

    (R the named router, B the budget), each present when the run has both methods, in one Holm family over every
    kind. Losses are continuous (nats), so differences are tested on the clustered t route and intervals resample
    documents. None when the run declares none."""
    cfg, b = st.config, st.config.budget
    names = set(st.methods)
    r = f"{cfg.router}@{b}"
    pairs = [("hqq2", "hqq8"), (f"oracle@{b}", f"minmax@{b}")]
    pairs += [(r, m.name) for m in st.lossy if m.family == "evict"]
    pairs += [(r, "hqq8"), (r, "hqq4")]
    out = []
    for kind in cfg.kinds:
        out += [clustered.Contrast(f"{kind}: {a} vs {x}", a, x, unit="nats", binary=False) for a, x in pairs
                if a in names and x in names]
        if f"int8 {r}" in names and r in names:
            out.append(clustered.Contrast(f"{kind}: int8 {r} no worse than {r}", f"int8 {r}", r, "non-inferiority",
                                          cfg.margin, higher_is_better=False, unit="nats", binary=False))
    return clustered.ContrastPlan(out, seed=seed) if out else None


def _tokens(rows: list[dict], kind: str, method: str) -> dict[tuple, float]:
    return {(r["doc"], r["token"]): r["nll"] for r in rows if r["kind"] == kind and r["method"] == method}


def _paired(rows: list[dict], kind: str, a: str, b: str):
    """(a's losses, b's losses, their documents) over the tokens both scored on `kind`, in (doc, token) order."""
    import numpy as np
    ta, tb = _tokens(rows, kind, a), _tokens(rows, kind, b)
    common = sorted(set(ta) & set(tb))
    if not common:
        raise ValueError(f"methods {a!r} and {b!r} scored no common token of kind {kind!r}")
    return (np.array([ta[k] for k in common]), np.array([tb[k] for k in common]),
            np.array([d for d, _ in common]))


def paired_delta(rows: list[dict], kind: str, a: str, b: str, seed: int = 0) -> dict:
    """Method a's loss minus b's on `kind`, over the tokens both scored, with documents as the unit
    (`clustered.paired_difference`): {"n" tokens, "docs", "mean", "lo", "hi" (cluster-bootstrap 95% interval), "p"
    (clustered t-test, raw)}. ValueError when they share no token, or share fewer than 2 documents."""
    r = clustered.paired_difference(*_paired(rows, kind, a, b), seed=seed, binary=False)
    return {"n": r.n_questions, "docs": r.n_docs, "mean": r.estimate, "lo": r.lo, "hi": r.hi, "p": r.p}


def summarize(st: TailStudy, seed: int = 0) -> None:
    """Fill `st.summary`, `st.agree` and `st.contrasts` from `st.rows` (see `TailStudy`)."""
    for kind in st.config.kinds:
        for m in st.methods:
            dense = st.dense_of(m)
            mine, ref = _tokens(st.rows, kind, m), _tokens(st.rows, kind, dense)
            b = paired_delta(st.rows, kind, m, dense, seed) if m != dense else \
                {"n": len(mine), "docs": len({d for d, _ in mine}), "mean": 0.0, "lo": 0.0, "hi": 0.0, "p": 1.0}
            docs = sorted({d for d, _ in mine})
            worse = sum(sum(mine[k] for k in mine if k[0] == d) > sum(ref[k] for k in ref if k[0] == d) for d in docs)
            st.summary[(kind, m)] = {"n": b["n"], "nll": sum(mine.values()) / len(mine), "delta": b["mean"],
                                     "lo": b["lo"], "hi": b["hi"], "p": b["p"], "docs_worse": worse,
                                     "docs": len(docs)}
        st.agree[kind] = paired_delta(st.rows, kind, "dense", "hf dense", seed)
    p = plan(st, seed)
    if p is not None:
        st.contrasts = p.evaluate_pairs({c.name: _paired(st.rows, c.name.split(": ", 1)[0], c.method_a, c.method_b)
                                         for c in p.contrasts})


def run(cfg: TailConfig, progress: bool = True) -> TailStudy:
    """Load the model (sparsekv's store and transformers' float32 model of the same file), score every method's tail
    on every document, then count bytes and summarise (`summarize`)."""
    from tqdm.auto import tqdm

    from ...model import fetch

    tok, hf, engines, windows = load(cfg.model_path, cfg.prefill, cfg.block_size, cfg.length,
                                     cfg.scorers + cfg.int8_scorers, bool(cfg.int8_scorers))
    st = TailStudy(cfg, fetch.title(cfg.model_path), windows, *methods_of(cfg))
    t0 = time.perf_counter()
    for kind in cfg.kinds:          # refuse a window past the text before any document runs
        text = len(tok(corpus.haystack(kind), add_special_tokens=False)["input_ids"])
        body = cfg.length - (tok.bos_token_id is not None)          # `document`'s tokens of text
        have = max(0, (text - body) // cfg.length + 1)
        if cfg.doc0 + cfg.docs > have:
            raise ValueError(f"docs: {kind} text holds {have} documents of {cfg.length} tokens; doc0 + docs = "
                             f"{cfg.doc0 + cfg.docs} must be at most that")
    with tqdm(total=len(cfg.kinds) * cfg.docs, desc="documents", disable=not progress) as bar:
        for kind in cfg.kinds:
            for d in range(cfg.doc0, cfg.doc0 + cfg.docs):
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
    st.held_modelled = {m.name: qs.method_bytes(m, cfg.prefix, itemsize=4, residual=0, layout="transformers",
                                                **geom)["held_bytes"] for m in st.lossy}
    st.model_vs_held = {m: max(st.held_measured[m]) / st.held_modelled[m] for m in st.held_modelled}
    summarize(st)
    return st


def methods_of(cfg: TailConfig) -> tuple[list, list]:
    """(lossless, lossy): sparsekv's methods (dense, each scorer at the budget, then "int8 dense" and the int8
    scorers) and transformers' (`questions.peer_methods`), from the configuration alone."""
    lossless = [qs.Lossless("dense")] + [qs.Lossless(f"{s}@{cfg.budget}", Router(s, token_budget=cfg.budget),
                                                     cfg.budget) for s in cfg.scorers]
    if cfg.int8_scorers:
        lossless += [qs.Lossless("int8 dense", kv_bits=8)] + [
            qs.Lossless(f"int8 {s}@{cfg.budget}", Router(s, token_budget=cfg.budget), cfg.budget, kv_bits=8)
            for s in cfg.int8_scorers]
    return lossless, qs.peer_methods(cfg.presses, [cfg.budget], cfg.prefix, cfg.bits)


# -- a run in cells: each a block of documents written to a folder, all read back as one study -------------------

RUN_FIELDS = ("doc0", "docs")      # the fields in which the cells of one study may differ


def write_cell(st: TailStudy, rows_path) -> None:
    """A finished run as a cell of a larger study: its rows at `rows_path` ("<stem>.rows.csv", one row per kind,
    document, method and token) and beside it "<stem>.cell.json" (configuration, model, windows, bytes, held bytes
    measured and modelled, seconds). `load_cells` reads every cell back as one study."""
    import csv
    import json
    from dataclasses import asdict
    rows_path = Path(rows_path)
    if not rows_path.name.endswith(".rows.csv"):
        raise ValueError(f"rows_path must end in '.rows.csv', got {str(rows_path)!r}")
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    with open(rows_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["kind", "doc", "method", "token", "nll"])
        w.writeheader()
        w.writerows(st.rows)
    info = {"config": asdict(st.config), "model_name": st.model_name,
            "windows": list(st.windows) if st.windows is not None else None, "nbytes": st.nbytes,
            "held_measured": {m: max(v) for m, v in st.held_measured.items()}, "held_modelled": st.held_modelled,
            "run_s": st.run_s}
    rows_path.with_name(rows_path.name.replace(".rows.csv", ".cell.json")).write_text(json.dumps(info, indent=1))


def load_cells(*folders) -> TailStudy | None:
    """Every cell (`write_cell`) under the folders, as one summarised study: rows concatenated (a token scored twice,
    by a cell run twice, kept once), the configuration of the cells with doc0 the first document and docs the
    documents of the kind with the fewest; bytes from the cells, held bytes measured as the largest any cell saw.
    Cells that differ in any field but `RUN_FIELDS` are a ValueError naming it. None when no folder holds a cell."""
    import csv
    import json
    cells = sorted(f for d in folders if d and Path(d).is_dir() for f in Path(d).rglob("*.cell.json"))
    if not cells:
        return None
    infos = [json.loads(f.read_text()) for f in cells]
    first = infos[0]
    for f, info in zip(cells, infos):
        for k, v in info["config"].items():
            if k not in RUN_FIELDS and v != first["config"][k]:
                raise ValueError(f"cells must share every field but {RUN_FIELDS}: {f} has {k} = {v!r}, {cells[0]} has "
                                 f"{first['config'][k]!r}")
    rows = {}
    for f in cells:
        with open(f.with_name(f.name.replace(".cell.json", ".rows.csv")), newline="") as fh:
            for r in csv.DictReader(fh):
                key = (r["kind"], int(r["doc"]), r["method"], int(r["token"]))
                rows[key] = {"kind": key[0], "doc": key[1], "method": key[2], "token": key[3], "nll": float(r["nll"])}
    docs = {}
    for kind, d, _, _ in rows:
        docs.setdefault(kind, set()).add(d)
    cfg = TailConfig(**{**first["config"], "doc0": min(min(v) for v in docs.values()),
                        "docs": min(len(v) for v in docs.values())})
    st = TailStudy(cfg, first["model_name"], tuple(first["windows"]) if first["windows"] is not None else None,
                   *methods_of(cfg), rows=list(rows.values()), run_s=sum(i["run_s"] for i in infos))
    st.nbytes = first["nbytes"]
    st.held_modelled = first["held_modelled"]
    st.held_measured = {m: [i["held_measured"][m] for i in infos] for m in first["held_measured"]}
    st.model_vs_held = {m: max(st.held_measured[m]) / st.held_modelled[m] for m in st.held_modelled}
    summarize(st)
    return st


def contrast_key(tag: str, name: str) -> str:
    """The metrics key of a declared contrast: "contrast.<tag>.<kind>.<what>" with spaces as underscores."""
    kind, what = name.split(": ", 1)
    return f"contrast.{tag}.{kind}.{what.replace(' ', '_')}"


def metrics(st: TailStudy, tag: str) -> tuple[dict, dict]:
    """(metrics, kinds) under `tag` (a model and length, e.g. "smollm2_2k"): loss.<tag>.<kind>.<method>.nll, .delta,
    .ci_lo, .ci_hi (over documents), .docs_worse; every declared contrast as `contrast_key` (the estimate) with
    .ci_lo, .ci_hi, .p_raw, .p_holm, .docs and .outcome
    (`clustered.outcome` on the Holm p: +1 higher or shown, -1 lower, 0 neither); dense_vs_hf.<tag>.<kind> with .ci_lo, .ci_hi; bytes.<tag>.<method>.read
    and .held (over bf16 dense); held_model.<tag>.<method> (measured over modelled); run_s.<tag>; the run's size:
    tokens.<tag> (scored per kind), docs.<tag>, doc0.<tag>, length.<tag>, tail.<tag>, budget.<tag>, margin.<tag>."""
    cfg = st.config
    m = {f"run_s.{tag}": st.run_s, f"tokens.{tag}": st.summary[(cfg.kinds[0], "dense")]["n"], f"docs.{tag}": cfg.docs,
         f"doc0.{tag}": cfg.doc0, f"length.{tag}": cfg.length, f"tail.{tag}": cfg.tail, f"budget.{tag}": cfg.budget,
         f"margin.{tag}": cfg.margin}
    kinds = {k: "exact" for k in m}
    kinds[f"run_s.{tag}"] = "timing"
    for (kind, name), s in st.summary.items():
        key = f"loss.{tag}.{kind}.{name}"
        m[key + ".nll"], m[key + ".delta"], m[key + ".ci_lo"], m[key + ".ci_hi"] = s["nll"], s["delta"], s["lo"], s["hi"]
        m[key + ".docs_worse"] = s["docs_worse"]
        kinds[key + ".docs_worse"] = "exact"
    for r in st.contrasts or ():
        key = contrast_key(tag, r.name)
        m[key], m[key + ".ci_lo"], m[key + ".ci_hi"] = r.estimate, r.lo, r.hi
        m[key + ".p_raw"], m[key + ".p_holm"], m[key + ".docs"] = r.p_raw, r.p_adj, r.n_docs
        m[key + ".outcome"] = r.outcome
        kinds[key + ".docs"] = kinds[key + ".outcome"] = "exact"
    for kind, b in st.agree.items():
        key = f"dense_vs_hf.{tag}.{kind}"
        m[key], m[key + ".ci_lo"], m[key + ".ci_hi"] = b["mean"], b["lo"], b["hi"]
    for name, v in st.nbytes.items():
        m[f"bytes.{tag}.{name}.read"], m[f"bytes.{tag}.{name}.held"] = v["read"], v["held"]
    for name, v in st.model_vs_held.items():
        m[f"held_model.{tag}.{name}"] = v
    return m, kinds


__all__ = ["TailConfig", "TailStudy", "document", "lossless_losses", "peer_losses", "plan", "paired_delta",
           "summarize", "run", "methods_of", "write_cell", "load_cells", "contrast_key", "metrics"]
