"""Synthetic recall tasks at the token level, for training and for end-to-end routing studies.

Vocabulary (1,024 ids, the `recall` presets):
    0 PAD, 1 QUERY, 2 PASS       markers
    [8, 256)                      filler (background text)
    [256, 640)                    keys / variable names
    [640, 1024)                   values / passkey symbols

Every task writes a context, then queries at the end. A query is a key token whose next token
(the answer) the model must predict; answers are teacher-forced, so the logits after each query
token are scored. Tasks:
    mqar       n_pairs key-value pairs at random depths in filler; n_queries of them queried
    niah       n_keys needles (key-value pairs) at random or given depths, all queried
    passkey    PASS s1..s5 at a random depth; QUERY s1..s5 at the end (predict each symbol)
    multihop   variable tracking: chains x1 = v, x2 = x1, ..., each written in order (shuffled=True:
               in any order) at random depths, with distractor chains; query x_hops.
               `min_hops` < `hops` gives each chain min_hops..hops links (a hop mix for training)
Evaluation sets use a separate seed stream (`EVAL_SEED_OFFSET`), so they never repeat training data.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

PAD, QUERY, PASS = 0, 1, 2
FILLER = (8, 256)
KEYS = (256, 640)
VALUES = (640, 1024)
VOCAB = 1024
EVAL_SEED_OFFSET = 1_000_003          # eval generators start here; training uses seeds below it


@dataclass
class Batch:
    tokens: torch.Tensor      # [B, T] int64
    targets: torch.Tensor     # [B, T] int64: the answer expected after position t, or -100
    depths: torch.Tensor      # [B, Q] float: depth (0..1) of the fact each query needs
    first_query: torch.Tensor  # [B] int64: position of the first scored token (prefill up to and including it)


def _distinct(g, lo, hi, n):
    return lo + torch.randperm(hi - lo, generator=g)[:n]


def _slots(g, length, n, width, depths=None):
    """n non-overlapping start positions for `width`-token items inside [0, length)."""
    cells = length // width
    if depths is not None:
        starts = [min(cells - 1, int(d * (cells - 1))) for d in depths]
        used, out = set(), []
        for c in starts:                      # nudge collisions to the next free cell
            while c in used:
                c = (c + 1) % cells
            used.add(c)
            out.append(c * width)
        return out
    return (torch.randperm(cells, generator=g)[:n] * width).tolist()


def _pairs(task: str, length: int, g: torch.Generator, **kw):
    """MQAR and needles: key-value pairs in filler, then queries for some keys."""
    n_pairs = kw.get("n_pairs", 16 if task == "mqar" else 8)
    n_queries = kw.get("n_queries", 8 if task == "mqar" else n_pairs)
    q_len = 2 * n_queries
    ctx = length - q_len
    keys, vals = _distinct(g, *KEYS, n_pairs), _distinct(g, *VALUES, n_pairs)
    tokens = torch.randint(*FILLER, (length,), generator=g)
    starts = _slots(g, ctx, n_pairs, 2, kw.get("depths"))
    for s, k, v in zip(starts, keys, vals):
        tokens[s], tokens[s + 1] = k, v
    ask = torch.randperm(n_pairs, generator=g)[:n_queries]
    targets = torch.full((length,), -100)
    for i, j in enumerate(ask.tolist()):
        p = ctx + 2 * i
        tokens[p], tokens[p + 1] = keys[j], vals[j]
        targets[p] = vals[j]
    depths = torch.tensor([starts[j] / max(1, ctx - 1) for j in ask.tolist()])
    return tokens, targets, depths, ctx


def _passkey(length: int, g: torch.Generator, **kw):
    """A PASS marker and n symbols in filler; after QUERY the model recites the symbols."""
    n = kw.get("symbols", 5)
    sym = _distinct(g, *VALUES, n)
    ctx = length - (n + 1)
    tokens = torch.randint(*FILLER, (length,), generator=g)
    (s,) = _slots(g, ctx - (n + 1), 1, n + 1, kw.get("depths"))
    tokens[s] = PASS
    tokens[s + 1:s + 1 + n] = sym
    targets = torch.full((length,), -100)
    tokens[ctx] = QUERY
    tokens[ctx + 1:ctx + 1 + n] = sym
    targets[ctx:ctx + n] = sym
    return tokens, targets, torch.full((n,), s / max(1, ctx - 1)), ctx


def _multihop(length: int, g: torch.Generator, **kw):
    """Variable tracking: chains x_1 = value, x_h = x_{h-1}; the query names a chain's last variable."""
    hops, chains = kw.get("hops", 2), kw.get("chains", 4)
    min_hops = kw.get("min_hops", hops)
    n_queries = kw.get("n_queries", 1)
    if not 1 <= min_hops <= hops:
        raise ValueError(f"min_hops must be in [1, hops={hops}], got {min_hops}")
    if min_hops == hops:                   # draws nothing: fixed-hop streams stay as they were
        per_chain = [hops] * chains
    else:                                  # a hop mix: chain c gets min_hops..hops links
        per_chain = torch.randint(min_hops, hops + 1, (chains,), generator=g).tolist()
    offsets = [sum(per_chain[:c]) for c in range(chains + 1)]
    flat = _distinct(g, *KEYS, offsets[-1])
    names = [flat[offsets[c]:offsets[c + 1]] for c in range(chains)]
    vals = _distinct(g, *VALUES, chains)
    ctx = length - 2 * n_queries
    tokens = torch.randint(*FILLER, (length,), generator=g)
    starts = _slots(g, ctx, offsets[-1], 2, kw.get("depths"))
    if not kw.get("shuffled", False):      # variable tracking: a name is assigned after its source
        starts = [s for c in range(chains) for s in sorted(starts[offsets[c]:offsets[c + 1]])]
    it = iter(starts)
    for c in range(chains):
        for h in range(per_chain[c]):      # x_1 = value, x_h = x_{h-1}
            s = next(it)
            tokens[s] = names[c][h]
            tokens[s + 1] = vals[c] if h == 0 else names[c][h - 1]
    targets = torch.full((length,), -100)
    ask = torch.randperm(chains, generator=g)[:n_queries]
    for i, c in enumerate(ask.tolist()):
        p = ctx + 2 * i
        tokens[p], tokens[p + 1] = names[c][-1], vals[c]
        targets[p] = vals[c]
    depths = torch.tensor([min(starts[offsets[c]:offsets[c + 1]]) / max(1, ctx - 1) for c in ask.tolist()])
    return tokens, targets, depths, ctx


