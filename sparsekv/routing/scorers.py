"""Block scorers: how a router ranks blocks for one decode query, in a registry.

Each scorer turns a query and the store's per-block summaries (or, for the oracle, the keys
themselves) into block logits [H, G or 1, nb]; `Router` softmaxes and selects. The registry
(`SCORERS`) is bound once, below, from every built-in scorer (the flat ones here and the
hierarchical one in `hierarchy`); `register_scorer` adds another. A router takes a scorer as an
instance or by name (`make_scorer`): a registered name, or a parametrised one ("hminmax-g64-k4")
that the named family reads back (`Scorer.from_name`).
"""
from __future__ import annotations

import math

import torch

from ..core import registry
from ..core.traffic import key_traffic
from .hierarchy import HierarchicalMinMaxScorer
from .mass import block_attention_mass
from .scorer_base import ScoreInput, Scorer

# -- scorers ----------------------------------------------------------------------------------

def _summary_logits(q: torch.Tensor, summary: torch.Tensor, inp: ScoreInput) -> torch.Tensor:
    """q [H, G, D] against a head-major summary [L, NB, H, D]: q . s for the sequence's blocks, [H, G, nb].

    When the sequence holds at least a quarter of the pool, multiply against the whole
    layer's summaries (one contiguous [NB, D] matrix per kv head, no copy) and keep the
    sequence's columns; otherwise gather its blocks' summaries first. Either way nothing of
    size H x nb x D is formed from the pool beyond what a kernel would read.
    """
    per_head = summary[inp.layer].transpose(0, 1)                          # [H, NB, D] view
    if 4 * inp.table.numel() >= per_head.shape[1]:
        return (q @ per_head.float().transpose(1, 2))[:, :, inp.table]
    return q @ per_head[:, inp.table].float().transpose(1, 2)


def _cpp_summaries(inp: ScoreInput) -> bool:
    """Whether the fused CPU scorer reads these summaries (float32 or bf16, on the CPU)."""
    c = inp.store.config
    return c.device.type == "cpu" and c.summary_dtype in (torch.float32, torch.bfloat16)


def _triton_scores(inp: ScoreInput) -> tuple[torch.Tensor, torch.Tensor]:
    """minmax and mean logits [H, G, nb] from the block-scoring kernel (one pass for both)."""
    from ..kernels.block_score import block_scores
    H, G, D = inp.q.shape
    s, L = inp.store, inp.layer
    minmax, mean = block_scores(inp.q.reshape(1, H * G, D), s.kmin[L], s.kmax[L], s.kmean[L],
                                inp.table[None], torch.tensor([inp.table.numel()], device=inp.q.device))
    return minmax.view(H, G, -1), mean.view(H, G, -1)


def fused_route(scorer: Scorer, inp: ScoreInput, top_k: int, sink: int, local: int):
    """Score, distribute and select in one pass of the CPU route kernel (`kernels/cpu/route.cpp`):
    (blocks [H, min(top_k, nb)] int64 ascending, mass [H, nb] float32), the result of softmax per query
    head, the group's mean and top-k with the forced blocks first (Router's gqa="shared", agg="sum").
    Only for a scorer with a `fused_kind`, on summaries `_cpp_summaries` accepts."""
    from ..kernels.cpu_decode import route_topk
    H, G, D = inp.q.shape
    a, b = scorer.route_operands(inp.store, inp.layer)                      # [H, NB, D] each, contiguous
    return route_topk(inp.q.reshape(H * G, D).contiguous(), a, b, inp.table, scorer.fused_kind, top_k, sink, local)


class MinMaxScorer(Scorer):
    """Quest's upper bound on q.k over the block: sum_i max(q_i min_i, q_i max_i).

    Reads the per-block key summaries kmin and kmax (2 vectors per tile). The fast path is
    two matrix products, q+ @ max + q- @ min, so nothing of size H x nb x D is formed
    beyond the summaries themselves.
    """

    name, reads, fused_kind = "minmax", ("kmin", "kmax"), 0

    def logits(self, inp, backend, generator):
        q = inp.q
        if backend == "triton":
            return _triton_scores(inp)[0]
        if backend == "cpp" and _cpp_summaries(inp):      # the fused pass: summaries read once, in place
            from ..kernels.cpu_decode import minmax_scores
            H, G, D = q.shape
            lo = inp.store.kmin[inp.layer].transpose(0, 1)                    # [H, NB, D], contiguous
            hi = inp.store.kmax[inp.layer].transpose(0, 1)
            return minmax_scores(q.reshape(H * G, D).float().contiguous(), lo, hi, inp.table)
        if backend == "reference":   # the definition, elementwise: [H, G, D, nb]
            kmin = inp.store.kmin[inp.layer][inp.table].float().permute(1, 2, 0)
            kmax = inp.store.kmax[inp.layer][inp.table].float().permute(1, 2, 0)
            bound = torch.maximum(q[..., None] * kmin[:, None], q[..., None] * kmax[:, None]).sum(2)
        else:
            bound = (_summary_logits(q.clamp(min=0), inp.store.kmax, inp)
                     + _summary_logits(q.clamp(max=0), inp.store.kmin, inp))
        return bound / math.sqrt(q.shape[-1])


