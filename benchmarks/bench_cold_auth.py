"""What authenticating a cold record costs: keyed BLAKE2b (what `storage.cold` checks) against CRC-32 (what it
checked before), per record, at the record sizes the cold tier stores.

    python -m benchmarks.bench_cold_auth

For each size: the median of `--repeats` timings (after `--warmup` discarded ones) of as many hashes of one
record as make `--sample-bytes` (short samples, many of them: on a machine shared under a CPU quota a long sample often spans a throttled
period, which inflates its mean but not the median of short ones), as `ColdFile` computes them (zlib.crc32 over the bytes; hashlib.blake2b, 16-byte digest, 32-byte key,
over a 24-byte slot header and the bytes), reported as microseconds per record and GB/s, with the ratio; and
a peer in the same run, HMAC-SHA256 (OpenSSL's SHA-256, which uses the CPU's SHA extensions where it has them). For
context, the same run times `ColdFile.read` of one record of that size (one read per sample) (its preadv, the tag check and the copy
out: O_DIRECT where the file system allows it, so every read reaches the device), and the share of it that the
tag check is. Sizes (bytes):

    4,096     one page (a tiny test store)
    12,288    one bf16 K tile of SmolLM2-135M at block 32 (3 kv heads x 32 tokens x 64 dims x 2 bytes)
    24,576    SmolLM2's whole bf16 record at block 32 (K tile | V tile)
    32,768    Gemma 3 270M's bf16 record at block 32 (1 kv head x 256 dims)
    262,144   a float32 record of 8 kv heads x 64 tokens x 64 dims (K | V)

Writes benchmarks/results/cold_auth.json.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import platform
import struct
import sys
import tempfile
import zlib
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sparsekv.core.profiling import median_time  # noqa: E402
from sparsekv.storage.cold import KEY_BYTES, TAG_BYTES, ColdFile  # noqa: E402
from sparsekv.suite.cpuconfig import cpu_model  # noqa: E402

SIZES = [4096, 12288, 24576, 32768, 262144]




def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="record bytes")
    ap.add_argument("--sample-bytes", type=int, default=65536, help="bytes hashed per timed sample (at least one record)")
    ap.add_argument("--repeats", type=int, default=501, help="timed samples (the median is reported)")
    ap.add_argument("--warmup", type=int, default=20, help="samples discarded first")
    ap.add_argument("--cold-dir", type=Path, default=None, help="where the read's cold file goes (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cold_auth.json")
    args = ap.parse_args(argv)
    key = os.urandom(KEY_BYTES)
    header = struct.pack("<QQQ", 3, 1234, 7)                       # layer, block, generation
    rows = []
    with tempfile.TemporaryDirectory(dir=args.cold_dir) as tmp:
        for n in args.sizes:
            calls = max(1, args.sample_bytes // n)
            data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n)).numpy()

            def crc():
                for _ in range(calls):
                    zlib.crc32(data)

            def blake():
                for _ in range(calls):
                    h = hashlib.blake2b(header, digest_size=TAG_BYTES, key=key)
                    h.update(data)
                    h.digest()

            def sha():
                for _ in range(calls):
                    h = hmac.new(key, header, "sha256")
                    h.update(data)
                    h.digest()

            t_crc = median_time(crc, args.repeats, args.warmup) / calls
            t_blake = median_time(blake, args.repeats, args.warmup) / calls
            t_sha = median_time(sha, args.repeats, args.warmup) / calls
            cold = ColdFile(tmp, 1, 4, n)
            cold.write(0, 1, torch.from_numpy(data))
            t_read = median_time(lambda: cold.read(0, 1), args.repeats, args.warmup)
            io_mode = cold.io_mode
            cold.close()
            row = {"record_bytes": n, "crc32_us": t_crc * 1e6, "blake2b_keyed_us": t_blake * 1e6,
                   "crc32_GBps": n / t_crc / 1e9, "blake2b_keyed_GBps": n / t_blake / 1e9,
                   "blake2b_over_crc32": t_blake / t_crc, "hmac_sha256_us": t_sha * 1e6,
                   "hmac_sha256_GBps": n / t_sha / 1e9, "read_us": t_read * 1e6,
                   "tag_share_of_read": t_blake / t_read, "io_mode": io_mode}
            rows.append(row)
            print(f"{n:7d} B: crc32 {row['crc32_us']:7.2f} us ({row['crc32_GBps']:5.2f} GB/s), keyed blake2b "
                  f"{row['blake2b_keyed_us']:7.2f} us ({row['blake2b_keyed_GBps']:5.2f} GB/s), "
                  f"{row['blake2b_over_crc32']:4.1f}x; hmac-sha256 {row['hmac_sha256_us']:7.2f} us; ColdFile.read {row['read_us']:7.1f} us ({io_mode}), "
                  f"of which the tag {100 * row['tag_share_of_read']:4.1f}%")
    out = {"benchmark": "cold_auth", "date": date.today().isoformat(), "python": platform.python_version(),
           "cpu": cpu_model(), "cpu_count": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "sample_bytes": args.sample_bytes, "repeats": args.repeats,
           "warmup": args.warmup, "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
