"""Notebook 24's figures: every family as a curve of accuracy against bytes, read per step and held per sequence.

    curves_figure(curves, model, length, task, path)   two panels (bytes read, bytes held), a line per method line,
                                                       document-level 95% intervals as error bars
    finding(table, cell)                               the title line: verdicts of the cell's declared contrasts
    fast_memory_table(rows) / fast_memory_figure(t)    the third byte axis: fast memory held against stall per step
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from ...methods import Method, parse
from ...suite import viz

LINE_STYLE = {"dense": ("#555555", "*"), "int8 dense": ("#555555", "P"), "int4 dense": ("#555555", "X"),
              "transformers dense": ("#999999", "*")}
PRESS_COLOR = "#CC79A7"


def style(method: Method) -> dict:
    """Colour, marker and dash of a method's line, from its fields (never its name): a router its scorer's colour
    (`viz.router_color`; a circle at 16-token blocks, a square at others; dashed under the routed question rule,
    hollow markers over int blocks), a press reddish purple with its own marker (dotted when question-aware), HQQ sky
    blue, dense grey stars."""
    if not isinstance(method, Method):
        raise TypeError(f"method must be a methods.Method, got {type(method).__name__} {method!r}")
    if method.family == "dense":
        c, m = LINE_STYLE[method.line]
        return dict(color=c, marker=m, linestyle="none", markersize=11)
    if method.family == "quant":
        return dict(color=viz.QUANT_COLOR, marker="D", linestyle="-")
    if method.family == "router":
        out = dict(color=viz.router_color(method.scorer), marker="o" if method.block_size == 16 else "s",
                   linestyle="--" if method.rule == "routed" else "-")
        if method.kv_bits:                 # hollow markers: the same scorer over int codes
            out.update(markerfacecolor="white", linestyle=":" if method.kv_bits == 4 else "-.")
        return out
    return dict(color=PRESS_COLOR, marker=viz.PRESS_MARKERS.get(method.press.removesuffix("Press"), "v"),
                linestyle=":" if method.question_aware else "-")


ROUTER_FOCUS = ("halves/16", "mean/8")    # the two best-supported routers, drawn again beside the peers


def named(names) -> dict[str, Method]:
    """{name: Method} for each of `names` (the `method` column of a study's rows), through `methods.parse`, the one
    reader of a method's name; a name that names no method is a ValueError."""
    return {n: parse(n) for n in names}


def _panel_lines(methods, row: str) -> list[Method]:
    """One Method per line that a row of panels draws, in the order of their lines: "routers" (every router over
    exact blocks, both question rules, and the oracle) or "peers" (the focus routers under the headline rule, every
    router over int8/int4 blocks, the presses and HQQ); dense markers first in both."""
    if row not in ("routers", "peers"):
        raise ValueError(f"row must be 'routers' or 'peers', got {row!r}")
    lines = {}
    for m in methods:
        lines.setdefault(m.line, m)
    ordered = [lines[k] for k in sorted(lines)]
    dense = [m for m in ordered if m.family == "dense"]
    if row == "routers":
        return dense + [m for m in ordered if m.family == "router" and not m.kv_bits]
    return dense + [m for m in ordered if m.family in ("press", "quant") or m.family == "router" and (
        m.kv_bits or m.line in ROUTER_FOCUS)]


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
    by_name = named(c["method"].unique())
    for r, (row, what) in enumerate((("routers", "routers over exact blocks"),
                                     ("peers", "halves and mean/8 against int blocks, presses and HQQ"))):
        for col, (axis, label) in enumerate((("read", "K/V bytes read per decode step / bf16 dense"),
                                             ("held", "bytes held per sequence / bf16 dense"))):
            ax = axes[r, col]
            for m in _panel_lines(by_name.values(), row):
                g = c[c["line"] == m.line].sort_values("knob", na_position="first")
                lo = (g["accuracy"] - g["lo"]).clip(lower=0).fillna(0).to_numpy()
                hi = (g["hi"] - g["accuracy"]).clip(lower=0).fillna(0).to_numpy()
                ax.errorbar(g[axis].to_numpy(), g["accuracy"].to_numpy(), yerr=[lo, hi], capsize=2, label=m.line,
                            **style(m))     # arrays: matplotlib's float() of a one-row Series is deprecated in pandas
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
    (`slowdown`), and whether every answer equalled the in-memory one; per CPU too where the rows name it
    (`analysis.load_fast_memory`), since stall is a timing of one machine."""
    import numpy as np
    import pandas as pd
    out = []
    keys = ["model", "length", "task", "method", "hot_share"] + (["cpu"] if "cpu" in rows else [])
    for key, g in rows.groupby(keys, sort=False):
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
    """Stall per decode step against bytes held in fast memory, one panel per (model, length, task) and CPU (models
    and machines are never pooled), one line per router (hot share as the knob), with each router's bytes held in
    memory without a cold tier as a dashed vertical line. Returns the figure."""
    by_name = named(table["method"].unique())
    cells = list(table.groupby(["model", "length", "task"] + (["cpu"] if "cpu" in table else []), sort=False))
    cols = min(2, len(cells))
    rows = -(-len(cells) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(8.5 if cols == 1 else 6.4 * cols, 4.6 * rows + 0.6),
                             squeeze=False)
    for ax in axes.flat[len(cells):]:
        ax.set_visible(False)
    for ax, ((model, length, task, *_), cell) in zip(axes.flat, cells):
        for method, g in cell.groupby("method"):
            g = g.sort_values("fast_held")
            st = style(by_name[method])
            ax.errorbar(g["fast_held"].to_numpy(), g["stall_ms"].to_numpy(),
                        yerr=[(g["stall_ms"] - g["lo"]).clip(lower=0).to_numpy(),
                              (g["hi"] - g["stall_ms"]).clip(lower=0).to_numpy()],
                        capsize=2, label=f"{method} over a cold tier", color=st["color"], marker=st["marker"])
            ax.axvline(float(g["held"].iloc[0]), color=st["color"], ls="--", lw=1)
        n = int(cell["docs"].min())
        ax.set(xlabel="bytes held in fast memory / bf16 dense\n(dashed: the same router with no cold tier)",
               ylabel="stall per decode step (ms, median over documents)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
        cpu = f"; {', '.join(cell['cpu'].unique())}" if "cpu" in cell else ""
        ax.set_title(f"{model}, {length:,} tokens, {task}: fast memory {cell['fast_held'].min():.2f}-"
                     f"{cell['fast_held'].max():.2f}\n({n} document{'s' * (n != 1)} or more per point{cpu})",
                     fontsize=9)
    exact = bool(table["exact"].all())
    fig.suptitle(f"A cold tier keeps {table['fast_held'].min():.2f}-{table['fast_held'].max():.2f} of a dense cache "
                 f"in fast memory; every answer {'equals' if exact else 'does NOT equal'} the in-memory one\n"
                 "(95% intervals over documents; stall is a timing on the machine each run records)", fontsize=10)
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


__all__ = ["style", "named", "curves_figure", "finding", "contrast_records", "fast_memory_table", "fast_memory_figure"]
