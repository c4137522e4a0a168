"""Notebook 16's finding (`notebooks/16_router_halves.ipynb`): `halves`, a router at Quest's bytes that reaches the
oracle."""
from __future__ import annotations

from typing import Callable

from ..finding import Finding, Metrics, paired_word

N16 = "16_router_halves"


def _h16(scorer: str, budget: int, bs: int = 16) -> tuple[str, str]:
    return (N16, f"passkey.{scorer}@{budget}.bs{bs}.acc_given_dense")


def _goal16(scorer: str, budget: int, bs: int, tol: float) -> Callable[[Metrics], str]:
    """Whether `scorer` in `bs`-token blocks is within `tol` of the oracle in 16-token blocks at `budget` (the router
    issue's goal), in words."""
    def f(m: Metrics) -> str:
        gap = m[N16][_h16("oracle", budget)[1]] - m[N16][_h16(scorer, budget, bs)[1]]
        return f"{'met' if gap <= tol + 1e-12 else 'missed'} by `{scorer}` in {bs}-token blocks ({gap:.1%} below it)"
    return f


def _pair16(a: tuple, b: tuple, label: str) -> Callable[[Metrics], str]:
    name = lambda x: f"{x[0]}@{x[1]}.bs{x[2]}"
    return paired_word(_h16(*a)[1], _h16(*b)[1], f"passkey.{name(a)}_vs_{name(b)}.p", label, N16)


FINDINGS = (
    Finding("**A router at Quest's bytes that reaches the oracle (notebook 16, SmolLM2 at 2k tokens, held-out "
            "passkeys).** On the {n:.0f} of {total:.0f} new passkeys dense answers, `halves` (the mean key of each "
            "half of a 16-token block: Quest's 2 summary vectors per block and 8 values per token) answers "
            "{h128:.0%} at a 128-token budget, which {hm128}, against the oracle's {o128:.0%}; at 64 tokens "
            "{h64:.0%}, `minmax` {m64:.0%} and the oracle {o64:.0%}. At the same summary bytes per token `mean` in "
            "8-token blocks answers {me8:.0%} at 64 tokens, which {mew}, and `halves` in 8-token blocks (twice "
            "Quest's bytes per token) {h8:.0%}. The router issue's goals against the oracle: within 1 in 20 at 128 "
            "tokens, {g128}; within 1 in 12 at 64 tokens, {g64m}, {g64h8} and {g64}. On real text "
            "at a 256-token budget ({ld:.0f} documents of {ll:,.0f} tokens per kind, the last {lt:.0f} tokens each), `halves`' "
            "next-token loss is {lp:+.3f} nats from dense's on prose (per-token bootstrap 95% interval {lpl:+.3f} to "
            "{lph:+.3f}) and {lc:+.3f} on code ({lcl:+.3f} to {lch:+.3f}); `minmax`'s {mp:+.3f} and {mc:+.3f}, and the "
            "oracle's own {op:+.3f} and {oc:+.3f}. On Gemma 3 270M's global layers at {gl:,.0f} tokens ({gn:.0f} of "
            "{gp:.0f} new passkeys dense answers), `halves` answers {gh64:.0%} at 64 tokens, which {ghw}, and "
            "{gh256:.0%} at 256, against the oracle's {go64:.0%} and {go256:.0%}.",
            {"n": (N16, "passkey.dense_ok"), "total": (N16, "passkey.prompts"),
             "h128": _h16("halves", 128), "o128": _h16("oracle", 128), "h64": _h16("halves", 64),
             "m64": _h16("minmax", 64), "o64": _h16("oracle", 64), "me8": _h16("mean", 64, 8),
             "h8": _h16("halves", 64, 8),
             "hm128": _pair16(("halves", 128, 16), ("minmax", 128, 16), "`minmax`"),
             "mew": _pair16(("mean", 64, 8), ("halves", 64, 16), "`halves` in 16-token blocks"),
             "g128": _goal16("halves", 128, 16, 1 / 20), "g64": _goal16("halves", 64, 16, 1 / 12),
             "g64m": _goal16("mean", 64, 8, 1 / 12), "g64h8": _goal16("halves", 64, 8, 1 / 12),
             **{f"l{k[0]}{e}": (N16, f"loss.{k}.halves@256.{f}") for k in ("prose", "code")
                for e, f in (("", "delta"), ("l", "lo"), ("h", "hi"))},
             "mp": (N16, "loss.prose.minmax@256.delta"), "mc": (N16, "loss.code.minmax@256.delta"),
             "op": (N16, "loss.prose.oracle@256.delta"), "oc": (N16, "loss.code.oracle@256.delta"),
             "ld": (N16, "loss.docs"), "ll": (N16, "loss.length"), "lt": (N16, "loss.tail"),
             "gl": (N16, "gemma.length"), "gn": (N16, "gemma.passkey.dense_ok"), "gp": (N16, "gemma.passkey.prompts"),
             **{f"g{x}{b}": (N16, f"gemma.passkey.{s}@{b}.acc_given_dense") for x, s in (("h", "halves"), ("o", "oracle"))
                for b in (64, 256)},
             "ghw": paired_word("gemma.passkey.halves@64.acc_given_dense", "gemma.passkey.minmax@64.acc_given_dense",
                                 "gemma.passkey.halves@64_vs_minmax@64.p", "`minmax`", N16)}),
)
