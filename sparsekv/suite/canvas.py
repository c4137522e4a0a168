"""The one path every committed figure is saved by (`save`), and the checks it enforces (`problems`).

    save        lay the figure out, move a legend off the data, grow the canvas until every text fits, check, write
    problems    what is wrong with a drawn figure: text past the canvas, a legend over data or text, a tab10 colour

A figure is checked as drawn, in display (pixel) coordinates, never by trusting `bbox_inches="tight"`:

1. Every visible, non-empty text artist (titles, suptitles, axis labels, tick labels, legend entries and titles,
   annotations) has a window extent inside the figure's canvas (wrapped text measured as wrapped).
2. No legend covers plotted data: no point of a data line (its vertices, and points along its segments), a scatter's
   offsets, an error bar's segments or a bar's rectangle lies inside a legend's window extent. Reference lines drawn
   across the axes (`axhline`, `axvline`) and images are not data here: a legend may sit on a heatmap's colour bar
   side or over a goal line.
3. No legend covers another text: an axis label, a tick label, a title (a legend placed below its axes sits under
   the x axis's labels: `viz.legend_below` marks it and `save` anchors it there once the labels are measured).
4. No artist is drawn in one of matplotlib's default tab10 colours (its red and green are the pair a deuteranope
   cannot tell apart): figures use the project's palette (`viz.COLORS`, `viz.ROUTER_COLORS`) or greys.

matplotlib is imported inside each function, so importing sparsekv does not need it.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

TAB10 = frozenset({"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf"})
TOLERANCE_PX = 1.0          # a text may touch the canvas's edge (anti-aliasing rounds its extent outward)
PAD_IN = 0.08               # inches of margin left around text when the canvas grows to hold it
SEGMENT_SAMPLES = 16        # points sampled along each drawn segment of a data line when testing a legend's overlap


class FigureError(ValueError):
    """A figure that `save` could not make pass `problems`."""


class Problem(NamedTuple):
    kind: str               # "text outside", "legend over data", "legend over text" or "default colour"
    what: str               # the artist: its text, or the legend's first label, or the colour


class Saved(NamedTuple):
    path: Path
    moved_legends: int      # axes legends `save` moved off the data, to the right of their axes
    grown_in: tuple         # (width, height) inches the canvas grew by so that every text fits


# -- measuring ---------------------------------------------------------------------------------------

def _renderer(fig):
    """The renderer the texts are measured with, after a draw with rasterising disabled: layout engines, wrapping,
    tick updates and legend placement run as in a full draw, at a fraction of its cost (a save measures several
    times; pixels are drawn once, by savefig)."""
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def _texts(fig):
    """Every visible, non-empty Text the figure draws: figure and axes texts, titles, labels, legends, and the tick
    labels matplotlib draws (those of ticks inside the view limits; it keeps the others but leaves them undrawn)."""
    from matplotlib.text import Text
    tick_labels, drawn = set(), []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                tick_labels |= {id(tick.label1), id(tick.label2)}
            if ax.get_visible() and axis.get_visible():
                drawn += [lab for tick in axis._update_ticks() for lab in (tick.label1, tick.label2)
                          if lab.get_visible() and lab.get_text().strip()]
    out = []
    for t in fig.findobj(Text):
        ax = t.axes
        if id(t) in tick_labels or not t.get_visible() or not t.get_text().strip():
            continue
        if ax is not None and not ax.get_visible():
            continue
        out.append(t)
    return out + drawn


def text_extent(t, renderer):
    """A text's window extent as drawn: a wrapped text measured with its wrapped lines."""
    if t.get_wrap():
        with t._cm_set(text=t._get_wrapped_text()):       # what Text.draw does before measuring
            return t.get_window_extent(renderer)
    return t.get_window_extent(renderer)


