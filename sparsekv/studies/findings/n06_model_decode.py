"""Notebook 06's finding (`notebooks/06_model_decode.ipynb`): a random-weight decoder on the store."""
from .finding import Finding

N06 = "06_model_decode"

FINDINGS = (
    Finding("**A random-weight decoder on the store.** With the `cpu-timing` model, routed decode runs {s64:.2f}x the "
            "speed of dense per token at 64k tokens, reading {b64:.0%} of its bytes; at 4k tokens it runs {s4:.2f}x{fixed}.",
            {"s64": (N06, "minmax.tpot_speedup@65536"), "b64": (N06, "minmax.bytes_ratio@65536"),
             "s4": (N06, "minmax.tpot_speedup@4096"),
             "fixed": lambda m: (" (slower than dense: routing's fixed costs outweigh the bytes it saves there)"
                                 if m[N06]["minmax.tpot_speedup@4096"] < 1 else "")}),
)
