"""The figures' save path (`suite.canvas`, `viz.save`) and the figures drawn through it: text inside the canvas, no
legend over data or text, the project's palette, labelled axes, plain ticks, disclosed dodges and honest titles.
Each check is shown failing on a figure made to break it, then holding on the suite's own drawing code."""
import json
import math

import pytest
from conftest import REPO

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sparsekv.suite import canvas, viz  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _kinds(fig) -> set[str]:
    return {p.kind for p in canvas.problems(fig)}


def _labelled_and_plain(fig):
    """Every axes that plots data names both its axes (a unit where the quantity has one is the drawing code's
    duty; here, at least a name) but a categorical x axis, whose tick labels are the names, and no tick label is in
    scientific notation (1.04858e+06, 1e+06)."""
    fig.canvas.draw()
    for ax in fig.axes:
        if not (ax.get_lines() or ax.collections or ax.patches) or ax.get_label() == "<colorbar>":
            continue
        shared_y = len(ax.get_shared_y_axes().get_siblings(ax)) > 1
        words = any(c.isalpha() for t in ax.get_xticklabels() for c in t.get_text().replace("k", "").replace("M", ""))
        assert ax.get_xlabel() or words, ax.get_title()
        assert ax.get_ylabel() or shared_y, ax.get_title()
        for t in ax.get_xticklabels() + ax.get_yticklabels():
            assert "e+" not in t.get_text() and "×10" not in t.get_text(), (ax.get_title(), t.get_text())


# -- the checks fail on broken figures ------------------------------------------------------------

def _title_past_the_canvas():
    """Invariant 1 broken: a suptitle and an outside legend wider than a 5-inch canvas, after a plain tight_layout."""
    fig, ax = plt.subplots(1, 2, figsize=(5, 3))
    for a in ax:
        a.plot([1, 2, 3], [3, 1, 2], color=viz.COLORS[0], label="a label long enough to leave a 5-inch canvas")
        a.set(xlabel="x (tokens)", ylabel="y (s)")
    viz.legend_outside(ax[1])
    fig.suptitle("a suptitle that states the finding in more words than five inches can hold")
    fig.tight_layout()
    return fig


def _legend_over_data():
    """Invariant 2 broken: a legend at "upper left" over a falling line's first points."""
    import numpy as np
    fig, ax = plt.subplots(figsize=(4, 3))
    x = np.linspace(0, 1, 40)
    ax.plot(x, 1 - x, color=viz.COLORS[1], label="falls")
    ax.plot(x, x, color=viz.COLORS[0], label="rises")
    ax.set(xlabel="x", ylabel="y")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def test_a_title_past_the_canvas_is_found_and_save_grows_the_canvas_to_hold_it(tmp_path):
    """Invariant 1: a suptitle wider than its figure and a legend placed right of the last axes both leave the
    canvas after a plain tight_layout (the old `fig.tight_layout(); fig.savefig(...)`); `save` grows the canvas."""
    fig = _title_past_the_canvas()
    assert "text outside" in _kinds(fig)                  # what the old save path wrote
    saved = viz.save(fig, tmp_path / "f.png")
    assert canvas.problems(fig) == [] and saved.grown_in[0] > 0


def test_a_legend_over_data_is_found_and_save_moves_it_beside_its_axes(tmp_path):
    """Invariant 2: a legend at "upper left" over a falling line covers its first points; `save` moves it below."""
    fig = _legend_over_data()
    assert _kinds(fig) == {"legend over data"}
    saved = viz.save(fig, tmp_path / "f.png")
    assert saved.moved_legends == 1 and canvas.problems(fig) == []


