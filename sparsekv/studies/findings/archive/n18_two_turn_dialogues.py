"""Archived notebook 18's finding (`notebooks/archive/18_two_turn_dialogues.ipynb`): two-turn dialogues,
counterbalanced, Gemma 3 at 2k tokens."""
from ..finding import Finding, Metrics
from ..paired_words import BUDGET, best_pair, versus_pair, vs_dense

N18 = "18_two_turn_dialogues"                  # notebook 18: two-turn dialogues, counterbalanced, Gemma 3 at 2k


def _turn_word(method: str, n: str = N18, task: str = "passkey"):
    """How asking another question first changed `method`'s answers, in words, from notebook `n`'s exact McNemar of
    the question alone against it asked second (0.05)."""
    def f(m: Metrics) -> str:
        k = f"turn.{task}.{method}"
        a, b, p = m[n][k + ".alone"], m[n][k + ".second"], m[n][k + ".p"]
        if p < 0.05:
            return f"{a:.0%} alone and {b:.0%} asked second, significantly {'fewer' if b < a else 'more'} (p = {p:.2g})"
        return f"{a:.0%} alone and {b:.0%} asked second, not significantly different (p = {p:.2g})"
    return f


_O = "acc_by_order.passkey 2-turn.{}.{}"

FINDINGS = (
    Finding("**Two-turn dialogues, counterbalanced (notebook 18, Gemma 3 270M at {L:,.0f} tokens).** {nd:.0f} "
            "dialogues ({ne:.0f} asking the earlier fact first, {nl:.0f} the later first) on new documents, each scored on "
            "its second answer after a teacher-forced first one and paired with the same question asked alone by the "
            "same method. Dense answers {td}; `halves@" + str(BUDGET) + "` {th}; `minmax@" + str(BUDGET) + "` {tm}; "
            "SnapKV {ts}; HQQ 4-bit {tq}. By order, dense answers {de:.0%} of the earlier-first dialogues and {dl:.0%} "
            "of the later-first ones, `halves@" + str(BUDGET) + "` {he:.0%} and {hl:.0%}. On the second turns, `minmax` "
            "{w1}. The dialogue cells are {size}. On the {ns:.0f} questions asked alone, dense answers {sd:.0%} and "
            "HQQ 4-bit {sq:.0%}, {sqw}; the best router against the best quantised cache: {bq}.",
            {"L": (N18, "document_tokens"), "nd": (N18, "questions.passkey 2-turn"),
             "ne": (N18, "questions_by_order.passkey 2-turn.earlier_first"),
             "nl": (N18, "questions_by_order.passkey 2-turn.later_first"),
             "td": _turn_word("dense"), "th": _turn_word(f"halves@{BUDGET}"), "tm": _turn_word(f"minmax@{BUDGET}"),
             "ts": _turn_word(f"SnapKV@{BUDGET}"), "tq": _turn_word("hqq4"),
             "de": (N18, _O.format("earlier_first", "dense")), "dl": (N18, _O.format("later_first", "dense")),
             "he": (N18, _O.format("earlier_first", f"halves@{BUDGET}")),
             "hl": (N18, _O.format("later_first", f"halves@{BUDGET}")),
             "w1": versus_pair("passkey 2-turn", f"minmax@{BUDGET}", f"SnapKV@{BUDGET}", "minmax_vs_SnapKV",
                             f"SnapKV@{BUDGET}", N18),
             "size": lambda m: "a pilot by the project's rule (fewer than 30 per order)" if min(
                 m[N18]["questions_by_order.passkey 2-turn.earlier_first"],
                 m[N18]["questions_by_order.passkey 2-turn.later_first"]) < 30 else "at least 30 per order",
             "ns": (N18, "questions.passkey"), "sd": (N18, "acc.passkey.dense"), "sq": (N18, "acc.passkey.hqq4"),
             "sqw": vs_dense("passkey", "hqq4", N18), "bq": best_pair("passkey", "quantiser", N18)}),
)
