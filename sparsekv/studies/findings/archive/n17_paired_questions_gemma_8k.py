"""Archived notebook 17's findings (`notebooks/archive/17_paired_questions_gemma_8k.ipynb`): notebook 15's study at
8k tokens, and agreement with dense on every answer token."""
from ..finding import Finding
from ..paired_words import (
    BUDGET,
    best_pair,
    kl_word,
    paired_values,
    quant_vs_routers,
    router_vs_press,
    task_row,
    versus_pair,
)

N17 = "17_paired_questions_gemma_8k"            # notebook 17: notebook 15's study at 8k tokens

_T17 = [task_row("passkey", N17)]
_A = f"agreement.passkey.{{}}@{BUDGET}"

FINDINGS = (
    Finding("**Paired questions on Gemma 3 270M at 8k tokens (notebook 17).** Notebook 15's study at {L:,.0f} tokens, "
            "where a " + str(BUDGET) + "-token budget is {frac:.1%} of the context: {n:.0f} keyed passkey questions (8 per "
            "document, chosen on a dense-only pilot), each on its own copy of one prefill. " + _T17[0][0] + "; `halves@"
            + str(BUDGET) + "` answers {h:.0%}, which {hw}. On passkey {rp}; against the best quantised cache, {bq}. Per "
            "decode step, over the whole model, `minmax@" + str(BUDGET) + "` reads {rr:.2f} of a bf16 dense cache's K/V "
            "bytes and holds {hr:.2f}; a press reads and holds {rs:.2f}, HQQ 4-bit {rh4:.2f} and 2-bit {rh:.2f}: {q4}. "
            "sparsekv's dense answers and transformers' differ on {dis:.0f} of the {nall:.0f} questions.",
            {**paired_values(N17, _T17), "frac": lambda m: BUDGET / m[N17]["document_tokens"],
             "h": (N17, f"acc.passkey.halves@{BUDGET}"),
             "hw": versus_pair("passkey", f"halves@{BUDGET}", f"minmax@{BUDGET}", "halves_vs_minmax", f"`minmax@{BUDGET}`", N17),
             "rp": router_vs_press("passkey", N17), "q4": quant_vs_routers("hqq4", N17),
             "bq": best_pair("passkey", "quantiser", N17)}),
    Finding("**Agreement with dense on every answer token, and routing over int8 blocks (notebook 17, Gemma 3 270M "
            "at {L:,.0f} tokens).** On the same {n:.0f} passkey questions, every answer step teacher-forced and "
            "compared with its own engine's dense (sparsekv's methods with sparsekv dense, the peers with "
            "transformers dense): KL(dense ‖ method) per answer token is {kh:.3g} nats for `halves@" + str(BUDGET) + "` "
            "(top-1 agreement {th:.0%}), {km:.3g} for `minmax@" + str(BUDGET) + "` ({tm:.0%}), {ko:.3g} for the oracle "
            "({to:.0%}), {ks:.3g} for SnapKV ({ts:.0%}), {kq4:.3g} for HQQ 4-bit ({tq4:.0%}) and {kq:.3g} for HQQ 2-bit "
            "({tq:.0%}). Paired by question, "
            "`minmax` {w1}; `halves` {w2}. Over int8 blocks (int8 codes and a scale per token and kv head), "
            "`int8 dense` answers {i8d:.0%}, which {i8dw}, with a KL of {ki8:.2g} nats per token to exact dense; "
            "`int8 halves@" + str(BUDGET) + "` answers {i8h:.0%}, which {i8hw}, reading {i8r:.2f} of a bf16 dense "
            "cache's bytes per step and holding {i8held:.2f}, against `halves@" + str(BUDGET) + "`'s {hr:.2f} and "
            "{hh:.2f}.",
            {"L": (N17, "document_tokens"), "n": (N17, "questions_per_cell.min"),
             "kh": (N17, _A.format("halves") + ".kl"), "th": (N17, _A.format("halves") + ".top1"),
             "km": (N17, _A.format("minmax") + ".kl"), "tm": (N17, _A.format("minmax") + ".top1"),
             "ko": (N17, _A.format("oracle") + ".kl"), "to": (N17, _A.format("oracle") + ".top1"),
             "ks": (N17, _A.format("SnapKV") + ".kl"), "ts": (N17, _A.format("SnapKV") + ".top1"),
             "kq": (N17, "agreement.passkey.hqq2.kl"), "tq": (N17, "agreement.passkey.hqq2.top1"),
             "kq4": (N17, "agreement.passkey.hqq4.kl"), "tq4": (N17, "agreement.passkey.hqq4.top1"),
             "w1": kl_word("minmax_vs_SnapKV", f"SnapKV@{BUDGET}", N17),
             "w2": kl_word("halves_vs_minmax", f"`minmax@{BUDGET}`", N17),
             "i8d": (N17, "acc.passkey.int8 dense"),
             "i8dw": versus_pair("passkey", "int8 dense", "dense", "int8_dense_vs_dense", "exact dense", N17),
             "ki8": (N17, "agreement.passkey.int8 dense.kl"),
             "i8h": (N17, f"acc.passkey.int8 halves@{BUDGET}"),
             "i8hw": versus_pair("passkey", f"int8 halves@{BUDGET}", f"halves@{BUDGET}", "int8_halves_vs_halves",
                               f"`halves@{BUDGET}` over exact blocks", N17),
             "i8r": (N17, f"bytes.int8 halves@{BUDGET}.read"), "i8held": (N17, f"bytes.int8 halves@{BUDGET}.held"),
             "hr": (N17, f"bytes.halves@{BUDGET}.read"), "hh": (N17, f"bytes.halves@{BUDGET}.held")}),
)
