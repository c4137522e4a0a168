"""The equal-bytes study's design, fixed before any outcome is read: the methods and their knobs, the headline rule,
the margin and the pre-listed contrasts.

    Design                 the notebook's parameters as one value: which methods, on which curves
    Design.methods()       every Method the cell runs (dense first; each family over its knob)
    HEADLINE_MIN           a (model, length, task) is a headline cell when sparsekv's exact dense answers at least this
                           share of the pilot's questions (a separate split of documents; `run.SPLITS`); otherwise it is
                           reported as "dense cannot do this", with its dense accuracy, and never compared
    MARGIN                 the non-inferiority margin (accuracy points), stated before the run
    contrasts(cell, rows)  the pre-listed contrasts of one headline cell (`analysis.clustered.Contrast`)

The headline question rule is "dense" (the question prefilled densely over what the method holds): it is the one
rule every family can follow (a press or a quantiser has nothing to route), so it is the rule under which
families are compared; the "routed" rule (the question's tokens routed like decode steps, sparse-attention-hub's
stricter protocol) is run for every router and reported beside it, with one pre-listed contrast between the two.

Matched bytes: a contrast "at matched bytes read" pairs a peer with the router point whose bytes read per step is
nearest the peer's; "at matched bytes held" likewise for bytes held. Bytes come from the byte model
(`questions.method_bytes`), a function of the model's shape and the knobs alone, never of an outcome, so the pair is
fixed before the run even though the analysis computes it from the rows.
"""
from __future__ import annotations

from dataclasses import dataclass

from ... import methods as mt
from ...analysis.clustered import Contrast

HEADLINE_MIN = 0.60        # pilot dense accuracy a headline cell needs
MARGIN = 0.05              # non-inferiority margin, accuracy points
PIVOT = 0.125              # the share at which single-point contrasts are taken (an eighth of the context)
SHARES = (0.015625, 0.03125, 0.0625, 0.125, 0.25)      # routers: 1/64 .. 1/4 of the context read per step


@dataclass(frozen=True)
class Design:
    """Which methods a cell runs. Lists of names; empty lists leave a family out (the pilot runs dense alone).

    scorers: routers over exact blocks ("mean/8": mean at 8-token blocks; others at `block_size`); shares: their
    knob; rules: question rules; routed_scorers: the scorers run under the rules other than "dense" (None: every
    one); int_scorers / int_bits: routers over int8/int4 blocks (with
    "int8 dense" / "int4 dense"), under the headline rule; presses / press_shares: query-agnostic kvpress presses;
    aware_presses / aware_shares: question-aware ones; hqq_bits: HQQ's bits (an empty list: no quantiser)."""

    scorers: tuple = ("halves", "mean", "mean/8", "minmax", "oracle")
    shares: tuple = SHARES
    rules: tuple = ("dense", "routed")
    block_size: int = 16
    int_scorers: tuple = ("halves",)
    int_bits: tuple = (8, 4)
    presses: tuple = ("SnapKVPress", "StreamingLLMPress", "KnormPress")
    press_shares: tuple = (0.0625, 0.125, 0.25, 0.5)
    aware_presses: tuple = ("SnapKVPress",)
    aware_shares: tuple = (0.0625, 0.125, 0.25)
    hqq_bits: tuple = (2, 4, 8)
    routed_scorers: tuple | None = None

    def __post_init__(self):
        if self.routed_scorers is None:
            object.__setattr__(self, "routed_scorers", tuple(self.scorers))
        for name in ("scorers", "shares", "rules", "int_scorers", "int_bits", "presses", "press_shares",
                     "aware_presses", "aware_shares", "hqq_bits", "routed_scorers"):
            v = getattr(self, name)
            if isinstance(v, str) or not isinstance(v, (list, tuple)):
                raise TypeError(f"{name} must be a list, got {type(v).__name__} {v!r}")
            object.__setattr__(self, name, tuple(v))
        bad = [r for r in self.rules if r not in mt.RULES]
        if bad or (self.scorers and "dense" not in self.rules):
            raise ValueError(f"rules must be drawn from {mt.RULES} and include the headline rule 'dense', got "
                             f"{list(self.rules)}")
        if any(s not in self.scorers for s in self.routed_scorers):
            raise ValueError(f"routed_scorers must be drawn from scorers {list(self.scorers)}, got "
                             f"{list(self.routed_scorers)}")
        if any(b not in (8, 4) for b in self.int_bits):
            raise ValueError(f"int_bits must be drawn from (8, 4), got {list(self.int_bits)}")

    def methods(self) -> list[mt.Method]:
        """sparsekv's dense (and int dense), every router curve, then transformers' dense, presses and HQQ."""
        out = [mt.Method("dense", "sparsekv")]
        out += [mt.Method("dense", "sparsekv", kv_bits=b) for b in self.int_bits if self.int_scorers]
        out += mt.routers(self.scorers, self.shares, (self.block_size,), (0,), ("dense",))
        out += mt.routers(self.routed_scorers, self.shares, (self.block_size,), (0,),
                          [r for r in self.rules if r != "dense"])
        out += mt.routers(self.int_scorers, self.shares, (self.block_size,), self.int_bits, ("dense",))
        peers = mt.presses(self.presses, self.press_shares) + mt.presses(self.aware_presses, self.aware_shares, True) \
            + mt.quantisers(self.hqq_bits)
        if peers:
            out += [mt.Method("dense", "transformers")] + peers
        return out


