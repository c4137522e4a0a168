"""Gemma 3 270M at long context: sparsekv's engine against transformers, same weights, same token ids, same run.

    python -m benchmarks.bench_gemma_speed                  # 8k, 16k and 32k tokens of real prose
    python -m benchmarks.bench_gemma_speed --quick          # 1k and 2k (a smoke run)

The three numbers long-context serving is judged by, for each system at each length:
  TTFT   wall time of the prefill that returns the first token's logits, in chunks of `--chunk` (512) tokens on
         both sides (transformers: forwards with `logits_to_keep=1` into its own DynamicCache, whose sliding layers
         keep only their window, `DynamicSlidingWindowLayer`; sparsekv: `Engine.prefill`); `--repeats` timed
         prefills after an untimed one-chunk warm-up;
  TPOT   one untimed round, then `--repeats` rounds of `--steps` greedy decode steps (dense); a round's value is its
         steps' median. transformers decodes in each variant of `--hf-decode` (the dynamic cache; a StaticCache; a
         StaticCache with the forward under torch.compile, compiled in the untimed round), each recorded, and the
         fastest is the one compared; its attention implementation is recorded too;
  memory the process's peak RSS during the request and its RSS after loading the model (the peak is reset there, so
         the difference is what the request cost),
         and the K/V the cache holds at the end (sparsekv: its sliding groups hold only their windows; transformers
         5.2's DynamicCache for Gemma 3 keeps its sliding layers' last window too).
Each number is the median of the repeats with their min-max (`benchmarks.repeats`); the speed-ups' intervals span
the two systems' intervals' far ends, since they run in separate processes.
Each (system, length) runs in its own process, so peak RSS is that run's; the order alternates per length so drift
on this shared machine hits both. Both systems must produce the same greedy tokens (checked, reported).

Floors, measured in the same run (`benchmarks.floors`): a decode step must read the weights (float32) and the K/V its
attention reads, at the machine's measured read bandwidth; a prefill must do its FLOPs (2 per weight per token, plus
attention's: global layers over every earlier key, sliding layers over their window) at the faster of the measured
float32 and bfloat16 matmul rates. Each time is
reported as a multiple of its floor. Results go to benchmarks/results/gemma_speed.json and a figure beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

GGUF = ROOT / "data/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf"
SYSTEMS = ("sparsekv", "transformers")


def _status(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024                            # kB
    except OSError:
        pass
    return None


def start_request() -> int:
    """The resident set now, with the peak reset to it (Linux: `clear_refs` 5 resets VmHWM), so that the peak read
    at the end is the request's, not the model load's (loading the weights peaks higher than a short request)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """The process's peak resident set since `start_request` (VmHWM), or since it started where that is unknown."""
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def prompt_ids(tok, n: int) -> list[int]:
    """BOS, then n - 1 tokens of the suite's real prose (the same ids for both systems)."""
    from sparsekv.analysis import corpus
    return [tok.bos_token_id] + corpus.take(tok, corpus.haystack("prose"), n - 1)


class Rounds(NamedTuple):
    tpot: list[float]           # each timed round's median step, seconds
    tokens: list[int]           # every token fed, warm-up rounds included
    warmup_rounds: int          # untimed rounds run before the timed ones


def _rounds(step, first: int, steps: int, rounds: int, settle: int = 1) -> Rounds:
    """Untimed rounds, then `rounds` timed rounds of `steps` greedy steps through `step(tok) -> next token`.

    One untimed round, or (settle > 1, for a compiled forward that may recompile in its first steps) up to `settle`,
    stopping once a round's median is within 1.5x of the round before it."""
    tokens, tok = [], first

    def one_round() -> float:
        nonlocal tok
        secs = []
        for _ in range(steps):
            tokens.append(tok)
            t0 = time.perf_counter()
            tok = step(tok)
            secs.append(time.perf_counter() - t0)
        return statistics.median(secs)
    warm = [one_round()]
    while len(warm) < settle and not (len(warm) > 1 and warm[-1] < 1.5 * warm[-2] and warm[-2] < 1.5 * warm[-1]):
        warm.append(one_round())
    return Rounds([one_round() for _ in range(rounds)], tokens, len(warm))


