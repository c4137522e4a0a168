"""Archived notebook 14's finding (`notebooks/archive/14_paired_questions.ipynb`): paired questions at equal bytes
read, SmolLM2 at 2k tokens."""
from ..finding import Finding
from ..paired_words import BUDGET, best_pair, paired_values, task_row

N14 = "14_paired_questions"                      # notebook 14, whose full run set the paired studies' budget

_T14 = [task_row(t, N14) for t in ("passkey", "multi-key", "fact-prose")]

FINDINGS = (
    Finding("**Paired questions at equal bytes read (notebook 14, SmolLM2-135M).** {n:.0f} questions per task on "
            "{L:,.0f}-token documents, each asked on its own copy of one prefill, every method on the same token ids "
            "and the question prefilled densely over what the method holds. " + "; ".join(t for t, _ in _T14) + ". "
            "Per decode step `minmax@" + str(BUDGET) + "` reads {rr:.2f} of a bf16 dense cache's K/V bytes and holds "
            "{hr:.2f} (its block summaries included); a press at the same budget reads and holds {rs:.2f}, HQQ 4-bit "
            "{rh4:.2f} and 2-bit {rh:.2f}. Paired on the same questions, the best router against the best quantised "
            "cache: passkey, {bq_passkey}; multi-key, {bq_multi_key}; fact-prose, {bq_fact_prose}. "
            "Stated before the run: that dense answers at least half the passkey "
            "questions ({verdict}: {pd:.0%}), so every accuracy here reads against dense's, not against 100%. sparsekv's dense answers and transformers' differ on {dis:.0f} of the {nall:.0f} questions.",
            {**paired_values(N14, _T14),
             "verdict": lambda m: "supported" if m[N14]["acc.passkey.dense"] >= 0.5 else "rejected",
             "pd": (N14, "acc.passkey.dense"),
             **{f"bq_{t.replace('-', '_')}": best_pair(t, "quantiser", N14)
                for t in ("passkey", "multi-key", "fact-prose")}}),
)
