"""Layer 7 (research; a sibling of `analysis` and `recall`, importing neither): what a study compares, a method, as
a value with fields, never a string parsed back.

A `Method` is one point of one family's curve: the family's fixed settings (which scorer over which store, which
press, which quantiser), its knob (the share of the context a router reads per step or a press keeps; a quantiser's
bits) and the rule its question is asked under. Its `name` is for tables and legends only; rows of results carry
the fields themselves, so no reader ever recovers a setting from a name.

    FAMILIES       family -> what its knob means ("dense", "router", "press", "quant")
    Method         one configuration; .line (the curve it belongs to), .knob, .name
    routers(...), presses(...), quantisers(...)
                   the points of each family's curve, in knob order
    parse(name)    the Method a name names: the one parser of a name (rows that hold only a name, such as a results
                   file's `method` column, are read through it), exact inverse of `Method.name`

Engines: "sparsekv" (the block store; routers and its own dense) or "transformers" (kvpress presses, HQQ, and its
own dense). Each method is compared with its own engine's dense.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

FAMILIES = {
    "dense": "nothing: every token held and read",
    "router": "share of the context's tokens a decode step reads (the token budget over the context length)",
    "press": "share of the context's tokens the press keeps",
    "quant": "bits per stored K/V element",
}
RULES = ("dense", "routed")      # the question's tokens: one dense pass over what the method holds, or routed steps


def _number(x: float) -> str:
    """A knob as a name writes it: the short form ("0.125", "1") where it is exact, else every digit
    ("0.9217078489634569"), so that two methods never share a name."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


@dataclass(frozen=True)
class Method:
    """One method at one knob value.

    family: a key of FAMILIES. engine: "sparsekv" or "transformers". scorer: a router's scorer (registered name);
    block_size: the sparsekv store's block (tokens); kv_bits: the store's K/V codes (0 exact, 8 or 4: int codes with
    a scale per token and kv head, `storage.codec`); share: a router's tokens read per step, or a press's tokens
    kept, as a share of the context in (0, 1]; press: a kvpress press's class name; question_aware: the press
    compresses the context together with the question (one compression per question) instead of once for all
    questions; bits: HQQ's bits; rule: the question rule (`RULES`; a press or a quantiser has nothing to route,
    so only "dense")."""

    family: str
    engine: str
    scorer: str | None = None
    block_size: int = 16
    kv_bits: int = 0
    share: float | None = None
    press: str | None = None
    question_aware: bool = False
    bits: int | None = None
    rule: str = "dense"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {list(FAMILIES)}, got {self.family!r}")
        if self.engine not in ("sparsekv", "transformers"):
            raise ValueError(f"engine must be 'sparsekv' or 'transformers', got {self.engine!r}")
        if self.rule not in RULES or (self.rule == "routed" and self.family != "router"):
            raise ValueError(f"rule must be one of {RULES} ('routed' only for a router), got {self.rule!r} for a "
                             f"{self.family}")
        if self.kv_bits not in (0, 8, 4) or (self.kv_bits and self.engine != "sparsekv"):
            raise ValueError(f"kv_bits must be 0, 8 or 4 (sparsekv's store only), got {self.kv_bits!r}")
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")
        if self.family in ("router", "press"):
            if isinstance(self.share, bool) or not isinstance(self.share, (int, float)) or not 0 < self.share <= 1:
                raise ValueError(f"a {self.family} needs share in (0, 1], got {self.share!r}")
        elif self.share is not None:
            raise ValueError(f"share must be None for a {self.family}, got {self.share!r}")
        if (self.family == "router") != (self.scorer is not None) or \
                (self.family == "router" and self.engine != "sparsekv"):
            raise ValueError(f"a router (and only a router) has a scorer and runs on sparsekv; got family "
                             f"{self.family!r}, scorer {self.scorer!r}, engine {self.engine!r}")
        if (self.family == "press") != (self.press is not None) or (self.question_aware and self.family != "press"):
            raise ValueError(f"a press (and only a press) names its press and may be question-aware; got family "
                             f"{self.family!r}, press {self.press!r}, question_aware {self.question_aware!r}")
        if self.press is not None and (not isinstance(self.press, str) or not self.press.endswith("Press")
                                       or not self.press[:1].isupper() or self.press == "Press"
                                       or any(c in self.press for c in "@,/ ")):
            raise ValueError(f"press must be a press class's name, capitalised and ending in 'Press' (kvpress's "
                             f"naming), without '@', ',', '/' or spaces, got {self.press!r}")
        if self.scorer is not None and (not isinstance(self.scorer, str) or not self.scorer
                                        or any(c in self.scorer for c in "@,/ ")):
            raise ValueError(f"scorer must be a scorer's registered name without '@', ',', '/' or spaces, got "
                             f"{self.scorer!r}")
        if (self.family == "quant") != (self.bits is not None) or (self.bits is not None and self.bits not in (2, 4, 8)):
            raise ValueError(f"a quantiser (and only a quantiser) has bits in (2, 4, 8), got {self.bits!r}")
        if self.family in ("press", "quant") and self.engine != "transformers":
            raise ValueError(f"a {self.family} runs on transformers, got engine {self.engine!r}")

    @property
    def knob(self) -> float | None:
        """The value the family's curve is swept over (FAMILIES), None for dense."""
        return {"router": self.share, "press": self.share, "quant": self.bits}.get(self.family)

    @property
    def line(self) -> str:
        """The curve this point belongs to: everything but the knob ("halves/16", "int4 halves/16, routed question",
        "SnapKV", "SnapKV, question-aware", "HQQ", "dense", "int8 dense", "transformers dense")."""
        store = {0: "", 8: "int8 ", 4: "int4 "}[self.kv_bits]
        if self.family == "dense":
            return ("transformers " if self.engine == "transformers" else store) + "dense"
        if self.family == "router":
            return f"{store}{self.scorer}/{self.block_size}" + (", routed question" if self.rule == "routed" else "")
        if self.family == "press":
            return self.press.removesuffix("Press") + (", question-aware" if self.question_aware else "")
        return "HQQ"

    @property
    def name(self) -> str:
        """The line and the knob: "halves/16@0.125", "SnapKV@0.25", "HQQ4", "dense"."""
        if self.family == "quant":
            return f"HQQ{self.bits}"
        return self.line if self.knob is None else f"{self.line}@{_number(self.knob)}"