def run_sparsekv(path: Path, ids: list[int], args) -> dict:
    import sparsekv as sk
    model = sk.load_model(path)
    base_rss = start_request()
    eng = sk.Engine(model, block_size=16, num_blocks=len(ids) // 16 + args.steps * (args.repeats + 1) // 16 + 64,
                    chunk_size=args.chunk, progress=False)
    warm = eng.new_sequence()                         # untimed: one chunk
    eng.prefill(warm, ids[:args.chunk])
    eng.finish(warm)
    ttft = []
    for r in range(args.repeats):
        seq = eng.new_sequence()
        t0 = time.perf_counter()
        eng.prefill(seq, ids)
        ttft.append(time.perf_counter() - t0)
        if r < args.repeats - 1:
            eng.finish(seq)
    first = int(eng.last_logits(seq).argmax())

    def step(t):
        eng.decode_batch([seq], router=None, sampler=lambda _lg, t=t: t)
        return int(eng.last_logits(seq).argmax())
    tpot, tokens, _ = _rounds(step, first, args.steps, args.repeats)
    return {"ttft_rounds_s": ttft, "tpot_rounds_s": tpot, "tokens": tokens, "base_rss": base_rss,
            "peak_rss": rss_bytes(), "kv_held": eng.store.sequence_bytes(seq),
            "kv_read_per_step": eng.stats(seq).steps[-1].kv_bytes, "settings": {"chunk": args.chunk}}


# transformers' decode variants: (cache class, torch.compile of the forward). Each prefills in chunks into its own
# cache (the sliding layers of both keep only their window: DynamicSlidingWindowLayer, StaticSlidingWindowLayer).
SETTLE = 5      # at most this many untimed decode rounds for a compiled forward (its first steps compile and recompile)
HF_DECODE = {"dynamic": ("DynamicCache", False), "static": ("StaticCache", False), "static+compile": ("StaticCache", True)}


def run_transformers(path: Path, ids: list[int], args) -> dict:
    """transformers at its best here: a chunked prefill (`--chunk` tokens a forward, as sparsekv's) into its own
    cache classes, then decode with each of `--hf-decode` (the default dynamic cache; a static cache; a static cache
    with the forward compiled by torch.compile, the compile in the untimed round). The prefill is timed with the
    dynamic cache; every variant's decode is recorded, and the fastest is the one compared."""
    import transformers
    from transformers import AutoModelForCausalLM

    from sparsekv.model.checkpoint import converted_folder
    hf = AutoModelForCausalLM.from_pretrained(str(converted_folder(path)), dtype=torch.float32).eval()
    base_rss = start_request()
    n, total = len(ids), len(ids) + args.steps * (args.repeats + SETTLE) + 1      # every round fits a static cache

    def prefill(cache) -> int:
        out = None
        for i in range(0, n, args.chunk):
            x = torch.tensor([ids[i:i + args.chunk]])
            out = hf(x, past_key_values=cache, use_cache=True, logits_to_keep=1,
                     cache_position=torch.arange(i, i + x.shape[1]))
        return int(out.logits[0, -1].argmax())

    def new_cache(kind: str):
        cls = getattr(transformers, HF_DECODE[kind][0])
        return cls(config=hf.config) if kind == "dynamic" else cls(config=hf.config, max_cache_len=total)

    res = {"settings": {"attn_implementation": hf.config._attn_implementation, "chunk": args.chunk,
                        "decode_variants": {k: {"cache": v[0], "torch_compile": v[1]} for k, v in HF_DECODE.items()
                                            if k in args.hf_decode}}}
    with torch.inference_mode():
        hf(torch.tensor([ids[:args.chunk]]), past_key_values=new_cache("dynamic"), use_cache=True,
           logits_to_keep=1)                                             # untimed warm-up: one chunk
        ttft = []
        for _ in range(args.repeats):
            cache = new_cache("dynamic")
            t0 = time.perf_counter()
            first = prefill(cache)
            ttft.append(time.perf_counter() - t0)
        res["ttft_rounds_s"] = ttft
        for kind in args.hf_decode:
            cache = cache if kind == "dynamic" else new_cache(kind)
            if kind != "dynamic":
                prefill(cache)
            fwd = torch.compile(hf.forward, dynamic=False) if HF_DECODE[kind][1] else hf.forward
            pos = [n]

            def step(t, cache=cache, fwd=fwd, pos=pos):
                out = fwd(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True,
                          cache_position=torch.tensor([pos[0]]))
                pos[0] += 1
                return int(out.logits[0, -1].argmax())
            t0 = time.perf_counter()
            tpot, tokens, warm = _rounds(step, first, args.steps, args.repeats, settle=SETTLE if HF_DECODE[kind][1] else 1)
            res[f"{kind}_tpot_rounds_s"], res[f"{kind}_tokens"], res[f"{kind}_warmup_rounds"] = tpot, tokens, warm
            res[f"{kind}_decode_wall_s"] = time.perf_counter() - t0          # with the compile, for the record
            if kind == "dynamic":
                res["kv_held"] = sum(t.numel() * t.element_size() for layer in cache.layers
                                     for t in (layer.keys, layer.values) if t is not None)
    best = min(args.hf_decode, key=lambda k: statistics.median(res[f"{k}_tpot_rounds_s"]))
    res.update(tpot_rounds_s=res[f"{best}_tpot_rounds_s"], tokens=res[f"{best}_tokens"], base_rss=base_rss,
               peak_rss=rss_bytes())
    res["settings"]["decode_compared"] = best
    return res


