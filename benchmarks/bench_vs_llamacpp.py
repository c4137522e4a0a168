"""sparsekv against llama.cpp on the same GGUF file and the same token ids, in one process, interleaved.

    make bench-peers                                  # builds llama-cpp-python==0.3.36 from source (~4 min)
    python -m benchmarks.bench_vs_llamacpp            # SmolLM2 (Q4_1 and Q8_0) at 2k and 8k; Gemma 3 270M at 2k-32k
    python -m benchmarks.bench_vs_llamacpp --models smollm2-q8_0 --lengths 512 --steps 4 --repeats 3 \
        --skip-agreement --skip-profile --run-kind "short verification run" --out build/vs.json   # a short run
    make bench-peers-avx2 && python -m benchmarks.bench_vs_llamacpp --cpu alt ...   # this CPU as an AVX2 machine

`--cpu alt` measures both engines' AVX2 paths on any CPU with AVX2 and FMA: sparsekv under `suite.cpuconfig`'s
"avx2" environment (ATen's AVX2 kernels, oneDNN and MKL capped at AVX2, the extension built for x86-64-v3, so a
float32 prefill and no bfloat16 dot products; on an AVX2-only CPU, the paths "native" takes) at `--threads`, and
llama.cpp built without AVX-512 into build/llama-avx2. It
stands in for an AVX2-only machine's instruction set, not for its caches, clocks or memory: the JSON's `cpu_config`
says what was forced, and the report labels the run.

Every peer at its best, its settings recorded. llama.cpp runs in each configuration of `--llama-configs`
(`llama_peer.CONFIGS`: flash attention off and on, K/V f16 and bf16, and q8_0 as a lossy peer of its own), one
context each, with n_batch = n_ubatch = 512 and a sliding-window cache of the window only; each configuration's
settings go into the JSON beside its numbers. SmolLM2 runs as shipped (Q4_1, which llama.cpp's fast CPU matmuls do
not cover) and requantised to Q8_0 (which they do), made reproducibly from the shipped file (sha256 recorded).

For each (model, length), one process holds every engine on the same prompt: BOS and n - 1 tokens of the suite's
real prose, tokenized once by sparsekv (`load_tokenizer`) and fed to llama.cpp as ids (`speed_case`):
  warm-up  untimed: every engine evaluates the whole prompt once, then `--quality-tokens` tokens of its continuation
           teacher-forced, which give, in this run, routed's quality against dense (sparsekv's) and each lossy
           llama.cpp configuration's against its exact reference: top-1 agreement and KL (mean, p99);
  prefill  `--repeats` (3) interleaved rounds, each evaluating the prompt in every engine (llama.cpp: `eval` after a
           reset, n_batch 512; sparsekv: `Engine.prefill`, chunks of 512; and its float32 and SDPA variants);
  TPOT     one untimed round, then `--repeats` rounds, each `--steps` greedy steps of every llama.cpp configuration,
           sparsekv dense and routed (`minmax`, a 128-token budget), on their own continuations of the prompt; a
           round's value is its steps' median. Both sides pick the argmax of the logits in Python and feed it back.
Every engine's number is the median over the rounds, with the rounds' min-max as its interval; ratios pair round r
with round r (`benchmarks.repeats`). The comparison: dense decode and prefill against llama.cpp's fastest exact
configuration (16-bit K/V), called faster or slower only past a 5% noise margin at the interval's nearer end; routed
decode against each lossy configuration (it reads fewer K/V bytes at a measured quality cost: both are recorded).
  floors   decode: a step's bytes (the weights as held, and the K/V and summaries it reads: sparsekv's from its
           step statistics, llama.cpp's from the K/V type over the same tokens) over the read bandwidth; prefill: its
           FLOPs over the faster of the float32 and bfloat16 matmul rates; both measured in the same run
           (`benchmarks.floors`). Every engine's time is also given over its floor.
sparsekv runs `load_model(path, weights="gguf", activations=..., prefill=...)` (the file's own codes, `sparsekv.model.quant`; by
default int8 activations into every decode matmul, as llama.cpp's own dot products take them: `--activations float32`
keeps them float; each case also times the lm_head alone both ways, and dense decode with float32 ones) with bfloat16 K/V
and the summaries `minmax` reads (kmin, kmax), both at the same thread count; with that
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
import os
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
          "smollm2-q8_0": ("derived/SmolLM2-135M-Instruct.Q8_0.gguf", [2048, 8192]),
          "gemma3-270m": ("gemma-3-270m/gemma-3-270m-q4_k_m.gguf", [2048, 8192, 16384, 32768])}
# SmolLM2 ships as Q4_1, a format neither llamafile's tinyBLAS nor ggml's repack accelerates; its Q8_0 requantisation
# (made on first use with llama.cpp's own quantiser, `llama_peer.requantize`) is one they do. Both are measured.
DERIVED = {"smollm2-q8_0": ("smollm2", "Q8_0")}
# The derived file's sha256 as made here on 2026-12-05 (llama-cpp-python 0.3.36; the same digest with 1 and 2 quantiser
# threads). A file that differs is measured, with a warning, and its own digest recorded.
DERIVED_SHA256 = {"smollm2-q8_0": "7b46609d11703c058397e5cfe4cc6e4b2508cb1eb4c80ddc472a5d421fbdb508"}
BUDGET = 128                    # the routed run's token budget (minmax)
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
    """Whether this process has bfloat16 dot products (`core.cpu_paths.bf16_dot_products`: the CPU's AVX512_BF16 or
    AMX-BF16, and oneDNN not capped below them, as `--cpu alt` caps it at AVX2): there torch's bfloat16 matmuls run
    several times float32's rate; elsewhere they are emulated and far slower."""
    from sparsekv.core.cpu_paths import bf16_dot_products
    return bf16_dot_products()


