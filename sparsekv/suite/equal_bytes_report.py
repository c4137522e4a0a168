"""Notebook 24's figures: every family as a curve of accuracy against bytes, read per step and held per sequence.

    curves_figure(curves, model, length, task, path)   two panels (bytes read, bytes held), a line per method line,
                                                       document-level 95% intervals as error bars
"""
from __future__ import annotations

import math

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


def curves_figure(curves, model: str, length: int, task: str, path=None, title: str | None = None):
    """Accuracy against bytes read (left) and held (right), both as shares of a bf16 dense cache on a log axis; one
    line per method line in knob order, with 95% intervals over documents. Returns the figure."""
    c = curves[(curves["model"] == model) & (curves["length"] == length) & (curves["task"] == task)]
    if c.empty:
        raise ValueError(f"curves has no rows for {model} at {length} tokens on {task!r}")
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 5.2), sharey=True)
    docs = int(c["docs"].min())
    for ax, axis, label in ((axes[0], "read", "K/V bytes read per decode step / bf16 dense"),
                            (axes[1], "held", "bytes held per sequence / bf16 dense")):
        for line, g in c.groupby("line", sort=True):
            g = g.sort_values("knob", na_position="first")
            st = style(line)
            lo = (g["accuracy"] - g["lo"]).clip(lower=0).fillna(0)
            hi = (g["hi"] - g["accuracy"]).clip(lower=0).fillna(0)
            ax.errorbar(g[axis], g["accuracy"], yerr=[lo, hi], capsize=2, label=line, **st)
        ax.set_xscale("log")
        viz.log_axis_plain(ax, "x")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("questions answered (teacher-forced, share)")
    axes[0].set_ylim(-0.03, 1.03)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title="method line")
    fig.suptitle(title or f"{model}, {length:,} tokens, {task}: accuracy against bytes "
                           f"(at least {docs} document{'s' * (docs != 1)} per point; 95% intervals over documents)",
                 fontsize=11)
    if path is not None:
        viz.save(fig, path)
    return fig


def contrast_records(table) -> list[dict]:
    """The contrast table's rows for display: estimate, interval, raw and Holm p, discordant pairs, verdict."""
    out = []
    for r in table:
        out.append({"contrast": r.name, "kind": r.kind, "a": r.method_a, "b": r.method_b,
                    "estimate": f"{r.estimate:+.3f}", "interval": f"[{r.lo:+.3f}, {r.hi:+.3f}]",
                    "p (raw)": f"{r.p_raw:.3g}", "p (Holm)": f"{r.p_adj:.3g}",
                    "a only / b only": "" if r.a_only is None else f"{r.a_only} / {r.b_only}", "verdict": r.verdict})
    return out


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


__all__ = ["style", "curves_figure", "contrast_records"]
