"""Live explorers for JupyterLab: controls that recompute (`studies.explore`) and redraw on every change.

    routing_explorer()          router, budget, block size, needle strength, channels, depth
    prefix_cache_explorer()     timestamp position, tool order, an edited history line, block size
    router_reads_explorer(...)  the real model: which text each router reads for an editable question
    sweep_explorer(DIR)         a finished sweep (`python -m sparsekv sweep`): any metric against its parameters

Each returns an `Explorer`: `.widget` (display it), `.controls` (name -> control), `.update()` (what a
control change runs), `.view` (the last computed view) and `.readout` (an HTML widget with the numbers, CSS class
`sparsekv-readout`, which the browser test reads). Figures are PNGs in an Image widget (class
`sparsekv-figure`), drawn without pyplot, so nothing else is displayed. `save=path` writes the first
render to `path` (PNG, or HTML for the reads explorer): what a headless papermill run leaves behind.
"""
from __future__ import annotations

import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..routing.router import Router
from . import explore, viz

READOUT, FIGURE = "sparsekv-readout", "sparsekv-figure"


@dataclass
class Explorer:
    widget: object
    readout: object
    update: Callable[..., None]
    controls: dict = field(default_factory=dict)      # name -> ipywidgets control
    view: object = None
    renders: int = 0
    errors: list = field(default_factory=list)


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def _wire(controls: dict, render: Callable[[dict], tuple[str, bytes | None, object]], figure: bool, save) -> Explorer:
    import ipywidgets as w
    readout = w.HTML()
    readout.add_class(READOUT)
    image = w.Image(format="png")
    image.add_class(FIGURE)
    ex = Explorer(None, readout, None, controls)

    def update(*_):
        try:
            text, png, ex.view = render({k: c.value for k, c in controls.items()})
        except Exception as exc:             # shown in the readout; the widget stays usable
            ex.errors.append(exc)
            readout.value = f"<b>error:</b> {html.escape(str(exc))}"
            return
        readout.value = text
        if png is not None:
            image.value = png
        ex.renders += 1

    for c in controls.values():
        c.observe(update, names="value")
    ex.update = update
    update()
    if save is not None:
        path = Path(save)
        path.parent.mkdir(parents=True, exist_ok=True)
        if figure:
            path.write_bytes(image.value)
        else:
            path.write_text(readout.value)
    box = [w.HBox(list(controls.values())[i:i + 3]) for i in range(0, len(controls), 3)]
    ex.widget = w.VBox(box + [readout] + ([image] if figure else []))
    return ex


# -- routing ------------------------------------------------------------------------------------

def routing_explorer(scorer: str = "minmax", token_budget: int = 512, block_size: int = 64, strength: float = 6.0,
                     channels: int = 8, depth: float = 0.5, length: int = 8192, save=None) -> Explorer:
    """Plant a needle, route one decode query, and compare the router's blocks with the oracle's."""
    import ipywidgets as w

    from ..routing.scorers import SCORERS
    c = {"scorer": w.Dropdown(options=sorted(n for n, c in SCORERS.items() if not c.needs_calibration), value=scorer, description="router"),
         "token_budget": w.Dropdown(options=sorted({128, 256, 512, 1024, 2048, token_budget}), value=token_budget,
                                    description="budget"),
         "block_size": w.Dropdown(options=sorted({16, 32, 64, 128, block_size}), value=block_size, description="block"),
         "strength": w.FloatSlider(value=strength, min=1.0, max=24.0, step=0.5, description="strength",
                                   continuous_update=False),
         "channels": w.Dropdown(options=sorted({1, 2, 4, 8, 16, 32, 64, channels}), value=channels, description="channels"),
         "depth": w.FloatSlider(value=depth, min=0.0, max=1.0, step=0.05, description="depth", continuous_update=False)}

    def render(v):
        view = explore.routing_view(length=length, **v)
        return html.escape(view.summary), _routing_figure(view), view

    return _wire(c, render, True, save)


