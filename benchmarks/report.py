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
             f"(read bandwidth {d['read_bandwidth_Bps'] / 1e9:.0f} GB/s; 32 q / 8 kv heads, head dim 128, block 64, "
             f"budget {d['config']['budget']} tokens). Time over each variant's byte floor, and speed-ups:",
             "",
             "| context | dtype | sparse / floor | dense / floor | SDPA / floor | Flex / floor | sparse vs Flex | sparse vs SDPA | dense vs SDPA |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in d["cases"]:
        lines.append(f"| {r['context']} | {r['dtype']} | {r['sparse_over_floor']:.2f} | {r['dense_over_floor']:.2f} | "
                     f"{r['sdpa_over_floor']:.2f} | {r.get('flex_over_floor', float('nan')):.2f} | "
                     f"{r.get('sparse_speedup_vs_flex', float('nan')):.2f}x | {r['sparse_speedup_vs_sdpa']:.1f}x | "
                     f"{r['dense_speedup_vs_sdpa']:.2f}x |")
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
