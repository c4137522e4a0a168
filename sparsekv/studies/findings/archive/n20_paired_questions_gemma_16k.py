"""Archived notebook 20's finding (`notebooks/archive/20_paired_questions_gemma_16k.ipynb`): the paired study at 16k
tokens, its peers on 3 documents."""
from ..finding import Finding
from ..paired_words import BUDGET, disagree, kl_word, router_vs_press, versus_pair

N20 = "20_paired_questions_gemma_16k"           # notebook 20: the study at 16k, its peers on 3 documents

FINDINGS = (
    Finding("**Paired questions on Gemma 3 270M at 16k tokens (notebook 20).** {n:.0f} keyed passkey questions on "
            "{L:,.0f}-token documents (2 per document, chosen on a dense-only pilot), where a " + str(BUDGET) + "-token "
            "budget is {frac:.1%} of the context. Dense answers {d:.0%}; `halves@" + str(BUDGET) + "` {h:.0%}, which {hw}; "
            "`minmax@" + str(BUDGET) + "` {mm:.0%}, which {mw}; the oracle {o:.0%}. On the answer tokens `halves` "
            "{kw}. A float32 transformers prefill of 16k tokens takes minutes here, so the peers answered {np:.0f} "
            "questions (a pilot): on those, {rp}. sparsekv's dense (its bfloat16 prefill) and transformers' float32 "
            "dense differ on {dis:.0f} of them. Gemma's dense answers almost nothing at 32k (the notebook's pilot), so "
            "there is no 32k cell.",
            {"n": (N20, "questions.passkey"), "L": (N20, "document_tokens"),
             "frac": lambda m: BUDGET / m[N20]["document_tokens"], "d": (N20, "acc.passkey.dense"),
             "h": (N20, f"acc.passkey.halves@{BUDGET}"), "mm": (N20, f"acc.passkey.minmax@{BUDGET}"),
             "o": (N20, f"acc.passkey.oracle@{BUDGET}"),
             "hw": versus_pair("passkey", f"halves@{BUDGET}", "dense", "halves_vs_dense", "dense", N20),
             "mw": versus_pair("passkey", f"minmax@{BUDGET}", "dense", "minmax_vs_dense", "dense", N20),
             "kw": kl_word("halves_vs_minmax", f"`minmax@{BUDGET}`", N20),
             "np": (N20, "questions_peered.passkey"), "rp": router_vs_press("passkey", N20, "acc_peered"),
             "dis": disagree(N20)}),
)