class MeanScorer(Scorer):
    """MoBA's q . mean-key. Reads the per-block kmean summary (1 vector per tile)."""

    name, reads, fused_kind = "mean", ("kmean",), 1

    def logits(self, inp, backend, generator):
        if backend == "triton":
            return _triton_scores(inp)[1]
        if backend == "reference":
            kmean = inp.store.kmean[inp.layer][inp.table].float()             # [nb, H, D]
            return torch.einsum("hgd,nhd->hgn", inp.q, kmean) / math.sqrt(inp.q.shape[-1])
        return _summary_logits(inp.q, inp.store.kmean, inp) / math.sqrt(inp.q.shape[-1])


class HalvesScorer(Scorer):
    """MoBA's gate at half the block size, choosing whole blocks: the larger of q . mean over the block's two
    halves (the `khalf` summary), at Quest's bytes per tile (2 vectors):

        logit_b = max(q . mean(k_t, t in first half of b), q . mean(k_t, t in second half of b)) / sqrt(D)

    A half with no valid row (the second half of the sequence's partial last block, or of a one-row block) does not
    count: the summary repeats the first half's mean there. The fused CPU route computes it in one pass (kind 2)."""

    name, reads, fused_kind = "halves", ("khalf",), 2

    def route_operands(self, store, layer):
        halves = store.summary("khalf")[layer]                                          # [NB, H, 2, D] view
        return halves[:, :, 0].transpose(0, 1), halves[:, :, 1].transpose(0, 1)         # [H, NB, D] each, contiguous

    def logits(self, inp, backend, generator):
        halves = inp.store.summary("khalf")[inp.layer][inp.table]                       # [nb, H, 2, D]
        q, halves = (inp.q.double(), halves.double()) if backend == "reference" else (inp.q, halves.float())
        s = torch.einsum("hgd,nhjd->hgnj", q, halves) / math.sqrt(q.shape[-1])          # [H, G, nb, 2]
        return s.amax(-1).float()


class ReprScorer(Scorer):
    """InfLLM-style: max of q.k over the block's representative keys.

    Reads the store's `krepr` summary: per block and kv head, the `repr_keys` keys farthest
    (L2) from the block mean, chosen at write time (r vectors per tile).
    """

    name, reads = "repr", ("krepr",)

    def logits(self, inp, backend, generator):
        c = inp.store.config
        if c.repr_keys == 0:
            raise ValueError("scorer 'repr' needs StoreConfig.repr_keys >= 1, got 0")
        r = inp.store.krepr[inp.layer][inp.table].float()                  # [nb, H, r, D]
        nb, H = r.shape[:2]
        keys = r.permute(1, 0, 2, 3).reshape(H, nb * c.repr_keys, c.head_dim)
        s = (inp.q @ keys.transpose(1, 2)).view(H, inp.q.shape[1], nb, c.repr_keys)
        return s.amax(-1) / math.sqrt(c.head_dim)


class LabelScorer(Scorer):
    """Double Sparsity's approximate attention: the query's calibrated label channels against the same channels of
    every key in the block (the `klabel` summary), pooled by log-sum-exp over the block's valid rows, so a block's
    logit estimates log of its attention mass the way the oracle's is exact:

        logit_b = log sum_{t in b} exp(q[ch] . k_t[ch] / sqrt(D))        (ch: the kv head's r label channels)

    Reads the label cache (bs * r / D head_dim vectors per tile: Quest's 2 at r = 2 D / bs). Rows past the sequence's
    last token weigh 0.
    """

    name, reads, needs_calibration = "labels", ("klabel",), True

    def logits(self, inp, backend, generator):
        c = inp.store.config
        if c.labels is None:
            raise ValueError("scorer 'labels' needs a store built with labels=... and 'klabel' in its summaries")
        H, G, D = inp.q.shape
        bs, r, nb = c.block_size, c.labels.r, inp.table.numel()
        ch = c.labels.index(inp.q.device)[inp.layer]                                    # [H, r]
        qs = torch.gather(inp.q, 2, ch[:, None, :].expand(H, G, r))                     # [H, G, r]
        lab = inp.store.summary("klabel")[inp.layer][inp.table].float()                  # [nb, H, V, D]
        lab = lab.reshape(nb, H, bs, r)
        if backend == "reference":
            qs, lab = qs.double(), lab.double()
        s = torch.einsum("hgr,nhtr->hgnt", qs, lab) / math.sqrt(D)                        # [H, G, nb, bs]
        rows = torch.arange(nb * bs, device=s.device).view(nb, bs) < inp.seq.num_tokens
        return torch.where(rows, s, -torch.inf).logsumexp(-1).float()


