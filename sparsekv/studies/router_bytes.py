"""Routers against the oracle at equal summary bytes, on held-out passkeys (notebook 16).

One grid: every scorer at every token budget, in each block size, on the same prompts (`hybrid.block_size_grid`:
one engine per block size, one prefill per prompt, every method on a fork). A method is a (scorer, budget, block
size) triple, named "<scorer>@<budget>.bs<block size>". Each cell is over the prompts dense answers in the
reference block size (dense answers the same prompts in every block size when the store is exact, which the grid
records as `dense_moved`), with its Wilson 95% interval; each pre-stated pair is an exact McNemar test on those
prompts. Bytes are what one decode step reads over every layer (`realmodel.step_bytes`: K/V of the budget and the
summaries the scorer reads, at the store's widths), and the summary bytes held per token.

    rows = grid(model, tok, cfg)
    res = summarize(rows, cfg, store_configs, num_q_heads)      # cells, pairs, bytes

Tail loss: `tail_loss` feeds the last `tail` tokens of real documents (consecutive windows of the standard library's
prose and source, `analysis.corpus`) after a dense prefill of the rest, under dense and every router, and keeps the
loss of every predicted token; `loss_summary` gives each method's mean and its difference from dense with a paired
per-token bootstrap interval, per kind of text (never pooled across kinds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis import corpus, observe
from ..analysis.stats import mcnemar, paired_bootstrap, wilson
from ..model.engine import Engine
from ..routing.router import Router
from ..routing.scorers import summaries_for
from . import hybrid, realmodel


@dataclass(frozen=True)
class GridConfig:
    """One held-out grid. seed: the prompts' (held out from every other notebook's passkey seeds, with `jitter`:
    new keys at new depths); reference_block_size: the block size whose dense answers define a cell's prompts."""

    length: int = 2048                    # prompt tokens
    prompts: int = 60                     # passkey prompts, depths drawn within 1/prompts slots of [0.05, 0.95]
    seed: int = 2
    scorers: tuple = ("oracle", "halves", "mean", "minmax")
    budgets: tuple = (64, 128)            # tokens read per step and layer, the forced sink and local blocks included
    block_sizes: tuple = (16, 8)          # the first is the reference
    summaries: tuple | None = None        # the store's summaries; None: what the scorers read (`summaries_for`)

    def __post_init__(self):
        for name in ("length", "prompts"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.summaries is None:
            object.__setattr__(self, "summaries", summaries_for(self.scorers))
        for name in ("scorers", "budgets", "block_sizes", "summaries"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name):
                raise ValueError(f"{name} must name at least one value")

    @property
    def reference_block_size(self) -> int:
        return self.block_sizes[0]


def method_name(scorer: str, budget: int, block_size: int) -> str:
    return f"{scorer}@{budget}.bs{block_size}"


def grid(model, tok, cfg: GridConfig, progress: bool = True) -> list[dict]:
    """Every method's answer to every prompt: rows {prompt, depth, method ("dense.bs<n>" or method_name), scorer,
    budget, block_size, correct}."""
    rows = hybrid.block_size_grid(model, tok, cfg.length, cfg.prompts, cfg.block_sizes, cfg.scorers, cfg.budgets,
                                  seed=cfg.seed, progress=progress, jitter=True, summaries=cfg.summaries)
    out = []
    for r in rows:
        scorer, _, budget = r["method"].partition("@")
        out.append({"prompt": r["prompt"], "depth": r["depth"], "block_size": r["block_size"], "scorer": scorer,
                    "budget": int(budget) if budget else 0, "correct": bool(r["correct"]),
                    "method": f"dense.bs{r['block_size']}" if scorer == "dense"
                    else method_name(scorer, int(budget), r["block_size"])})
    return out


@dataclass
class Summary:
    """cells: method -> {k, n, acc, lo, hi} over `prompts`; pairs: (a, b) -> McNemar; step: method -> the bytes
    one decode step reads (a StepTraffic); held_per_token: method -> summary bytes held per token and layer."""

    prompts: list                         # the prompts dense answers in the reference block size
    dense_moved: dict                     # block size -> prompts whose dense answer differs from the reference's
    cells: dict = field(default_factory=dict)
    pairs: dict = field(default_factory=dict)
    step: dict = field(default_factory=dict)
    held_per_token: dict = field(default_factory=dict)


def summarize(rows: list[dict], cfg: GridConfig, store_configs: dict, num_q_heads: int, pairs=()) -> Summary:
    """Cells over the prompts dense answers in the reference block size, the McNemar tests of `pairs` ((a, b)
    method names; a pair naming a method the grid lacks is a ValueError), and every method's bytes.
    `store_configs`: block size -> the StoreConfig of that grid's engine."""
    ref = cfg.reference_block_size
    routed = [r for r in rows if r["scorer"] != "dense" or r["block_size"] == ref]
    ok, cells, tests = paired_cells(routed, pairs, dense=f"dense.bs{ref}")
    missing = [m for pair in pairs for m in pair if m not in cells]
    if missing:
        raise ValueError(f"pairs name methods the grid lacks or that have no prompt: {missing}")
    answered = lambda bs: {r["prompt"] for r in rows if r["method"] == f"dense.bs{bs}" and r["correct"]}  # noqa: E731
    res = Summary(ok, {bs: len(answered(bs) ^ set(ok)) for bs in cfg.block_sizes if bs != ref}, cells, tests)
    for r in {(r["scorer"], r["budget"], r["block_size"]) for r in rows if r["scorer"] != "dense"}:
        scorer, budget, bs = r
        router, c = Router(scorer, token_budget=budget), store_configs[bs]
        name = method_name(scorer, budget, bs)
        res.step[name] = realmodel.step_bytes(router, c, num_q_heads, cfg.length)
        per_tile = router.scorer.vectors(c) * c.head_dim * c.summary_itemsize if scorer != "oracle" else 0
        res.held_per_token[name] = per_tile * c.num_kv_heads / bs
    return res


def hybrid_grid(model, tok, length: int, prompts: int, seed: int, scorers, budgets, block_size: int = 16,
                summaries=None, progress: bool = True) -> list[dict]:
    """Passkey on a hybrid model (Gemma 3: routers route its global layers, the sliding ones read their window):
    `prompts` held-out prompts (new keys at new depths: `jitter`), dense and every scorer at every budget on forks of
    one prefill. Rows as `hybrid.answer_grid`'s, methods named "dense" and "<scorer>@<budget>"."""
    engine = Engine(model, block_size=block_size, num_blocks=3 * (length // block_size + 64), prefix_cache=True,
                    progress=False, summaries=summaries or summaries_for(scorers))
    routers = {"dense": None, **{f"{s}@{b}": Router(s, token_budget=b) for s in scorers for b in budgets}}
    rows, _ = hybrid.answer_grid(engine, tok, [length], prompts, routers, route_lengths=[length], tasks=("passkey",),
                                 seed=seed, progress=progress, jitter=True)
    return rows


def paired_cells(rows: list[dict], pairs=(), dense: str = "dense") -> tuple[list, dict, dict]:
    """Rows {prompt, method, correct} -> (the prompts `dense` answers, method -> Wilson cell {k, n, acc, lo, hi} over
    them, (a, b) -> exact McNemar on them for each pair in `pairs`)."""
    by = {(r["method"], r["prompt"]): bool(r["correct"]) for r in rows}
    ok = sorted(p for (m, p), c in by.items() if m == dense and c)
    cells, tests = {}, {}
    for m in sorted({r["method"] for r in rows} - {dense}):
        xs = [by[m, p] for p in ok]
        if xs:
            lo, hi = wilson(sum(xs), len(xs))
            cells[m] = {"k": sum(xs), "n": len(xs), "acc": sum(xs) / len(xs), "lo": lo, "hi": hi}
    for a, b in pairs:
        if a in cells and b in cells:
            tests[a, b] = mcnemar([by[a, p] for p in ok], [by[b, p] for p in ok])
    return ok, cells, tests


def tail_loss(model, tok, kinds=("prose", "code"), docs: int = 4, length: int = 4096, tail: int = 128,
              scorers=("oracle", "halves", "mean", "minmax"), budget: int = 256, block_size: int = 16,
              summaries=None, progress: bool = True) -> list[dict]:
    """Per-token next-token loss over the last `tail` tokens of `docs` documents of `length` tokens per kind
    (document i: tokens [i * length, (i + 1) * length) of the kind's text, BOS first), for dense and every scorer at
    `budget` tokens. Rows {kind, doc, method ("dense" or "<scorer>@<budget>"), token, nll}."""
    from tqdm.auto import tqdm
    engine = Engine(model, block_size=block_size, num_blocks=2 * (length // block_size + 16), progress=False,
                    summaries=summaries or summaries_for(scorers))
    methods = {"dense": None, **{f"{s}@{budget}": Router(s, token_budget=budget) for s in scorers}}
    rows = []
    with tqdm(total=len(kinds) * docs, desc="documents", disable=not progress, leave=False) as bar:
        for kind in kinds:
            text = corpus.haystack(kind)
            for d in range(docs):
                ids = [tok.bos_token_id] + corpus.take(tok, text, length - 1, offset=d * length)
                seq = engine.new_sequence()
                engine.prefill(seq, ids[:length - tail - 1])
                for name, router in methods.items():
                    losses, _ = observe.tail_token_nll(engine, seq, ids[length - tail - 1:], router)
                    rows += [{"kind": kind, "doc": d, "method": name, "token": t, "nll": float(x)}
                             for t, x in enumerate(losses.tolist())]
                engine.finish(seq)
                bar.update()
    return rows


def loss_summary(rows: list[dict], seed: int = 0) -> dict:
    """(kind, method) -> {"n", "nll" (mean), "delta" (method minus dense, mean), "lo", "hi" (its paired per-token
    bootstrap 95% interval)}; dense's own delta is 0."""
    by = {(r["kind"], r["method"], r["doc"], r["token"]): r["nll"] for r in rows}
    out = {}
    for kind, method in sorted({(r["kind"], r["method"]) for r in rows}):
        keys = sorted((d, t) for (k, m, d, t) in by if (k, m) == (kind, method))
        mine = [by[kind, method, d, t] for d, t in keys]
        dense = [by[kind, "dense", d, t] for d, t in keys]
        b = paired_bootstrap(mine, dense, seed=seed)
        out[kind, method] = {"n": b["n"], "nll": sum(mine) / len(mine), "delta": b["mean"], "lo": b["lo"], "hi": b["hi"]}
    return out


__all__ = ["GridConfig", "method_name", "grid", "Summary", "summarize", "hybrid_grid", "paired_cells", "tail_loss",
           "loss_summary"]