def texts_outside(fig, renderer=None) -> list[Problem]:
    """Invariant 1: the texts whose extent leaves the canvas."""
    import numpy as np
    renderer = renderer or _renderer(fig)
    W, H = fig.bbox.width, fig.bbox.height
    out = []
    for t in _texts(fig):
        bb = text_extent(t, renderer)
        if not np.all(np.isfinite([bb.x0, bb.y0, bb.x1, bb.y1])):
            continue
        if bb.x0 < -TOLERANCE_PX or bb.y0 < -TOLERANCE_PX or bb.x1 > W + TOLERANCE_PX or bb.y1 > H + TOLERANCE_PX:
            out.append(Problem("text outside", t.get_text()[:80]))
    return out


def _data_points(ax):
    """Display coordinates of what `ax` plots as data (invariant 2's list), as an (N, 2) array."""
    import numpy as np
    from matplotlib.collections import LineCollection, PathCollection, PolyCollection
    from matplotlib.patches import Rectangle
    pts = []

    def along(xy):                                      # vertices, and points along each segment between them
        xy = xy[np.all(np.isfinite(xy), axis=1)]
        if len(xy) > 1:
            t = np.linspace(0, 1, SEGMENT_SAMPLES)[:, None, None]
            pts.append((xy[:-1] + t * (xy[1:] - xy[:-1])).reshape(-1, 2))
        pts.append(xy)

    for line in ax.get_lines():
        if not line.get_visible() or not line.get_transform().contains_branch(ax.transData):
            continue                                    # axhline / axvline (axes-blended): a reference, not data
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        if line.get_linestyle() in ("None", "none", "", " "):
            pts.append(xy[np.all(np.isfinite(xy), axis=1)])
        else:
            along(xy)
    for c in ax.collections:
        if not c.get_visible():
            continue
        if isinstance(c, PathCollection):               # scatter
            off = c.get_offset_transform().transform(np.asarray(c.get_offsets(), dtype=float))
            pts.append(off[np.all(np.isfinite(off), axis=1)])
        elif isinstance(c, LineCollection):             # error bars
            for seg in c.get_segments():
                along(c.get_transform().transform(np.asarray(seg, dtype=float)))
        elif isinstance(c, PolyCollection):             # fill_between: its outline
            for p in c.get_paths():
                along(c.get_transform().transform(p.vertices))
    rects = []
    for p in ax.patches:
        if isinstance(p, Rectangle) and p.get_visible() and p.get_transform() == ax.transData:
            rects.append(p.get_window_extent())
    return (np.concatenate(pts) if pts else np.zeros((0, 2))), rects


def _legends(fig):
    out = [(ax, ax.get_legend()) for ax in fig.axes if ax.get_legend() is not None]
    return out + [(None, leg) for leg in fig.legends]


def _label(leg) -> str:
    texts = [t.get_text() for t in leg.get_texts()]
    return texts[0] if texts else (leg.get_title().get_text() or "legend")


def legend_covers_data(leg, fig, renderer) -> bool:
    import numpy as np
    bb = leg.get_window_extent(renderer)
    for ax in fig.axes:
        pts, rects = _data_points(ax)
        if len(pts) and np.any((pts[:, 0] > bb.x0) & (pts[:, 0] < bb.x1) & (pts[:, 1] > bb.y0) & (pts[:, 1] < bb.y1)):
            return True
        if any(r.overlaps(bb) and r.width > 0 and r.height > 0 for r in rects):
            return True
    return False


def legends_over_data(fig, renderer=None) -> list[Problem]:
    """Invariant 2: the legends that cover a plotted point, segment or bar of any axes in the figure."""
    renderer = renderer or _renderer(fig)
    return [Problem("legend over data", _label(leg)) for _, leg in _legends(fig)
            if leg.get_visible() and legend_covers_data(leg, fig, renderer)]


def legends_over_text(fig, renderer=None) -> list[Problem]:
    """Invariant 3: the legends whose extent overlaps a text that is not their own (labels, tick labels, titles)."""
    renderer = renderer or _renderer(fig)
    out = []
    texts = _texts(fig)
    for _, leg in _legends(fig):
        if not leg.get_visible():
            continue
        own = {id(t) for t in leg.findobj(lambda a: True)}
        bb = leg.get_window_extent(renderer)
        hit = next((t for t in texts if id(t) not in own and text_extent(t, renderer).overlaps(bb)), None)
        if hit is not None:
            out.append(Problem("legend over text", f"{_label(leg)} / {hit.get_text()[:40]}"))
    return out


