"""What holding the dequantised weights for a prefill buys (`quant.held_weights`), for each prefill dtype.

    python -m benchmarks.bench_held_weights                        # Gemma 3 270M at 2k and 8k, each prefill dtype
    python -m benchmarks.bench_held_weights --quick                # SmolLM2 at 600 tokens, float32, 2 rounds (tests)
    python -m benchmarks.bench_held_weights --lengths --out benchmarks/results/held_weights_serving.json   # serving

A gguf model's prefill chunk multiplies by W dequantised from the file's codes (`quant.QuantLinear`). Without a
hold, every 512-token chunk dequantises every W again (and rounds it to bfloat16 for a bfloat16 prefill); inside
`quant.held_weights`, a prompt dequantises each W once and frees it after. Both give the same bits
(tests/test_quant.py); this measures the time, and the memory the hold costs while a prefill runs (the layers' W in
the prefill dtype, `quant.held_bytes`). The Engine holds where this measured a gain: a bfloat16 prefill
(`EngineConfig.hold_weights`); it is measured here for both dtypes by wrapping the prefill of an engine that does not
hold itself (hold_weights=False) in the block.

Per (model, prefill dtype, length): one untimed prefill of each, then --repeats rounds, each timing a prefill with the
hold and one without, in alternating order; the result is each one's median with its min-max (`repeats.Spread`) and
the paired ratio held / unheld with its verdict (5% margin). A bfloat16 prefill is run only where this process has
bfloat16 dot products (elsewhere its matmuls are emulated: `core.cpu_paths.bf16_dot_products`). This machine is shared:
the ratio, paired round by round, is the number to read.

Serving (`serving` in the JSON, --serve-requests 0 skips it): a scheduler prefills a prompt a chunk at a time through
`Engine.extend` and decodes the running requests as one batch, and a batch wider than `quant.DECODE_ROWS` rows also
multiplies by a dequantised W. `Scheduler.run` holds the weights for the whole run (`EngineExecutor.session`, where
the Engine would hold: `Engine.holding_weights`). Here one burst of --serve-requests distinct prompts of
--serve-prompt tokens, each generating --serve-new tokens, runs under the "chunked" policy with every request in one
batch (max_batch = the requests, batch_tokens = the chunk), on an engine that does not hold itself, with the whole run
inside `quant.held_weights` or not; per round the seconds of its prefill chunks and of its decode steps (the
executor's op log) and their sum, paired like the prefill's, and whether both runs gave every request the same
tokens (they must: the same bits). Results: benchmarks/results/held_weights.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

CHUNK = 512                            # the engine's prefill chunk (EngineConfig.chunk_size)
PARTS = ("chunks", "steps", "run")     # a served run's prefill chunks, its decode steps, and their sum


def held_and_unheld(run, rounds: int) -> dict[str, list]:
    """`repeats.both_ways` over `run(hold)` (a warm-up each way, then rounds, held first in even rounds):
    {"held": [...], "unheld": [...]} of what it returned, round by round."""
    from benchmarks import repeats
    held, unheld = repeats.both_ways(run, rounds)
    return {"held": held, "unheld": unheld}


def paired(held: list[float], unheld: list[float]) -> dict:
    """Each side's median [min-max] and the round-paired ratio held / unheld with its verdict (5% margin)."""
    from benchmarks import repeats
    ratio = repeats.paired_ratio(held, unheld)
    return {"held_s": repeats.spread(held).as_dict(), "unheld_s": repeats.spread(unheld).as_dict(),
            "held_vs_unheld": {**ratio.as_dict(), "verdict": repeats.verdict(ratio)}}


