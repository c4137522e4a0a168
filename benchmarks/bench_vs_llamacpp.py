"""sparsekv against llama.cpp on the same GGUF file and the same token ids, in one process, interleaved.

    make bench-peers                                  # builds llama-cpp-python==0.3.36 from source (~4 min)
    python -m benchmarks.bench_vs_llamacpp            # SmolLM2 at 2k and 8k; Gemma 3 270M at 2k, 8k, 16k, 32k
    python -m benchmarks.bench_vs_llamacpp --models smollm2 --lengths 2048 --steps 8 --repeats 2   # a short run

For each (model, length), one process holds both engines on the same prompt: BOS and n - 1 tokens of the suite's
real prose, tokenized once by sparsekv (`load_tokenizer`) and fed to llama.cpp as ids.
  prefill  wall time of the prompt's forward (llama.cpp: `eval` in n_batch 512; sparsekv: `Engine.prefill`, chunks
           of 512), each once;
  TPOT     `--repeats` rounds, each `--steps` greedy steps of llama.cpp, then of sparsekv dense, then of sparsekv
           routed (`minmax`, a 128-token budget), each on its own continuation of the prompt (sparsekv forks the
           prefilled sequence; nothing is shared between the two routed and dense runs but the prompt's blocks);
           the first round is discarded as warm-up and the median of the rest reported. Both sides pick the
           argmax of the logits in Python and feed it back: the same work per step.
  floor    a step's bytes (its weights as held, and the K/V and summaries its attention reads) over the machine's
           read bandwidth, measured in the same run (`bench_cpu_decode.read_bandwidth`). llama.cpp's: the file's
           weight bytes, and 16-bit K/V over the same tokens as sparsekv's dense step.
sparsekv runs `load_model(path, weights="gguf", activations=..., prefill=...)` (the file's own codes, `sparsekv.model.quant`; by
default int8 activations into every decode matmul, as llama.cpp's own dot products take them: `--activations float32`
keeps them float; each case also times the lm_head alone both ways, and dense decode with float32 ones) with bfloat16 K/V
(llama.cpp keeps float16) and the summaries `minmax` reads (kmin, kmax), both at the same thread count; with that
store its decode step is one operator call per layer (`sparsekv.model.fused`), the profile's "after". Its prefill runs
in bfloat16 (matmuls and attention, float32 accumulation: `--prefill`, by default where the CPU has bfloat16 dot
products), as llama.cpp's own prefill matmuls round their activations to 8 bits.

Agreement, on held-out prose (`--agree-tokens` tokens, once per model): top-1 agreement and KL(llama.cpp || sparsekv)
of the next-token distributions at every position, for sparsekv's gguf and float32 modes; and greedy continuations
of 32 tokens from short prompts, the first position where each differs from llama.cpp's, and at that position each
side's logit gap between its own pick and the other's (a near tie there is a rounding difference, not a fault:
llama.cpp rounds the activations of its matmuls to 8 bits, sparsekv keeps them in float32 but in the
gguf-fused-int8 mode).
Results go to benchmarks/results/vs_llamacpp.json (rendered into docs/benchmarks.md by `benchmarks.report`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

LLAMA_CPP = "0.3.36"            # the llama-cpp-python version measured (Makefile: bench-peers)
MODELS = {"smollm2": ("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf", [2048, 8192]),
          "gemma3-270m": ("gemma-3-270m/gemma-3-270m-q4_k_m.gguf", [2048, 8192, 16384, 32768])}
BUDGET = 128                    # the routed run's token budget (minmax)
# llama.cpp at its fastest here: a sliding-window cache of the window only. This binding's default keeps a full-size
# one, which costs Gemma 3 dearly (measured here on 2026-12-01 at 16k: prefill 97.3 s and 50.2 ms per token, against
# 43.1 s and 23.1 ms with swa_full=False); SmolLM2 has no sliding layers, so the setting does not touch it.
LLAMA_SETTINGS = {"swa_full": False}
# The engines whose agreement with llama.cpp is measured: (label, weights, Engine keywords). "gguf" is the general
# decode path (per-layer Python), "gguf-fused" the one-call-per-layer step the speed cases time (`model.fused`: it
# needs the kmin/kmax-only store), "float32" the parity reference.
# "gguf-fused-int8" is the speed cases' engine with `--activations int8` (every decode matmul's input quantised to
# int8 first, as llama.cpp's are).
FUSED = {"summaries": ("kmin", "kmax"), "repr_keys": 0}
# "gguf-fused-int8-bf16" adds the speed cases' bfloat16 prefill where this run uses it (`--prefill`): the tokens it
# prefills (the first token of the teacher-forced text, the sink every later step attends to, and each greedy
# prompt) get their K/V through bfloat16 matmuls and attention, so its decode differs from "gguf-fused-int8" too.
AGREE_MODES = [("gguf", "gguf", "float32", {"fused_decode": False}, "float32"),
               ("gguf-fused", "gguf", "float32", FUSED, "float32"),
               ("gguf-fused-int8", "gguf", "int8", FUSED, "float32"),
               ("gguf-fused-int8-bf16", "gguf", "int8", FUSED, "bfloat16"),
               ("float32", "float32", "float32", {}, "float32")]


def native_bf16() -> bool:
    """Whether this CPU has bfloat16 dot products (AVX512_BF16 or AMX-BF16, as /proc/cpuinfo's flags name them),
    where torch's bfloat16 matmuls run several times float32's rate; elsewhere they are emulated and slower."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def bf16_kernel() -> bool:
    """Whether sparsekv's bfloat16 prefill attention runs in its own kernel here (`cpu/prefill_attn.cpp`), not SDPA."""
    from sparsekv.kernels import cpu_decode
    return cpu_decode.bf16_prefill_available()


def cpu_name() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it (runs differ in machine: docs/benchmarks.md says which)."""
    from sparsekv.suite.cpuconfig import cpu_model
    return cpu_model()


def prompt_ids(tok, n: int, kind: str = "prose", skip: int = 0) -> list[int]:
    """BOS, then n - 1 tokens of the suite's real text, from token `skip` on."""
    from sparsekv.analysis import corpus
    bos = tok.bos_token_id
    return ([bos] if bos is not None else []) + corpus.take(tok, corpus.haystack(kind), n - 1 + skip)[skip:]


class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level API: eval ids, read the last position's logits."""

    def __init__(self, path: Path, n_ctx: int, threads: int, logits_all: bool = False):
        from llama_cpp import Llama
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                         logits_all=logits_all, verbose=False, **LLAMA_SETTINGS)
        self.vocab = self.llm.n_vocab()

    def reset(self) -> None:
        self.llm.reset()          # n_tokens = 0: the next eval removes every cached position from 0 on

    def eval(self, ids: list[int]) -> None:
        self.llm.eval(ids)

    def last_logits(self) -> np.ndarray:
        import llama_cpp
        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab,)).copy()

    def all_logits(self, n: int) -> np.ndarray:
        """Logits of the last n positions evaluated [n, vocab] (needs logits_all)."""
        return np.asarray(self.llm.scores[self.llm.n_tokens - n:self.llm.n_tokens], dtype=np.float32)

    def step(self, tok: int) -> int:
        self.llm.eval([tok])
        return int(np.argmax(self.last_logits()))

    def weight_bytes(self, path: Path) -> int:
        from sparsekv.model.gguf_file import read_header
        return sum(t.n_bytes for t in read_header(path).tensors)