# The task registry: name -> generator(length, g, **kw) -> (tokens [T], targets [T], depths [Q], first_query).
GENERATORS = {
    "mqar": lambda length, g, **kw: _pairs("mqar", length, g, **kw),
    "niah": lambda length, g, **kw: _pairs("niah", length, g, **kw),
    "passkey": _passkey,
    "multihop": _multihop,
}
TASKS = tuple(GENERATORS)


def make_example(task: str, length: int, g: torch.Generator, **kw):
    """One sequence: (tokens [T], targets [T], depths [Q], first_query). `length` counts everything."""
    if task not in GENERATORS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return GENERATORS[task](length, g, **kw)


def make_batch(task: str, batch: int, length: int, seed: int, **kw) -> Batch:
    """A seeded batch; the same (task, batch, length, seed, kw) always gives the same tokens."""
    g = torch.Generator().manual_seed(seed)
    rows = [make_example(task, length, g, **kw) for _ in range(batch)]
    return Batch(torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]),
                 torch.stack([r[2] for r in rows]), torch.tensor([r[3] for r in rows]))


def eval_batch(task: str, batch: int, length: int, index: int = 0, **kw) -> Batch:
    """An evaluation batch from the eval seed stream (disjoint from training seeds)."""
    return make_batch(task, batch, length, EVAL_SEED_OFFSET + 7919 * length + index, **kw)


def accuracy(logits: torch.Tensor, targets: torch.Tensor, per: str = "answer") -> float:
    """Answer accuracy: per scored token ("answer") or whole examples right ("example")."""
    mask = targets != -100
    right = (logits.argmax(-1) == targets) | ~mask
    if per == "example":
        return float(right.all(-1).float().mean())
    return float(right[mask].float().mean())
