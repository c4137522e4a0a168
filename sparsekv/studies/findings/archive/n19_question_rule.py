"""Archived notebook 19's finding (`notebooks/archive/19_question_rule.ipynb`): one rule for the question, each
router under both rules."""
from ..finding import Finding, Metrics
from ..paired_words import BUDGET, best_pair, vs_dense

N19 = "19_question_rule"                       # notebook 19: each router under both question rules, Gemma 3 at 2k


def _rule_word(scorer: str, n: str = N19, task: str = "passkey"):
    """How routing the question's tokens changed `scorer@BUDGET`'s answers, in words, from notebook `n`'s exact McNemar
    of the router under the routed rule against itself under the dense one (0.05)."""
    def f(m: Metrics) -> str:
        k = f"mcnemar.{task}.{scorer}_routed_question_vs_dense"
        a, b = m[n][f"acc.{task}.{scorer}@{BUDGET}"], m[n][f"acc.{task}.{scorer}@{BUDGET}, routed question"]
        p, dense_only, routed_only = m[n][k + ".p"], m[n][k + ".b_only"], m[n][k + ".a_only"]
        says = (f"significantly {'fewer' if b < a else 'more'} with it routed" if p < 0.05 else
                "not significantly different")
        kl = f"kl_diff.{task}.{scorer}_routed_question_vs_dense"
        d, lo, hi = m[n][kl], m[n][kl + ".ci_lo"], m[n][kl + ".ci_hi"]
        moves = "further from" if lo > 0 else "closer to" if hi < 0 else "not clearly further from or closer to"
        return (f"{a:.0%} with the question prefilled densely and {b:.0%} with its tokens routed, {says} (p = {p:.2g}; "
                f"{dense_only:.0f} answered only densely, {routed_only:.0f} only routed), and {moves} dense on the answer "
                f"tokens with it routed (KL {d:+.3f} nats per token, 95% CI [{lo:+.3f}, {hi:+.3f}])")
    return f


def _rule_verdict(scorers, n: str = N19, task: str = "passkey"):
    """Which rule the routers whose answers the rule changes significantly (0.05) do better under, in words."""
    def f(m: Metrics) -> str:
        changed = {s: m[n][f"acc.{task}.{s}@{BUDGET}"] > m[n][f"acc.{task}.{s}@{BUDGET}, routed question"] for s in scorers
                   if m[n][f"mcnemar.{task}.{s}_routed_question_vs_dense.p"] < 0.05}
        if not changed:
            return "no router's answers depend significantly on the rule"
        better = {"dense" if d else "routed" for d in changed.values()}
        names = ", ".join(f"`{s}`" for s in changed)
        if better == {"dense"}:
            return f"it favours {names}, whose answers it changes significantly"
        if better == {"routed"}:
            return f"the routed rule favours {names}, whose answers it changes significantly"
        return f"the rule changes {names} significantly, in both directions"
    return f


FINDINGS = (
    Finding("**One rule for the question (notebook 19, Gemma 3 270M at {L:,.0f} tokens, {n:.0f} held-out passkeys).** "
            "For dense, a press or a quantised cache both rules compute the same attention; a router under the routed "
            "rule reads only its chosen blocks for each question token too. Each router answered every question under "
            "both rules on the same prefill: `halves@" + str(BUDGET) + "` {h}; `minmax@" + str(BUDGET) + "` {mm}; "
            "`oracle@" + str(BUDGET) + "` {o}. Dense answers {d:.0%}. Every headline in notebooks 14-19 uses the dense "
            "rule; {fav}. Paired with dense under the dense rule, `halves@" + str(BUDGET) + "` answers {ha:.0%}, "
            "{hv}; with its question routed, {hra:.0%}, {hrv}. The best router against the best press: {bp}; "
            "against the best quantised cache: {bq}.",
            {"L": (N19, "document_tokens"), "n": (N19, "questions.passkey"), "d": (N19, "acc.passkey.dense"),
             "h": _rule_word("halves"), "mm": _rule_word("minmax"), "o": _rule_word("oracle"),
             "fav": _rule_verdict(("halves", "minmax", "oracle")),
             "ha": (N19, f"acc.passkey.halves@{BUDGET}"), "hv": vs_dense("passkey", f"halves@{BUDGET}", N19),
             "hra": (N19, f"acc.passkey.halves@{BUDGET}, routed question"),
             "hrv": vs_dense("passkey", f"halves@{BUDGET}, routed question", N19),
             "bp": best_pair("passkey", "press", N19), "bq": best_pair("passkey", "quantiser", N19)}),
)
