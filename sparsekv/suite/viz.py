"""What the notebooks' figures share: the palette and markers, tick and legend helpers, the store's pictures, and
`save`, the one path a committed figure is written by (`suite.canvas` lays it out and checks it).

matplotlib is imported inside each function, so importing sparsekv does not need it.
"""
from __future__ import annotations

from ..storage.store import BlockStore, Sequence


def plot_block_tables(store: BlockStore, seqs: dict[str, Sequence], ax_tables=None, ax_pool=None):
    """Left: each sequence's block table (logical -> physical id). Right: the physical pool
    coloured by ref count, so shared blocks (ref count > 1) stand out; a legend names each
    colour, and cells past the pool's last block are left blank. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    if ax_tables is None or ax_pool is None:
        fig, (ax_tables, ax_pool) = plt.subplots(1, 2, figsize=(12, 0.6 * len(seqs) + 2.5),
                                                 gridspec_kw={"width_ratios": [3, 2]})
    fig = ax_tables.figure
    refs = store.pool.ref_counts
    colours = ["#eeeeee", "#9ecae1", "#fd8d3c", "#e6550d", "#a63603"]     # sequential: more sharing, darker
    cmap = ListedColormap(colours)
    cmap.set_bad("white")
    width = max(s.num_blocks for s in seqs.values())
    grid = np.full((len(seqs), width), np.nan)
    for r, (name, s) in enumerate(seqs.items()):
        for j, b in enumerate(s.block_ids):
            grid[r, j] = min(refs[b], 4)
            ax_tables.text(j, r, str(b), ha="center", va="center", fontsize=8)
    ax_tables.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-0.5, vmax=4.5, aspect="auto")
    ax_tables.set_yticks(range(len(seqs)), list(seqs))
    step = max(1, width // 16)
    ax_tables.set_xticks(range(0, width, step))                          # whole blocks only
    ax_tables.set_xlabel("logical block (text: physical block id)")
    ax_tables.set_title("block tables")
    side = int(np.ceil(np.sqrt(store.config.num_blocks)))
    pool = np.full(side * side, np.nan)                                  # cells past the pool stay blank
    pool[: store.config.num_blocks] = [min(r, 4) for r in refs]
    ax_pool.imshow(np.ma.masked_invalid(pool.reshape(side, side)), cmap=cmap, vmin=-0.5, vmax=4.5)
    ax_pool.set_title(f"physical pool ({side} per row): {store.num_free_blocks}/{store.config.num_blocks} free")
    ax_pool.set_xticks([]), ax_pool.set_yticks([])
    labels = ["free (ref 0)", "ref 1", "ref 2 (shared)", "ref 3", "ref 4+"]
    ax_pool.legend(handles=[Patch(facecolor=c, edgecolor="k", label=l) for c, l in zip(colours, labels)],
                   title="ref count", loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    fig.tight_layout()
    return fig


# Okabe-Ito: a colour-blind-safe palette. Routers keep one colour across every notebook; query-blind
# routers are dashed, so colour and line style both separate them. Dense is the reference, drawn dark grey
# (and dashed where it is a line), so it never shares a hue with a router: its old vermillion sat beside
# mean's orange for deuteranopes.
COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
# Okabe-Ito: each router its own colour, HQQ's sky blue left to quantisation; `hminmax` (hierarchical min/max bounds)
# shares minmax's, as a variant of it
ROUTER_COLORS = {"minmax": "#0072B2", "mean": "#E69F00", "repr": "#009E73", "oracle": "#000000",
                 "recency": "#CC79A7", "random": "#999999", "dense": "#555555", "halves": "#D55E00",
                 "labels": "#F0E442", "hminmax": "#0072B2"}
# A marker per router, so that routers whose hues sit close (mean's orange and halves' vermillion, for a deuteranope)
# still differ where they share a panel; hminmax is minmax's variant and shares its marker too.
ROUTER_MARKERS = {"minmax": "o", "mean": "s", "repr": "D", "oracle": "*", "recency": "v", "random": "x",
                  "dense": "P", "halves": "^", "labels": "<", "hminmax": "o"}
QUERY_BLIND = ("recency", "random")
OTHER = "#8c8c8c"                   # anything without a colour of its own (never a router's)
SEQUENTIAL_CMAP = "cividis"         # heatmaps: perceptually uniform and readable with any colour vision
QUANT_COLOR = "#56B4E9"             # HQQ quantisation (sky blue: no router's colour)


def router_color(name: str) -> str:
    """The colour of a router (or "scorer@budget" method) by its scorer's family (`Scorer.family`, `ROUTER_COLORS`):
    the parametrised names of a family ("hminmax-g64-k4", `routing.hierarchy.hierarchical(64, 4).name`) share its
    colour; a scorer registered later without one is drawn in `OTHER`, which no named router or HQQ uses."""
    from ..routing.scorers import make_scorer
    scorer = name.split("@")[0].split(" ")[0]
    try:
        family = type(make_scorer(scorer)).family()
    except ValueError:
        family = scorer
    return ROUTER_COLORS.get(family, OTHER)


def router_marker(name: str) -> str:
    """The marker of a router (or "scorer@budget" method) by its scorer's family, "o" for one without its own."""
    from ..routing.scorers import make_scorer
    scorer = name.split("@")[0].split(" ")[0]
    try:
        family = type(make_scorer(scorer)).family()
    except ValueError:
        family = scorer
    return ROUTER_MARKERS.get(family, "o")