def case(model, name: str, prefill: str, ids: list[int], args) -> dict:
    import torch

    import sparsekv as sk
    from sparsekv.model import quant
    quant.set_prefill(model, prefill)
    eng = sk.Engine(model, block_size=16, num_blocks=len(ids) // 16 + 96, chunk_size=args.chunk, progress=False,
                    kv_dtype=torch.bfloat16, hold_weights=False)
    held = []

    def run(hold: bool) -> float:
        seq = eng.new_sequence()
        with quant.held_weights(model) if hold else contextlib.nullcontext():
            t0 = time.perf_counter()
            eng.prefill(seq, ids)
            dt = time.perf_counter() - t0
            held.append(quant.held_bytes(model))                # before the block frees them
        eng.finish(seq)
        return dt
    times = held_and_unheld(run, args.repeats)
    out = {"model": name, "prefill": prefill, "length": len(ids), "chunks": -(-len(ids) // args.chunk),
           "held_bytes": max(held), **paired(times["held"], times["unheld"])}
    ratio = out["held_vs_unheld"]
    print(f"{name} {prefill} {len(ids):>6,}: held {out['held_s']['median']:.2f} s, unheld "
          f"{out['unheld_s']['median']:.2f} s, held / unheld {ratio['median']:.3f} [{ratio['lo']:.3f}-{ratio['hi']:.3f}] "
          f"{ratio['verdict']}; holds {out['held_bytes'] / 2**20:.0f} MiB while it runs", flush=True)
    return out


def serving_case(model, name: str, prefill: str, prompts: list[list[int]], args) -> dict:
    """One burst of `prompts` served with the weights held for the run and without (module docstring)."""
    import torch

    import sparsekv as sk
    from sparsekv.model import quant
    from sparsekv.serving.executors import EngineExecutor
    from sparsekv.serving.scheduler import Scheduler, SchedulerConfig
    from sparsekv.serving.trace import ServeRequest
    quant.set_prefill(model, prefill)
    blocks = 2 * sum(-(-(len(p) + args.serve_new) // 16) for p in prompts) + 16     # room: admission never waits
    eng = sk.Engine(model, block_size=16, num_blocks=blocks, chunk_size=args.chunk, progress=False,
                    kv_dtype=torch.bfloat16, hold_weights=False)
    reqs = [ServeRequest(i, f"prompt {i}", 0.0, torch.tensor(p, dtype=torch.int64), args.serve_new)
            for i, p in enumerate(prompts)]
    cfg = SchedulerConfig(policy="chunked", max_batch=len(prompts), batch_tokens=args.chunk)
    held, tokens, wide, preempted = [], [], [], []

    def run(hold: bool) -> dict[str, float]:
        ex = EngineExecutor(eng)
        with quant.held_weights(model) if hold else contextlib.nullcontext():
            res = Scheduler(ex, cfg).run(reqs)
            held.append(quant.held_bytes(model))                # before the block frees them
        tokens.append([r.tokens for r in res.records])
        preempted.append(res.preemptions)
        steps = [o for o in ex.ops if o.kind == "decode"]
        wide.append((sum(o.tokens > quant.DECODE_ROWS for o in steps), len(steps)))
        t = {k: sum(o.seconds for o in ex.ops if o.kind == kind) for k, kind in (("chunks", "prefill"),
                                                                                  ("steps", "decode"))}
        return {**t, "run": t["chunks"] + t["steps"]}
    times = held_and_unheld(run, args.repeats)
    out = {"model": name, "prefill": prefill, "requests": len(prompts), "prompt_tokens": len(prompts[0]),
           "new_tokens": args.serve_new, "policy": cfg.policy, "max_batch": cfg.max_batch,
           "batch_tokens": cfg.batch_tokens, "decode_steps": wide[-1][1], "decode_steps_wider": wide[-1][0],
           "decode_rows": quant.DECODE_ROWS, "preemptions": max(preempted), "held_bytes": max(held),
           "same_tokens": all(t == tokens[0] for t in tokens),
           **{k: paired([t[k] for t in times["held"]], [t[k] for t in times["unheld"]]) for k in PARTS}}
    print(f"{name} {prefill} serving {len(prompts)} x {len(prompts[0])} tokens, {args.serve_new} new: "
          + ", ".join(f"{k} held / unheld {out[k]['held_vs_unheld']['median']:.3f} "
                      f"[{out[k]['held_vs_unheld']['lo']:.3f}-{out[k]['held_vs_unheld']['hi']:.3f}] "
                      f"{out[k]['held_vs_unheld']['verdict']}" for k in PARTS)
          + f"; {out['decode_steps_wider']} of {out['decode_steps']} decode steps wider than {quant.DECODE_ROWS} rows;"
          f" same tokens: {out['same_tokens']}", flush=True)
    return out


def measure(args) -> dict:
    import torch

    import sparsekv as sk
    from benchmarks.bench_vs_llamacpp import model_file, prompt_ids
    from sparsekv.core.cpu_paths import bf16_dot_products
    from sparsekv.suite import cpuconfig
    torch.set_num_threads(args.threads)
    prefills = [p for p in args.prefills if p == "float32" or bf16_dot_products()]
    skipped = sorted(set(args.prefills) - set(prefills))
    cases, serving = [], []
    for name in args.models:
        path, _ = model_file(name, args.threads)
        tok = sk.load_tokenizer(path)
        model = sk.load_model(path, weights="gguf")
        for prefill in prefills:
            for n in args.lengths:
                cases.append(case(model, name, prefill, prompt_ids(tok, n), args))
        if args.serve_requests:
            n = args.serve_prompt                                   # BOS and distinct text: no shared prefix
            prompts = [prompt_ids(tok, n, skip=i * (n - 1)) for i in range(args.serve_requests)]
            for prefill in prefills:
                serving.append(serving_case(model, name, prefill, prompts, args))
    return {"date": str(date.today()), "cpu": cpuconfig.cpu_model(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "chunk": args.chunk, "repeats": args.repeats,
            "warmup": "one untimed prefill (or served run) with the hold and one without",
            "order": "alternating within a round (held first in even rounds)",
            "skipped_prefills": {p: "no bfloat16 dot products in this process" for p in skipped},
            "shared_machine": "yes: other developers' jobs share its 2 cores; read the paired ratio", "cases": cases,
            "serving": serving}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gemma3-270m"], choices=["gemma3-270m", "smollm2"])
    ap.add_argument("--lengths", nargs="*", type=int, default=[2048, 8192],
                    help="prefill lengths (none: serving only, e.g. into held_weights_serving.json)")
    ap.add_argument("--prefills", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    ap.add_argument("--chunk", type=int, default=CHUNK)
    ap.add_argument("--repeats", type=int, default=4, help="timed rounds (each times both engines)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serve-requests", type=int, default=24,
                    help="serving: prompts in one burst, all in one batch (0: skip serving)")
    ap.add_argument("--serve-prompt", type=int, default=512, help="serving: tokens per prompt")
    ap.add_argument("--serve-new", type=int, default=32, help="serving: tokens each request generates")
    ap.add_argument("--quick", action="store_true", help="SmolLM2 at 600 tokens in chunks of 256, float32, 2 rounds; "
                                                          "serving 18 prompts of 14 tokens (one chunk), 2 new")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/held_weights.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.lengths, args.prefills, args.chunk, args.repeats = ["smollm2"], [600], ["float32"], 256, 2
        args.serve_requests, args.serve_prompt, args.serve_new = 18, 14, 2
    if args.repeats < 2:
        ap.error(f"--repeats must be at least 2 (a paired ratio needs rounds to span), got {args.repeats}")
    if not args.lengths and not args.serve_requests:
        ap.error("nothing to measure: give --lengths or --serve-requests")
    if any(n < 2 for n in args.lengths):
        ap.error(f"--lengths must be at least 2 tokens each, got {args.lengths}")
    for flag, v, lo in (("--serve-requests", args.serve_requests, 0), ("--serve-prompt", args.serve_prompt, 1),
                        ("--serve-new", args.serve_new, 1)):
        if v < lo:
            ap.error(f"{flag} must be at least {lo}, got {v}")
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
