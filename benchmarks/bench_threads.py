"""Thread settings on a busy machine: how a notebook-sized workload slows when another process keeps a core busy.

torch parallelises each op over its intra-op threads and waits for all of them at the end of the op. When another
process holds a core, one of those threads is descheduled for a scheduler slice at a time, and every op waits for
it: with as many threads as cores, a busy neighbour slows the whole run by far more than the core it takes. This
benchmark measures that on a real workload (SmolLM2-135M: a prefill, then routed and dense decode steps, the shape
of notebooks 08-10) under each setting, idle and beside one busy-looping process, each in a fresh process:

    threads=N      torch.set_num_threads(N)
    auto           `suite.threads.choose()`: the cores left idle by other processes, measured at start (what the
                   runner and the tests use)

    python -m benchmarks.bench_threads [--repeats 3] [--out benchmarks/results/threads.json]

Reports the median wall time of each (setting, load) and its ratio to the idle, all-cores run of the same workload.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

WORKLOAD = r"""
import os, sys, time, torch
setting = sys.argv[1]
if setting == "auto":
    from sparsekv.suite import threads
    torch.set_num_threads(threads.choose())
else:
    torch.set_num_threads(int(setting.split("=")[1]))
import sparsekv as sk
from sparsekv.analysis import corpus
path = "data/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
model, tok = sk.load_model(path), sk.load_tokenizer(path)
ids = corpus.take(tok, corpus.haystack("prose"), 1024)
t0 = time.perf_counter()
eng = sk.Engine(model, block_size=16, num_blocks=256, progress=False)
seq = eng.new_sequence(); eng.prefill(seq, ids)
for router in (sk.Router("minmax", token_budget=128), None):
    child = eng.fork(seq); eng.decode(child, 24, router=router); eng.finish(child)
print(f"{time.perf_counter() - t0:.4f} {torch.get_num_threads()}")
"""
HOG = "import time\nt = time.time() + 1800\nwhile time.time() < t:\n    pass\n"


def run_once(setting: str, env: dict) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", WORKLOAD, setting], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    return float(out[-2]), int(out[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/threads.json"))
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    settings = [f"threads={n}" for n in sorted({cores, 1})] + ["auto"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    run_once(settings[0], env)                                      # warm-up: the converted model, the extension
    rows = []
    for load in ("idle", "one busy process"):
        hog = subprocess.Popen([sys.executable, "-c", HOG]) if load != "idle" else None
        try:
            time.sleep(1.0 if hog else 0.0)                          # let the scheduler see the hog
            for setting in settings:
                times, used = [], 0
                for _ in range(args.repeats):
                    t, used = run_once(setting, env)
                    times.append(t)
                rows.append({"load": load, "setting": setting, "threads": used, "median_s": statistics.median(times),
                             "runs_s": times})
                print(f"{load:>17s}  {setting:>10s} ({used} threads): median {rows[-1]['median_s']:.2f} s "
                      f"over {args.repeats}", flush=True)
        finally:
            if hog:
                hog.kill()
                hog.wait()
    base = next(r["median_s"] for r in rows if r["load"] == "idle" and r["setting"] == f"threads={cores}")
    for r in rows:
        r["vs_idle_all_cores"] = r["median_s"] / base
    result = {"date": str(date.today()), "cores": cores, "workload": "SmolLM2-135M: prefill 1,024 tokens, 24 routed "
              "(minmax@128) and 24 dense decode steps", "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