def pilot() -> Design:
    """The pilot: sparsekv's exact dense alone (it decides the headline cells)."""
    return Design(scorers=(), rules=("dense",), int_scorers=(), int_bits=(), presses=(), aware_presses=(), hqq_bits=(),
                  routed_scorers=())


def _nearest(points: dict, target: float) -> str | None:
    """The name of the Method among `points` (Method -> bytes share) nearest `target`; ties to the smaller share read
    per step (the method's knob), then to the name, so that the choice never depends on the order of `points` (int4
    blocks hold the same bytes at every share: the held match is decided by this rule alone)."""
    best = min(points, key=lambda m: (abs(points[m] - target), m.knob, m.name)) if points else None
    return None if best is None else best.name


def contrasts(cell: str, nbytes: dict[str, dict], design: Design = Design()) -> list[Contrast]:
    """The pre-listed contrasts of one headline cell, named "<cell>: <what>". nbytes: method name -> {"read",
    "held"} shares of bf16 dense (the byte model's, one per method). A contrast whose methods the design lacks is
    left out (the list depends only on the design and the byte model, never on outcomes).

    1. halves at the pivot share, no worse than dense (non-inferiority, MARGIN)
    2. mean at 8-token blocks at the pivot share, no worse than dense (non-inferiority, MARGIN)
    3. halves at the pivot: the routed question rule against the dense one (difference)
    4. halves at the pivot over int4 blocks against exact blocks (difference: what int4 storage costs)
    5. halves against HQQ-4 at matched bytes read (difference)
    6. int4 halves against HQQ-4 at matched bytes held (difference)
    7. halves against SnapKV at the pivot share (difference: equal tokens; the router also reads its summaries)
    8. question-aware SnapKV at the pivot against halves at the pivot (difference: knowing the question against
       keeping everything)
    """
    p = PIVOT
    present = {n: mt.parse(n) for n in nbytes}
    out = []

    def halves(share=p, kv_bits=0, rule="dense"):
        return mt.Method("router", "sparsekv", "halves", design.block_size, kv_bits, share, rule=rule).name

    def snapkv(aware=False):
        return mt.Method("press", "transformers", press="SnapKVPress", share=p, question_aware=aware).name

    def add(what, a, b, kind="difference", margin=None):
        if a in present and b in present and a != b:
            out.append(Contrast(f"{cell}: {what}", a, b, kind, margin))

    dense, hqq4 = mt.Method("dense", "sparsekv").name, mt.Method("quant", "transformers", bits=4).name
    add(f"halves@{p:g} no worse than dense", halves(), dense, "non-inferiority", MARGIN)
    add(f"mean/8@{p:g} no worse than dense", mt.Method("router", "sparsekv", "mean", 8, 0, p).name, dense,
        "non-inferiority", MARGIN)
    add(f"halves@{p:g}: routed question vs dense question", halves(rule="routed"), halves())
    add(f"halves@{p:g}: int4 blocks vs exact", halves(kv_bits=4), halves())
    if hqq4 in present:
        def curve(kv_bits):       # every point of halves' curve over exact (0) or int4 blocks, under the dense rule
            return [m for m in present.values() if m.family == "router" and m.scorer == "halves" and m.rule == "dense"
                    and m.block_size == design.block_size and m.kv_bits == kv_bits]
        add("halves vs HQQ-4 at matched bytes read",
            _nearest({m: nbytes[m.name]["read"] for m in curve(0)}, nbytes[hqq4]["read"]), hqq4)
        add("int4 halves vs HQQ-4 at matched bytes held",
            _nearest({m: nbytes[m.name]["held"] for m in curve(4)}, nbytes[hqq4]["held"]), hqq4)
    add(f"halves vs SnapKV@{p:g}", halves(), snapkv())
    add(f"question-aware SnapKV vs halves@{p:g}", snapkv(aware=True), halves())
    return out


__all__ = ["HEADLINE_MIN", "MARGIN", "PIVOT", "SHARES", "Design", "pilot", "contrasts"]