def worker(args) -> int:
    torch.set_num_threads(args.threads)
    import sparsekv as sk
    tok = sk.load_tokenizer(args.model)
    ids = prompt_ids(tok, args.length)
    fn = run_sparsekv if args.worker == "sparsekv" else run_transformers
    print("RESULT " + json.dumps(fn(args.model, ids, args)), flush=True)
    return 0


def prefill_flops(cfg, n: int) -> float:
    """The prefill's FLOPs (`floors.prefill_flops`)."""
    from benchmarks.floors import prefill_flops
    return prefill_flops(cfg, n)


def floors(cfg, n: int, rates, kv_read: int) -> dict:
    """Decode: the float32 weights and the K/V a step reads over the read bandwidth; prefill: FLOPs over the faster
    matmul rate (`benchmarks.floors`)."""
    from benchmarks import floors as fl
    from sparsekv.serving.gpu import param_count
    return {"prefill_floor_s": fl.prefill_floor_s(cfg, n, rates),
            "decode_floor_s": fl.decode_floor_s(param_count(cfg) * 4, kv_read, rates)}


def request_peak_mib(c: dict, system: str) -> float:
    """The request's peak resident set over the loaded model (MiB), or NaN where the measurement is invalid: a peak
    below the base plus the K/V the request held at its end cannot be (the reset of VmHWM failed, or the peak was
    read from the wrong process), and a figure must show it missing, never as 0."""
    peak, base, held = (c.get(f"{system}_{k}") for k in ("peak_rss", "base_rss", "kv_held"))
    if peak is None or base is None or peak - base < (held or 0):
        return float("nan")
    return (peak - base) / 2**20


def _speed_finding(cases: list[dict]) -> str:
    """The title's finding: each speed-up's full range over the lengths measured, as sparsekv's speed over
    transformers' (above 1x, sparsekv is faster)."""
    from benchmarks.repeats import span_text
    parts = []
    for key, what in (("prefill_speedup", "prefill"), ("decode_speedup", "dense decode")):
        xs = [c[key] for c in cases if key in c]
        if xs:
            parts.append(f"{what} at {span_text(xs)} transformers' speed")
    return "; ".join(parts) if parts else "transformers did not run"


