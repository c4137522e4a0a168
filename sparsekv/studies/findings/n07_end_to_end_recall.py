"""Notebook 07's finding (`notebooks/07_end_to_end_recall.ipynb`): end to end, with the recall models trained here."""
from .finding import Finding

N07 = "07_end_to_end_recall"

FINDINGS = (
    Finding("**End to end, with models trained here.** At 4,096 tokens MQAR's dense accuracy is {mq:.1%}; with a "
            "64-token budget `minmax` keeps {mq64:.0%} and representative keys {rq64:.0%}, and at 256 tokens "
            "`minmax` keeps {mq256:.0%} while the recency window keeps {rc256:.0%}. A linear-attention twin falls from "
            "{lin256:.0%} at 256 tokens to {lin4k:.0%} at 4,096.",
            {"mq": (N07, "mqar.dense@4096"), "mq64": (N07, "mqar.minmax@64.acc@4096"),
             "rq64": (N07, "mqar.repr@64.acc@4096"), "mq256": (N07, "mqar.minmax@256.acc@4096"),
             "rc256": (N07, "mqar.recency@256.acc@4096"), "lin256": (N07, "niah-linear.dense@256"),
             "lin4k": (N07, "niah-linear.dense@4096")}),
)
