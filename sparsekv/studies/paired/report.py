"""The paired-question study's figures and checks (`studies.paired` runs it): what notebooks 14 and 15 draw and
assert.

    accuracy_figure     accuracy per method and task, Wilson 95% intervals
    bytes_figure        accuracy against K/V bytes read per step and held, against bf16 dense
    agreement_figure    the answer tokens' KL to dense and top-1 agreement against bytes read per step
    dialogue_figure     each method's accuracy on a question alone and asked second, by the dialogue's order
    rule_figure         each router's accuracy under both question rules, with their paired test
    vs_dense_table      every method against its own engine's dense, and the best router against the best peers
    checks              the invariants, gated findings and hypotheses stated before the run
"""
from __future__ import annotations

from pathlib import Path

from ...suite.report import Checks
from .study import Study


def _errorbar(ax, x, cell, style, **kw):
    ax.errorbar([x], [cell["accuracy"]], yerr=[[cell["accuracy"] - cell["lo"]], [cell["hi"] - cell["accuracy"]]],
                fmt=style["marker"], color=style["color"], **kw)


def _finish(fig, title: str, path, **kw):
    """The tail every figure here shares: its title, then `viz.save` (layout, checks, file) when `path` is given."""
    from ...suite import viz
    fig.suptitle(title, fontsize=10, **kw)
    if path is not None:
        viz.save(fig, path, dpi=120)
    return fig


def _hollow(st: Study) -> set[str]:
    """The methods `accuracy_figure` and `bytes_figure` draw hollow: transformers' dense, and a router under the other
    question rule (`StudyConfig.rule_scorers`)."""
    return {"hf dense"} | {m.name for m in st.lossless if m.rule is not None}


def _n_words(st: Study, task: str, cells: dict) -> str:
    """How many questions `cells` ((task, method) -> {"n", ...}) rest on: "104 questions per method", or with the
    peers on fewer documents (`StudyConfig.peer_docs`) "100 questions for sparsekv, 6 for transformers"."""
    ns = {cells[(task, m)]["n"] for m in st.methods if (task, m) in cells}
    if len(ns) == 1:
        return f"{ns.pop()} questions per method"
    return f"{cells[(task, 'dense')]['n']} questions for sparsekv, {cells[(task, 'hf dense')]['n']} for transformers"


def _leaders(st: Study, t: str) -> str:
    """Words for the non-oracle methods that answered the most of task `t` on the questions all answered, with the
    count they rest on: "passkey: minmax@256 answered most, 5 of 6", or a tie named as one ("3 methods tie at 2 of
    6"), or "passkey: no method but dense and the oracle answered any of 6": never a "best" picked among ties."""
    acc, skip = st.acc_shared, ("dense", "oracle", "int8 oracle")
    cand = [m for m in st.methods if st.family(m) not in skip]
    top = max(acc[(t, m)]["accuracy"] for m in cand)
    lead = [m for m in cand if acc[(t, m)]["accuracy"] == top]
    n = acc[(t, lead[0])]["n"]
    k = round(top * n)
    if k == 0:
        return f"{t}: no method but dense and the oracle answered any of {n}"
    if len(lead) > 1:
        names = ", ".join(lead) if len(lead) <= 3 else f"{len(lead)} methods"
        return f"{t}: {names} tie at {k} of {n}"
    return f"{t}: {lead[0]} answered most, {k} of {n}"


def accuracy_figure(st: Study, path: str | Path | None = None):
    """One panel per task: every method's accuracy with its Wilson 95% interval; sparsekv's methods left of the
    rule, transformers' right. Hollow: transformers dense, and a router under the other question rule
    (`StudyConfig.rule_scorers`, as in `rule_figure`)."""
    import matplotlib.pyplot as plt

    from ...suite import viz
    tn, methods = st.config.task_names, st.methods
    hollow = _hollow(st)
    fig, axes = plt.subplots(1, len(tn), figsize=(max(7.0, 4.2 * len(tn)), 4.8), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], tn):
        for x, m in enumerate(methods):
            st_ = viz.method_style(st.family(m))
            _errorbar(ax, x, st.acc[(t, m)], st_, capsize=3, ms=7, mfc="white" if m in hollow else st_["color"])
        ax.axvline(len(st.lossless) - 0.5, color="0.7", lw=0.8)
        ax.set_xticks(range(len(methods)), methods, rotation=60, ha="right", fontsize=8)
        ax.set_title(f"{t}\n{_n_words(st, t, st.acc)}", fontsize=10)      # two lines: it fits a 4-inch panel
        ax.set_ylim(-0.03, 1.03)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("questions answered (Wilson 95% CI)")
    on = "" if st.acc_peered is None else " (on the questions all answered)"
    return _finish(fig, f"{st.model_name}, {st.config.length}-token documents, budget {st.config.budget}{on}: "
                   + "; ".join(_leaders(st, t) for t in tn), path, wrap=True)


