"""Prefix-cache lookup speed on long prompts: ns per token for `match` and `insert`.

    python -m benchmarks.bench_prefix_match

For 128k-token prompts at several block sizes, times (median after warm-up):
  * match, full hit: every block cached, so every block is hashed and looked up;
  * match, miss at block 0: the lookup stops at the first block;
  * insert of a whole prompt;
  * a peer in the same run: SHA-256 over a pickled (parent hash, token tuple) per block, the
    scheme vLLM uses for its sha256 prefix-cache hashing, without any dictionary lookups.
vLLM's published figure for its SHA-256 block hashing is about 120 ns per token; the ratio
against the same-run peer is what transfers between machines. Writes
benchmarks/results/prefix_match.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sparsekv.core.profiling import median_time  # noqa: E402
from sparsekv.storage.prefix_cache import PrefixCache  # noqa: E402
from sparsekv.storage.store import BlockStore, StoreConfig  # noqa: E402


def pickle_sha256_peer(tokens: list[int], block_size: int) -> list[bytes]:
    parent, out = b"", []
    for i in range(0, len(tokens) // block_size * block_size, block_size):
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i:i + block_size])))).digest()
        out.append(parent)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prefix_match.json")
    args = ap.parse_args(argv)
    prompt = torch.randint(0, 128000, (args.tokens + 1,), generator=torch.Generator().manual_seed(0))
    as_list = prompt.tolist()
    rows = []
    for bs in args.block_sizes:
        store = BlockStore(StoreConfig(num_layers=1, num_kv_heads=1, head_dim=1, block_size=bs,
                                       num_blocks=args.tokens // bs + 2, repr_keys=0))
        cache = PrefixCache(store)
        seq = store.new_sequence()
        store.reserve(seq, len(prompt))
        t_insert = median_time(lambda: cache.insert(seq, prompt), 1, warmup=0)   # first insert registers
        t_insert_again = median_time(lambda: cache.insert(seq, prompt), args.repeats)
        t_hit = median_time(lambda: cache.match(prompt), args.repeats)
        other = prompt.clone()
        other[0] += 1
        t_miss = median_time(lambda: cache.match(other), args.repeats)
        t_peer = median_time(lambda: pickle_sha256_peer(as_list, bs), args.repeats)
        assert cache.match(prompt).num_tokens == args.tokens // bs * bs
        n = len(prompt)
        row = {"block_size": bs, "tokens": n, "match_hit_ns_per_token": t_hit / n * 1e9,
               "match_miss_ns_per_token": t_miss / n * 1e9, "insert_ns_per_token": t_insert / n * 1e9,
               "insert_again_ns_per_token": t_insert_again / n * 1e9,
               "peer_pickle_sha256_ns_per_token": t_peer / n * 1e9}
        row["match_speedup_vs_peer"] = t_peer / t_hit
        rows.append(row)
        print(f"block {bs:4d}: match (hit) {row['match_hit_ns_per_token']:6.1f} ns/token, miss "
              f"{row['match_miss_ns_per_token']:.3f}, insert {row['insert_ns_per_token']:6.1f}; peer hashing "
              f"{row['peer_pickle_sha256_ns_per_token']:6.1f} ns/token ({row['match_speedup_vs_peer']:.1f}x slower than match)")
    out = {"benchmark": "prefix_match", "date": date.today().isoformat(), "torch": torch.__version__,
           "vllm_published_sha256_ns_per_token": 120, "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
