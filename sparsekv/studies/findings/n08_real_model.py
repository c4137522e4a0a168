"""Notebook 08's findings (`notebooks/08_real_model.ipynb`): a real pretrained model's attention, passkeys and tail
loss, needles in real text, and speed against transformers' `generate`."""
from __future__ import annotations

from typing import Callable

from .finding import Finding, Metrics, versus

N08 = "08_real_model"


def _ahead(a: str, b: str, key: Callable[[str], tuple[str, str]]) -> Callable[[Metrics], str]:
    def word(m: Metrics) -> str:
        x, y = (m[key(r)[0]][key(r)[1]] for r in (a, b))
        return f"`{a}` ahead of `{b}`" if x > y else f"`{b}` ahead of `{a}`" if y > x else f"`{a}` and `{b}` tied"
    return word


FINDINGS = (
    Finding("**A real pretrained model (SmolLM2-135M-Instruct, notebook 08).** On 8k-token real documents, 90% of a "
            "median query head's attention mass sits in {b90p:.0f} (prose) and {b90c:.0f} (code) of {nb:.0f} blocks "
            "(the mean over heads, {m90p:.0f} and {m90c:.0f}, is pulled up by a few wide early-layer heads), and the "
            "attention sink holds {sink:.0%} of it. Passkey, where dense answers ({ok:.0f} prompts): "
            "at 128 tokens `minmax` answers {pm128:.0%}, `mean` {pe128:.0%}, `repr` {pr128:.0%} and `recency` "
            "{pc128:.0%} ({word128}); at 1,024 tokens `minmax` {pm1k:.0%} and `mean` {pe1k:.0%}. Over the last 256 "
            "tokens of an 8k prose document, dense loss is {ld:.3f} nats/token, `minmax@256` {lm0:.3f} with every "
            "layer routed and {lm2:.3f} with two dense layers, `mean@256` {le0:.3f}, `recency@256` {lr0:.3f}; on 8k "
            "tokens of code, dense {lcd:.3f}, `minmax@256` {lcm:.3f}, `mean@256` {lce:.3f}, `recency@256` {lcr:.3f}.",
            {"b90p": (N08, "anatomy.prose.blocks90_median"), "b90c": (N08, "anatomy.code.blocks90_median"),
             "m90p": (N08, "anatomy.prose.blocks90"), "m90c": (N08, "anatomy.code.blocks90"),
             "nb": (N08, "anatomy.num_blocks"), "sink": (N08, "anatomy.prose.sink"),
             "ok": (N08, "passkey.dense_ok_prompts"),
             "pm128": (N08, "passkey.minmax@128.acc_given_dense"), "pe128": (N08, "passkey.mean@128.acc_given_dense"),
             "pr128": (N08, "passkey.repr@128.acc_given_dense"), "pc128": (N08, "passkey.recency@128.acc_given_dense"),
             "word128": _ahead("minmax", "mean", lambda r: (N08, f"passkey.{r}@128.acc_given_dense")),
             "pm1k": (N08, "passkey.minmax@1024.acc_given_dense"), "pe1k": (N08, "passkey.mean@1024.acc_given_dense"),
             "ld": (N08, "loss.prose.dense.dl0"), "lm0": (N08, "loss.prose.minmax@256.dl0"),
             "lm2": (N08, "loss.prose.minmax@256.dl2"), "le0": (N08, "loss.prose.mean@256.dl0"),
             "lr0": (N08, "loss.prose.recency@256.dl0"), "lcd": (N08, "loss.code.dense.dl0"),
             "lcm": (N08, "loss.code.minmax@256.dl0"), "lce": (N08, "loss.code.mean@256.dl0"),
             "lcr": (N08, "loss.code.recency@256.dl0")}),
    Finding("**Needles in real text: {harder}.** With a fact planted at six depths in 4k tokens "
            "of real prose (the standard library's docstrings) or real Python source, dense answers {dp:.0%} (prose) "
            "and {dc:.0%} (code), against {dk:.0%} on the repeated-filler passkey at the same length; at a 256-token "
            "budget `minmax` answers {mp:.0%} and {mc:.0%}, `mean` {ep:.0%} and "
            "{ec:.0%}, `repr` {rp:.0%} and {rc:.0%}; at 1,024 tokens `minmax` {mp1:.0%} and {mc1:.0%}.",
            {"dp": (N08, "needle.prose.dense.acc"), "dc": (N08, "needle.code.dense.acc"),
             "mp": (N08, "needle.prose.minmax@256.acc"), "mc": (N08, "needle.code.minmax@256.acc"),
             "ep": (N08, "needle.prose.mean@256.acc"), "ec": (N08, "needle.code.mean@256.acc"),
             "rp": (N08, "needle.prose.repr@256.acc"), "rc": (N08, "needle.code.repr@256.acc"),
             "mp1": (N08, "needle.prose.minmax@1024.acc"), "mc1": (N08, "needle.code.minmax@1024.acc"),
             "dk": (N08, "passkey.dense.acc@4096"),
             "harder": lambda m: versus(max(m[N08]["needle.prose.dense.acc"], m[N08]["needle.code.dense.acc"]),
                                         m[N08]["passkey.dense.acc@4096"], "harder for the model than repeated filler",
                                         "as hard as repeated filler", "easier for the model than repeated filler")}),
    Finding("**Against transformers' `generate`** (the same weights and prompt ids, its default cache and SDPA, one run "
            "on this CPU; over 1 means sparsekv is faster): at 8k tokens sparsekv's prefill runs at {ttft:.2f}x "
            "generate's speed, its dense decode at {tpd:.2f}x, and its routed decode (`minmax@128`) at {tpr:.2f}x.",
            {"ttft": (N08, "speed.ttft_hf_over_ours@8192"), "tpd": (N08, "speed.tpot_hf_over_dense@8192"),
             "tpr": lambda m: m[N08]["speed.tpot_hf_over_dense@8192"] * m[N08]["speed.tpot_dense_over_routed@8192"]}),
)
