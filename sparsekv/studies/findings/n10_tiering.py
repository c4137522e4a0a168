"""Notebook 10's finding (`notebooks/10_tiering.ipynb`): tiered KV, its hit rates, stalls and prefetch, and reloading a
spilled prefix against recomputing it."""
from __future__ import annotations

from .finding import Finding, Metrics

N10 = "10_tiering"


def _prefetch_word(m: Metrics) -> str:
    """What prefetch did at 24 hot tiles: to the stall and to TPOT, each from the measured pair."""
    g = lambda k: m[N10][k]
    stall = g("decode.hot24.prefetch2.stall_ms_per_token") < g("decode.hot24.prefetch0.stall_ms_per_token")
    tpot = g("decode.hot24.prefetch2.tpot_ms") < g("decode.hot24.prefetch0.tpot_ms")
    return {(True, True): "lowered both the stall and TPOT", (True, False): "lowered the stall but not TPOT",
            (False, True): "lowered TPOT but not the stall", (False, False): "lowered neither the stall nor TPOT"}[stall, tpot]


def _prefetch_unused(m: Metrics) -> float:
    """The share of what prefetch read from the cold tier that no step needed: the tiles a step needs from the cold
    tier are the same with or without read-ahead (without it, exactly the demand reads, r0 per token), so what it
    read beyond those (r2 - r0 of r2) was never used."""
    r0, r2 = (m[N10][f"decode.hot24.prefetch{d}.read_mib_per_token"] for d in (0, 2))
    return max(0.0, (r2 - r0) / r2) if r2 > 0 else 0.0


def _crossover(m: Metrics) -> str:
    """Where reloading a spilled prefix starts to beat recomputing it, in words (the notebook's own wording)."""
    # imported on render only: the study's module loads the engine and torch
    from ..tiering import crossover_words
    lengths = [int(k.split(".")[1]) for k in m[N10] if k.startswith("ttft.") and k.endswith(".recompute_ms")]
    return crossover_words(m[N10]["ttft.crossover_tokens"], lengths)


FINDINGS = (
    Finding("**Tiered KV (notebook 10).** On SmolLM2 over {ctx:,} tokens of prose with a {bud}-token budget (routers read "
            "{bps:.1f} blocks per layer per step), a hot tier of 24 tiles per layer ({f24:.0%} of the context) serves {h24:.0%} "
            "of routed reads without waiting for the disk, and {h24p:.0%} when the 4 blocks per kv head the router ranked "
            "next are read ahead; 12 tiles serve {h12:.0%}. In decode, 24 hot tiles per layer ran at {r24:.2f}x all-hot TPOT "
            "with a {st24:.1f} ms/token stall, reading {rb24:.2f} MiB per token from the cold tier; 48 tiles at {r48:.2f}x. "
            "Prefetch {pword} ({st24p:.1f} ms/token stall, {r24p:.2f}x all-hot TPOT), and of the {rb24p:.2f} MiB per token "
            "it read, {unused:.0%} was never needed. Reloading a spilled 2,048-token prefix from disk "
            "(O_DIRECT, {bw:.0f} MiB/s) took {rl:.0f} ms against {rc:.0f} ms to recompute it ({hh:.0f} ms when it was "
            "still in memory); reload beats recompute {cross}.",
            {"ctx": (N10, "context_tokens"), "bud": (N10, "token_budget"), "bps": (N10, "trace.SmolLM2.blocks_per_step"),
             "h24": (N10, "hit_rate.SmolLM2.hot24.depth0"), "h24p": (N10, "hit_rate.SmolLM2.hot24.depth4"),
             "h12": (N10, "hit_rate.SmolLM2.hot12.depth0"),
             "r24": lambda m: m[N10]["decode.hot24.prefetch0.tpot_ms"] / m[N10]["decode.all_hot.tpot_ms"],
             "r48": lambda m: m[N10]["decode.hot48.prefetch0.tpot_ms"] / m[N10]["decode.all_hot.tpot_ms"],
             "r24p": lambda m: m[N10]["decode.hot24.prefetch2.tpot_ms"] / m[N10]["decode.all_hot.tpot_ms"],
             "st24": (N10, "decode.hot24.prefetch0.stall_ms_per_token"),
             "st24p": (N10, "decode.hot24.prefetch2.stall_ms_per_token"),
             "rb24": (N10, "decode.hot24.prefetch0.read_mib_per_token"),
             "bw": (N10, "ttft.2048.reload_read_mib_per_s"), "rl": (N10, "ttft.2048.reload_ms"),
             "rc": (N10, "ttft.2048.recompute_ms"), "hh": (N10, "ttft.2048.hot_hit_ms"), "cross": _crossover,
             "f24": lambda m: 24 / -(-m[N10]["context_tokens"] // 16), "rb24p": (N10, "decode.hot24.prefetch2.read_mib_per_token"),
             "pword": _prefetch_word, "unused": _prefetch_unused}),
)
