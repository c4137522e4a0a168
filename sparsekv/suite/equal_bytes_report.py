"""Notebook 24's figures: every family as a curve of accuracy against bytes, read per step and held per sequence.

    curves_figure(curves, model, length, task, path)   two panels (bytes read, bytes held), a line per method line,
                                                       document-level 95% intervals as error bars
    finding(table, cell)                               the title line: verdicts of the cell's declared contrasts
    fast_memory_table(rows) / fast_memory_figure(t)    the third byte axis: fast memory held against stall per step
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from . import viz

LINE_STYLE = {"dense": ("#555555", "*"), "int8 dense": ("#555555", "P"), "int4 dense": ("#555555", "X"),
              "transformers dense": ("#999999", "*")}
PRESS_COLOR = "#CC79A7"


def style(line: str) -> dict:
    """Colour, marker and dash of a method line: a router its scorer's colour (dashed under the routed question
    rule, hollow markers over int blocks), a press reddish purple with its own marker (dotted when question-aware),
    HQQ sky blue, dense grey stars."""
    if line in LINE_STYLE:
        c, m = LINE_STYLE[line]
        return dict(color=c, marker=m, linestyle="none", markersize=11)
    if line == "HQQ":
        return dict(color=viz.QUANT_COLOR, marker="D", linestyle="-")
    scorer = line.removeprefix("int8 ").removeprefix("int4 ").split("/")[0].split(",")[0]
    if scorer in viz.ROUTER_COLORS:
        bs = line.split("/")[1].split(",")[0] if "/" in line else "16"
        out = dict(color=viz.ROUTER_COLORS[scorer], marker="o" if bs == "16" else "s",
                   linestyle="--" if "routed question" in line else "-")
        if line.startswith(("int8 ", "int4 ")):   # hollow markers: the same scorer over int codes
            out.update(markerfacecolor="white", linestyle=":" if line.startswith("int4") else "-.")
        return out
    name = line.split(",")[0]
    return dict(color=PRESS_COLOR, marker=viz.PRESS_MARKERS.get(name, "v"),
                linestyle=":" if "question-aware" in line else "-")


ROUTER_FOCUS = ("halves/16", "mean/8")    # the two best-supported routers, drawn again beside the peers


def _panel_lines(lines, row: str) -> list[str]:
    """The method lines one row of panels draws: "routers" (every router over exact blocks, both question rules, and
    the oracle) or "peers" (the focus routers, the same over int8/int4 blocks, the presses and HQQ); dense markers in
    both."""
    dense = [x for x in lines if x.endswith("dense")]
    if row == "routers":
        return dense + [x for x in lines if "/" in x and not x.startswith(("int8 ", "int4 "))]
    return dense + [x for x in lines if x in ROUTER_FOCUS or (x.startswith(("int8 ", "int4 ")) and "/" in x)
                    or "/" not in x and not x.endswith("dense")]


def curves_figure(curves, model: str, length: int, task: str, path=None, title: str | None = None,
                  finding: str | None = None):
    """Accuracy against bytes read (left) and held (right), both as shares of a bf16 dense cache on a log axis; one
    line per method line in knob order, with 95% intervals over documents. Top row: the routers over exact blocks
    (dashed: the question routed too) and the oracle (charged for the blocks it selects only). Bottom row: halves and
    mean/8 beside the same over int8/int4 blocks, the presses and HQQ. finding: a first title line that states what
    the cell's tested contrasts found (`finding`). Returns the figure."""
    c = curves[(curves["model"] == model) & (curves["length"] == length) & (curves["task"] == task)]
    if c.empty:
        raise ValueError(f"curves has no rows for {model} at {length} tokens on {task!r}")
    fig, axes = plt.subplots(2, 2, figsize=(12.5, 9.5), sharey=True)
    docs = int(c["docs"].min())
    lines = sorted(c["line"].unique())
    for r, (row, what) in enumerate((("routers", "routers over exact blocks"),
                                     ("peers", "halves and mean/8 against int blocks, presses and HQQ"))):
        for col, (axis, label) in enumerate((("read", "K/V bytes read per decode step / bf16 dense"),
                                             ("held", "bytes held per sequence / bf16 dense"))):
            ax = axes[r, col]
            for line in _panel_lines(lines, row):
                g = c[c["line"] == line].sort_values("knob", na_position="first")
                lo = (g["accuracy"] - g["lo"]).clip(lower=0).fillna(0)
                hi = (g["hi"] - g["accuracy"]).clip(lower=0).fillna(0)
                ax.errorbar(g[axis], g["accuracy"], yerr=[lo, hi], capsize=2, label=line, **style(line))
            ax.set_xscale("log")
            viz.log_axis_plain(ax, "x")
            ax.set_xlabel(label)
            ax.set_title(what, fontsize=10)
            ax.grid(alpha=0.3)
            ax.set_ylim(-0.03, 1.03)
        axes[r, 0].set_ylabel("questions answered (share)")
        handles, labels = axes[r, 0].get_legend_handles_labels()
        axes[r, 1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8,
                          title="method line")
    what = f"{model}, {length:,} tokens, {task}"
    sample = f"{docs} document{'s' * (docs != 1)} or more per point; 95% intervals over documents"
    fig.suptitle(title or (f"{finding}\n{what} ({sample})" if finding else
                           f"{what}: accuracy against bytes read and held\n({sample})"), fontsize=11)
    if path is not None:
        viz.save(fig, path)
    return fig


