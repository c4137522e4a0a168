"""Archived notebook 15's finding (`notebooks/archive/15_paired_questions_gemma.ipynb`): notebook 14's study on
Gemma 3 270M, at the same budget."""
from ..finding import Finding
from ..paired_words import BUDGET, best_pair, paired_values, quant_vs_routers, router_vs_press, task_row

N15 = "15_paired_questions_gemma"               # notebook 15: the same study on Gemma 3 270M, at the same budget

_T15 = [task_row(t, N15) for t in ("passkey", "multi-key")]

FINDINGS = (
    Finding("**Paired questions on Gemma 3 270M (notebook 15).** The same study where the model retrieves: {n:.0f} "
            "questions per task on {L:,.0f}-token documents, routers routing and presses compressing the 3 global layers, the 15 sliding layers holding their "
            "512-token window for every method. " + "; ".join(t for t, _ in _T15) + ". On passkey {rp}. Per decode "
            "step, over the whole model, `minmax@" + str(BUDGET) + "` reads {rr:.2f} of a bf16 dense cache's K/V bytes "
            "and holds {hr:.2f}; a press reads and holds {rs:.2f}, HQQ 4-bit {rh4:.2f} and 2-bit {rh:.2f} (counted "
            "as if its sliding layers held only their window): {q4}. Paired on the same questions, the best router "
            "against the best quantised cache: passkey, {bq_passkey}; multi-key, {bq_multi_key}. sparsekv's dense answers and "
            "transformers' differ on {dis:.0f} of the {nall:.0f} questions.",
            {**paired_values(N15, _T15),
             "rp": router_vs_press("passkey", N15), "q4": quant_vs_routers("hqq4", N15),
             **{f"bq_{t.replace('-', '_')}": best_pair(t, "quantiser", N15) for t in ("passkey", "multi-key")}}),
)
