"""Notebook 04's findings (`notebooks/04_hbm_traffic.ipynb`): what routing costs, with notebook 01's shares, and
hierarchical routing at a million tokens."""
from __future__ import annotations

from ...core.traffic import roofline_bound
from .finding import Finding, Metrics
from .n01_dense_vs_sparse_baselines import N01

N04 = "04_hbm_traffic"


def _bound(m: Metrics) -> str:
    """Which roofline bound dense decode attention meets on this CPU (`core.traffic.roofline_bound`)."""
    word = roofline_bound(m[N04]["dense_intensity"], m[N04]["cpu_ridge_flop_per_byte"])
    return word + (": neither clearly memory- nor compute-bound, so both floors matter" if word == "at the ridge" else "")


FINDINGS = (
    Finding("**Routing is not free.** At block 64 and 128k tokens the min/max summaries are {bs:.0%} of a routed step's "
            "bytes and routing took {tf:.0%} of its time. At a million tokens the summaries are {sm:.0%} of the bytes "
            "(notebook 04). This CPU's ridge point is {ridge:.2f} flop/byte (measured), and dense decode attention runs "
            "at {inten:.2f} flop/byte (the byte model), so on this machine it is {bound}.",
            {"bs": (N01, "minmax.route_byte_share"), "tf": (N01, "minmax.route_fraction"),
             "sm": (N04, "summary_share_minmax@max"), "ridge": (N04, "cpu_ridge_flop_per_byte"),
             "inten": (N04, "dense_intensity"), "bound": _bound}),
    Finding("**Hierarchical routing (notebook 04).** At 1M tokens with a 2,048-token "
            "budget (block 64), flat `minmax` summaries are {flat:.0%} of a routed step's bytes; `hminmax-g64-k4` "
            "(coarse min/max bounds over groups of 64 blocks, fine ones only in the 4 groups of largest coarse mass) "
            "reads {h:.1%}, for {held:.1%} more summary bytes held. On 4-needle synthetic probes it {verdict} (loss "
            "{l32:.1f} points at 32k tokens, {l128:.1f} at 128k); refining 2 groups instead loses {k2:.0f} points at "
            "128k, because 4 needles sit in 4 groups.",
            {"flat": (N04, "hier.summary_share.minmax@1048576"), "h": (N04, "hier.summary_share.hminmax-g64-k4@1048576"),
             "held": lambda m: m[N04]["hier.summary_held_per_token.hminmax-g64-k4"]
             / m[N04]["hier.summary_held_per_token.minmax"] - 1,
             "verdict": lambda m: "keeps flat routing's mass recall within 1 point" if max(
                 m[N04][f"hier.recall_loss_pts.hminmax-g64-k4@{n}"] for n in (32768, 131072)) <= 1
             else "loses more than 1 point of flat routing's mass recall",
             "l32": (N04, "hier.recall_loss_pts.hminmax-g64-k4@32768"),
             "l128": (N04, "hier.recall_loss_pts.hminmax-g64-k4@131072"),
             "k2": (N04, "hier.recall_loss_pts.hminmax-g64-k2@131072")}),
)