class OracleScorer(Scorer):
    """The true softmax attention mass of each block, computed densely from the keys.

    Logits are log(mass), so the block softmax reproduces the mass exactly. It reads all of
    K and is the upper bound every other scorer is compared with.
    """

    name = "oracle"

    def score_bytes(self, store, seq):
        c = store.config
        return key_traffic(seq.num_tokens, c.num_kv_heads, c.head_dim, c.itemsize).summary_bytes

    def logits(self, inp, backend, generator):
        H, G, D = inp.q.shape
        mass = block_attention_mass(inp.q.reshape(H * G, D), inp.store, inp.seq, inp.layer)
        return mass.view(H, G, -1).log()


class RecencyScorer(Scorer):
    """Query-blind (StreamingLLM-style with the sinks): later blocks score higher. Reads nothing."""

    name, query_aware = "recency", False

    def logits(self, inp, backend, generator):
        nb = inp.table.numel()
        return torch.arange(nb, dtype=torch.float32).expand(inp.q.shape[0], 1, nb)


class RandomScorer(Scorer):
    """Query-blind: uniform random scores per kv head, from the router's seeded generator."""

    name, query_aware = "random", False

    def logits(self, inp, backend, generator):
        return torch.rand(inp.q.shape[0], 1, inp.table.numel(), generator=generator)


def register_scorer(cls: type[Scorer]) -> type[Scorer]:
    """Add a scorer class to the registry under `cls.name`; `Router(name, ...)` can then use it.

    A new scorer is one subclass of `Scorer` (its `logits`, and `summary_vectors` or
    `score_bytes` for the byte model) and this call; selection, attention and the sweeps need
    nothing else.
    """
    return registry.add(SCORERS, cls, Scorer, "scorer")


# The registry, bound once: every built-in scorer under its name. Nothing registers by being imported.
SCORERS: dict[str, type[Scorer]] = {}
for _cls in (MinMaxScorer, MeanScorer, HalvesScorer, ReprScorer, LabelScorer, OracleScorer, RecencyScorer, RandomScorer,
             HierarchicalMinMaxScorer):
    register_scorer(_cls)
ROUTERS = SCORERS       # the name the public API has always used for the scorer registry


def make_scorer(scorer: "str | Scorer", what: str = "scorer") -> Scorer:
    """The scorer `scorer` names: a `Scorer` instance as it is; a registered name, its class with no arguments
    ("minmax" -> MinMaxScorer()); a parametrised name, what its family's `from_name` reads back ("hminmax-g64-k4" ->
    HierarchicalMinMaxScorer(group=64, keep=4), whose `name` is that string again).

    TypeError for anything but a str or a Scorer; ValueError for a name no family reads, listing the known ones.
    `what` is the argument's name in the message.
    """
    if isinstance(scorer, Scorer):
        return scorer
    if not isinstance(scorer, str):
        raise TypeError(f"{what} must be a registered scorer name or a routing.Scorer, got {type(scorer).__name__}")
    cls = SCORERS.get(scorer)
    if cls is not None:
        return cls()
    family, sep, _ = scorer.partition("-")
    made = SCORERS[family].from_name(scorer) if sep and family in SCORERS else None
    if made is None:
        raise ValueError(f"{what} must be one of {sorted(SCORERS)} (or a parametrised name such as 'hminmax-g64-k4'), "
                         f"got {scorer!r}")
    return made


def summaries_for(scorers) -> tuple[str, ...]:
    """The per-block summaries a store keeps so that every one of `scorers` (names or instances, `make_scorer`) can
    route on it: the Engine's default ones (`storage.summaries.DEFAULT_SUMMARIES`), then each scorer's `reads` not
    among them, in order, without repeats (e.g. ("minmax", "halves") -> the defaults and "khalf"). ValueError names
    an unknown scorer."""
    from ..storage.summaries import DEFAULT_SUMMARIES
    scorers = [scorers] if isinstance(scorers, (str, Scorer)) else list(scorers)
    unknown = [s for s in scorers if isinstance(s, str) and _parsed(s) is None]
    if unknown:
        raise ValueError(f"scorers must name scorers of {list(SCORERS)}, got {unknown!r}")
    return tuple(dict.fromkeys(DEFAULT_SUMMARIES + tuple(r for s in scorers for r in make_scorer(s, "scorers").reads)))


def _parsed(name: str) -> Scorer | None:
    try:
        return make_scorer(name)
    except ValueError:
        return None
