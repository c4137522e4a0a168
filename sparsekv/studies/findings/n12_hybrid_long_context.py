"""Notebook 12's finding (`notebooks/12_hybrid_long_context.ipynb`): Gemma 3 270M, a hybrid model, with only its
global layers routed."""
from __future__ import annotations

from typing import Callable

from .finding import Finding, Metrics

N12 = "12_hybrid_long_context"


def _kept(stem: str, metric: str) -> Callable[[Metrics], str]:
    """A router's share of dense's answers, or why there is none (dense answered no prompt, so none is recorded)."""
    def word(m: Metrics) -> str:
        return f"{m[stem][metric]:.0%}" if metric in m.get(stem, {}) else "nothing (dense answered none)"
    return word


FINDINGS = (
    Finding("**Gemma 3 270M, a hybrid model (notebook 12, 2k to 8k tokens).** Its dense passkey accuracy is {p2:.0%} "
            "at 2k tokens and {p8:.0%} at 8k ({n:.0f} prompts per length), the secret word in real prose {q2:.0%} and "
            "{q8:.0%}. Routing only its 3 global layers at 8k tokens keeps, of dense's passkey answers, {o:} for the "
            "oracle, {mm:} for `minmax` and {lb:} for `labels` at a 2,048-token budget, and {o2:}, {mm2:} and {lb2:} at "
            "256; of the prose answers at 256, {po:}, {pm:} and {pl:} (pilots: fewer than 30 pairs). At 8k, 90% of a "
            "global layer's attention mass sits in {b90:.0f} of {nb:.0f} blocks and the sink holds {sink:.0%}. "
            "Bounding the 15 sliding layers by their window holds {h:.1f}x less K/V than keeping every layer at 32k "
            "tokens; at 1M tokens routing the global layers cuts a step's K/V reads {g:.1f}x (the byte model, "
            "checked against the store's counts).",
            {"p2": (N12, "passkey.dense.acc@2048"), "p8": (N12, "passkey.dense.acc@8192"),
             "n": (N12, "passkey.dense.n@8192"), "q2": (N12, "prose.dense.acc@2048"), "q8": (N12, "prose.dense.acc@8192"),
             "o": _kept(N12, "passkey.oracle@2048.kept@8192"), "mm": _kept(N12, "passkey.minmax@2048.kept@8192"),
             "lb": _kept(N12, "passkey.labels@2048.kept@8192"), "o2": _kept(N12, "passkey.oracle@256.kept@8192"),
             "mm2": _kept(N12, "passkey.minmax@256.kept@8192"), "lb2": _kept(N12, "passkey.labels@256.kept@8192"),
             "po": _kept(N12, "prose.oracle@256.kept@8192"), "pm": _kept(N12, "prose.minmax@256.kept@8192"),
             "pl": _kept(N12, "prose.labels@256.kept@8192"),
             "b90": (N12, "anatomy.blocks90"), "nb": (N12, "anatomy.num_blocks"), "sink": (N12, "anatomy.sink"),
             "h": (N12, "bytes.held_every_layer_over_bounded@32768"),
             "g": (N12, "bytes.read_dense_over_routed@1048576")}),
)
