"""Notebook 03's findings (`notebooks/03_lost_detail_probes.ipynb`): what mean pooling loses, and each router's
breaking point against a real needle's strength."""
from .finding import Finding, versus

N03 = "03_lost_detail_probes"

FINDINGS = (
    Finding("**Mean pooling loses detail (synthetic probes).** One key moves its block mean by only 1/block_size of its "
            "logit: `mean` found the washout needle in {mw:.0%} of probes (`minmax` {xw:.0%}), and with a 512-token "
            "budget its needle recall falls from {m2:.0%} at 2k tokens to {m128:.0%} at 128k; `minmax` found "
            "{x512:.0%} of the needles at every depth and length.",
            {"mw": (N03, "mean.washout_recall"), "xw": (N03, "minmax.washout_recall"),
             "m2": (N03, "mean@512.needle_recall@2048"), "m128": (N03, "mean@512.needle_recall@131072"),
             "x512": (N03, "minmax@512.needle_recall")}),
    Finding("**Every router has a breaking point, and real needles sit {near}.** In the synthetic sweep (notebook 03) "
            "`minmax` keeps 90% needle recall from a needle {m8:.0f} background standard deviations strong on 8 of 128 "
            "channels and from {m32:.0f} on 32 channels; `mean` needs {e8} on 8 channels. On the real model a "
            "passkey needle in its retrieval heads (the top 5% of heads) sits {rs:.1f} standard deviations above the "
            "background on {rc:.0f} effective channels: a weaker, wider needle than the probes that made `minmax` "
            "look perfect.",
            {"m8": (N03, "break.minmax.ch8"), "m32": (N03, "break.minmax.ch32"),
             "e8": lambda m: (f"{m[N03]['break.mean.ch8']:.0f}" if m[N03]["break.mean.ch8"] > 0
                              else "more than the sweep's strongest (16)"),
             "rs": (N03, "real.top5.strength"), "rc": (N03, "real.top5.channels"),
             "near": lambda m: versus(m[N03]["real.top5.strength"], m[N03]["break.minmax.ch8"],
                                       "below it", "near it", "above it")}),
)
