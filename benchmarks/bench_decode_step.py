"""Decode step time, dense and routed, and batched decode against single decodes, for this checkout and another.

The Engine's decode step is one `attention.plan` per step for B >= 1 sequences (`Engine.decode`, `Engine.feed` and
`Engine.decode_batch` share it). This measures what that costs, against another checkout of the package (for example
the commit before a change): both run the same workload in fresh processes, alternately, round after round, so a
busy machine slows both alike, and each reports the median of its steps (warm-up steps discarded).

    python -m benchmarks.bench_decode_step [--before PATH] [--rounds 5] [--out benchmarks/results/decode_step.json]

Workload: the `tiny` and `cpu-timing` models (random weights), a 2,048-token synthetic context, 16 decode steps
per round: one sequence dense and routed (`minmax`, 256 tokens), and four sequences decoded together
(`decode_batch`) against the same four decoded one after another, dense and routed. Reported: ms per step, and
the batched throughput (tokens/s) over the single decodes'.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKLOAD = r"""
import json, sys, time, statistics, torch
import sparsekv as sk
torch.set_num_threads(int(sys.argv[2]))
out = {}
for preset in ("tiny", "cpu-timing"):
    model = sk.Model(sk.ModelConfig.from_name(preset))
    ctx, steps, warm = 2048, 16, 3
    eng = sk.Engine(model, block_size=16, num_blocks=8 * (ctx // 16 + 64), progress=False)
    bases = []
    for i in range(4):
        s = eng.new_sequence(); eng.fill_synthetic(s, ctx + 16 * i, seed=i); eng.prefill(s, [1]); bases.append(s)
    for name, router in (("dense", None), ("routed", sk.Router("minmax", token_budget=256))):
        one = eng.fork(bases[0])
        eng.decode(one, warm + steps, router=router)
        out[f"{preset}.{name}.step_ms"] = 1e3 * statistics.median(s.seconds for s in eng.stats(one).steps[warm:])
        eng.finish(one)
        forks = [eng.fork(b) for b in bases]
        for _ in range(warm):
            eng.decode_batch(forks, router=router)
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.decode_batch(forks, router=router)
        batched = time.perf_counter() - t0
        singles = [eng.fork(b) for b in bases]
        for s in singles:
            eng.decode(s, warm, router=router)
        t0 = time.perf_counter()
        for _ in range(steps):
            for s in singles:
                eng.decode(s, 1, router=router)
        alone = time.perf_counter() - t0
        out[f"{preset}.{name}.batch4_over_single"] = alone / batched
        for s in forks + singles:
            eng.finish(s)
print(json.dumps(out))
"""


def run(checkout: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    res = subprocess.run([sys.executable, "-c", WORKLOAD, str(checkout), str(threads)], capture_output=True, text=True,
                         env=env, cwd=checkout, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, default=None, help="another checkout to measure beside this one")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "decode_step.json")
    args = ap.parse_args(argv)
    sides = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    samples = {k: [] for k in sides}
    for r in range(args.rounds):
        for name, path in (sides.items() if r % 2 == 0 else reversed(sides.items())):    # alternate who goes first
            samples[name].append(run(path, args.threads))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    med = {name: {k: statistics.median(s[k] for s in rows) for k in rows[0]} for name, rows in samples.items()}
    result = {"date": str(date.today()), "threads": args.threads, "rounds": args.rounds, "median": med,
              "before": str(args.before) if args.before else None}
    if args.before:
        result["after_over_before"] = {k: med["after"][k] / med["before"][k] for k in med["after"] if k in med["before"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for k in med["after"]:
        line = f"{k:38s} after {med['after'][k]:8.3f}"
        if args.before:
            line += f"   before {med['before'][k]:8.3f}   after/before {result['after_over_before'][k]:.3f}"
        print(line)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