def prefill_path(model, engine) -> str:
    """What sparsekv's prefill attention runs in this run: `attention.decode.auto_prefill_path` for a chunk of this
    model's queries in its prefill dtype ("sdpa_amx", "bf16_prefill_kernel", "bf16_prefill_f32_kernel",
    "f32_prefill_kernel" or "sdpa")."""
    from sparsekv.attention import decode
    c = model.config
    store = getattr(engine.store, "main", engine.store)              # a hybrid store: its global group's
    return decode.auto_prefill_path(torch.zeros(1, c.n_heads, c.head_dim, dtype=model.prefill_dtype), store)


def other_prefill(path: str) -> tuple[str, str] | None:
    """The prefill attention this run also times, for what the engine's choice buys: (backend, results key). SDPA
    where "auto" takes a kernel (a float32 prefill's included); the extension's kernel where "auto" takes SDPA on AMX;
    None otherwise (SDPA where the extension has no kernel for the chunk)."""
    if path in ("bf16_prefill_kernel", "bf16_prefill_f32_kernel", "f32_prefill_kernel"):
        return "torch", "sdpa"
    if path == "sdpa_amx":
        return "cpp", "kernel"
    return None


def cpu_name() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it (runs differ in machine: docs/benchmarks.md says which)."""
    from sparsekv.suite.cpuconfig import cpu_model
    return cpu_model()


def first_token_gaps(ours: torch.Tensor, theirs: dict) -> dict:
    """Where the first greedy token after the prompt differs, whether it is a near tie: for each exact llama.cpp
    configuration c (theirs[c]: its logits over the vocabulary after the prompt, as ours are sparsekv's), both picks,
    each side's logit gap between its own pick and the other's (0 where they agree; a gap well under the logits'
    rounding across engines is a tie broken differently, not a fault), and KL(llama.cpp || sparsekv) of the two
    next-token distributions (nats)."""
    out = {"sparsekv": int(ours.argmax())}
    lo = torch.log_softmax(ours.double(), -1)
    for c, lg in theirs.items():
        a, b = out["sparsekv"], int(lg.argmax())
        lt = torch.log_softmax(lg.double(), -1)
        out[c] = {"token": b, "gap_sparsekv": float(ours[a] - ours[b]), "gap_llamacpp": float(lg[b] - lg[a]),
                  "kl": float((lt.exp() * (lt - lo)).sum())}
    return out


def _relative(path: Path) -> str:
    """`path` relative to the repository where it lies inside it (results name no machine's folders), else as is."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def cpu_label(out: dict) -> str:
    """A run's CPU for its figure: the model name, and "as an AVX2 machine" for a `--cpu alt` run."""
    cpu = out.get("cpu", "an unrecorded CPU")
    return cpu + (" as an AVX2 machine (--cpu alt)" if (out.get("cpu_config") or {}).get("name") == "alt" else "")


def prompt_ids(tok, n: int, kind: str = "prose", skip: int = 0) -> list[int]:
    """BOS, then n - 1 tokens of the suite's real text, from token `skip` on."""
    from sparsekv.analysis import corpus
    bos = tok.bos_token_id
    return ([bos] if bos is not None else []) + corpus.take(tok, corpus.haystack(kind), n - 1 + skip)[skip:]


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


def time_steps(step, first: int, steps: int) -> tuple[list[float], int]:
    """`steps` greedy steps from token `first` through `step(tok) -> next`; (seconds of each, the next token)."""
    secs, tok = [], first
    for _ in range(steps):
        t0 = time.perf_counter()
        tok = step(tok)
        secs.append(time.perf_counter() - t0)
    return secs, tok


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def quality(ref: torch.Tensor, other: torch.Tensor) -> dict:
    """Next-token agreement of two teacher-forced runs over the same text ([n, vocab] logits each): the share of
    positions whose argmax agrees, and KL(ref || other) in nats, mean and p99."""
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(other.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return {"top1_agreement": float((ref.argmax(-1) == other.argmax(-1)).double().mean()),
            "kl_mean": float(kl.mean()), "kl_p99": float(torch.quantile(kl, 0.99)), "positions": ref.shape[0]}


def speed_case(name: str, path: Path, n: int, args, rates) -> dict:
    """One (model, length): every llama.cpp configuration and sparsekv on the same ids, in one process.

    1. Warm-up, untimed, and quality: every engine evaluates the whole prompt once, then `--quality-tokens` tokens of
       the prompt's own continuation one at a time (teacher-forced); the logits give routed's quality against dense
       (sparsekv) and each llama.cpp configuration's against its reference (the first exact one), in this run.
    2. Prefill: `--repeats` rounds; in each, every llama.cpp configuration (reset, eval) and then sparsekv's prefills.
    3. Decode: one untimed round, then `--repeats` rounds of `--steps` greedy steps per engine, interleaved; a round's
       value is its steps' median.
    Every engine's value is the median of the rounds, with their min-max (`repeats.Spread`)."""
    import sparsekv as sk
    from benchmarks import floors, repeats
    from benchmarks.llama_peer import CONFIGS, LlamaCpp, weight_bytes
    from sparsekv.model import quant
    tok = sk.load_tokenizer(path)
    q = args.quality_tokens
    both = prompt_ids(tok, n + q)
    ids, text = both[:n], both[n:]                  # the prompt, and its continuation (teacher-forced)
    extra = args.steps * (args.repeats + 1) + q + 16
    ctx = n + extra + 64
    peers = {c: LlamaCpp(path, ctx, args.threads, CONFIGS[c]) for c in args.llama_configs}
    model = sk.load_model(path, weights="gguf", activations=args.activations, prefill=args.prefill)
    cfg = model.config
    engine_kw = dict(block_size=16, num_blocks=(n + 6 * extra) // 16 + 96, chunk_size=512, progress=False,
                     kv_dtype=torch.bfloat16, summaries=("kmin", "kmax"), repr_keys=0)            # what minmax reads
    eng = sk.Engine(model, **engine_kw)
    attn = prefill_path(model, eng)
    other = other_prefill(attn)
    alt = sk.Engine(model, **engine_kw, prefill_backend=other[0]) if other else None
    router = sk.Router("minmax", token_budget=BUDGET)
    case = {"model": name, "length": n, "activations": args.activations, "lm_head_s": lm_head_times(model, args),
            "llamacpp_settings": {c: p.settings() for c, p in peers.items()}}

    # 1. warm-up and quality (untimed)
    qual, ref_name = {}, next(c for c in peers if CONFIGS[c].exact)
    peer_logits = {}
    for c, p in peers.items():
        p.reset()
        p.eval(ids)
        peer_logits[c] = torch.from_numpy(p.teacher_forced(text))
    for c in peers:
        if c != ref_name:
            qual[f"llamacpp_{c}"] = quality(peer_logits[ref_name], peer_logits[c])
    seq = eng.new_sequence()
    eng.prefill(seq, ids)
    dense_q, routed_q = eng.fork(seq), eng.fork(seq)
    ours_dense = eng.feed(dense_q, text, router=None)
    qual["sparsekv_routed"] = quality(ours_dense, eng.feed(routed_q, text, router=router))
    for s in (dense_q, routed_q, seq):
        eng.finish(s)
    case["quality"] = {"reference": {"sparsekv_routed": "sparsekv_dense", **{k: f"llamacpp_{ref_name}" for k in qual
                                                                          if k.startswith("llamacpp_")}}, **qual}

    # 2. prefill, interleaved rounds
    pre = {f"llamacpp_{c}": [] for c in peers}
    pre.update({"sparsekv": [], **({"sparsekv_f32": []} if args.prefill != "float32" else {}),
                **({f"sparsekv_{other[1]}": []} if alt else {})})
    for r in range(args.repeats):
        for c, p in peers.items():
            p.reset()
            pre[f"llamacpp_{c}"].append(timed(lambda: p.eval(ids)))
        if args.prefill != "float32":        # what the bfloat16 prefill buys: a float32 one (the pool holds one
            quant.set_prefill(model, "float32")          # prefilled sequence at a time: each is freed before the next)
            s = eng.new_sequence()
            pre["sparsekv_f32"].append(timed(lambda: eng.prefill(s, ids)))
            eng.finish(s)
            quant.set_prefill(model, args.prefill)
        if alt is not None:                  # ... and what its prefill attention buys: the same with the other one
            s = alt.new_sequence()
            pre[f"sparsekv_{other[1]}"].append(timed(lambda: alt.prefill(s, ids)))
            alt.finish(s)
        seq = eng.new_sequence()
        pre["sparsekv"].append(timed(lambda: eng.prefill(seq, ids)))
        if r < args.repeats - 1:
            eng.finish(seq)                  # the last round's sequence is the one decode continues
    alt = None                               # its pool and model views go before decode
    last = {c: torch.from_numpy(p.last_logits()).float() for c, p in peers.items()}
    first = {c: int(lg.argmax()) for c, lg in last.items()}
    last_ours = eng.last_logits(seq).float().flatten()
    first_ours = int(last_ours.argmax())
    case["same_first_token"] = all(t == first_ours for c, t in first.items() if CONFIGS[c].exact)
    case["first_token"] = first_token_gaps(last_ours, {c: lg for c, lg in last.items() if CONFIGS[c].exact})

    # 3. decode, interleaved rounds after an untimed one
    runs = {"dense": eng.fork(seq), "routed": eng.fork(seq), "dense_f32act": eng.fork(seq)}

    def ours(s, rt):
        def step(t):
            eng.decode_batch([s], router=rt, sampler=lambda _lg, t=t: t)
            return int(eng.last_logits(s).argmax())
        return step

    steppers = {f"llamacpp_{c}": p.step for c, p in peers.items()}
    steppers.update({"sparsekv_dense": ours(runs["dense"], None), "sparsekv_routed": ours(runs["routed"], router)})
    acts = dict.fromkeys(steppers, args.activations)
    if args.activations == "int8":          # what int8 activations buy, in the same run: dense with float32 ones
        steppers["sparsekv_dense_f32act"], acts["sparsekv_dense_f32act"] = ours(runs["dense_f32act"], None), "float32"
    nexts = {k: first[k[len("llamacpp_"):]] if k.startswith("llamacpp_") else first_ours for k in steppers}
    dec = {k: [] for k in steppers}
    tokens = {k: [] for k in steppers}
    for r in range(args.repeats + 1):
        for k, step in steppers.items():
            quant.set_activations(model, acts[k])         # outside the clock; the fused step rebinds on its first step
            s, nexts[k] = time_steps(step, nexts[k], args.steps)
            if r:                                          # round 0 is the untimed warm-up
                dec[k].append(statistics.median(s))
            tokens[k].append(nexts[k])
    quant.set_activations(model, args.activations)

    # summaries: every engine's spread, the fastest exact llama.cpp configuration, paired ratios, floors
    S = {"prefill": {k: repeats.spread(v) for k, v in pre.items()},
         "tpot": {k: repeats.spread(v) for k, v in dec.items()}}
    exact = [f"llamacpp_{c}" for c in peers if CONFIGS[c].exact]
    lossy = [f"llamacpp_{c}" for c in peers if not CONFIGS[c].exact]
    best = {"prefill": repeats.fastest({k: S["prefill"][k] for k in exact}),
            "tpot": repeats.fastest({k: S["tpot"][k] for k in exact})}
    case["llamacpp_best_exact"] = {k: v[len("llamacpp_"):] for k, v in best.items()}
    held = quant.weight_bytes(model)["total"]
    dense_step, routed_step = eng.stats(runs["dense"]).steps[-1], eng.stats(runs["routed"]).steps[-1]
    peer_weights = weight_bytes(path)
    kv_read = {"sparsekv_dense": dense_step.kv_bytes + dense_step.route_bytes,
               "sparsekv_routed": routed_step.kv_bytes + routed_step.route_bytes,
               "sparsekv_dense_f32act": dense_step.kv_bytes + dense_step.route_bytes,
               **{f"llamacpp_{c}": floors.decode_kv_bytes(cfg, n, CONFIGS[c].kv_type) for c in peers}}
    decode_floor = {k: floors.decode_floor_s(peer_weights if k.startswith("llamacpp_") else held, kv_read[k], rates)
                    for k in dec}
    prefill_floor = floors.prefill_floor_s(cfg, n, rates)
    case.update(sparsekv_weight_bytes=held, llamacpp_weight_bytes=peer_weights, kv_read_per_step=kv_read,
                decode_floor_s=decode_floor, prefill_floor_s=prefill_floor,
                prefill_s={k: v.as_dict() for k, v in S["prefill"].items()},
                tpot_s={k: v.as_dict() for k, v in S["tpot"].items()},
                prefill_over_floor={k: v.scaled(1 / prefill_floor).as_dict() for k, v in S["prefill"].items()},
                tpot_over_floor={k: v.scaled(1 / decode_floor[k]).as_dict() for k, v in S["tpot"].items()},
                same_dense_tokens=tokens[best["tpot"]] == tokens["sparsekv_dense"])
    ratios = {"dense_vs_llamacpp": repeats.paired_ratio(dec["sparsekv_dense"], dec[best["tpot"]]),
              "prefill_vs_llamacpp": repeats.paired_ratio(pre["sparsekv"], pre[best["prefill"]]),
              "routed_vs_llamacpp_exact": repeats.paired_ratio(dec["sparsekv_routed"], dec[best["tpot"]])}
    for k in lossy:                          # routed against each lossy K/V type: the comparison at fewer bytes
        ratios[f"routed_vs_{k}"] = repeats.paired_ratio(dec["sparsekv_routed"], dec[k])
    if other:                                # the engine's prefill attention over the other, round with round
        ratios[f"prefill_vs_sparsekv_{other[1]}"] = repeats.paired_ratio(pre["sparsekv"], pre[f"sparsekv_{other[1]}"])
    case["ratios"] = {k: {**v.as_dict(), "verdict": repeats.verdict(v)} for k, v in ratios.items()}
    # the scalar keys of earlier results (medians), for readers of both
    case.update(llamacpp_tpot_s=S["tpot"][best["tpot"]].median, llamacpp_prefill_s=S["prefill"][best["prefill"]].median,
                sparsekv_prefill_s=S["prefill"]["sparsekv"].median,
                **{f"{k}_tpot_s": S["tpot"][k].median for k in ("sparsekv_dense", "sparsekv_routed", "sparsekv_dense_f32act")
                   if k in S["tpot"]},
                dense_vs_llamacpp=ratios["dense_vs_llamacpp"].median,
                prefill_vs_llamacpp=ratios["prefill_vs_llamacpp"].median)
    if "sparsekv_f32" in S["prefill"]:
        case["sparsekv_prefill_f32_s"] = S["prefill"]["sparsekv_f32"].median
    case["prefill_attention"] = attn
    for key in ("sdpa", "kernel"):
        if f"sparsekv_{key}" in S["prefill"]:
            case[f"sparsekv_prefill_{key}_s"] = S["prefill"][f"sparsekv_{key}"].median
    del peers
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
    from benchmarks.llama_peer import CONFIGS, LlamaCpp
    peer = LlamaCpp(path, args.agree_tokens + 64, args.threads, CONFIGS[args.agree_config], logits_all=True)
    peer.eval(text)
    ref = torch.from_numpy(peer.all_logits(len(text))).double()                # [n, vocab]
    out = {"model": name, "tokens": len(text), "text_from_token": start, "llamacpp_config": args.agree_config}
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
    """One line per model from the numbers. Results with intervals (`schema` 2): at each length, dense decode and
    prefill against llama.cpp's fastest exact configuration, and routed decode against each lossy one, each called
    faster, slower or a tie by `repeats.verdict` (the ratio's whole interval past 1 -/+ the noise margin), with the
    ratio's median and interval. Earlier results (one value per engine, no interval): from which measured length
    routed (and dense) decode is no slower than llama.cpp's, as they were first rendered."""
    if out.get("schema", 1) < 2:
        return _verdict_v1(out)
    parts = []
    for m in dict.fromkeys(c["model"] for c in out["cases"]):
        said = []
        for c in (c for c in out["cases"] if c["model"] == m):
            rs = c["ratios"]
            r = lambda k: f"{rs[k]['verdict']} ({rs[k]['median']:.2f}x, {rs[k]['lo']:.2f}-{rs[k]['hi']:.2f})"
            lossy = [k for k in rs if k.startswith("routed_vs_llamacpp_") and k != "routed_vs_llamacpp_exact"]
            said.append(f"at {c['length']:,}: dense decode {r('dense_vs_llamacpp')}, prefill {r('prefill_vs_llamacpp')}"
                        + "".join(f", routed vs {k[len('routed_vs_llamacpp_'):]} {r(k)}" for k in lossy))
        parts.append(f"{m}: " + "; ".join(said))
    return "\n".join(parts)


def _verdict_v1(out: dict) -> str:
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


def _plot_v1(out: dict, path: Path) -> None:
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
                 f"threads on {cpu_label(out)}. No slower than llama.cpp:\n{verdict(out)}",
                 fontsize=11)
    viz.save(fig, path, dpi=120)
    plt.close(fig)


def _plot_v2(out: dict, path: Path) -> None:
    """TPOT against context for each model: llama.cpp's fastest exact and fastest lossy configuration, sparsekv dense
    and routed (medians, bars: the repeats' min-max), each with its byte floor as a dash at each length; the prefill times beside them."""
    import textwrap

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import repeats
    from sparsekv.suite import viz
    models = list(dict.fromkeys(c["model"] for c in out["cases"]))
    fig, ax = plt.subplots(1, len(models) + 1, figsize=(5.6 * (len(models) + 1), 5.6), squeeze=False)
    ax = ax[0]

    def series(c):      # engine key in the case -> (label, colour)
        lossy = {k: v for k, v in c["tpot_s"].items() if k.startswith("llamacpp_") and not
                 c["llamacpp_settings"][k[len("llamacpp_"):]]["exact"]}
        out = {f"llamacpp_{c['llamacpp_best_exact']['tpot']}": ("llama.cpp, fastest exact", viz.COLORS[1])}
        if lossy:
            k = repeats.fastest({k: repeats.Spread.from_dict(v) for k, v in lossy.items()})
            out[k] = ("llama.cpp, fastest lossy K/V", viz.COLORS[3])
        out["sparsekv_dense"] = ("sparsekv dense", viz.COLORS[0])
        out["sparsekv_routed"] = (f"sparsekv minmax@{BUDGET}", viz.COLORS[2])
        return out

    for a, m in zip(ax, models):
        cs = [c for c in out["cases"] if c["model"] == m]
        xs = [c["length"] for c in cs]
        labels = {}
        for c in cs:
            for k, (label, color) in series(c).items():
                labels.setdefault(label, []).append((c["length"], c["tpot_s"][k], c["decode_floor_s"][k], color))
        top = 0.0
        for label, pts in labels.items():
            x = [p[0] for p in pts]
            med = [1e3 * p[1]["median"] for p in pts]
            err = [[1e3 * (p[1]["median"] - p[1]["lo"]) for p in pts], [1e3 * (p[1]["hi"] - p[1]["median"]) for p in pts]]
            a.errorbar(x, med, yerr=err, fmt="o", color=pts[0][3], label=label, capsize=3)
            a.plot(x, [1e3 * p[2] for p in pts], "_", ms=12, color=pts[0][3])   # floors: a dash at each length
            top = max(top, max(1e3 * p[1]["hi"] for p in pts))
        a.set(xscale="log", xlabel="context (tokens)", ylabel="ms per token (median; bars: min-max of repeats)",
              ylim=(0, 1.1 * top), title=f"{m}: decode (dashes: byte floors)")
        viz.log_ticks(a, "x", xs)
        a.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)   # below: clear of data
    a = ax[-1]
    for m, ls in zip(models, ("-", "--", ":", "-.")):
        cs = [c for c in out["cases"] if c["model"] == m]
        xs = [c["length"] for c in cs]
        for key, label, color in ((lambda c: f"llamacpp_{c['llamacpp_best_exact']['prefill']}", "llama.cpp (fastest exact)",
                                   viz.COLORS[1]), (lambda c: "sparsekv", "sparsekv", viz.COLORS[0])):
            s = [c["prefill_s"][key(c)] for c in cs]
            a.errorbar(xs, [v["median"] for v in s], yerr=[[v["median"] - v["lo"] for v in s], [v["hi"] - v["median"] for v in s]],
                       fmt=("s" if "llama" in label else "o"), color=color, label=f"{m}: {label}", capsize=3)
        a.plot(xs, [c["prefill_floor_s"] for c in cs], "_", ms=12, color="#555555")
    a.set(xscale="log", yscale="log", xlabel="prompt (tokens)", ylabel="prefill (s)",
          title="prefill, same token ids (grey dashes: FLOP floor)")
    viz.log_ticks(a, "x", sorted({c["length"] for c in out["cases"]}))
    viz.log_axis_plain(a, "y")
    a.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)   # below: clear of data

    from benchmarks.repeats import span_text

    def span(m, key):   # the range of a ratio's medians over the model's lengths (every length, never the best one)
        return span_text([c["ratios"][key]["median"] for c in out["cases"] if c["model"] == m])
    finding = "; ".join(f"{m}: prefill {span(m, 'prefill_vs_llamacpp')}, dense decode {span(m, 'dense_vs_llamacpp')} "
                        f"llama.cpp's fastest exact time" for m in models)
    setting = (f"sparsekv (the GGUF's own codes) against llama.cpp {out['llama_cpp_python']}, {out['threads']} "
               f"threads on {cpu_label(out)}" + (f" ({out['run_kind']})" if out.get("run_kind") else ""))
    width = int(fig.get_figwidth() * 13)                  # characters per line at fontsize 10, nothing clipped
    fig.suptitle("\n".join(textwrap.wrap(finding, width) + textwrap.wrap(setting, width)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(out: dict, path: Path) -> None:
    """The figure of a run: a run of this version (every configuration, repeats: `_plot_v2`) or a committed run of the
    first version (one configuration, one sample: `_plot_v1`), told apart by the cases' per-engine `tpot_s`."""
    (_plot_v2 if out["cases"] and isinstance(out["cases"][0].get("tpot_s"), dict) else _plot_v1)(out, path)



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


def model_file(name: str, threads: int) -> tuple[Path, dict]:
    """The GGUF file of a MODELS entry, made first where it is derived (requantised from a shipped file with
    llama.cpp's quantiser, `llama_peer.requantize`), and what the JSON records of it (path, sha256, provenance)."""
    from benchmarks.llama_peer import requantize, sha256
    rel = MODELS[name][0]
    path = ROOT / "data" / "models" / rel
    if name in DERIVED:
        src_name, ftype = DERIVED[name]
        src = ROOT / "data" / "models" / MODELS[src_name][0]
        if not src.is_file():
            raise SystemExit(f"{src} is absent: run `make model`")
        digest = requantize(src, path, ftype, threads)
        if digest != DERIVED_SHA256.get(name, digest):
            print(f"warning: {path.name} has sha256 {digest}, not the pinned {DERIVED_SHA256[name]}", file=sys.stderr)
        return path, {"path": rel, "sha256": digest, "derived_from": MODELS[src_name][0], "quantiser":
                      f"llama_model_quantize (llama-cpp-python {LLAMA_CPP}), ftype {ftype}, allow_requantize"}
    if not path.is_file():
        raise SystemExit(f"{path} is absent: run `make model`")
    return path, {"path": rel, "sha256": sha256(path)}


def main(argv=None) -> int:
    from benchmarks import floors, repeats
    from benchmarks.llama_peer import CONFIGS, DEFAULT_CONFIGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--lengths", type=int, nargs="+", default=None, help="override every model's lengths")
    ap.add_argument("--steps", type=int, default=8, help="greedy steps per round and engine")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds of every prefill and decode (after an untimed one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=list(CONFIGS),
                    help="llama.cpp configurations (llama_peer.CONFIGS: fa<0|1>-<K/V type>); at least one exact")
    ap.add_argument("--quality-tokens", type=int, default=64,
                    help="teacher-forced tokens after each prompt, for routed's (and lossy K/V's) quality in the run")
    ap.add_argument("--agree-tokens", type=int, default=512)
    ap.add_argument("--agree-config", default="fa1-f16", choices=list(CONFIGS),
                    help="the llama.cpp configuration sparsekv's agreement is measured against")
    ap.add_argument("--greedy-prompts", type=int, default=4)
    ap.add_argument("--skip-agreement", action="store_true", help="speed only (a quick run)")
    ap.add_argument("--profile-tokens", type=int, default=2048, help="context of the overhead profile (SmolLM2)")
    ap.add_argument("--skip-profile", action="store_true", help="no overhead profile (a quick run)")
    ap.add_argument("--activations", default="int8", choices=["float32", "int8"],
                    help="sparsekv's activations before 8-bit tensors in the speed cases (load_model's)")
    ap.add_argument("--prefill", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="sparsekv's prefill matmuls and attention (load_model's prefill); auto: bfloat16 where the "
                         "CPU has bfloat16 dot products (native_bf16), else float32")
    ap.add_argument("--cpu", default="native", choices=["native", "alt"],
                    help="native: this CPU as it is; alt: this CPU as an AVX2 machine runs it, both engines (sparsekv "
                         "under `suite.cpuconfig`'s alt environment at --threads, llama.cpp from --llama-path, a "
                         "build without AVX-512: `make bench-peers-avx2`)")
    ap.add_argument("--llama-path", type=Path, default=None,
                    help="a folder holding another llama_cpp package, imported first (--cpu alt: build/llama-avx2)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)    # already under --cpu's environment
    ap.add_argument("--run-kind", default="full run",
                    help="what this run is, recorded in the JSON and its figure (e.g. 'short verification run')")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vs_llamacpp.json")
    args = ap.parse_args(argv)
    if args.repeats < 2:
        ap.error(f"--repeats must be at least 2 (the first lm_head round is discarded as a warm-up), got {args.repeats}")
    if not any(CONFIGS[c].exact for c in args.llama_configs):
        ap.error("--llama-configs needs at least one exact (f16 or bf16) configuration")
    if args.cpu == "alt" and args.llama_path is None:
        args.llama_path = ROOT / "build" / "llama-avx2"
    if args.llama_path is not None and not (args.llama_path / "llama_cpp").is_dir():
        raise SystemExit(f"--llama-path: no llama_cpp package in {args.llama_path}"
                         + (" (build it: make bench-peers-avx2)" if args.cpu == "alt" else ""))
    if args.cpu == "alt" and not args.inner:
        # ATen reads ATEN_CPU_CAPABILITY and oneDNN its ISA cap when they load: the run goes on in a fresh process
        import subprocess

        from sparsekv.suite import cpuconfig
        env = {**os.environ, **cpuconfig.environment("avx2", threads=args.threads)}
        return subprocess.run([sys.executable, "-m", "benchmarks.bench_vs_llamacpp",
                               *(argv if argv is not None else sys.argv[1:]), "--inner"], env=env, cwd=ROOT).returncode
    if args.llama_path is not None:
        sys.path.insert(0, str(args.llama_path.resolve()))
    if args.prefill == "auto":
        args.prefill = "bfloat16" if native_bf16() else "float32"
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit("llama-cpp-python is not installed: run `make bench-peers` (builds it from source)")
    if args.llama_path is not None and Path(llama_cpp.__file__).resolve().parents[1] != args.llama_path.resolve():
        raise SystemExit(f"--llama-path: llama_cpp was imported from {llama_cpp.__file__}, not {args.llama_path}")
    if llama_cpp.__version__ != LLAMA_CPP:
        print(f"warning: llama-cpp-python {llama_cpp.__version__}, measured and pinned: {LLAMA_CPP}", file=sys.stderr)
    torch.set_num_threads(args.threads)
    rates = floors.measure(5, bf16=native_bf16())
    print(f"this machine: read {rates.read_Bps / 1e9:.1f} GB/s, matmul {rates.f32_flops / 1e9:.0f} (float32) / "
          f"{rates.bf16_flops / 1e9:.0f} (bfloat16) GFLOP/s, {args.threads} threads", flush=True)
    features = llama_cpp.llama_print_system_info().decode().strip(" |")
    if args.cpu == "alt" and "AVX512 = 1" in features:
        raise SystemExit(f"--cpu alt: {llama_cpp.__file__} was built with AVX-512 ({features}); build it for AVX2 "
                         "only: make bench-peers-avx2")
    from sparsekv.kernels import cpu_decode
    cpu_config = {"name": args.cpu, "aten": torch.backends.cpu.get_cpu_capability(),
                  "extension_arch": cpu_decode.arch() if cpu_decode.available() else None,
                  "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
                  "mkl_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS"),
                  "llama_cpp_path": _relative(Path(llama_cpp.__file__).parent)}
    files = {name: model_file(name, args.threads) for name in args.models}
    cases, agree, prof = [], [], []
    if "smollm2" in args.models and not args.skip_profile:
        print("overhead profile (SmolLM2, dense):", flush=True)
        prof = overhead(files["smollm2"][0], args.profile_tokens, 2 * args.steps)
    for name in args.models:
        path = files[name][0]
        if not args.skip_agreement:
            agree.append(agreement(name, path, args))
            print(json.dumps(agree[-1]), flush=True)
        for n in args.lengths or MODELS[name][1]:
            c = speed_case(name, path, n, args, rates)
            cases.append(c)
            r = c["ratios"]
            print(f"{name} at {n}: prefill {c['sparsekv_prefill_s']:.2f} s vs llama.cpp {c['llamacpp_prefill_s']:.2f} s "
                  f"({c['llamacpp_best_exact']['prefill']}); TPOT dense {1e3 * c['sparsekv_dense_tpot_s']:.2f} ms, routed "
                  f"{1e3 * c['sparsekv_routed_tpot_s']:.2f} ms, llama.cpp {1e3 * c['llamacpp_tpot_s']:.2f} ms "
                  f"({c['llamacpp_best_exact']['tpot']}); dense/llama.cpp {r['dense_vs_llamacpp']['median']:.2f}x "
                  f"[{r['dense_vs_llamacpp']['lo']:.2f}, {r['dense_vs_llamacpp']['hi']:.2f}] "
                  f"{r['dense_vs_llamacpp']['verdict']}", flush=True)
    out = {"schema": 2, "run_kind": args.run_kind, "date": str(date.today()), "torch": torch.__version__,
           "llama_cpp_python": llama_cpp.__version__, "cpu": cpu_name(), "cpu_config": cpu_config, "llama_cpp_features": features,
           "llama_cpp_amx": "AMX" in features, "threads": args.threads, "llama_configs": args.llama_configs,
           "llama_settings": {"swa_full": False, "n_batch": 512, "n_ubatch": 512},
           "files": {k: v[1] for k, v in files.items()}, **rates.as_dict(),
           "steps": args.steps, "repeats": args.repeats, "warmup": "one untimed full prompt eval (+ the quality "
           "tokens) per engine before the prefill rounds; one untimed decode round", "interval": repeats.INTERVAL,
           "noise_margin": repeats.NOISE_MARGIN, "quality_tokens": args.quality_tokens,
           "budget_tokens": BUDGET, "activations": args.activations, "prefill": args.prefill,
           "prefill_attention": cases[0]["prefill_attention"] if cases else "?", "cases": cases,
           "agreement": agree, "overhead": prof}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(out, args.out.with_suffix(".png"))
    print(verdict(out))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
