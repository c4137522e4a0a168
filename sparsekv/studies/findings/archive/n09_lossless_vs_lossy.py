"""Archived notebook 09's finding (`notebooks/archive/09_lossless_vs_lossy.ipynb`): lossless against lossy at equal
bytes, n = 3 probes."""
from __future__ import annotations

from typing import Callable

from ..finding import PRESSES, Finding, Metrics

N09 = "09_lossless_vs_lossy"


def _quant_word(m: Metrics) -> str:
    """Whether HQQ at equal bytes is at least as good as the best router and press on passkey q1 and tail loss."""
    e = lambda k: m[N09][f"equal_bytes.{k}"]
    best = (e("passkey.q1.quant") >= max(e("passkey.q1.router"), e("passkey.q1.press"))
            and e("loss.nll.quant") <= min(e("loss.nll.router"), e("loss.nll.press")))
    return "At equal bytes quantisation is the strongest peer" if best else \
        "At equal bytes quantisation is not uniformly ahead"


def _best_press(task: str, key: str, budget: int) -> Callable[[Metrics], float]:
    """The best kvpress press (query-agnostic) on `task`'s `key` at `budget`."""
    return lambda m: max(m[N09][f"{task}.{p}@{budget}.{key}"] for p in PRESSES if f"{task}.{p}@{budget}.{key}" in m[N09])


FINDINGS = (
    Finding("**Lossless against lossy at equal bytes (notebook 09).** On SmolLM2-135M, {n:.0f} dialogues per task of "
            "{L:,.0f} tokens with two planted facts, every method on the same token ids. The next question, about the "
            "other fact: at a 128-token budget `minmax` answers {mq2:.0%} of passkey dialogues and `mean` {eq2:.0%}, "
            "while the best kvpress press (the context compressed before any question) answers {pq2:.0%}; dense answers "
            "{dq2:.0%}. On the first question, with every step routed (the question included), `minmax` answers "
            "{mq1:.0%} and `mean` {eq1:.0%}; with the question prefilled densely (Quest's protocol) {mqd:.0%} and "
            "{eqd:.0%}. {qword}: reading at most what HQQ 4-bit reads (about {ref:.0f} MiB per step, all layers), "
            "the best passkey first-question accuracy is {rr:.0%} for a "
            "router, {rp:.0%} for a press and {rq:.0%} for HQQ, and the tail loss on real text {lr:.3f}, {lp:.3f} and "
            "{lq:.3f} nats (dense {ld:.3f}). int8 K/V blocks in sparsekv's own store change the tail loss by "
            "{i8:+.3f} nats at {i8r:.0%} of float32's bytes per step; routed over int8 blocks (`minmax@256`) it is "
            "{i8m:.3f} nats against {f8m:.3f} over float32 blocks.",
            {"n": (N09, "probes_per_task"), "L": (N09, "dialogue_tokens"),
             "mq2": (N09, "passkey.minmax@128.q2"), "eq2": (N09, "passkey.mean@128.q2"),
             "pq2": _best_press("passkey", "q2", 128), "dq2": (N09, "passkey.dense.q2"),
             "mq1": (N09, "passkey.minmax@128.q1"), "eq1": (N09, "passkey.mean@128.q1"),
             "mqd": (N09, "passkey.minmax@128 qdense.q1"), "eqd": (N09, "passkey.mean@128 qdense.q1"),
             "ref": (N09, "equal_bytes.ref_read_mib"), "qword": _quant_word,
             "rr": (N09, "equal_bytes.passkey.q1.router"), "rp": (N09, "equal_bytes.passkey.q1.press"),
             "rq": (N09, "equal_bytes.passkey.q1.quant"), "lr": (N09, "equal_bytes.loss.nll.router"),
             "lp": (N09, "equal_bytes.loss.nll.press"), "lq": (N09, "equal_bytes.loss.nll.quant"),
             "ld": (N09, "loss.dense.nll"),
             "i8": lambda m: m[N09]["loss.int8 dense.nll"] - m[N09]["loss.dense.nll"],
             "i8r": lambda m: m[N09]["loss.int8 dense.read_mib"] / m[N09]["loss.dense.read_mib"],
             "i8m": (N09, "loss.int8 minmax@256.nll"), "f8m": (N09, "loss.minmax@256.nll")}),
)