def default_colours(fig) -> list[Problem]:
    """Invariant 4: the tab10 colours drawn in the figure (lines, markers, collections, patches)."""
    from matplotlib.collections import Collection
    from matplotlib.colors import to_hex
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    seen = set()
    for a in fig.findobj(lambda a: isinstance(a, (Line2D, Collection, Patch))):
        if not a.get_visible() or a.figure is not fig:
            continue
        if isinstance(a, Line2D):                       # only the paint a line draws: an error bar's cap is a
            cs = []                                     # "_" marker whose unused line colour is C0
            if a.get_linestyle() not in ("None", "none", "", " "):
                cs.append(a.get_color())
            if a.get_marker() not in (None, "None", "none", "", " "):
                cs.append(a.get_markeredgecolor())
                if a._marker.is_filled() and a.get_fillstyle() != "none":
                    cs.append(a.get_markerfacecolor())
        elif isinstance(a, Collection):
            cs = [*a.get_facecolors(), *a.get_edgecolors()]
        else:
            cs = [a.get_facecolor(), a.get_edgecolor()]
        for c in cs:
            try:
                seen.add(to_hex(c, keep_alpha=False))
            except ValueError:
                continue                                # "none", "auto"
    return [Problem("default colour", c) for c in sorted(seen & TAB10)]


def problems(fig) -> list[Problem]:
    """Every violation of invariants 1-4 in `fig` as drawn now."""
    r = _renderer(fig)
    return texts_outside(fig, r) + legends_over_data(fig, r) + legends_over_text(fig, r) + default_colours(fig)


# -- fixing --------------------------------------------------------------------------------------------

def _layout(fig) -> None:
    """A layout pass: the figure's own engine if it has one (constrained layout), else `tight_layout`, which in
    matplotlib 3.11 makes room for a suptitle and for legends attached to axes."""
    import warnings
    if fig.get_layout_engine() is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)        # "not compatible with tight_layout": grown below
            fig.tight_layout()
    _renderer(fig)


BELOW = "_sparsekv_below"      # the attribute `viz.legend_below` sets on a legend: anchor it under the x axis


def _place_below(fig) -> None:
    """Anchor each legend marked by `viz.legend_below` just under its axes' x axis (tick labels and label), as drawn:
    a fixed offset in axes fraction lands on the x label of a short panel."""
    r = _renderer(fig)
    for ax, leg in _legends(fig):
        if ax is None or not getattr(leg, BELOW, False):
            continue
        xb = ax.xaxis.get_tightbbox(r)
        y = ax.transAxes.inverted().transform((0, (xb.y0 if xb is not None else ax.bbox.y0) - 4))[1]
        leg.set_loc("upper center")
        leg.set_bbox_to_anchor((0.5, y), transform=ax.transAxes)


def _move_legends_off_data(fig) -> int:
    """Each axes legend over data goes under its axes (as `viz.legend_below` puts it): beside them, in a row of
    panels, it lands on the next panel's tick labels."""
    r = _renderer(fig)
    moved = 0
    for ax, leg in _legends(fig):
        if ax is not None and leg.get_visible() and legend_covers_data(leg, fig, r):
            leg.set_loc("upper center")
            leg.set_bbox_to_anchor((0.5, -0.18), transform=ax.transAxes)
            setattr(leg, BELOW, True)
            moved += 1
    return moved


