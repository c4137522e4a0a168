"""Gemma 3 270M at long context: sparsekv's engine against transformers, same weights, same token ids, same run.

    python -m benchmarks.bench_gemma_speed                  # 8k, 16k and 32k tokens of real prose
    python -m benchmarks.bench_gemma_speed --quick          # 1k and 2k (a smoke run)

The three numbers long-context serving is judged by, for each system at each length:
  TTFT   wall time of the prefill that returns the first token's logits (transformers: one forward with
         `logits_to_keep=1`, its default attention (SDPA); sparsekv: `Engine.prefill`, chunks of 512);
  TPOT   median wall time of the next `--steps` greedy decode steps (dense), after one warm-up step;
  memory the process's peak RSS during the request and its RSS after loading the model (the peak is reset there, so
         the difference is what the request cost),
         and the K/V the cache holds at the end (sparsekv: its sliding groups hold only their windows; transformers
         5.2's DynamicCache for Gemma 3 keeps its sliding layers' last window too).
Each (system, length) runs in its own process, so peak RSS is that run's; the order alternates per length so drift
on this shared machine hits both. Both systems must produce the same greedy tokens (checked, reported).

Floors, measured in the same run: a decode step must read the weights (float32) and the K/V its attention reads,
at the machine's measured read bandwidth; a prefill must do its FLOPs (2 per weight per token, plus attention's:
global layers over every earlier key, sliding layers over their window) at the measured matmul rate. Each time is
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


def run_sparsekv(path: Path, ids: list[int], steps: int, chunk: int) -> dict:
    import sparsekv as sk
    model = sk.load_model(path)
    base_rss = start_request()
    eng = sk.Engine(model, block_size=16, num_blocks=len(ids) // 16 + 64, chunk_size=chunk, progress=False)
    seq = eng.new_sequence()
    t0 = time.perf_counter()
    eng.prefill(seq, ids)
    ttft = time.perf_counter() - t0
    tokens = eng.decode(seq, steps + 1, router=None)
    secs = [s.seconds for s in eng.stats(seq).steps][1:]
    return {"ttft_s": ttft, "tpot_s": statistics.median(secs), "tokens": tokens, "base_rss": base_rss,
            "peak_rss": rss_bytes(), "kv_held": eng.store.sequence_bytes(seq),
            "kv_read_per_step": eng.stats(seq).steps[-1].kv_bytes}


def run_transformers(path: Path, ids: list[int], steps: int, chunk: int) -> dict:
    from transformers import AutoModelForCausalLM

    from sparsekv.model.checkpoint import converted_folder
    hf = AutoModelForCausalLM.from_pretrained(str(converted_folder(path)), dtype=torch.float32).eval()
    base_rss = start_request()
    x = torch.tensor([ids])
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = hf(x, use_cache=True, logits_to_keep=1)
        ttft = time.perf_counter() - t0
        cache, tokens, secs = out.past_key_values, [], []
        tok = int(out.logits[0, -1].argmax())
        for _ in range(steps + 1):
            tokens.append(tok)
            t0 = time.perf_counter()
            out = hf(torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            secs.append(time.perf_counter() - t0)
            cache, tok = out.past_key_values, int(out.logits[0, -1].argmax())
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)
    return {"ttft_s": ttft, "tpot_s": statistics.median(secs[1:]), "tokens": tokens, "base_rss": base_rss,
            "peak_rss": rss_bytes(), "kv_held": held}


def worker(args) -> int:
    torch.set_num_threads(args.threads)
    import sparsekv as sk
    tok = sk.load_tokenizer(args.model)
    ids = prompt_ids(tok, args.length)
    fn = run_sparsekv if args.worker == "sparsekv" else run_transformers
    print("RESULT " + json.dumps(fn(args.model, ids, args.steps, args.chunk)), flush=True)
    return 0


def prefill_flops(cfg, n: int) -> float:
    """2 FLOPs per non-embedding weight per token, the last token's LM head, and attention: 4 * Hq * D per (query,
    key) pair, over every earlier key in a global layer and over at most `window` keys in a sliding one."""
    from sparsekv.serving.gpu import param_count
    dense = 2 * (param_count(cfg) - cfg.vocab_size * cfg.dim) * n + 2 * cfg.vocab_size * cfg.dim
    pairs = 0
    for w in cfg.layer_windows:
        pairs += n * (n + 1) // 2 if not w else sum(min(i + 1, w) for i in range(n))
    return dense + 4 * cfg.n_heads * cfg.head_dim * pairs


def floors(cfg, n: int, bw: float, rate: float, kv_read: int) -> dict:
    from sparsekv.serving.gpu import param_count
    return {"prefill_floor_s": prefill_flops(cfg, n) / rate,
            "decode_floor_s": (param_count(cfg) * 4 + kv_read) / bw}


def request_peak_mib(c: dict, system: str) -> float:
    """The request's peak resident set over the loaded model (MiB), or NaN where the measurement is invalid: a peak
    below the base plus the K/V the request held at its end cannot be (the reset of VmHWM failed, or the peak was
    read from the wrong process), and a figure must show it missing, never as 0."""
    peak, base, held = (c.get(f"{system}_{k}") for k in ("peak_rss", "base_rss", "kv_held"))
    if peak is None or base is None or peak - base < (held or 0):
        return float("nan")
    return (peak - base) / 2**20


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
        ax[0].plot(xs, [c[f"{s}_ttft_s"] for c in ok], "o-", color=colors[s], label=s)
        ax[1].plot(xs, [1e3 * c[f"{s}_tpot_s"] for c in ok], "o-", color=colors[s], label=s)
        peak = [request_peak_mib(c, s) for c in ok]
        bad = sum(p != p for p in peak)
        ax[2].plot(xs, peak, "o-", color=colors[s], label=f"{s}: peak RSS over the loaded model"
                   + (f"\n({bad} of {len(ok)} invalid: peak < base + K/V held; not drawn)" if bad else ""))
        ax[2].plot(xs, [c[f"{s}_kv_held"] / 2**20 for c in ok], "s--", color=colors[s], label=f"{s}: K/V held")
    ax[0].plot(lengths, [c["prefill_floor_s"] for c in cases], "k:", label="floor (FLOPs / matmul rate)")
    ax[1].plot(lengths, [1e3 * c["decode_floor_s"] for c in cases], "k:", label="floor (bytes / bandwidth)")
    for a, (title, ylab) in zip(ax, (("TTFT (prefill)", "seconds"), ("TPOT (dense decode)", "ms per token"),
                                     ("memory of the request", "MiB"))):
        a.set(xscale="log", xlabel="prompt tokens", ylabel=ylab, title=title)
        viz.log_ticks(a, "x", lengths)
        viz.legend_below(a, ncol=1)
    speed = cases[-1].get("prefill_speedup")
    fig.suptitle("Gemma 3 270M on this CPU: sparsekv against transformers, same token ids"
                 + (f" (prefill {speed:.1f}x at {lengths[-1]:,} tokens)" if speed else ""))
    viz.save(fig, path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--steps", type=int, default=16)
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
    from benchmarks.bench_cpu_decode import peak_rate, read_bandwidth
    cfg = sk.load_model(args.model).config
    bw, rate = read_bandwidth(5), peak_rate(5)
    print(f"this machine: read {bw / 1e9:.1f} GB/s, matmul {rate / 1e9:.0f} GFLOP/s, {args.threads} threads", flush=True)
    cases = []
    for i, n in enumerate(args.lengths):
        case = {"length": n}
        order = args.systems if i % 2 == 0 else args.systems[::-1]
        for system in order:
            cmd = [sys.executable, "-m", "benchmarks.bench_gemma_speed", "--worker", system, "--length", str(n),
                   "--steps", str(args.steps), "--chunk", str(args.chunk), "--threads", str(args.threads),
                   "--model", str(args.model)]
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
            print(f"{system} at {n}: TTFT {r['ttft_s']:.1f} s, TPOT {1e3 * r['tpot_s']:.0f} ms, peak RSS "
                  f"{r['peak_rss'] / 2**30:.2f} GiB, K/V held {r['kv_held'] / 2**20:.0f} MiB", flush=True)
        kv_read = case.get("sparsekv_kv_read_per_step", 0)
        case.update(floors(cfg, n, bw, rate, kv_read))
        if "sparsekv_ttft_s" in case:
            case["sparsekv_ttft_over_floor"] = case["sparsekv_ttft_s"] / case["prefill_floor_s"]
            case["sparsekv_tpot_over_floor"] = case["sparsekv_tpot_s"] / case["decode_floor_s"]
        if "sparsekv_ttft_s" in case and "transformers_ttft_s" in case:
            case["prefill_speedup"] = case["transformers_ttft_s"] / case["sparsekv_ttft_s"]
            case["decode_speedup"] = case["transformers_tpot_s"] / case["sparsekv_tpot_s"]
            case["same_tokens"] = case["sparsekv_tokens"] == case["transformers_tokens"]
            case["transformers_tpot_over_floor"] = case["transformers_tpot_s"] / case["decode_floor_s"]
            print(f"  prefill {case['prefill_speedup']:.2f}x, decode {case['decode_speedup']:.2f}x, "
                  f"same greedy tokens: {case['same_tokens']}", flush=True)
        cases.append(case)
    import transformers
    out = {"date": str(date.today()), "torch": torch.__version__, "transformers": transformers.__version__,
           "threads": args.threads, "model": args.model.name, "rss": "request peak (VmHWM reset after loading)",
           "read_bandwidth_Bps": bw, "matmul_flops": rate, "steps": args.steps, "chunk": args.chunk, "cases": cases}
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
