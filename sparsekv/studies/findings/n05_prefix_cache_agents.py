"""Notebook 05's findings (`notebooks/05_prefix_cache_agents.ipynb`): prefix caching for agents, and real chat text
through the real tokenizer."""
from .finding import Finding

N05 = "05_prefix_cache_agents"

FINDINGS = (
    Finding("**Prefix caching pays for agents.** The cache reaches the block-rounded theoretical maximum: {ma:.0%} of "
            "prompt tokens for the multi-agent trace and {rq:.0%} for repository QA, and total TTFT falls "
            "{ma_t:.1f}x and {rq_t:.1f}x (CPU timings: the median of {n:.0f} paired replays, cache off and on "
            "interleaved after a warm-up; ranges {ma_lo:.1f}-{ma_hi:.1f}x and {rq_lo:.1f}-{rq_hi:.1f}x). Dynamic "
            "content early in the prompt drops the hit rate from {cf:.0%} to {de:.0%}. At twice the working set, LFU "
            "keeps {lfu:.1%} and LRU {lru:.1%}.",
            {"ma": (N05, "multi_agent_build.hit_rate"), "rq": (N05, "repo_qa.hit_rate"),
             "ma_t": (N05, "multi_agent_build.ttft_speedup"), "rq_t": (N05, "repo_qa.ttft_speedup"),
             "n": (N05, "ttft_repeats"),
             "ma_lo": (N05, "multi_agent_build.ttft_speedup_lo"), "ma_hi": (N05, "multi_agent_build.ttft_speedup_hi"),
             "rq_lo": (N05, "repo_qa.ttft_speedup_lo"), "rq_hi": (N05, "repo_qa.ttft_speedup_hi"),
             "cf": (N05, "layout.cacheable_first.hit_rate"), "de": (N05, "layout.dynamic_early.hit_rate"),
             "lfu": (N05, "pressure.lfu@2x"), "lru": (N05, "pressure.lru@2x")}),
    Finding("**Real chat text through the real tokenizer.** Tokenising the whole rendered chat at once, a reply that "
            "starts with a newline merges with the generation prompt's newline, so {tb:.0f} of {tt:.0f} turns no longer "
            "extend the previous prompt token for token ({tl:.0f} tokens lost in all); tokenising the template's pieces "
            "and each message separately keeps all {st:.0f}. At block 16 that costs {dh:.1f} points of hit rate, {th:.1%} "
            "against {sh:.1%} of prompt tokens, because the lost token rarely completes a block; the cache cuts the "
            "real model's total TTFT {sx:.1f}x (median of {n:.0f} paired replays, range {sx_lo:.1f}-{sx_hi:.1f}x).",
            {"tb": lambda m: m[N05]["real_chat.template.turns"] - m[N05]["real_chat.template.extends"],
             "tt": (N05, "real_chat.template.turns"), "tl": (N05, "real_chat.template.lost_tokens"),
             "st": (N05, "real_chat.segmented.extends"), "th": (N05, "real_chat.template.hit_rate"),
             "sh": (N05, "real_chat.segmented.hit_rate"), "sx": (N05, "real_chat.segmented.ttft_speedup"),
             "n": (N05, "ttft_repeats"), "sx_lo": (N05, "real_chat.segmented.ttft_speedup_lo"),
             "sx_hi": (N05, "real_chat.segmented.ttft_speedup_hi"),
             "dh": lambda m: 100 * (m[N05]["real_chat.segmented.hit_rate"] - m[N05]["real_chat.template.hit_rate"])}),
)