def router_style(name: str) -> str:
    """Line style: solid for query-aware routers, dashed for query-blind ones."""
    return "--" if name.split("@")[0] in QUERY_BLIND else "-"


def interval_err(values, intervals):
    """Error-bar lengths [2, n] for `values` and their (low, high) intervals, clamped at 0
    (rounding can put a value a hair outside its own interval)."""
    import numpy as np
    v = np.asarray(values, dtype=float)
    lo, hi = (np.asarray(x, dtype=float) for x in zip(*intervals))
    return np.vstack([np.maximum(v - lo, 0), np.maximum(hi - v, 0)])


def annotate_heatmap(ax, im, grid, fmt: str = "{:.3f}", fontsize: int = 8) -> None:
    """Write each cell's value in black or white, whichever contrasts with the cell's colour."""
    import numpy as np
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if not np.isfinite(grid[i, j]):
                continue
            r, g, b, _ = im.cmap(im.norm(grid[i, j]))
            light = 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5          # relative luminance
            ax.text(j, i, fmt.format(grid[i, j]), ha="center", va="center", fontsize=fontsize,
                    color="black" if light else "white")


PRESS_MARKERS = {"StreamingLLM": "v", "SnapKV": "^", "SnapKV+q1": "X", "TOVA": "<", "Knorm": ">",
                 "ExpectedAttention": "p"}


QUANT_MARKERS = {"8": "D", "4": "v", "2": "X"}


def method_style(family: str) -> dict:
    """Matplotlib style of a notebook-09 method family: routers in their own colours (solid; dashed over
    int8 K/V), kvpress presses in grey with one marker each (dotted), HQQ quantisation in sky blue (one
    marker per bit width: "HQQ8", "HQQ4", "HQQ2"), dense in the dense colour."""
    if family.startswith("int8 "):
        return {"color": router_color(family.removeprefix("int8 ")), "marker": "s", "ls": "--"}
    if family.endswith(" qdense"):       # Quest's protocol: the question dense, only answer steps routed
        return {"color": router_color(family.removesuffix(" qdense")), "marker": "^", "ls": "-."}
    from ..routing.scorers import SCORERS
    if family in SCORERS or family in ROUTER_COLORS:      # every registered scorer, `halves` among them, and dense
        return {"color": router_color(family), "marker": router_marker(family), "ls": "-"}
    if family in PRESS_MARKERS:
        return {"color": "#777777", "marker": PRESS_MARKERS[family], "ls": ":" if family != "SnapKV+q1" else "-."}
    if family.startswith("HQQ"):           # "HQQ", or "HQQ<bits>": one marker per bit width
        return {"color": QUANT_COLOR, "marker": QUANT_MARKERS.get(family.removeprefix("HQQ"), "D"), "ls": "-"}
    return {"color": ROUTER_COLORS["dense"], "marker": "h", "ls": "none"}


def tick_label(v: float) -> str:
    """A tick's text: 512, 4k, 128k, 1M, 0.05 (never 1e+06 or 3x10^1). A power-of-two count of tokens reads in binary
    units as the notebooks write lengths (16384 is "16k", 2**20 is "1M"); a round decimal in decimal ones (50000 is
    "50k"); anything else keeps three significant digits ("1.05M"), never an exponent."""
    a = abs(v)
    if a >= 1024 and a % 1024 == 0 and a % 1000 != 0:
        return f"{v / 2**20:g}M" if a >= 2**20 and a % 2**20 == 0 else f"{v / 1024:g}k"
    if a >= 1e6 and a % 1e5 == 0:
        return f"{v / 1e6:g}M"
    if a >= 1e4 and a % 100 == 0:
        return f"{v / 1e3:g}k"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if 0 < a < 1e-3:
        return f"{v:.1e}".replace("e-0", "e-")      # a small rate: still no offset text
    return f"{v:g}"


