"""The words the paired-question findings share (notebooks 14, 15 and 17-21: `studies.paired` and `studies.questions`).

Each is a function of one notebook's metrics (its stem `n`), so every notebook module words its own numbers the same
way; a word names the best router and press by `Study.best_of`'s rule, so the page names the methods a study tested.
"""
from __future__ import annotations

from ...methods import best as best_method  # `best_pair` has a `best` of its own
from .finding import PRESSES, Metrics, router_names

BUDGET = 256                    # the token budget of every paired-question study (notebook 14's full run set it)


def best_press(task: str, n: str):
    """The press with the most answers on `task` at the paired study's budget in notebook `n`: "Name (acc)"."""
    def f(m: Metrics) -> str:
        accs = {p: m[n][f"acc.{task}.{p}@{BUDGET}"] for p in PRESSES if f"acc.{task}.{p}@{BUDGET}" in m[n]}
        best = max(accs, key=lambda p: (accs[p], p))
        return f"{best} {accs[best]:.0%}"
    return f


def versus_pair(task: str, a: str, b: str, pair: str, label: str, n: str):
    """How method `a` compares with `b` on `task`, in words, from notebook `n`'s exact McNemar p (0.05)."""
    def f(m: Metrics) -> str:
        x, y, p = m[n][f"acc.{task}.{a}"], m[n][f"acc.{task}.{b}"], m[n][f"mcnemar.{task}.{pair}.p"]
        if p < 0.05:
            return f"answers significantly {'more' if x > y else 'fewer'} questions than {label} (p = {p:.2g})"
        return f"is not significantly different from {label} (p = {p:.2g})"
    return f


def task_row(task: str, n: str) -> tuple[str, dict]:
    """One task's row of a paired-question finding: its text (a template piece, keys prefixed by the task) and the
    values that fill it, from notebook `n`."""
    t = task.replace("-", "_")
    text = (f"{task}: dense {{{t}_d:.0%}}, `oracle@{BUDGET}` {{{t}_o:.0%}}, `mean@{BUDGET}` {{{t}_me:.0%}}, "
            f"`minmax@{BUDGET}` {{{t}_mm:.0%}}, the best press {{{t}_bp}}, HQQ 4-bit {{{t}_h4:.0%}} and 2-bit "
            f"{{{t}_h2:.0%}}; `minmax` {{{t}_w1}} and {{{t}_w2}}")
    values = {f"{t}_d": (n, f"acc.{task}.dense"), f"{t}_o": (n, f"acc.{task}.oracle@{BUDGET}"),
              f"{t}_mm": (n, f"acc.{task}.minmax@{BUDGET}"), f"{t}_me": (n, f"acc.{task}.mean@{BUDGET}"),
              f"{t}_bp": best_press(task, n), f"{t}_h4": (n, f"acc.{task}.hqq4"), f"{t}_h2": (n, f"acc.{task}.hqq2"),
              f"{t}_w1": versus_pair(task, f"minmax@{BUDGET}", f"SnapKV@{BUDGET}", "minmax_vs_SnapKV", f"SnapKV@{BUDGET}", n),
              f"{t}_w2": versus_pair(task, f"minmax@{BUDGET}", "hqq2", "minmax_vs_hqq2", "HQQ 2-bit", n)}
    return text, values


def disagree(n: str):
    """How many questions sparsekv's dense and transformers' dense answer differently in notebook `n`."""
    return lambda m: sum(v for k, v in m[n].items() if k.endswith(".dense_vs_hf.disagree"))


def questions(n: str):
    """How many questions notebook `n` asked, over every task."""
    return lambda m: sum(v for k, v in m[n].items() if k.startswith("questions."))


def router_vs_press(task: str, n: str, cells: str = "acc"):
    """The best router's (oracle aside) answers on `task` against the best press's, in words; `cells`: "acc", or
    "acc_peered" for a run whose peers answered fewer documents (every method on the questions both answered)."""
    def f(m: Metrics) -> str:
        acc = {k.removeprefix(f"{cells}.{task}.").removesuffix(f"@{BUDGET}"): v for k, v in m[n].items()
               if k.startswith(f"{cells}.{task}.") and k.endswith(f"@{BUDGET}")}
        routers = {k: v for k, v in acc.items() if k in router_names()}
        presses = {k: v for k, v in acc.items() if k in PRESSES}
        r, p = best_method(routers), best_method(presses)
        word = "at least as many as" if routers[r] >= presses[p] else "fewer than"
        out = f"`{r}@{BUDGET}` answers {routers[r]:.0%}, {word} the best press ({p} {presses[p]:.0%})"
        k = f"best.{task}.router_vs_press"             # the paired test (`Study.best_of` picks the same two methods)
        if k + ".p" in m[n]:
            out += (f"; paired on the same questions, {m[n][k + '.a_only']:.0f} answered only by the router and "
                    f"{m[n][k + '.b_only']:.0f} only by the press, exact McNemar p = {m[n][k + '.p']:.2g}")
        return out
    return f


