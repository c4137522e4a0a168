"""Engine decode TPOT with the fused CPU kernel against the torch path it replaced, in the same run.

    python -m benchmarks.bench_engine_tpot            # cpu-timing model, 8k and 64k tokens
    python -m benchmarks.bench_engine_tpot --quick    # 2k and 8k

The `cpu-timing` preset (random weights, 4 layers, 8 q / 2 kv heads, D 64) decodes after its cache is
filled with random K/V (`Engine.fill_synthetic`). For each context, each path ("cpp": the plan's fused
attention kernel; "torch": the plan forced onto the torch path for attention; routing runs the fused route
pass in both, so the columns differ in attention only) decodes the same tokens densely and routed
(`minmax`, 2,048-token budget) from forks of one filled sequence; TPOT is the median step after one
warm-up step, cycled twice so drift hits both paths alike. The greedy tokens must match across paths.
Results go to benchmarks/results/engine_tpot.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import date
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sparsekv as sk  # noqa: E402
from sparsekv.attention import plan as plan_mod  # noqa: E402
from sparsekv.model import engine as engine_mod  # noqa: E402


def decode_tpot(engine, base, steps: int, router, backend: str) -> tuple[float, list[int]]:
    real = plan_mod.plan_decode
    with mock.patch.object(engine_mod, "plan_decode", lambda s, q, h, **kw: real(s, q, h, backend=backend, **kw)):
        seq = engine.fork(base)
        tokens = engine.decode(seq, steps + 1, router=router)
        secs = [s.seconds for s in engine.stats(seq).steps][1:]          # the first step warms up
        engine.finish(seq)
    return statistics.median(secs), tokens


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 65536])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine_tpot.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts, args.steps = [2048, 8192], 4
    model = sk.Model(sk.ModelConfig.from_name("cpu-timing"), seed=0)
    rows = []
    for n in args.contexts:
        engine = sk.Engine(model, block_size=64, num_blocks=n // 64 + 64, progress=False)
        base = engine.new_sequence()
        engine.fill_synthetic(base, n, seed=n)
        engine.prefill(base, [1, 2, 3])
        res = {"context": n}
        tokens = {}
        for name, router in (("dense", None), ("routed", sk.Router("minmax", token_budget=args.budget))):
            times = {"cpp": [], "torch": []}
            for _ in range(2):
                for backend in ("cpp", "torch"):
                    t, tok = decode_tpot(engine, base, args.steps, router, backend)
                    times[backend].append(t)
                    tokens[name, backend] = tok
            for backend, ts in times.items():
                res[f"{name}_{backend}_tpot_s"] = min(ts)
            res[f"{name}_speedup"] = res[f"{name}_torch_tpot_s"] / res[f"{name}_cpp_tpot_s"]
            res[f"{name}_same_tokens"] = tokens[name, "cpp"] == tokens[name, "torch"]
        engine.finish(base)
        rows.append(res)
        print(json.dumps(res), flush=True)
    out = {"date": str(date.today()), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "model": "cpu-timing", "budget": args.budget, "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    if not all(r["dense_same_tokens"] and r["routed_same_tokens"] for r in rows):
        raise SystemExit("the fused kernel and the torch path printed different greedy tokens")


if __name__ == "__main__":
    main()
