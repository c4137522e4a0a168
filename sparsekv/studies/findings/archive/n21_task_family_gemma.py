"""Archived notebook 21's findings (`notebooks/archive/21_task_family_gemma.ipynb`): a fact in real code and
aggregation, and the question rule on that task family."""
from ..finding import Finding, Metrics
from ..paired_words import BUDGET, best_pair, best_press, versus_pair

N21 = "21_task_family_gemma"                    # notebook 21: a fact in real code, and aggregation, Gemma 3 at 2k


def _rule_brief(scorers, n: str, task: str):
    """Each router's accuracy under both question rules on `task` of notebook `n`, with the exact McNemar p of the
    pair, then which rule the significant changes (0.05) favour, in words."""
    def f(m: Metrics) -> str:
        parts, better = [], set()
        for s in scorers:
            a, b = m[n][f"acc.{task}.{s}@{BUDGET}"], m[n][f"acc.{task}.{s}@{BUDGET}, routed question"]
            p = m[n][f"mcnemar.{task}.{s}_routed_question_vs_dense.p"]
            parts.append(f"`{s}@{BUDGET}` {a:.0%} and {b:.0%} (p = {p:.2g})")
            if p < 0.05:
                better.add("dense" if a > b else "routed")
        verdict = ("the rule changes no router's answers significantly" if not better else
                   f"the significant changes favour the {better.pop()} rule" if len(better) == 1 else
                   "the significant changes go both ways")
        return "; ".join(parts) + f": {verdict}"
    return f


FINDINGS = (
    Finding("**A fact in real code, and aggregation (notebook 21, Gemma 3 270M at {L:,.0f} tokens).** On fact-code "
            "({nfc:.0f} keyed constants planted in the standard library's source, each asked alone): dense answers "
            "{d:.0%}; `halves@" + str(BUDGET) + "` {h:.0%}, which {hw}; `minmax@" + str(BUDGET) + "` {mm:.0%}, which {mw}; the "
            "oracle {o:.0%}; the best press {bp}; HQQ 4-bit {h4:.0%} and 2-bit {h2:.0%}. Paired on the same "
            "questions, the best router against the best peers: {bpp}; {bpq}. On common-word "
            "extraction ({ncw:.0f} word lists, the most common word asked), where top-k selection is expected to "
            "struggle: dense {cd:.0%}, `halves@" + str(BUDGET) + "` {ch:.0%}, which {chw}; `minmax@" + str(BUDGET) + "` "
            "{cm:.0%}, which {cmw}; the oracle {co:.0%}.",
            {"L": (N21, "document_tokens"), "nfc": (N21, "questions.fact-code"), "ncw": (N21, "questions.common-words"),
             **{k: (N21, f"acc.{t}.{m}") for k, t, m in (
                 ("d", "fact-code", "dense"), ("h", "fact-code", f"halves@{BUDGET}"), ("mm", "fact-code", f"minmax@{BUDGET}"),
                 ("o", "fact-code", f"oracle@{BUDGET}"), ("h4", "fact-code", "hqq4"), ("h2", "fact-code", "hqq2"),
                 ("cd", "common-words", "dense"), ("ch", "common-words", f"halves@{BUDGET}"),
                 ("cm", "common-words", f"minmax@{BUDGET}"), ("co", "common-words", f"oracle@{BUDGET}"))},
             "hw": versus_pair("fact-code", f"halves@{BUDGET}", "dense", "halves_vs_dense", "dense", N21),
             "mw": versus_pair("fact-code", f"minmax@{BUDGET}", "dense", "minmax_vs_dense", "dense", N21),
             "chw": versus_pair("common-words", f"halves@{BUDGET}", "dense", "halves_vs_dense", "dense", N21),
             "cmw": versus_pair("common-words", f"minmax@{BUDGET}", "dense", "minmax_vs_dense", "dense", N21),
             "bp": best_press("fact-code", N21), "bpp": best_pair("fact-code", "press", N21),
             "bpq": best_pair("fact-code", "quantiser", N21)}),
    Finding("**The question rule on the task family (notebook 21, Gemma 3 270M at {L:,.0f} tokens).** Each router "
            "also answered every question with its question's tokens routed, on the same prefill, paired with itself "
            "under the dense rule; each router's accuracy with the question prefilled densely, then routed, and the "
            "exact McNemar p. On fact-code ({nfc:.0f} questions): {fc}. On common-words ({ncw:.0f}): {cw}. Every "
            "headline keeps the dense rule.",
            {"L": (N21, "document_tokens"), "nfc": (N21, "questions.fact-code"), "ncw": (N21, "questions.common-words"),
             "fc": _rule_brief(("halves", "minmax", "oracle"), N21, "fact-code"),
             "cw": _rule_brief(("halves", "minmax", "oracle"), N21, "common-words")}),
)