def best_pair(task: str, kind: str, n: str):
    """The best router against the best press or quantised cache of notebook `n` (`Study.best_of`, ties by name as
    here), paired on the same questions, in words: the discordant counts, the exact McNemar p (0.05) and what each
    reads per step."""
    def best(m: Metrics, names) -> str:
        cells = "acc_peered" if any(k.startswith(f"acc_peered.{task}.") for k in m[n]) else "acc"
        return best_method({x: m[n][f"{cells}.{task}.{x}"] for x in names if f"{cells}.{task}.{x}" in m[n]})

    def f(m: Metrics) -> str:
        k = f"best.{task}.router_vs_{kind}"
        a, b, p = m[n][k + ".a_only"], m[n][k + ".b_only"], m[n][k + ".p"]
        r = best(m, [f"{x}@{BUDGET}" for x in router_names()])
        o = best(m, [f"{x}@{BUDGET}" for x in PRESSES] if kind == "press" else [f"hqq{bits}" for bits in (8, 4, 2)])
        says = (f"the router answers significantly {'more' if a > b else 'fewer'}" if p < 0.05 else
                "no significant difference")
        return (f"`{r}` against {o}, the best {kind}: {a:.0f} question{'' if a == 1 else 's'} answered only by the "
                f"router, {b:.0f} only by {o} (exact McNemar p = {p:.2g}; {says}), reading {m[n][f'bytes.{r}.read']:.2f} and "
                f"{m[n][f'bytes.{o}.read']:.2f} of a bf16 dense cache per step")
    return f


def quant_vs_routers(method: str, n: str):
    """Whether `method` reads fewer bytes per step than every router of notebook `n`, in words."""
    def f(m: Metrics) -> str:
        routers = {k.split(".")[1]: v for k, v in m[n].items() if k.startswith("bytes.") and k.endswith(".read")
                   and k.split(".")[1].split("@")[0] in router_names() + ("oracle",)}
        q = m[n][f"bytes.{method}.read"]
        side = "fewer" if q < min(routers.values()) else "more" if q > max(routers.values()) else "about as many"
        return (f"{method} reads {side} bytes per step than the routers ({q:.2f} against "
                f"{min(routers.values()):.2f}-{max(routers.values()):.2f})")
    return f


def paired_values(n: str, task_rows: list[tuple[str, dict]]) -> dict:
    """The values every paired-question finding renders: its size, the byte ratios of `minmax`, a press and HQQ at
    the study's budget, sparsekv's disagreements with transformers, and each task's row (`task_row`)."""
    return {"n": (n, "questions_per_cell.min"), "L": (n, "document_tokens"),
            "rr": (n, f"bytes.minmax@{BUDGET}.read"), "hr": (n, f"bytes.minmax@{BUDGET}.held"),
            "rs": (n, f"bytes.SnapKV@{BUDGET}.read"), "rh": (n, "bytes.hqq2.read"), "rh4": (n, "bytes.hqq4.read"),
            "dis": disagree(n), "nall": questions(n),
            **{k: v for _, vals in task_rows for k, v in vals.items()}}


def kl_word(pair: str, label: str, n: str, task: str = "passkey"):
    """Whether the pair's first method departs less or more from its dense than `label` on the answer tokens, in
    words, from notebook `n`'s paired bootstrap of the per-question KL difference (its 95% interval)."""
    def f(m: Metrics) -> str:
        k = f"kl_diff.{task}.{pair}"
        d, lo, hi = m[n][k], m[n][k + ".ci_lo"], m[n][k + ".ci_hi"]
        side = "less" if hi < 0 else "more" if lo > 0 else "neither less nor more (the interval holds 0)"
        return f"departs {side} from dense than {label} ({d:+.2g} nats per token, 95% CI [{lo:+.2g}, {hi:+.2g}])"
    return f


def vs_dense(task: str, method: str, n: str):
    """`method` against its own engine's dense on `task` of notebook `n`, paired (`paired.against_dense`), in words:
    the direction when exact McNemar's p < 0.05, with the discordant counts."""
    def f(m: Metrics) -> str:
        k = f"vs_dense.{task}.{method}"
        a, b, p = m[n][k + ".a_only"], m[n][k + ".b_only"], m[n][k + ".p"]
        if p < 0.05:
            return (f"significantly {'more' if a > b else 'fewer'} than its dense ({a:.0f} answered only by it, "
                    f"{b:.0f} only by dense, p = {p:.2g})")
        return f"not significantly different from its dense (p = {p:.2g})"
    return f
