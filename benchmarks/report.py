"""Render the committed benchmark results as Markdown tables (for the README).

    python -m benchmarks.report
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_decode_table(path: Path = RESULTS / "cpu_decode.json") -> str:
    d = json.loads(path.read_text())
    lines = [f"CPU decode, {d['threads']} threads, torch {d['torch']}, {d['date']} "
             f"(read bandwidth {d['read_bandwidth_Bps'] / 1e9:.0f} GB/s, matmul {d['matmul_flops'] / 1e9:.0f} GFLOP/s; "
             f"32 q / 8 kv heads, head dim 128, block 64, budget {d['config']['budget']} tokens). Time over each variant's "
             "floor (the larger of its byte and compute floors; the bound that applies in brackets), and speed-ups with "
             "the same work on both sides:",
             "",
             "| context | dtype | routed / floor | attention alone / floor | dense / floor | SDPA / floor | Flex / floor "
             "| attention vs Flex | routed vs Flex routed | dense vs SDPA |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    nan = float("nan")
    for r in d["cases"]:
        fl = lambda v: f"{r.get(f'{v}_over_floor', nan):.2f} ({r.get(f'{v}_bound', '?')})"
        lines.append(f"| {r['context']} | {r['dtype']} | {fl('sparse')} | {fl('sparse_attn')} | {fl('dense')} | "
                     f"{fl('sdpa')} | {fl('flex')} | {r.get('attn_speedup_vs_flex', nan):.2f}x | "
                     f"{r.get('routed_speedup_vs_flex_routed', nan):.2f}x | {r['dense_speedup_vs_sdpa']:.2f}x |")
    return "\n".join(lines)


def prefix_match_table(path: Path = RESULTS / "prefix_match.json") -> str:
    d = json.loads(path.read_text())
    lines = [f"Prefix-cache lookup on {d['cases'][0]['tokens'] - 1}-token prompts ({d['date']}); vLLM publishes about "
             f"{d['vllm_published_sha256_ns_per_token']} ns/token for its SHA-256 block hashing:", "",
             "| block size | match (full hit) ns/token | insert ns/token | same-run pickle+SHA-256 peer ns/token | match vs peer |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for r in d["cases"]:
        lines.append(f"| {r['block_size']} | {r['match_hit_ns_per_token']:.1f} | {r['insert_ns_per_token']:.1f} | "
                     f"{r['peer_pickle_sha256_ns_per_token']:.1f} | {r['match_speedup_vs_peer']:.1f}x faster |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(cpu_decode_table())
    print()
    print(prefix_match_table())