def bytes_figure(st: Study, path: str | Path | None = None):
    """The first task's accuracy against bytes read per decode step (left) and held (right), both over bf16 dense.
    Methods at the same x (the presses, which hold what they read) are dodged by 4% each about it (`viz.dodged`), and
    the legend says so; the tables and metrics give the exact counts."""
    import matplotlib.pyplot as plt

    from ...suite import viz
    t = st.config.task_names[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    hollow = _hollow(st)
    for ax, kind in zip(axes, ("read", "held")):
        xs = viz.dodged(ax, [st.nbytes[m][kind] for m in st.methods])
        for m, x in zip(st.methods, xs):
            style = viz.method_style(st.family(m))
            _errorbar(ax, x, st.acc[(t, m)], style, capsize=2, ms=7, label=m,
                      mfc="white" if m in hollow else style["color"])
        ax.set_xscale("log")
        viz.log_axis_plain(ax)
        ax.set(xlabel=f"K/V bytes {'read per decode step' if kind == 'read' else 'held'} / bf16 dense (log)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{t}: questions answered (95% CI)")
    viz.legend_outside(axes[1], ncol=1, title=viz.dodge_note(), title_fontsize=7)
    r = st.nbytes[f"{st.config.scorers[0]}@{st.config.budget}"]
    scope = "; sliding layers identical" if st.windows else ""
    return _finish(fig, f"{st.model_name}, {t} at {st.config.length} tokens: routers read {r['read']:.2f} of dense per "
                   f"step and hold {r['held']:.2f}; presses hold what they read{scope}", path)


def agreement_figure(st: Study, path: str | Path | None = None):
    """The first task's answer tokens against each method's own engine's dense (sparsekv's methods against sparsekv
    dense, transformers' against transformers dense): mean KL(dense || method) per answer step (left, symmetric log
    axis, linear below 1e-3 nats) and the fraction of answer steps whose top-1 token agrees (right), each a mean over
    questions with its bootstrap 95% interval, against K/V bytes read per decode step over bf16 dense. The two
    dense references sit at (1, 0) and (1, 1) by construction and are left out."""
    import matplotlib.pyplot as plt

    from ...suite import viz
    t = st.config.task_names[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    shown = [m for m in st.methods if (t, m) in st.agreement and st.family(m) != "dense"]
    for ax, stat in zip(axes, ("kl", "top1")):
        xs = viz.dodged(ax, [st.nbytes[m]["read"] for m in shown])
        for m, x in zip(shown, xs):
            v = st.agreement[(t, m)]
            style = viz.method_style(st.family(m))
            lo, hi = (v["kl_lo"], v["kl_hi"]) if stat == "kl" else (v["top1_lo"], v["top1_hi"])
            ax.errorbar([x], [v[stat]], yerr=[[max(0.0, v[stat] - lo)], [max(0.0, hi - v[stat])]],
                        fmt=style["marker"], color=style["color"], capsize=2, ms=7, label=m)
        ax.set_xscale("log")
        viz.log_axis_plain(ax)
        ax.set(xlabel="K/V bytes read per decode step / bf16 dense (log)")
        ax.grid(alpha=0.3)
    axes[0].set_yscale("symlog", linthresh=1e-3)
    axes[0].set_ylim(bottom=0)
    axes[0].set_ylabel("KL(dense || method) per answer token (nats)")
    axes[1].set(ylabel="answer tokens whose top-1 agrees with dense", ylim=(-0.03, 1.03))
    viz.legend_outside(axes[1], ncol=1, title=viz.dodge_note(), title_fontsize=7)
    kl = {m: st.agreement[(t, m)]["kl"] for m in shown}
    best = min(kl, key=kl.get) if kl else "none"
    return _finish(fig, f"{st.model_name}, {t} at {st.config.length:,} tokens: closest to its dense on the answer "
                   f"tokens: {best} ({kl.get(best, float('nan')):.3g} nats per token)\n"
                   f"{_n_words(st, t, st.agreement)}; bootstrap 95% intervals over questions", path)


def dialogue_figure(st: Study, path: str | Path | None = None):
    """The first task with dialogues (`StudyConfig.dialogues`): per method, its accuracy on the questions asked alone
    (circle) and asked second in a two-turn dialogue, after the earlier fact (triangle up) or the later one (triangle
    down), each with its Wilson 95% interval, in the method's colour; sparsekv's methods left of the rule."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from ...suite import viz
    if not st.config.dialogues:
        raise ValueError("dialogue_figure needs a run with dialogues (StudyConfig.dialogues > 0)")
    t = st.config.task_names[0]
    fig, ax = plt.subplots(figsize=(max(9.0, 0.75 * len(st.methods) + 3), 5.0))
    conds = (("alone", "o", -0.22), ("earlier first", "^", 0.0), ("later first", "v", 0.22))
    for x, m in enumerate(st.methods):
        style = viz.method_style(st.family(m))
        for cond, marker, dx in conds:
            cell = st.acc[(t, m)] if cond == "alone" else st.order_acc[(f"{t} 2-turn", cond, m)]
            ax.errorbar([x + dx], [cell["accuracy"]], yerr=[[cell["accuracy"] - cell["lo"]],
                                                            [cell["hi"] - cell["accuracy"]]],
                        fmt=marker, color=style["color"], capsize=2, ms=6,
                        mfc="white" if cond != "alone" else style["color"])
    ax.axvline(len(st.lossless) - 0.5, color="0.7", lw=0.8)
    ax.set_xticks(range(len(st.methods)), st.methods, rotation=60, ha="right", fontsize=8)
    ax.set(ylim=(-0.03, 1.03), ylabel=f"{t} questions answered (Wilson 95% CI)")
    ax.grid(axis="y", alpha=0.3)
    n_alone = st.acc[(t, "dense")]["n"]
    n_turn = {c: st.order_acc[(f"{t} 2-turn", c, "dense")]["n"] for c in ("earlier first", "later first")}
    handles = [Line2D([], [], marker=mk, ls="none", color="0.2", mfc="0.2" if c == "alone" else "white",
                      label=f"{c} (n = {n_alone if c == 'alone' else n_turn[c]})") for c, mk, _ in conds]
    viz.legend_outside(ax, handles=handles, ncol=1)
    r = st.turn[(t, "dense")]
    return _finish(fig, f"{st.model_name}, {t} at {st.config.length} tokens, budget {st.config.budget}:\ndense answers "
                   f"{r['acc_a']:.0%} of the questions alone and {r['acc_b']:.0%} asked second (n = {r['n']}, McNemar "
                   f"p = {r['p']:.2g})", path)


def rule_figure(st: Study, path: str | Path | None = None):
    """Each task's routers under both question rules (`StudyConfig.rule_scorers`): accuracy with its Wilson 95%
    interval under the run's rule (filled) and the other (hollow), joined per router; under each router its discordant
    questions and exact McNemar p; dense's accuracy as a dotted line."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from ...suite import viz
    if not st.rule_pairs:
        raise ValueError("rule_figure needs a run with rule_scorers (StudyConfig.rule_scorers)")
    tn, cfg = st.config.task_names, st.config
    fig, axes = plt.subplots(1, len(tn), figsize=(4.6 * len(tn) + 3.4, 5.2), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], tn):
        labels = []
        for x, k in enumerate(st.rule_pairs):
            other, base = st.pairs[k]
            style = viz.method_style(st.family(base))
            for dx, m, filled in ((-0.12, base, True), (0.12, other, False)):
                c = st.acc[(t, m)]
                ax.errorbar([x + dx], [c["accuracy"]], yerr=[[c["accuracy"] - c["lo"]], [c["hi"] - c["accuracy"]]],
                            fmt=style["marker"], color=style["color"], capsize=3, ms=7,
                            mfc=style["color"] if filled else "white")
            ax.plot([x - 0.12, x + 0.12], [st.acc[(t, base)]["accuracy"], st.acc[(t, other)]["accuracy"]],
                    color=style["color"], lw=0.8)
            r = st.tests[(t, k)]
            labels.append(f"{base}\n{r['b_only']} / {r['a_only']}, p = {r['p']:.2g}")
        ax.axhline(st.acc[(t, "dense")]["accuracy"], color=viz.method_style("dense")["color"], ls=":", lw=1)
        ax.set_xticks(range(len(st.rule_pairs)), labels, fontsize=8)
        ax.set_xlim(-0.5, len(st.rule_pairs) - 0.5)
        ax.set(title=f"{t} (n = {st.acc[(t, 'dense')]['n']} paired questions)", ylim=(-0.03, 1.03))
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("questions answered (Wilson 95% CI)")
    says = {"dense": "question prefilled densely", "routed": "question's tokens routed"}
    handles = [Line2D([], [], marker="o", ls="none", color="0.2", label=says[cfg.rule]),
               Line2D([], [], marker="o", ls="none", color="0.2", mfc="white", label=says[st.other_rule]),
               Line2D([], [], ls=":", color=viz.method_style("dense")["color"], label="dense"),
               Line2D([], [], ls="none", label=f"under each router: questions\nanswered only under the {cfg.rule}"
                      f"\nrule / only under the {st.other_rule} one,\nexact McNemar p")]
    viz.legend_outside(axes[0][-1], handles=handles, ncol=1)
    changed = [(t, k) for t in tn for k in st.rule_pairs if st.tests[(t, k)]["p"] < 0.05]
    verdict = ("the question rule changes no router's answers significantly" if not changed else
               f"with the {says[st.other_rule]}, " + ", ".join(
                   f"{st.pairs[k][1]} answers {'fewer' if st.tests[(t, k)]['acc_a'] < st.tests[(t, k)]['acc_b'] else 'more'}"
                   f" on {t} (p = {st.tests[(t, k)]['p']:.2g})" for t, k in changed))
    return _finish(fig, f"{st.model_name}, {cfg.length} tokens, budget {cfg.budget}:\n{verdict}", path)


# -- checks ------------------------------------------------------------------------------------

def vs_dense_table(st: Study) -> str:
    """Every method's exact McNemar against its own engine's dense, per task (`Study.vs_dense`): its accuracy and
    dense's on the questions both answered, the discordant counts and p; then the best router against the best press
    and the best quantised cache (`Study.best_tests`). Descriptive: the pre-stated pairs are the checks'."""
    from ...core.tables import format_table
    rows = [{"task": t, "method": m, "n": r["n"], "method acc": f"{r['acc_a']:.1%}", "dense acc": f"{r['acc_b']:.1%}",
             "only method": r["a_only"], "only dense": r["b_only"], "McNemar p": f"{r['p']:.3g}"}
            for (t, m), r in st.vs_dense.items()]
    out = format_table(rows, ["task", "method", "n", "method acc", "dense acc", "only method", "only dense",
                              "McNemar p"])
    for (t, k), r in st.best_tests.items():
        out += (f"\n{t}: best {k.replace('vs ', 'vs best ')}: {r['a']} {r['acc_a']:.1%} vs {r['b']} {r['acc_b']:.1%}, "
                f"only the router {r['a_only']}, only the other {r['b_only']}, n {r['n']}, McNemar p = {r['p']:.3g}")
    return out


def checks(st: Study, min_questions: int, gated: bool = True, dense_half: bool = True, kl_pairs=(),
           turn_methods=(), hqq2_gated: bool | None = None) -> Checks:
    """The study's claims on the first task (the headline) and per task.

    Invariants: every single-question cell has `min_questions` paired questions; sparsekv dense and transformers
    dense disagree on at most 5% (in every task, second turns included; with sparsekv's bfloat16 prefill, which may
    flip a near-tied answer either way, their disagreements favour neither engine significantly: exact McNemar
    p >= 0.05); the byte model is within 10% of what
    transformers' caches held. The two claims "the best router (oracle
    aside) answers at least as many as the best press at equal bytes read" and "HQQ-2 answers at most 5%" are gated
    findings (`gated`; `hqq2_gated`, when given, for the second alone) or, where a run states them for the first
    time on a model, hypotheses. Hypotheses: the oracle
    within 5 points of dense, and each pre-stated pair not significantly worse (McNemar p < 0.05); with `dense_half`,
    dense answering at least half (a hypothesis since notebook 14's first run rejected it); for each pre-stated pair
    named in `kl_pairs` (e.g. "minmax vs SnapKV"), its first method departing less from dense on the answer tokens
    than its second (the paired bootstrap's 95% interval of the per-question KL difference lies below 0); for each
    method in `turn_methods` (a run with dialogues), that asking another question first does not change its answers
    significantly (exact McNemar of the question alone against it asked second, p >= 0.05); for each router the run
    also answers under the other question rule (`StudyConfig.rule_scorers`), that the rule does not change its answers
    significantly (exact McNemar, p >= 0.05)."""
    cfg, acc = st.config, st.acc
    out = Checks()
    every = st.methods if st.acc_peered is None else [m.name for m in st.lossless]     # peers on fewer documents
    for t in cfg.task_names:
        out.invariant(f"{t}: every method{'' if every == st.methods else ' of sparsekv'} answered at least "
                      "min_questions paired questions", min(acc[(t, m)]["n"] for m in every), ">=", min_questions)
    for t in st.tasks:                          # the single questions, and the second turns of dialogues
        a = st.agree[t]
        if cfg.prefill == "float32":            # the same model at the same precision: answers nearly always equal
            out.invariant(f"{t}: sparsekv dense and transformers dense disagree on at most 5% of questions",
                          (a["a_only"] + a["b_only"]) / a["n"], "<=", 0.05)
        else:                                   # a bf16 prefill may flip a near-tie; it must not favour one engine
            out.invariant(f"{t}: sparsekv dense ({cfg.prefill} prefill) and transformers dense (float32) differ in no "
                          "direction significantly (exact McNemar p >= 0.05; their count: agreement.<task>.dense_vs_hf.disagree)",
                          a["p"], ">=", 0.05)
    t0 = cfg.task_names[0]
    routers = [f"{s}@{cfg.budget}" for s in cfg.scorers if s != "oracle"]
    presses = [m.name for m in st.lossy if m.family == "evict"]
    claim = out.finding if gated else out.hypothesis
    if routers and presses:                     # on the same questions (with peer_docs, those the peers answered)
        on = st.acc_shared
        claim(f"{t0}: at equal bytes read the best router (oracle aside) answers at least as many questions as the "
              "best press" + ("" if st.acc_peered is None else f" (on the {on[(t0, 'dense')]['n']} questions both "
                                                               "answered)"),
              max(on[(t0, m)]["accuracy"] for m in routers) - max(on[(t0, m)]["accuracy"] for m in presses), ">=", 0.0)
    if "hqq2" in st.methods:
        claim = claim if hqq2_gated is None else out.finding if hqq2_gated else out.hypothesis
        claim(f"{t0}: HQQ at 2 bits answers at most 5% of questions", acc[(t0, "hqq2")]["accuracy"], "<=", 0.05)
    if dense_half:
        out.hypothesis(f"{t0}: dense answers at least half the questions at {cfg.length} tokens",
                       acc[(t0, "dense")]["accuracy"], ">=", 0.5)
    out.invariant("the byte model matches the bytes transformers' compressed caches held (within 10%)",
                  max(abs(v - 1) for v in st.model_vs_held.values()) if st.model_vs_held else 0.0, "<=", 0.10)
    for (t, k), r in st.tests.items():
        a, b = st.pairs[k]
        if k in st.rule_pairs:                  # a router under both question rules: the headline's rule is tested
            out.hypothesis(f"{t}: routing the question's tokens too does not change {b}'s answers significantly "
                           f"(exact McNemar p >= 0.05; its discordant counts: mcnemar.<task>.<pair>.a_only, .b_only)",
                           r["p"], ">=", 0.05)
        elif k == "oracle vs dense":
            out.hypothesis(f"{t}: {a} answers within 5 points of dense", r["acc_a"] - r["acc_b"], ">=", -0.05)
        else:
            worse = r["acc_a"] < r["acc_b"] and r["p"] < 0.05
            out.hypothesis(f"{t}: {a} is not significantly worse than {b} (McNemar p < 0.05)", float(worse), "==", 0.0)
    tested = {k for _, k in st.kl_tests}               # the pre-stated pairs but those against dense
    unknown = [k for k in kl_pairs if k not in tested]
    if unknown:
        raise ValueError(f"kl_pairs must name pre-stated pairs of this run {sorted(tested)}"
                         f", got {unknown!r}")
    for (t, k), r in st.kl_tests.items():
        if k in kl_pairs:
            a, b = st.pairs[k]
            out.hypothesis(f"{t}: on the answer tokens {a} departs less from its dense than {b} from its own (paired "
                           "bootstrap 95% interval of the KL difference below 0 nats)", r["hi"], "<", 0.0)
    unknown = [m for m in turn_methods if not any(k[1] == m for k in st.turn)]
    if unknown:
        raise ValueError(f"turn_methods must name methods of a run with dialogues {st.methods if st.turn else []}, "
                         f"got {unknown!r}")
    for (t, m), r in st.turn.items():
        if m in turn_methods:
            out.hypothesis(f"{t}: asking another question first does not change {m}'s answers significantly (exact "
                           "McNemar of the question alone against it asked second)", r["p"], ">=", 0.05)
    return out


__all__ = ["accuracy_figure", "bytes_figure", "agreement_figure", "dialogue_figure", "rule_figure", "vs_dense_table",
           "checks"]