def bytes_label(v: float) -> str:
    """Bytes in binary units: 512 B, 4 KiB, 1.5 MiB, 2 GiB (never 1.04858e+06)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} B"


def bytes_axis(ax, axis: str = "y") -> None:
    """Label an axis that holds bytes in KiB / MiB / GiB (`bytes_label`) on its existing ticks."""
    from matplotlib.ticker import FuncFormatter
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(FuncFormatter(lambda v, _: bytes_label(v)))


def save(fig, path, dpi: int = 110, **kw):
    """Write a committed figure: a layout pass, any axes legend over data moved beside its axes, the canvas grown
    until every text fits, then the checks of `suite.canvas` (text inside the canvas, no legend over data, no tab10
    colour, no legend over text), raising `canvas.FigureError` rather than writing a figure that fails them. Returns `canvas.Saved`."""
    from . import canvas
    return canvas.save(fig, path, dpi=dpi, **kw)


def log_axis_plain(ax, axis: str = "x") -> None:
    """Plain numbers on a log axis (1, 2, 5, 10, ...; 4k, 1M), without the overlapping minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda v, _: tick_label(v)))
    a.set_minor_locator(NullLocator())
    a.set_minor_formatter(NullFormatter())


def log_ticks(ax, axis: str, ticks, labels=None) -> None:
    """Ticks exactly at `ticks` (the values measured) on a log axis, labelled by `tick_label` or `labels`,
    with no minor ticks or labels (which is what garbles a log axis with set_xticks alone)."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter, NullLocator
    a = ax.xaxis if axis == "x" else ax.yaxis
    ticks = list(ticks)
    a.set_major_locator(FixedLocator(ticks))
    a.set_major_formatter(FixedFormatter(list(labels) if labels is not None else [tick_label(t) for t in ticks]))
    a.set_minor_locator(NullLocator())
    a.set_minor_formatter(NullFormatter())


def dodge_log(xs, factor: float = 1.04):
    """Positions on a log axis for points whose x values coincide: the j-th of m points sharing x is drawn at
    x * factor ** (j - (m - 1) / 2), so the group stays centred on its true value. Returns (positions, the shared x
    values): a figure that dodges must say so (a legend note) and may mark the true values."""
    groups: dict[float, list[int]] = {}
    for i, x in enumerate(xs):
        groups.setdefault(round(float(x), 6), []).append(i)
    pos = [float(x) for x in xs]
    for idx in groups.values():
        for j, i in enumerate(idx):
            pos[i] = float(xs[i]) * factor ** (j - (len(idx) - 1) / 2)
    return pos, sorted(float(xs[idx[0]]) for idx in groups.values() if len(idx) > 1)


def dodged(ax, xs: list[float], factor: float = 1.04) -> list[float]:
    """x positions for points drawn against bytes on a log axis: where several methods share a byte count (the
    presses, which hold what they read) they are dodged by `factor` each, centred on the true value (`dodge_log`),
    and a thin grey line marks that value; `dodge_note` says so in the legend. Tables and metrics give exact counts."""
    pos, shared = dodge_log(xs, factor)
    for x in shared:
        ax.axvline(x, color="0.8", lw=0.8, zorder=0)
    return pos


def dodge_note(factor: float = 1.04) -> str:
    """The legend's title for a panel drawn with `dodged`."""
    return (f"methods at one byte count are\ndodged by {factor - 1:.0%} each in x about it\n(thin grey line: "
            "the true value)")


def legend_outside(ax, **kw):
    """A legend to the right of the axes, clear of the data."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False,
                     **{"fontsize": 8, **kw})


def legend_below(ax, ncol: int = 3, **kw):
    """A legend under the axes (below the x label), clear of the data; `save` anchors it under the x axis's labels
    as drawn (`canvas.BELOW`)."""
    from . import canvas
    leg = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=ncol, frameon=False, **{"fontsize": 8, **kw})
    setattr(leg, canvas.BELOW, True)
    return leg