def test_a_legend_over_an_axis_label_and_a_tab10_colour_are_refused(tmp_path):
    """Invariants 3 and 4: a legend pinned at a fixed axes fraction under a short panel lands on its x label (the
    old `legend_below`), and a line in matplotlib's default blue; `save` raises rather than write either."""
    fig, ax = plt.subplots(figsize=(4, 1.6))
    ax.plot([1, 2], [1, 2], label="default colour")          # tab10's C0
    ax.set(xlabel="the x axis's label", ylabel="y")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    fig.tight_layout()
    assert _kinds(fig) >= {"legend over text", "default colour"}
    with pytest.raises(canvas.FigureError, match="default colour"):
        viz.save(fig, tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists()
    fig, ax = plt.subplots()                                  # an error bar's caps carry an undrawn C0: not counted
    ax.bar([0, 1], [0.5, 0.6], yerr=[0.1, 0.1], capsize=2, color=viz.COLORS[0])
    assert canvas.default_colours(fig) == []


def test_measuring_without_rasterising_finds_and_writes_what_a_full_draw_does(tmp_path, monkeypatch):
    """`canvas` measures texts after `draw_without_rendering` (a save measures several times). Against the full
    `canvas.draw()` it replaced, on figures that break invariants 1 and 2: the same problems before the save, the
    same moves and growth, and the same PNG bytes."""
    def full_draw(fig):
        fig.canvas.draw()
        return fig.canvas.get_renderer()

    for make in (_title_past_the_canvas, _legend_over_data):
        out = []
        for name, renderer in (("fast", canvas._renderer), ("full", full_draw)):
            monkeypatch.setattr(canvas, "_renderer", renderer)
            fig = make()
            found = sorted((p.kind, p.what) for p in canvas.problems(fig))
            saved = viz.save(fig, tmp_path / f"{make.__name__}_{name}.png")
            out.append((found, saved.moved_legends, saved.grown_in, (tmp_path / f"{make.__name__}_{name}.png")
                        .read_bytes()))
            plt.close(fig)
        assert out[0][0], f"{make.__name__}: the figure breaks no invariant, so it tests nothing"
        assert out[0] == out[1], make.__name__


def test_ticks_never_read_in_scientific_notation():
    """`tick_label` wrote 2**20 tokens as "1.04858e+06" (04_bytes_per_token, 11_gpu_scale); bytes read in binary
    units."""
    assert [viz.tick_label(v) for v in (512, 2048, 16384, 131072, 2**20, 2**21, 50000, 10**6, 1234567)] == \
        ["512", "2k", "16k", "128k", "1M", "2M", "50k", "1M", "1.23M"]
    assert all("e+" not in viz.tick_label(2.0 ** k) for k in range(0, 40))
    assert [viz.bytes_label(v) for v in (100, 4096, 1.5 * 2**20, 2**31)] == ["100 B", "4 KiB", "1.5 MiB", "2 GiB"]


def test_a_dodge_is_centred_on_the_true_value():
    """`dodge_log`: 3 methods at one byte count sit at x / 1.04, x, x * 1.04 (the group's middle is the value), and
    a method alone is not moved; the shared values are returned for the figure to mark."""
    pos, shared = viz.dodge_log([0.5, 0.25, 0.25, 0.25], 1.04)
    assert pos[0] == 0.5 and pos[1:] == pytest.approx([0.25 / 1.04, 0.25, 0.25 * 1.04]) and shared == [0.25]


def test_mean_and_halves_differ_in_marker_as_well_as_hue():
    assert viz.method_style("mean")["marker"] != viz.method_style("halves")["marker"]
    assert viz.router_marker("mean@256") == "s" and viz.router_marker("halves@256") == "^"


# -- the suite's figures pass ---------------------------------------------------------------------

def _study(ties: bool):
    """A hand-built paired study of 6 questions: minmax, halves and the presses; with `ties`, no non-oracle method
    answers any (the case whose title named a "best" picked among zeros)."""
    from sparsekv.studies import questions as qs
    from sparsekv.studies.paired import study as paired
    cfg = paired.StudyConfig("m.gguf", task_names=["passkey"], scorers=["minmax", "halves", "oracle"],
                             presses=["SnapKVPress", "TOVAPress"], bits=[2])
    st = paired.Study(cfg, "SmolLM2-135M", None, qs.lossless_methods(cfg.scorers, [256]),
                      qs.peer_methods(cfg.presses, [256], cfg.length, cfg.bits))
    k = {"dense": 5, "hf dense": 5, "oracle@256": 4, "minmax@256": 3, "halves@256": 2, "SnapKV@256": 1,
         "TOVA@256": 1, "hqq2": 0}
    if ties:
        k = {m: (v if m in ("dense", "hf dense", "oracle@256") else 0) for m, v in k.items()}
    from sparsekv.analysis import stats
    st.acc = {("passkey", m): {"accuracy": v / 6, "n": 6, "k": v, "lo": stats.wilson(v, 6)[0],
                               "hi": stats.wilson(v, 6)[1]} for m, v in k.items()}
    st.nbytes = {m: {"read": 1.0, "held": 1.0} for m in st.methods}
    st.nbytes.update({"minmax@256": {"read": 0.12, "held": 1.03}, "halves@256": {"read": 0.12, "held": 1.03},
                      "oracle@256": {"read": 0.1, "held": 1.0}, "SnapKV@256": {"read": 0.12, "held": 0.12},
                      "TOVA@256": {"read": 0.12, "held": 0.12}, "hqq2": {"read": 0.14, "held": 0.14}})
    st.agreement = {("passkey", m): {"kl": 0.1, "kl_lo": 0.05, "kl_hi": 0.2, "top1": 0.9, "top1_lo": 0.8,
                                     "top1_hi": 1.0, "n": 6} for m in st.methods}
    return st


@pytest.mark.parametrize("ties", [False, True], ids=["ranked", "all-zero"])
def test_the_paired_figures_pass_and_their_titles_name_no_best_among_ties(tmp_path, ties):
    """accuracy_figure's title said "best non-oracle method: passkey minmax@256" when every non-oracle method answered
    0 of 6 (notebook 21) and on 6 questions (notebook 20): it now states the count, the tie or that none answered."""
    from sparsekv.studies.paired import report as paired_report
    st = _study(ties)
    for draw in (paired_report.accuracy_figure, paired_report.bytes_figure, paired_report.agreement_figure):
        fig = draw(st, tmp_path / f"{draw.__name__}.png")       # raises FigureError on a failing figure
        assert canvas.problems(fig) == []
        _labelled_and_plain(fig)
    title = paired_report.accuracy_figure(st)._suptitle.get_text()
    assert "best" not in title and "of 6" in title
    assert ("no method but dense and the oracle answered any of 6" in title) is ties
    assert ties or "minmax@256 answered most, 3 of 6" in title


def test_a_bytes_figure_discloses_its_dodge(tmp_path):
    """The presses and routers share 0.12 of dense's bytes read: they are dodged about it, a grey line marks the
    true value, and the legend says so (the old 4% spread was undisclosed)."""
    from sparsekv.studies.paired import report as paired_report
    fig = paired_report.bytes_figure(_study(False), tmp_path / "b.png")
    leg = fig.axes[1].get_legend()
    assert "dodged by 4%" in leg.get_title().get_text()
    xs = sorted(float(line.get_xdata()[0]) for line in fig.axes[0].get_lines() if len(line.get_xdata()) == 1
                and line.get_linestyle() in ("None", "none"))
    assert 0.12 / 1.04 ** 1.5 == pytest.approx(min(x for x in xs if 0.105 < x < 0.13))


def test_the_benchmark_figures_redrawn_from_the_committed_results_pass(tmp_path, monkeypatch):
    """cpu_decode, summary_precision, gemma_speed and vs_llamacpp drawn from their committed JSON (as
    `benchmarks.report --figures` does): each saves through `viz.save` and passes every check."""
    from benchmarks import bench_cpu_decode, bench_gemma_speed, bench_summary_precision, bench_vs_llamacpp
    shown = []
    monkeypatch.setattr(plt, "close", lambda fig=None: shown.append(fig))
    bench_cpu_decode.plot(json.loads((RESULTS / "cpu_decode.json").read_text()), tmp_path / "c.png")
    d = json.loads((RESULTS / "summary_precision.json").read_text())
    bench_summary_precision.plot(d["real_rows"], d["probe_summary"], tmp_path / "s.png")
    bench_gemma_speed.plot(json.loads((RESULTS / "gemma_speed.json").read_text())["cases"], tmp_path / "g.png")
    bench_vs_llamacpp.plot(json.loads((RESULTS / "vs_llamacpp.json").read_text()), tmp_path / "v.png")
    assert len(shown) == 4
    for fig in shown:
        assert canvas.problems(fig) == []
        _labelled_and_plain(fig)


def test_an_invalid_peak_rss_is_missing_not_zero():
    """gemma_speed.json's sparsekv runs read a peak equal to the base (the VmHWM reset failed): 0 MiB was drawn."""
    from benchmarks.bench_gemma_speed import request_peak_mib
    c = {"sparsekv_peak_rss": 2**31, "sparsekv_base_rss": 2**31, "sparsekv_kv_held": 2**20}
    assert math.isnan(request_peak_mib(c, "sparsekv"))
    c["sparsekv_peak_rss"] += 3 * 2**20
    assert request_peak_mib(c, "sparsekv") == 3.0


def test_vs_llamacpp_joins_no_measured_points_with_lines(tmp_path, monkeypatch):
    """Lengths measured at 2 to 4 points: markers only, no line implying values between them (floors are models and
    stay dotted)."""
    from benchmarks import bench_vs_llamacpp
    shown = []
    monkeypatch.setattr(plt, "close", lambda fig=None: shown.append(fig))
    bench_vs_llamacpp.plot(json.loads((RESULTS / "vs_llamacpp.json").read_text()), tmp_path / "v.png")
    for ax in shown[0].axes:
        for line in ax.get_lines():
            assert line.get_marker() in ("None", "none", "") or line.get_linestyle() in ("None", "none"), \
                line.get_label()


def test_gemma_speed_draws_each_repeated_time_with_its_min_max_and_joins_no_points(tmp_path, monkeypatch):
    """A run with repeats (schema 2) draws each TTFT and TPOT at its median with a bar from the repeats' min to max;
    measured points stand alone (only the floors, a model, are lines)."""
    from benchmarks import bench_gemma_speed
    shown = []
    monkeypatch.setattr(plt, "close", lambda fig=None: shown.append(fig))
    cases = []
    for n, t in ((8192, 20.0), (16384, 50.0)):
        c = {"length": n, "prefill_floor_s": t / 2, "decode_floor_s": 0.04, "prefill_speedup": 2.0}
        for s, k in (("sparsekv", 1.0), ("transformers", 2.0)):
            c.update({f"{s}_ttft_s": k * t, f"{s}_ttft": {"median": k * t, "lo": k * t - 1, "hi": k * t + 3, "n": 3},
                      f"{s}_tpot_s": k * 0.1, f"{s}_tpot": {"median": k * 0.1, "lo": k * 0.09, "hi": k * 0.12, "n": 3},
                      f"{s}_kv_held": 2**26, f"{s}_peak_rss": 2**31 + 2**27, f"{s}_base_rss": 2**31})
        cases.append(c)
    bench_gemma_speed.plot(cases, tmp_path / "g.png")
    fig = shown[0]
    assert canvas.problems(fig) == []
    _labelled_and_plain(fig)
    assert fig._suptitle.get_text().endswith("prefill at 2.00x transformers' speed")   # the range, no decode run
    cases[1]["prefill_speedup"], cases[0]["decode_speedup"], cases[1]["decode_speedup"] = 0.87, 1.31, 1.12
    assert bench_gemma_speed._speed_finding(cases) == ("prefill at 0.87-2.00x transformers' speed; "
                                                       "dense decode at 1.12-1.31x transformers' speed")
    ttft = fig.axes[0]
    spans = sorted(tuple(sorted(seg[:, 1])) for coll in ttft.collections for seg in coll.get_segments())
    assert spans == [(19.0, 23.0), (39.0, 43.0), (49.0, 53.0), (99.0, 103.0)]
    tpot_spans = sorted(tuple(round(v, 6) for v in sorted(seg[:, 1])) for coll in fig.axes[1].collections
                        for seg in coll.get_segments())
    assert tpot_spans[0] == (90.0, 120.0)
    for ax in fig.axes:
        for line in ax.get_lines():
            assert line.get_linestyle() in ("None", "none") or line.get_marker() in ("None", "none", ""), \
                line.get_label()
