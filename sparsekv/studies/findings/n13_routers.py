"""Notebook 13's finding (`notebooks/13_routers.ipynb`): routers against the oracle on real keys."""
from .finding import Finding, paired_word

N13 = "13_routers"

_union_word = paired_word("passkey.minmax+union@64.acc_given_dense", "passkey.minmax@64.acc_given_dense",
                          "passkey.minmax+union_vs_minmax@64.p", "one shared choice per kv head", N13)
_block_word = paired_word("blocks.passkey.minmax@64.bs8.acc_given_dense", "passkey.minmax@64.acc_given_dense",
                          "blocks.passkey.minmax@64.bs8_vs_bs16.p", "in 16-token blocks", N13)
_fresh_mean_word = paired_word("fresh.passkey.mean@64.bs8.acc_given_dense", "fresh.passkey.minmax@64.bs16.acc_given_dense",
                               "fresh.passkey.mean.bs8_vs_minmax.bs16@64.p", "`minmax` in 16-token blocks", N13)
_fresh_quest_word = paired_word("fresh.passkey.minmax+quest@64.bs16.acc_given_dense",
                                "fresh.passkey.minmax@64.bs16.acc_given_dense",
                                "fresh.passkey.minmax+quest.bs16_vs_minmax.bs16@64.p", "the suite's protocol", N13)


FINDINGS = (
    Finding("**Routers against the oracle on real keys (notebook 13, SmolLM2 at 2k tokens).** Quest's bound is loose "
            "{where}: the fastest-rotating RoPE band holds {fast:.0%} of its slack over each block's best key and the "
            "slow band {slow:.0%}, and a bound on the slow and mid bands alone keeps {sb:.0%} of the attention mass at "
            "8 blocks against Quest's {mm:.0%} (oracle {orc:.0%}). On the {n:.0f} passkey prompts dense answers, at a "
            "64-token budget the oracle answers {o64:.0%}, `mean` {me64:.0%}, `minmax` {m64:.0%} and the calibrated "
            "`labels` router (at Quest's summary bytes per block) {l64:.0%} (labels against minmax: McNemar p = "
            "{p64:.2g}); at 256 tokens `labels` answers {l256:.0%} against `minmax`'s {m256:.0%} (p = {p256:.2g}). "
            "Choosing per query head at the same K/V bytes (`gqa=\"union\"`: each kv head takes its query heads' own "
            "rankings round robin until it holds the budget), `minmax` answers {mu64:.0%} at 64 tokens, which {uw}, "
            "and `mean` {meu64:.0%}. In 8-token blocks at the same 64 tokens (6 free blocks beside the forced two, "
            "against 2), `minmax` answers {b8m:.0%}, which {bw}, `mean` {b8me:.0%} and the oracle {b8o:.0%}; in "
            "32-token blocks at 128 tokens `minmax` answers {b32m:.0%} (16-token blocks: {m128:.0%}). "
            "On {fn:.0f} held-out passkeys (new keys at new depths) at 64 tokens and the same bytes read and held "
            "(one summary vector per 8 tokens per kv head, 64 tokens of K/V per layer), `mean` in 8-token blocks "
            "answers {fme:.0%}, which {fmw}, against the oracle's {fo:.0%}; under Quest's own passkey protocol (no "
            "sink forced, layers 0 and 1 dense: {fqkv:.1f}x the K/V bytes per step) `minmax` answers {fq:.0%}, which "
            "{fqw}. "
            "On Gemma 3 270M's global layers at 8k tokens, at a 64-token budget: oracle {g_o:.0%}, `labels` {g_l:.0%}, "
            "`minmax` {g_m:.0%} of the {g_n:.0f} prompts dense answers.",
            {"where": lambda m: "mainly in the fastest RoPE band" if m[N13]["slack.share.fast"] > 0.5
             else "but not mainly through its fastest RoPE band",
             "fast": (N13, "slack.share.fast"), "slow": (N13, "slack.share.slow"),
             "sb": (N13, "slack.recall.slow_bound"), "mm": (N13, "slack.recall.minmax"),
             "orc": (N13, "slack.recall.oracle"), "n": (N13, "passkey.oracle@64.n"),
             "o64": (N13, "passkey.oracle@64.acc_given_dense"), "me64": (N13, "passkey.mean@64.acc_given_dense"),
             "m64": (N13, "passkey.minmax@64.acc_given_dense"), "l64": (N13, "passkey.labels@64.acc_given_dense"),
             "p64": (N13, "passkey.labels_vs_minmax@64.p"), "l256": (N13, "passkey.labels@256.acc_given_dense"),
             "m256": (N13, "passkey.minmax@256.acc_given_dense"), "p256": (N13, "passkey.labels_vs_minmax@256.p"),
             "g_o": (N13, "gemma.passkey.oracle@64.acc_given_dense"),
             "g_l": (N13, "gemma.passkey.labels@64.acc_given_dense"),
             "g_m": (N13, "gemma.passkey.minmax@64.acc_given_dense"), "g_n": (N13, "gemma.passkey.dense_ok"),
             "mu64": (N13, "passkey.minmax+union@64.acc_given_dense"),
             "meu64": (N13, "passkey.mean+union@64.acc_given_dense"), "uw": _union_word,
             "b8m": (N13, "blocks.passkey.minmax@64.bs8.acc_given_dense"),
             "b8me": (N13, "blocks.passkey.mean@64.bs8.acc_given_dense"),
             "b8o": (N13, "blocks.passkey.oracle@64.bs8.acc_given_dense"), "bw": _block_word,
             "b32m": (N13, "blocks.passkey.minmax@128.bs32.acc_given_dense"),
             "m128": (N13, "passkey.minmax@128.acc_given_dense"),
             "fn": (N13, "fresh.passkey.dense_ok"), "fme": (N13, "fresh.passkey.mean@64.bs8.acc_given_dense"),
             "fmw": _fresh_mean_word, "fo": (N13, "fresh.passkey.oracle@64.bs16.acc_given_dense"),
             "fq": (N13, "fresh.passkey.minmax+quest@64.bs16.acc_given_dense"), "fqw": _fresh_quest_word,
             "fqkv": lambda m: m[N13]["fresh.bytes.minmax+quest@64.bs16.kv"] / m[N13]["fresh.bytes.minmax@64.bs16.kv"]}),
)