def plot(cases: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sparsekv.suite import viz
    lengths = [c["length"] for c in cases]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"sparsekv": viz.COLORS[0], "transformers": viz.COLORS[1]}
    for s in SYSTEMS:
        ok = [c for c in cases if c.get(f"{s}_ttft_s")]
        xs = [c["length"] for c in ok]
        for a, k, scale in ((ax[0], "ttft", 1.0), (ax[1], "tpot", 1e3)):
            ys = [scale * c[f"{s}_{k}_s"] for c in ok]
            spread = [c.get(f"{s}_{k}") for c in ok]        # runs with repeats: the min-max of the timed rounds
            if all(spread) and ok:
                err = [[y - scale * sp["lo"] for y, sp in zip(ys, spread)],
                       [scale * sp["hi"] - y for y, sp in zip(ys, spread)]]
                a.errorbar(xs, ys, yerr=err, fmt="o", color=colors[s], capsize=3,
                           label=f"{s} (median, min-max of {spread[0]['n']} repeats)")
            else:
                a.plot(xs, ys, "o", color=colors[s], label=f"{s} (one run)")
        peak = [request_peak_mib(c, s) for c in ok]
        bad = sum(p != p for p in peak)
        ax[2].plot(xs, peak, "o", color=colors[s], label=f"{s}: peak RSS over the loaded model"
                   + (f"\n({bad} of {len(ok)} invalid: peak < base + K/V held; not drawn)" if bad else ""))
        ax[2].plot(xs, [c[f"{s}_kv_held"] / 2**20 for c in ok], "s", mfc="none", color=colors[s], label=f"{s}: K/V held")
    ax[0].plot(lengths, [c["prefill_floor_s"] for c in cases], "k:", label="floor (FLOPs / matmul rate)")
    ax[1].plot(lengths, [1e3 * c["decode_floor_s"] for c in cases], "k:", label="floor (bytes / bandwidth)")
    for a, (title, ylab) in zip(ax, (("TTFT (prefill)", "seconds"), ("TPOT (dense decode)", "ms per token"),
                                     ("memory of the request", "MiB"))):
        a.set(xscale="log", xlabel="prompt tokens", ylabel=ylab, title=title)
        viz.log_ticks(a, "x", lengths)
        viz.legend_below(a, ncol=1)
    fig.suptitle("Gemma 3 270M on this CPU, sparsekv against transformers on the same token ids: "
                 + _speed_finding(cases))
    viz.save(fig, path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    from benchmarks import repeats
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--steps", type=int, default=16, help="greedy decode steps per round")
    ap.add_argument("--repeats", type=int, default=3, help="timed prefills, and timed decode rounds after an untimed one")
    ap.add_argument("--hf-decode", nargs="+", default=list(HF_DECODE), choices=list(HF_DECODE),
                    help="transformers' decode variants (cache class, torch.compile); the fastest is compared")
    ap.add_argument("--run-kind", default="full run", help="recorded in the JSON (e.g. 'short verification run')")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model", type=Path, default=GGUF)
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds allowed for one (system, length) run")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gemma_speed.json")
    ap.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads is None:
        from sparsekv.suite import threads
        args.threads = threads.choose()
    if args.worker:
        return worker(args)
    if not args.model.exists():
        raise SystemExit(f"{args.model} is absent: run `python -m sparsekv fetch --model gemma3-270m`")
    if args.quick:
        args.lengths, args.steps = [1024, 2048], 4
    torch.set_num_threads(args.threads)
    import sparsekv as sk
    from benchmarks import floors as fl
    cfg = sk.load_model(args.model).config
    rates = fl.measure(5)
    print(f"this machine: read {rates.read_Bps / 1e9:.1f} GB/s, matmul {rates.f32_flops / 1e9:.0f} (float32) / "
          f"{rates.bf16_flops / 1e9:.0f} (bfloat16) GFLOP/s, {args.threads} threads", flush=True)
    cases = []
    for i, n in enumerate(args.lengths):
        case = {"length": n}
        order = args.systems if i % 2 == 0 else args.systems[::-1]
        for system in order:
            cmd = [sys.executable, "-m", "benchmarks.bench_gemma_speed", "--worker", system, "--length", str(n),
                   "--steps", str(args.steps), "--chunk", str(args.chunk), "--threads", str(args.threads),
                   "--model", str(args.model), "--repeats", str(args.repeats), "--hf-decode", *args.hf_decode]
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
            try:
                p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
                line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                if p.returncode or not line:
                    why = "killed (out of memory?)" if p.returncode in (-9, 137) else f"exit {p.returncode}"
                    case[f"{system}_failed"] = f"{why}: {p.stderr.strip().splitlines()[-1:] or ''}"
                    print(f"{system} at {n}: {case[f'{system}_failed']}", flush=True)
                    continue
                r = json.loads(line[0][len("RESULT "):])
            except subprocess.TimeoutExpired:
                case[f"{system}_failed"] = f"did not finish in {args.timeout:.0f} s"
                continue
            for k, v in r.items():
                case[f"{system}_{k}"] = v
            for k in ("ttft", "tpot"):               # the median of the rounds, and its spread (benchmarks.repeats)
                sp = repeats.spread(r[f"{k}_rounds_s"])
                case[f"{system}_{k}_s"], case[f"{system}_{k}"] = sp.median, sp.as_dict()
            print(f"{system} at {n}: TTFT {case[f'{system}_ttft_s']:.2f} s, TPOT {1e3 * case[f'{system}_tpot_s']:.1f} ms, "
                  f"peak RSS {r['peak_rss'] / 2**30:.2f} GiB, K/V held {r['kv_held'] / 2**20:.0f} MiB; {r['settings']}",
                  flush=True)
        kv_read = case.get("sparsekv_kv_read_per_step", 0)
        case.update(floors(cfg, n, rates, kv_read))
        if "sparsekv_ttft_s" in case:
            case["sparsekv_ttft_over_floor"] = case["sparsekv_ttft_s"] / case["prefill_floor_s"]
            case["sparsekv_tpot_over_floor"] = case["sparsekv_tpot_s"] / case["decode_floor_s"]
        if "sparsekv_ttft_s" in case and "transformers_ttft_s" in case:
            case["prefill_speedup"] = case["transformers_ttft_s"] / case["sparsekv_ttft_s"]
            case["decode_speedup"] = case["transformers_tpot_s"] / case["sparsekv_tpot_s"]
            for k in ("ttft", "tpot"):               # separate processes: not paired, the intervals' far ends
                ours, theirs = (repeats.Spread.from_dict(case[f"{who}_{k}"]) for who in ("sparsekv", "transformers"))
                sp = repeats.ratio_bounds(theirs, ours)                    # the speed-up: above 1, sparsekv is faster
                case[f"{'prefill' if k == 'ttft' else 'decode'}_speedup_interval"] = {
                    **sp.as_dict(), "verdict": repeats.verdict(repeats.ratio_bounds(ours, theirs))}   # sparsekv's
            a, b = case["sparsekv_tokens"], case["transformers_tokens"]     # a compiled variant may warm up longer:
            case["same_tokens"] = a[:len(b)] == b[:len(a)]                  # the same greedy path over the common steps
            case["transformers_tpot_over_floor"] = case["transformers_tpot_s"] / case["decode_floor_s"]
            case["transformers_ttft_over_floor"] = case["transformers_ttft_s"] / case["prefill_floor_s"]
            print(f"  prefill {case['prefill_speedup']:.2f}x, decode {case['decode_speedup']:.2f}x, "
                  f"same greedy tokens: {case['same_tokens']}", flush=True)
        cases.append(case)
    import transformers
    out = {"schema": 2, "run_kind": args.run_kind, "date": str(date.today()), "torch": torch.__version__,
           "transformers": transformers.__version__, "threads": args.threads, "model": args.model.name,
           "rss": "request peak (VmHWM reset after loading)", **rates.as_dict(), "matmul_flops": rates.flops,
           "steps": args.steps, "repeats": args.repeats, "interval": repeats.INTERVAL, "noise_margin": repeats.NOISE_MARGIN,
           "chunk": args.chunk, "hf_decode": args.hf_decode, "cases": cases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(cases, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    mismatched = [c["length"] for c in cases if c.get("same_tokens") is False]
    if mismatched:
        print(f"greedy tokens differ at {mismatched}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