def time_steps(step, first: int, steps: int) -> tuple[list[float], int]:
    """`steps` greedy steps from token `first` through `step(tok) -> next`; (seconds of each, the next token)."""
    secs, tok = [], first
    for _ in range(steps):
        t0 = time.perf_counter()
        tok = step(tok)
        secs.append(time.perf_counter() - t0)
    return secs, tok


def lm_head_times(model, args) -> dict:
    """The lm_head's decode matmul alone, with float32 and with int8 activations, interleaved over `args.repeats`
    rounds of `args.steps` calls (the first round discarded): {activations: median seconds}. The same weights and
    input on both sides; the difference is the activations' width and the integer dot products."""
    from sparsekv.model import quant
    head = model.lm_head
    if not isinstance(head, quant.QuantLinear):
        return {}
    saved = head.activations
    x = torch.randn(1, head.in_features, generator=torch.Generator().manual_seed(0))
    secs = {a: [] for a in quant.ACTIVATIONS}
    try:
        for r in range(args.repeats):
            for a in quant.ACTIVATIONS:
                head.set_activations(a)
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    head(x)
                    if r:
                        secs[a].append(time.perf_counter() - t0)
    finally:
        head.set_activations(saved)
    return {a: statistics.median(v) for a, v in secs.items()}


def speed_case(name: str, path: Path, n: int, args, bw: float) -> dict:
    import sparsekv as sk
    from sparsekv.model import quant
    tok = sk.load_tokenizer(path)
    ids = prompt_ids(tok, n)
    ctx = n + args.steps * args.repeats + 64
    peer = LlamaCpp(path, ctx, args.threads)
    model = sk.load_model(path, weights="gguf", activations=args.activations, prefill=args.prefill)
    engine_kw = dict(block_size=16, num_blocks=ctx // 16 + 64, chunk_size=512, progress=False, kv_dtype=torch.bfloat16,
                     summaries=("kmin", "kmax"), repr_keys=0)                        # what minmax reads
    eng = sk.Engine(model, **engine_kw)
    seq = eng.new_sequence()
    case = {"model": name, "length": n, "activations": args.activations, "lm_head_s": lm_head_times(model, args)}
    t0 = time.perf_counter()
    peer.eval(ids)
    case["llamacpp_prefill_s"] = time.perf_counter() - t0
    if args.prefill != "float32":           # what the bfloat16 prefill buys, in the same run: a float32 one first
        quant.set_prefill(model, "float32")  # (the pool holds one sequence: it is freed before the timed one)
        other = eng.new_sequence()
        t0 = time.perf_counter()
        eng.prefill(other, ids)
        case["sparsekv_prefill_f32_s"] = time.perf_counter() - t0
        eng.finish(other)
        quant.set_prefill(model, args.prefill)
        if bf16_kernel():                   # ... and what the prefill attention kernel buys: the same with SDPA
            sdpa = sk.Engine(model, **engine_kw, prefill_backend="torch")
            other = sdpa.new_sequence()
            t0 = time.perf_counter()
            sdpa.prefill(other, ids)
            case["sparsekv_prefill_sdpa_s"] = time.perf_counter() - t0
            sdpa.finish(other)
            del sdpa
    t0 = time.perf_counter()
    logits = eng.prefill(seq, ids)
    case["sparsekv_prefill_s"] = time.perf_counter() - t0
    first_peer, first_ours = int(np.argmax(peer.last_logits())), int(logits.argmax())
    case["same_first_token"] = first_peer == first_ours
    router = sk.Router("minmax", token_budget=BUDGET)
    runs = {"dense": eng.fork(seq), "routed": eng.fork(seq), "dense_f32act": eng.fork(seq)}

    def ours(s, r):
        def step(t):
            eng.decode_batch([s], router=r, sampler=lambda _lg, t=t: t)
            return int(eng.last_logits(s).argmax())
        return step

    steppers = {"llamacpp": peer.step, "sparsekv_dense": ours(runs["dense"], None),
                "sparsekv_routed": ours(runs["routed"], router)}
    acts = dict.fromkeys(steppers, args.activations)
    if args.activations == "int8":          # what int8 activations buy, in the same run: dense with float32 ones
        steppers["sparsekv_dense_f32act"], acts["sparsekv_dense_f32act"] = ours(runs["dense_f32act"], None), "float32"
    nexts = {k: first_peer if k == "llamacpp" else first_ours for k in steppers}
    secs = {k: [] for k in steppers}
    tokens = {k: [] for k in steppers}
    for r in range(args.repeats):
        for k, step in steppers.items():
            quant.set_activations(model, acts[k])         # outside the clock; the fused step rebinds on its first step
            s, nexts[k] = time_steps(step, nexts[k], args.steps)
            if r:                                          # round 0 is warm-up
                secs[k] += s
            tokens[k].append(nexts[k])
    for k, s in secs.items():
        case[f"{k}_tpot_s"] = statistics.median(s)
    held = quant.weight_bytes(model)["total"]
    dense_step = eng.stats(runs["dense"]).steps[-1]
    routed_step = eng.stats(runs["routed"]).steps[-1]
    case.update(
        sparsekv_weight_bytes=held, llamacpp_weight_bytes=peer.weight_bytes(path),
        sparsekv_dense_kv_bytes=dense_step.kv_bytes + dense_step.route_bytes,
        sparsekv_routed_kv_bytes=routed_step.kv_bytes + routed_step.route_bytes,
        same_dense_tokens=tokens["llamacpp"] == tokens["sparsekv_dense"])
    case["sparsekv_dense_floor_s"] = (held + case["sparsekv_dense_kv_bytes"]) / bw
    case["sparsekv_routed_floor_s"] = (held + case["sparsekv_routed_kv_bytes"]) / bw
    case["llamacpp_floor_s"] = (case["llamacpp_weight_bytes"] + case["sparsekv_dense_kv_bytes"]) / bw
    for k in ("llamacpp", "sparsekv_dense", "sparsekv_routed"):
        case[f"{k}_over_floor"] = case[f"{k}_tpot_s"] / case[f"{k}_floor_s"]
    quant.set_activations(model, args.activations)
    case["dense_vs_llamacpp"] = case["sparsekv_dense_tpot_s"] / case["llamacpp_tpot_s"]
    case["routed_vs_llamacpp"] = case["sparsekv_routed_tpot_s"] / case["llamacpp_tpot_s"]
    case["prefill_vs_llamacpp"] = case["sparsekv_prefill_s"] / case["llamacpp_prefill_s"]
    del peer
    return case