def fast_memory_table(rows):
    """Per (model, length, task, method, hot share): documents, questions, fast bytes held, the median stall per
    decode step with a 95% interval over documents (bootstrap of the per-document medians), the share of tile
    accesses that waited (misses and late prefetches), the median step over the cold tier against in memory
    (`slowdown`), and whether every answer equalled the in-memory one."""
    import numpy as np
    import pandas as pd
    out = []
    keys = ["model", "length", "task", "method", "hot_share"]
    for key, g in rows.groupby(keys):
        per_doc = g.groupby("doc")["stall_ms_per_step"].median().to_numpy()
        rng = np.random.default_rng(0)
        boot = np.median(rng.choice(per_doc, (2000, len(per_doc)), replace=True), axis=1) if len(per_doc) > 1 \
            else per_doc
        waited = (g["misses"] + g["late_prefetches"]).sum()
        accesses = g[["hits", "prefetch_hits", "late_prefetches", "misses", "staged"]].to_numpy().sum()
        out.append({**dict(zip(keys, key)), "docs": g["doc"].nunique(), "questions": len(g),
                    "fast_held": g["fast_held"].iloc[0], "held": g["held"].iloc[0], "read": g["read"].iloc[0],
                    "stall_ms": float(np.median(per_doc)), "lo": float(np.quantile(boot, 0.025)),
                    "hi": float(np.quantile(boot, 0.975)), "waited": float(waited / max(accesses, 1)),
                    "slowdown": float(g["step_ms"].median() / g["in_memory_step_ms"].median()),
                    "exact": bool(g["exact"].all())})
    return pd.DataFrame(out)


def fast_memory_figure(table, path=None):
    """Stall per decode step against bytes held in fast memory, one line per router (hot share as the knob), with
    each router's bytes held in memory without a cold tier as a dashed vertical line. Returns the figure."""
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    for method, g in table.groupby("method"):
        g = g.sort_values("fast_held")
        st = style(method.split("@")[0])
        ax.errorbar(g["fast_held"].to_numpy(), g["stall_ms"].to_numpy(),
                    yerr=[(g["stall_ms"] - g["lo"]).clip(lower=0).to_numpy(), (g["hi"] - g["stall_ms"]).clip(lower=0).to_numpy()],
                    capsize=2, label=f"{method} over a cold tier", color=st["color"], marker=st["marker"])
        ax.axvline(float(g["held"].iloc[0]), color=st["color"], ls="--", lw=1)
    exact = bool(table["exact"].all())
    n = int(table["docs"].min())
    ax.set(xlabel="bytes held in fast memory per sequence / bf16 dense (dashed: the same router with no cold tier)",
           ylabel="stall per decode step (ms, median over documents)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"A cold tier keeps {table['fast_held'].min():.2f}-{table['fast_held'].max():.2f} of dense in fast "
                 f"memory; every answer {'equals' if exact else 'does NOT equal'} the in-memory one\n"
                 f"({n} document{'s' * (n != 1)} or more per point; 95% intervals over documents; stall is a timing "
                 "on this machine)", fontsize=10)
    if path is not None:
        viz.save(fig, path)
    return fig


FINDING_CONTRASTS = ("halves@0.125 no worse than dense", "halves vs HQQ-4 at matched bytes read",
                     "int4 halves vs HQQ-4 at matched bytes held")    # declared with the design, never picked on results


def finding(table, cell: str) -> str | None:
    """The first lines of a figure title, one per contrast: the verdicts of `cell`'s FINDING_CONTRASTS in a tested
    contrast table (Holm p), or None when the table has none of them (too few documents)."""
    if table is None:
        return None
    rows = {r.name.split(": ", 1)[1]: r for r in table if r.name.startswith(f"{cell}: ")}
    said = [f"{what}: {rows[what].verdict}" for what in FINDING_CONTRASTS if what in rows]
    return "\n".join(said) or None


def contrast_records(table) -> list[dict]:
    """The contrast table's rows for display: estimate, interval, raw and Holm p, discordant pairs, verdict."""
    out = []
    for r in table:
        out.append({"contrast": r.name, "kind": r.kind, "a": r.method_a, "b": r.method_b,
                    "estimate": f"{r.estimate:+.3f}", "interval": f"[{r.lo:+.3f}, {r.hi:+.3f}]",
                    "p (raw)": f"{r.p_raw:.3g}", "p (Holm)": f"{r.p_adj:.3g}",
                    "a only / b only": "" if r.a_only is None else f"{r.a_only} / {r.b_only}", "verdict": r.verdict})
    return out


__all__ = ["style", "curves_figure", "finding", "contrast_records", "fast_memory_table", "fast_memory_figure"]