def _overhang(fig) -> tuple:
    """Inches by which the texts overhang the canvas (left, bottom, right, top), each with `PAD_IN` of margin; zeros
    where nothing does."""
    import numpy as np
    r = _renderer(fig)
    boxes = [b for b in (text_extent(t, r) for t in _texts(fig)) if np.all(np.isfinite([b.x0, b.y0, b.x1, b.y1]))]
    if not boxes:
        return (0.0, 0.0, 0.0, 0.0)
    dpi, (W, H), tol = fig.dpi, fig.get_size_inches(), TOLERANCE_PX / fig.dpi
    x0, y0 = min(b.x0 for b in boxes) / dpi, min(b.y0 for b in boxes) / dpi
    x1, y1 = max(b.x1 for b in boxes) / dpi, max(b.y1 for b in boxes) / dpi
    return (PAD_IN - x0 if x0 < -tol else 0.0, PAD_IN - y0 if y0 < -tol else 0.0,
            x1 - W + PAD_IN if x1 > W + tol else 0.0, y1 - H + PAD_IN if y1 > H + tol else 0.0)


def _refit(fig, over: tuple) -> None:
    """The last resort when a layout pass cannot place every text inside a larger canvas (a text wider than any
    panel): grow the canvas by `over` around what is drawn, keeping every artist's size and its place relative to
    the others (axes, figure texts and figure legends re-placed in the new figure fraction), with no layout after."""
    left, bottom, right, top = over
    W, H = fig.get_size_inches()
    W2, H2 = W + left + right, H + bottom + top

    def refit(x, y):                                    # a point in the old figure fraction, in the new one
        return (x * W + left) / W2, (y * H + bottom) / H2

    fig.set_layout_engine("none")                       # the positions below are final
    for ax in fig.axes:
        p = ax.get_position(original=True)
        (a, b), (c, d) = refit(p.x0, p.y0), refit(p.x1, p.y1)
        ax.set_position([a, b, c - a, d - b], which="both")
    for t in fig.texts:                                 # fig.text's, suptitle and supxlabel among them
        if t.get_transform() == fig.transFigure:
            t.set_position(refit(*t.get_position()))
    for leg in fig.legends:
        anchor = leg.get_bbox_to_anchor()
        if anchor is not None:
            bb = anchor.transformed(fig.transFigure.inverted())
            (a, b), (c, d) = refit(bb.x0, bb.y0), refit(bb.x1, bb.y1)
            leg.set_bbox_to_anchor((a, b, c - a, d - b), transform=fig.transFigure)
    fig.set_size_inches(W2, H2)


def _fit_canvas(fig, tries: int = 3) -> tuple:
    """Grow the canvas by what the texts overhang and lay the figure out again, until every text fits (a wider
    canvas gives a suptitle or an outside legend its room); after `tries`, `_refit`. Returns the inches grown."""
    W0, H0 = fig.get_size_inches()
    for _ in range(tries):
        over = _overhang(fig)
        if not any(over):
            break
        W, H = fig.get_size_inches()
        fig.set_size_inches(W + over[0] + over[2], H + over[1] + over[3])
        _layout(fig)
        _place_below(fig)
    else:
        over = _overhang(fig)
        if any(over):
            _refit(fig, over)
    W, H = fig.get_size_inches()
    return (round(float(W - W0), 3), round(float(H - H0), 3))


def save(fig, path, dpi: int = 110, **savefig_kw) -> Saved:
    """Lay `fig` out, move any axes legend that covers data to the right of its axes, grow the canvas until every
    text lies inside it, check invariants 1-4 (`problems`) and write `path`. Raises `FigureError` naming what is
    still wrong rather than writing a figure with clipped text, a legend over data or a tab10 colour."""
    path = Path(path)
    _layout(fig)
    moved = _move_legends_off_data(fig)
    for _ in range(2):                                  # the layout moves the axes; the anchor follows them
        _place_below(fig)
        _layout(fig)
    grown = _fit_canvas(fig)
    _place_below(fig)
    left = problems(fig)
    if left:
        raise FigureError(f"{path.name}: " + "; ".join(f"{p.kind}: {p.what!r}" for p in left))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, **savefig_kw)
    return Saved(path, moved, grown)


__all__ = ["FigureError", "Problem", "Saved", "problems", "texts_outside", "legends_over_data", "legends_over_text",
           "default_colours",
           "text_extent", "save"]