def agreement(name: str, path: Path, args) -> dict:
    """Next-token agreement with llama.cpp over held-out prose, for both weights modes; greedy continuations."""
    import sparsekv as sk
    from sparsekv.analysis import corpus
    tok = sk.load_tokenizer(path)
    prose = tok(corpus.haystack("prose"), add_special_tokens=False)["input_ids"]
    start = len(prose) - args.agree_tokens - 24 * args.greedy_prompts           # the prose's tail: after every prompt
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    text = bos + prose[len(prose) - args.agree_tokens + 1:]
    peer = LlamaCpp(path, args.agree_tokens + 64, args.threads, logits_all=True)
    peer.eval(text)
    ref = torch.from_numpy(peer.all_logits(len(text))).double()                # [n, vocab]
    out = {"model": name, "tokens": len(text), "text_from_token": start}
    prompts = [bos + prose[start + 24 * i:start + 24 * i + 23] for i in range(args.greedy_prompts)]
    peer_tokens, peer_logits = [], []
    for p in prompts:
        peer.reset()
        peer.eval(p)
        lg = [peer.last_logits()]
        seq_t = [int(np.argmax(lg[-1]))]
        for _ in range(31):
            peer.eval([seq_t[-1]])
            lg.append(peer.last_logits())
            seq_t.append(int(np.argmax(lg[-1])))
        peer_tokens.append(seq_t)
        peer_logits.append(lg)
    for weights, mode, act, kw, prefill in AGREE_MODES:
        if prefill != "float32" and prefill != args.prefill:
            continue
        model = sk.load_model(path, weights=mode, activations=act, prefill=prefill)
        eng = sk.Engine(model, block_size=16, num_blocks=args.agree_tokens // 16 + 64, progress=False, **kw)
        seq = eng.new_sequence()
        eng.prefill(seq, text[:1])
        ours = torch.cat([eng.last_logits(seq)[None], eng.feed(seq, text[1:], router=None)]).double()   # [n, vocab]
        lp, lq = torch.log_softmax(ref, -1), torch.log_softmax(ours, -1)
        kl = (lp.exp() * (lp - lq)).sum(-1)
        out[f"{weights}_top1_agreement"] = float((ref.argmax(-1) == ours.argmax(-1)).double().mean())
        out[f"{weights}_kl_mean"] = float(kl.mean())
        out[f"{weights}_kl_p99"] = float(torch.quantile(kl, 0.99))
        firsts, margins = [], []
        for p, theirs, their_logits in zip(prompts, peer_tokens, peer_logits):
            s = eng.new_sequence()
            eng.prefill(s, p)
            seen = []
            mine = eng.decode(s, 32, router=None, sampler=lambda lg: seen.append(lg) or int(lg.argmax()))
            diff = [i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b]
            firsts.append(diff[0] if diff else 32)
            if diff:           # the cause: a near tie? each side's logit gap between its own pick and the other's
                i = diff[0]
                margins.append({"position": i, "ours": float(seen[i][mine[i]] - seen[i][theirs[i]]),
                                "llamacpp": float(their_logits[i][theirs[i]] - their_logits[i][mine[i]])})
            eng.finish(s)
        out[f"{weights}_greedy_first_divergence"] = firsts
        out[f"{weights}_divergence_margins"] = margins
        out[f"{weights}_greedy_identical"] = sum(f == 32 for f in firsts)
    out["greedy_prompts"] = len(prompts)
    return out


def verdict(out: dict) -> str:
    """One line from the numbers: per model, from which measured length routed (and dense) decode is no slower than
    llama.cpp's, and whether prefill is faster at every length."""
    parts = []
    for m in dict.fromkeys(c["model"] for c in out["cases"]):
        cs = [c for c in out["cases"] if c["model"] == m]
        said = []
        for key, name in (("routed", "routed"), ("dense", "dense")):
            ok = [c["length"] for c in cs if c[f"{key}_vs_llamacpp"] <= 1.0]
            said.append(f"{name} decode from {ok[0]:,} tokens" if ok and all(c[f"{key}_vs_llamacpp"] <= 1.0 for c in cs
                                                             if c["length"] >= ok[0]) else f"{name} decode at no length measured")
        pre = "prefill faster at every length" if all(c["prefill_vs_llamacpp"] < 1 for c in cs) else "prefill not always faster"
        parts.append(f"{m}: {', '.join(said)}; {pre}")
    return "\n".join(parts)


def plot(out: dict, path: Path) -> None:
    """TPOT against context for each model: llama.cpp, sparsekv dense and routed (markers at the lengths measured,
    no line drawn between them: nothing was measured there), and each one's byte floor (a model, dotted); the
    prefill times beside them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sparsekv.suite import viz
    models = list(dict.fromkeys(c["model"] for c in out["cases"]))
    fig, ax = plt.subplots(1, len(models) + 1, figsize=(5.6 * (len(models) + 1), 4.9), squeeze=False)
    ax = ax[0]
    series = (("llamacpp", "llama.cpp dense", viz.COLORS[1], "s"), ("sparsekv_dense", "sparsekv dense", viz.COLORS[0], "o"),
              ("sparsekv_routed", f"sparsekv minmax@{out['budget_tokens']}", viz.COLORS[2], "D"))
    for a, m in zip(ax, models):
        cs = [c for c in out["cases"] if c["model"] == m]
        xs = [c["length"] for c in cs]
        for key, label, color, marker in series:
            a.plot(xs, [1e3 * c[f"{key}_tpot_s"] for c in cs], marker, ls="none", ms=7, color=color, label=label)
            a.plot(xs, [1e3 * c[f"{key}_floor_s"] for c in cs], ":", color=color, lw=1)
        top = max(1e3 * c[f"{key}_{kind}_s"] for c in cs for key, *_ in series for kind in ("tpot", "floor"))
        a.set(xscale="log", xlabel="context (tokens)", ylabel="ms per token (median)", ylim=(0, 1.5 * top),
              title=f"{m}: decode (dotted: byte floors)")             # the headroom keeps the legend off the data
        viz.log_ticks(a, "x", xs)
        viz.legend_below(a, ncol=2)
    a = ax[-1]
    for m, fill in zip(models, ("full", "none", "left")):       # a model by the markers' fill, no joining lines
        cs = [c for c in out["cases"] if c["model"] == m]
        xs = [c["length"] for c in cs]
        a.plot(xs, [c["llamacpp_prefill_s"] for c in cs], "s", ls="none", ms=7, fillstyle=fill, color=viz.COLORS[1],
               label=f"{m}: llama.cpp")
        a.plot(xs, [c["sparsekv_prefill_s"] for c in cs], "o", ls="none", ms=7, fillstyle=fill, color=viz.COLORS[0],
               label=f"{m}: sparsekv")
    a.set(xscale="log", yscale="log", xlabel="prompt (tokens)", ylabel="prefill (s)", title="prefill, same token ids")
    viz.log_ticks(a, "x", sorted({c["length"] for c in out["cases"]}))
    viz.legend_below(a, ncol=2)
    fig.suptitle(f"sparsekv (the GGUF's own codes) against llama.cpp {out['llama_cpp_python']}, {out['threads']} "
                 f"threads on {out.get('cpu', 'an unrecorded CPU')}. No slower than llama.cpp:\n{verdict(out)}",
                 fontsize=11)
    viz.save(fig, path, dpi=120)
    plt.close(fig)


KERNEL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")       # and every sparsekv_cpu:: op: the step's compute


def overhead(path: Path, n: int, steps: int) -> list[dict]:
    """Where a dense decode step's time goes, before and after this benchmark's engine settings: wall TPOT (median
    of `steps`, no profiler), the time inside compute kernels (torch.profiler's self CPU time of the matmuls, qlinear,
    paged_decode and the fused step's decode_layer, per step), and the rest (Python and small torch ops) per layer."""
    import sparsekv as sk
    tok = sk.load_tokenizer(path)
    ids = prompt_ids(tok, n)
    rows = []
    minmax = dict(summaries=("kmin", "kmax"), repr_keys=0)
    configs = [("float32 weights, every summary", "float32", {}),
               ("gguf weights, every summary", "gguf", {}),
               ("gguf weights, kmin/kmax only, per-layer Python (before)", "gguf", dict(minmax, fused_decode=False)),
               ("gguf weights, kmin/kmax only, one call per layer (after)", "gguf", minmax)]
    for label, weights, store in configs:
        model = sk.load_model(path, weights=weights)
        eng = sk.Engine(model, block_size=16, num_blocks=n // 16 + 64, chunk_size=512, progress=False,
                        kv_dtype=torch.bfloat16, **store)
        seq = eng.new_sequence()
        eng.prefill(seq, ids)
        eng.decode(seq, 3, router=None)                                           # warm-up
        eng.decode(seq, steps, router=None)
        wall = statistics.median(st.seconds for st in eng.stats(seq).steps[-steps:])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            eng.decode(seq, steps, router=None)
        kernel = sum(e.self_cpu_time_total for e in prof.key_averages()
                     if e.key.startswith("sparsekv_cpu::") or e.key in KERNEL_OPS) / 1e6 / steps
        L = model.config.n_layers
        rows.append({"config": label, "tokens": n, "tpot_s": wall, "kernel_s": kernel,
                     "other_per_layer_us": 1e6 * (wall - kernel) / L, "layers": L})
        print(f"  {label}: TPOT {1e3 * wall:.1f} ms, kernels {1e3 * kernel:.1f} ms, the rest "
              f"{rows[-1]['other_per_layer_us']:.0f} us per layer", flush=True)
        del eng, model
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--lengths", type=int, nargs="+", default=None, help="override every model's lengths")
    ap.add_argument("--steps", type=int, default=8, help="greedy steps per round and engine")
    ap.add_argument("--repeats", type=int, default=4, help="rounds (the first is warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--agree-tokens", type=int, default=512)
    ap.add_argument("--greedy-prompts", type=int, default=4)
    ap.add_argument("--skip-agreement", action="store_true", help="speed only (a quick run)")
    ap.add_argument("--profile-tokens", type=int, default=2048, help="context of the overhead profile (SmolLM2)")
    ap.add_argument("--skip-profile", action="store_true", help="no overhead profile (a quick run)")
    ap.add_argument("--activations", default="int8", choices=["float32", "int8"],
                    help="sparsekv's activations before 8-bit tensors in the speed cases (load_model's)")
    ap.add_argument("--prefill", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="sparsekv's prefill matmuls and attention (load_model's prefill); auto: bfloat16 where the "
                         "CPU has bfloat16 dot products (native_bf16), else float32")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vs_llamacpp.json")
    args = ap.parse_args(argv)
    if args.prefill == "auto":
        args.prefill = "bfloat16" if native_bf16() else "float32"
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit("llama-cpp-python is not installed: run `make bench-peers` (builds it from source)")
    if llama_cpp.__version__ != LLAMA_CPP:
        print(f"warning: llama-cpp-python {llama_cpp.__version__}, measured and pinned: {LLAMA_CPP}", file=sys.stderr)
    torch.set_num_threads(args.threads)
    from benchmarks.bench_cpu_decode import read_bandwidth
    bw = read_bandwidth(5)
    print(f"this machine: read {bw / 1e9:.1f} GB/s, {args.threads} threads", flush=True)
    cases, agree, prof = [], [], []
    if "smollm2" in args.models and not args.skip_profile:
        print("overhead profile (SmolLM2, dense):", flush=True)
        prof = overhead(ROOT / "data" / "models" / MODELS["smollm2"][0], args.profile_tokens, 2 * args.steps)
    for name in args.models:
        rel, lengths = MODELS[name]
        path = ROOT / "data" / "models" / rel
        if not path.is_file():
            raise SystemExit(f"{path} is absent: run `make model`")
        if not args.skip_agreement:
            agree.append(agreement(name, path, args))
            print(json.dumps(agree[-1]), flush=True)
        for n in args.lengths or lengths:
            c = speed_case(name, path, n, args, bw)
            cases.append(c)
            print(f"{name} at {n}: prefill {c['sparsekv_prefill_s']:.1f} s vs llama.cpp {c['llamacpp_prefill_s']:.1f} s;"
                  f" TPOT dense {1e3 * c['sparsekv_dense_tpot_s']:.1f} ms, routed {1e3 * c['sparsekv_routed_tpot_s']:.1f}"
                  f" ms, llama.cpp {1e3 * c['llamacpp_tpot_s']:.1f} ms", flush=True)
    out = {"date": str(date.today()), "torch": torch.__version__, "llama_cpp_python": llama_cpp.__version__,
           "cpu": cpu_name(), "llama_cpp_features": llama_cpp.llama_print_system_info().decode().strip(" |"),
           "threads": args.threads, "llama_settings": LLAMA_SETTINGS, "read_bandwidth_Bps": bw, "steps": args.steps, "repeats": args.repeats,
           "budget_tokens": BUDGET, "activations": args.activations, "prefill": args.prefill,
           "prefill_attention": "kernel" if args.prefill == "bfloat16" and bf16_kernel() else "sdpa", "cases": cases,
           "agreement": agree, "overhead": prof}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(out, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
