"""Why two engines' first greedy tokens differ after a long prompt: a near tie broken differently, or a fault.

    python -m benchmarks.bench_first_token --model gemma3-270m --length 32768      # about 6 minutes on 2 cores

`bench_vs_llamacpp` found sparsekv's and llama.cpp's first greedy tokens different after Gemma 3 270M's 32,768-token
prompt (`same_first_token` false; they agree at 2k to 16k). This prefills the same ids (`bench_vs_llamacpp.prompt_ids`)
in llama.cpp's exact configurations (`--llama-configs`) and in sparsekv with its bfloat16 prefill (the speed run's)
and its float32 one, and records for each sparsekv prefill against each configuration both picks, each side's
logit gap between its own pick and the other's, and the KL of the two next-token distributions
(`bench_vs_llamacpp.first_token_gaps`); and the same between llama.cpp's configurations. A gap far below the logits'
spread across configurations of one engine is a tie that rounding breaks either way. Results: one JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def main(argv=None) -> int:
    from benchmarks.bench_vs_llamacpp import MODELS, cpu_name, first_token_gaps, model_file, prompt_ids
    from benchmarks.llama_peer import CONFIGS, LlamaCpp
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m", choices=list(MODELS))
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-configs", nargs="+", default=["fa0-f16", "fa1-f16"],
                    choices=[c for c in CONFIGS if CONFIGS[c].exact])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.length < 2:
        ap.error(f"--length must be at least 2, got {args.length}")
    import llama_cpp

    import sparsekv as sk
    torch.set_num_threads(args.threads)
    path, file = model_file(args.model, args.threads)
    tok = sk.load_tokenizer(path)
    ids = prompt_ids(tok, args.length)
    theirs = {}
    for c in args.llama_configs:                  # one context at a time: each holds its own K/V
        peer = LlamaCpp(path, args.length + 64, args.threads, CONFIGS[c])
        peer.eval(ids)
        theirs[c] = torch.from_numpy(peer.last_logits()).float()
        del peer
        print(f"llama.cpp {c}: picks {int(theirs[c].argmax())}", flush=True)
    ours = {}
    for prefill in ("bfloat16", "float32"):
        model = sk.load_model(path, weights="gguf", activations="int8", prefill=prefill)
        eng = sk.Engine(model, block_size=16, num_blocks=args.length // 16 + 64, chunk_size=512, progress=False,
                        kv_dtype=torch.bfloat16)
        seq = eng.new_sequence()
        eng.prefill(seq, ids)
        ours[prefill] = eng.last_logits(seq).float().flatten()
        eng.finish(seq)
        del eng, model
        print(f"sparsekv, {prefill} prefill: picks {int(ours[prefill].argmax())}", flush=True)
    out = {"date": str(date.today()), "cpu": cpu_name(), "torch": torch.__version__,
           "llama_cpp_python": llama_cpp.__version__, "model": args.model, "file": file, "length": args.length,
           "threads": args.threads,
           "sparsekv": {p: first_token_gaps(lg, theirs) for p, lg in ours.items()},
           "sparsekv_bf16_vs_f32": first_token_gaps(ours["bfloat16"], {"float32": ours["float32"]}),
           "llamacpp": {c: first_token_gaps(theirs[c], {d: theirs[d] for d in theirs if d != c}) for c in theirs}}
    path_out = args.out or ROOT / "benchmarks" / "results" / f"first_token_{args.model}_{args.length}.json"
    path_out.parent.mkdir(parents=True, exist_ok=True)
    path_out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("sparsekv", "sparsekv_bf16_vs_f32", "llamacpp")}, indent=1))
    print(f"wrote {path_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