def _routing_figure(view: explore.RoutingView) -> bytes:
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    H, nb = view.selected.shape
    code = view.selected.astype(int) + 2 * view.oracle.astype(int)          # 0 neither, 1 router, 2 oracle, 3 both
    fig = Figure(figsize=(9, 1.2 + 0.5 * H + 1.6))
    ax, am = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [H, 3]})
    cmap = ListedColormap(["#f2f2f2", viz.COLORS[1], viz.COLORS[4], viz.COLORS[0]])
    im = ax.imshow(code, aspect="auto", cmap=cmap, vmin=-0.5, vmax=3.5, interpolation="nearest")
    cb = fig.colorbar(im, ax=[ax, am], ticks=[0, 1, 2, 3], fraction=0.03)
    cb.ax.set_yticklabels(["neither", "router only", "oracle only", "both"], fontsize=7)
    for b in view.needle_blocks:
        ax.plot(b, -0.6, marker="v", color="k", ms=6, clip_on=False)
    ax.set(ylabel="kv head", yticks=range(H))
    for h in range(H):
        am.plot(np.arange(nb), view.mass[h], lw=1, color=viz.COLORS[h % len(viz.COLORS)], label=f"kv head {h}")
    am.set(xlabel=f"logical block ({view.block_size} tokens each)", ylabel="true attention mass", yscale="log")
    am.legend(fontsize=7, loc="upper right")
    r = view.result
    ax.set_title(f"{view.scorer} keeps {r.mass_recall:.0%} of the attention mass reading {r.bytes_ratio:.0%} of dense's "
                 f"bytes (needle ▼ {'found' if r.needle_recall == 1 else 'missed'})", fontsize=9)
    return _png(fig)


# -- prefix cache -------------------------------------------------------------------------------

def prefix_cache_explorer(block_size: int = 16, tok=None, save=None) -> Explorer:
    """Edit an agent prompt's layout and see which blocks of the cached base prompt still hit."""
    import ipywidgets as w
    base = explore.agent_prompt()
    line = dict(base)["history 1"]
    c = {"timestamp": w.Dropdown(options=["after the system prompt", "before the question"],
                                 value="after the system prompt", description="timestamp"),
         "tools": w.Dropdown(options=["registered", "reversed", "alphabetical"], value="registered", description="tools"),
         "block_size": w.Dropdown(options=sorted({8, 16, 32, 64, block_size}), value=block_size, description="block"),
         "history": w.Text(value=line, description="history 1", continuous_update=False,
                           layout=w.Layout(width="60em"))}

    def render(v):
        edited = explore.agent_prompt(v["timestamp"] == "after the system prompt", v["tools"],
                                      None if v["history"] == line else v["history"])
        view = explore.prefix_view(base, edited, v["block_size"], tok)
        return html.escape(view.summary), _prefix_figure(view), view

    return _wire(c, render, True, save)


def _prefix_figure(view: explore.PrefixView) -> bytes:
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    colors = {"hit": viz.COLORS[2], "miss": viz.COLORS[5], "tail": "0.75"}
    fig = Figure(figsize=(10, 2.6))
    ax = fig.subplots()
    bs = view.block_size
    for i, s in enumerate(view.status):
        ax.barh(0, bs, left=i * bs, height=0.6, color=colors[s], edgecolor="white", lw=0.5)
    for name, a, b in view.spans:
        ax.axvline(a, color="k", lw=0.6, ymin=0.15, ymax=0.85)
        ax.text((a + b) / 2, 0.42, name.replace("tool ", "").replace("history ", "h"), rotation=60, fontsize=6,
                ha="left", va="bottom")
    ax.set(xlim=(0, max(view.num_tokens, 1)), ylim=(-0.5, 1.4), yticks=[], xlabel="prompt token")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items()], fontsize=7, loc="lower right", ncol=3)
    ax.set_title(f"{view.hit_tokens} of {view.num_tokens} tokens reused; {view.recomputed_tokens} recomputed "
                 f"(block {bs})", fontsize=9)
    fig.tight_layout()
    return _png(fig)


# -- what does the router read ------------------------------------------------------------------

def router_reads_explorer(session: explore.ReadsSession, question: str, scorers=("minmax", "mean", "recency"),
                          token_budget: int = 128, save=None) -> Explorer:
    """The real model's answers, dense and routed, with each router's blocks highlighted in the document."""
    import ipywidgets as w
    L = session.engine.store.config.num_layers
    c = {"question": w.Text(value=question, description="question", continuous_update=False,
                            layout=w.Layout(width="50em")),
         "token_budget": w.Dropdown(options=sorted({32, 64, 128, 256, token_budget}), value=token_budget,
                                    description="budget"),
         "layer": w.Dropdown(options=[("all layers", -1)] + [(f"layer {i}", i) for i in range(L)], value=-1,
                             description="layer")}

    def render(v):
        routers = {s: Router(s, token_budget=v["token_budget"]) for s in scorers}
        view = session.view(v["question"], routers, None if v["layer"] < 0 else v["layer"])
        return _reads_html(view), None, view

    return _wire(c, render, False, save)