def routers(scorers, shares, block_sizes=(16,), kv_bits=(0,), rules=("dense",)) -> list[Method]:
    """Every (scorer, block size, K/V codes, rule) curve over `shares`; a scorer given as "mean/8" names its own
    block size (then `block_sizes` is not applied to it)."""
    out = []
    for s in scorers:
        name, _, bs = s.partition("/")
        for b in ([int(bs)] if bs else block_sizes):
            out += [Method("router", "sparsekv", name, b, k, x, rule=r) for k in kv_bits for r in rules for x in shares]
    return out


def presses(names, shares, question_aware: bool = False) -> list[Method]:
    """Each kvpress press over the kept shares `shares`."""
    return [Method("press", "transformers", press=p, share=x, question_aware=question_aware) for p in names
            for x in shares]


def quantisers(bits) -> list[Method]:
    """HQQ at each of `bits`."""
    return [Method("quant", "transformers", bits=b) for b in bits]


_STORES = {"": 0, "int8 ": 8, "int4 ": 4}


def parse(name: str) -> Method:
    """The Method whose `name` is `name`: "dense", "int8 dense", "transformers dense", "HQQ4",
    "[int8 |int4 ]<scorer>/<block>[, routed question]@<share>", "<press without 'Press'>[, question-aware]@<share>".
    The exact inverse of `Method.name` (`parse(m.name) == m` for every valid Method); a string that is not some
    Method's name, canonical form included ("halves/16@0.1250" is not), is a ValueError naming it."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")

    def refuse(why):
        return ValueError(f"name must be a method's name (methods.Method.name), got {name!r}: {why}")

    head, at, knob = name.rpartition("@")
    try:
        if not at:
            if name.startswith("HQQ") and name[3:].isdigit():
                m = Method("quant", "transformers", bits=int(name[3:]))
            elif name == "transformers dense":
                m = Method("dense", "transformers")
            elif name.endswith("dense") and name.removesuffix("dense") in _STORES:
                m = Method("dense", "sparsekv", kv_bits=_STORES[name.removesuffix("dense")])
            else:
                raise refuse("no '@<share>' and not dense or HQQ<bits>")
        else:
            try:
                share = float(knob)
            except ValueError:
                raise refuse(f"the share {knob!r} is not a number") from None
            if "/" in head:
                store = next((k for k in ("int8 ", "int4 ") if head.startswith(k)), "")
                line, comma, rule = head.removeprefix(store).partition(", ")
                if comma and rule != "routed question":
                    raise refuse(f"a router's line ends with ', routed question' or nothing, not {rule!r}")
                scorer, _, block = line.partition("/")
                if not block.isdigit():
                    raise refuse(f"the block size {block!r} is not a whole number")
                m = Method("router", "sparsekv", scorer, int(block), _STORES[store], share,
                           rule="routed" if comma else "dense")
            else:
                press, comma, aware = head.partition(", ")
                if comma and aware != "question-aware":
                    raise refuse(f"a press's line ends with ', question-aware' or nothing, not {aware!r}")
                m = Method("press", "transformers", press=press + "Press", share=share, question_aware=bool(comma))
    except ValueError as e:
        if str(e).startswith("name must be"):
            raise
        raise refuse(str(e)) from None
    if m.name != name:
        raise refuse(f"its canonical form is {m.name!r}")
    return m


def best(scores: Mapping[str, float], higher: bool = True) -> str:
    """The name with the best score of {name: score}: the highest (an accuracy), or with `higher=False` the lowest (a
    loss). Ties go to the name last in alphabetical order. This is the one rule for every study that picks a best
    method of a kind and for every page that names it, so the words always name the method the study tested.

    Raises ValueError when `scores` is empty."""
    if not scores:
        raise ValueError("scores must hold at least one method, got none")
    sign = 1.0 if higher else -1.0
    return max(scores, key=lambda name: (sign * scores[name], name))


__all__ = ["FAMILIES", "RULES", "Method", "routers", "presses", "quantisers", "parse", "best"]
