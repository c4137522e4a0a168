"""Where the decode kernel stops paying: a batch of R rows through the kernel that reads a gguf model's codes in place
(`QuantLinear.codes_matmul`) against torch's matmul by the dequantised W held for a run (`quant.held_weights`).

    python -m benchmarks.bench_decode_rows                 # Gemma 3 270M and SmolLM2, both activations, 1-64 rows
    python -m benchmarks.bench_decode_rows --quick         # SmolLM2, float32 activations, 1 and 24 rows (tests)

`QuantLinear` sends up to `quant.DECODE_ROWS` (16) rows of x to the kernel and more to the matmul: a decode batch
wider than that multiplies by W dequantised to float32, which a scheduler's run holds (`Engine.holding_weights`). The
kernel reads 4-8 bits per weight and the matmul 32, but the kernel's work grows with the rows and the matmul's
barely does, so past some width the held W is faster. This measures where, per model and activations (int8 rows
quantised per 32 values, as llama.cpp's dot products take them, or float32), over the linear maps one decode step of
R sequences multiplies (`quant.step_linears`: each layer's projections, fused as the gguf mode fuses them, and the
lm_head).

Per (model, activations, R): one untimed call of each, then --repeats rounds, each timing both, in alternating order;
each one's median with its min-max, and the paired ratio kernel / held with its verdict (5% margin): "faster" where
the kernel wins. Results: benchmarks/results/decode_rows.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script from anywhere
    sys.path.insert(0, str(ROOT))


def case(layers, rows: int, repeats: int) -> dict:
    """Both paths over every layer in `layers` for x of `rows` rows (fresh normal values per layer)."""
    import torch
    import torch.nn.functional as F

    from benchmarks import repeats as rep
    xs = [torch.randn(rows, m.in_features) for m in layers]
    ws = [m.prefill_weight() for m in layers]                  # held: dequantised once, before any timing

    def run(codes: bool) -> float:
        """Every layer once: through the codes kernel, or the matmul by the held W."""
        t0 = time.perf_counter()
        for m, w, x in zip(layers, ws, xs):
            if codes:
                m.codes_matmul(x)
            else:
                F.linear(x, w, m.bias)
        return time.perf_counter() - t0
    kernel, held = rep.both_ways(run, repeats)                 # a warm-up each way, then alternating rounds
    ratio = rep.paired_ratio(kernel, held)
    return {"rows": rows, "kernel_s": rep.spread(kernel).as_dict(), "held_s": rep.spread(held).as_dict(),
            "kernel_vs_held": {**ratio.as_dict(), "verdict": rep.verdict(ratio)}}


def measure(args) -> dict:
    import torch

    import sparsekv as sk
    from benchmarks.bench_vs_llamacpp import model_file
    from sparsekv.kernels import cpu_decode
    from sparsekv.model import quant
    from sparsekv.suite import cpuconfig
    if not cpu_decode.available():
        raise SystemExit(f"the extension is unavailable: {cpu_decode.reason()}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = []
    for name in args.models:
        model = sk.load_model(model_file(name, args.threads)[0], weights="gguf")
        quant.set_prefill(model, "float32")
        layers = quant.step_linears(model)                    # a fused layer's parts are modules too: not twice
        with quant.held_weights(model):
            for act in args.activations:
                quant.set_activations(model, act)
                cases = [case(layers, r, args.repeats) for r in args.rows]
                slower = [c["rows"] for c in cases if c["kernel_vs_held"]["verdict"] == "slower"]
                out.append({"model": name, "activations": act, "linears": len(layers),
                            "int8_layers": sum(m.int8_activations for m in layers),
                            "weight_bytes_codes": sum(m.codes.numel() * m.codes.element_size() for m in layers),
                            "weight_bytes_held": quant.held_bytes(model), "cases": cases,
                            "first_rows_kernel_slower": min(slower) if slower else None})
                for c in cases:
                    r = c["kernel_vs_held"]
                    print(f"{name} {act:>7s} {c['rows']:>3} rows: kernel {c['kernel_s']['median'] * 1e3:7.2f} ms, "
                          f"held W {c['held_s']['median'] * 1e3:7.2f} ms, kernel / held {r['median']:.2f} "
                          f"[{r['lo']:.2f}-{r['hi']:.2f}] {r['verdict']}", flush=True)
        del model
    return {"date": str(date.today()), "cpu": cpuconfig.cpu_model(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "repeats": args.repeats, "decode_rows": quant.DECODE_ROWS,
            "warmup": "one untimed call of each", "order": "alternating within a round (kernel first in even rounds)",
            "shared_machine": "yes: other developers' jobs share its 2 cores; read the paired ratio", "runs": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2"], choices=["gemma3-270m", "smollm2"])
    ap.add_argument("--activations", nargs="+", default=["int8", "float32"], choices=["int8", "float32"])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 4, 8, 12, 16, 20, 24, 32, 48, 64])
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (each times both paths)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="SmolLM2, float32 activations, 1 and 24 rows, 2 rounds")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/decode_rows.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.activations, args.rows, args.repeats = ["smollm2"], ["float32"], [1, 24], 2
    if args.repeats < 2:
        ap.error(f"--repeats must be at least 2 (a paired ratio needs rounds to span), got {args.repeats}")
    if any(r < 1 for r in args.rows):
        ap.error(f"--rows must be at least 1 each, got {args.rows}")
    if args.threads < 1:
        ap.error(f"--threads must be at least 1, got {args.threads}")
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