def _reads_html(view: explore.ReadsView) -> str:
    rows = []
    for name, answer in view.answers.items():
        w = view.weights[name]
        spans = "".join(f'<span style="background: rgba(0,114,178,{0.08 + 0.6 * x:.2f})">{html.escape(t)}</span>'
                        for t, x in zip(view.block_texts, w))
        share = f"{(w > 0).mean():.0%} of blocks read" if name != "dense" else "every block read"
        rows.append(f"<details{' open' if name != 'dense' else ''}><summary><b>{html.escape(name)}</b>: "
                    f"<code>{html.escape(answer)}</code> ({share})</summary>"
                    f'<div style="font-size: 11px; white-space: pre-wrap; max-height: 14em; overflow: auto">{spans}</div>'
                    f"</details>")
    where = "all layers" if view.layer is None else f"layer {view.layer}"
    return f"<div>answers, and the blocks each router read at the first answer step ({where}):</div>" + "".join(rows)


# -- a finished sweep ---------------------------------------------------------------------------

def sweep_explorer(out, metric: str | None = None, x: str | None = None, by: str | None = None,
                   save=None) -> Explorer:
    """Open the sweep in folder `out` (or a `sweep.load` table): choose a metric, the parameter on the x axis and
    one to draw a line per value of; the readout tabulates what the figure draws (mean, n cells, interval).

    Only parameters that vary across the sweep's cells are offered. Raises FileNotFoundError for a folder with no
    finished cell, ValueError for a metric or parameter the sweep lacks."""
    import ipywidgets as w

    from . import sweep as sw
    df = out if not isinstance(out, (str, Path)) else None
    if df is None:
        if not (Path(out) / "cells").is_dir():
            raise FileNotFoundError(f"out: {out} holds no sweep (no cells/ folder); run `python -m sparsekv sweep "
                                    f"NOTEBOOK --grid GRID.yaml --out {out}` first")
        df = sw.load(out)
    ok = df[df["status"] == "ok"] if len(df) else df
    if ok.empty:
        raise FileNotFoundError(f"out: the sweep in {out} has no finished cell")
    metrics = sorted(m for m in ok["metric"].dropna().unique() if not m.endswith(sw.INTERVAL))
    varying = [c for c in sw.parameters(df) if ok[c].nunique(dropna=False) > 1]
    if not varying:
        raise ValueError(f"the sweep in {out} varies no parameter: nothing to plot against")
    metric = metric or metrics[0]
    x = x or varying[0]
    by = by if by is not None else (next((c for c in varying if c != x), None))
    for name, value, allowed in (("metric", metric, metrics), ("x", x, varying), ("by", by, varying + [None])):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    c = {"metric": w.Dropdown(options=metrics, value=metric, description="metric", layout=w.Layout(width="40em")),
         "x": w.Dropdown(options=varying, value=x, description="x"),
         "by": w.Dropdown(options=[("(none)", None)] + [(v, v) for v in varying], value=by, description="lines by")}

    def render(v):
        by_ = v["by"] if v["by"] != v["x"] else None
        table = sw.summarize(df, v["metric"], v["x"], by_)
        return _sweep_html(table, v["metric"]), _sweep_figure(df, v["metric"], v["x"], by_), table

    return _wire(c, render, True, save)


def _sweep_figure(df, metric: str, x: str, by: str | None) -> bytes:
    from matplotlib.figure import Figure

    from . import sweep as sw
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    sw.plot(df, metric, x, by, ax=ax)
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _sweep_html(table, metric: str) -> str:
    cols = [c for c in table.columns if c not in ("interval",)]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{v:.4g}</td>" if isinstance(v, float) else f"<td>{html.escape(str(v))}</td>"
                                    for v in row) + "</tr>" for row in table[cols].itertuples(index=False))
    return (f"<div><b>{html.escape(metric)}</b> over {int(table['n'].sum())} finished cells "
            f"(interval: {html.escape(', '.join(sorted(set(table['interval']))))})</div>"
            f'<table style="font-size: 11px">{head and "<tr>" + head + "</tr>"}{body}</table>')
