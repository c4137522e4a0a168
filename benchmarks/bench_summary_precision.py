"""Routing over bf16 summaries against float32 ones: selection overlap and attention mass, on probes and real keys.

    python -m benchmarks.bench_summary_precision            # needle probes at 16k tokens, and SmolLM2-135M on 4k real tokens
    python -m benchmarks.bench_summary_precision --quick    # smaller probes, 1k real tokens

Issue 17's goal for half-precision summaries: routing bytes at least halved, with selection recall against
float32 summaries >= 0.99 on the probes and on real keys. Both stores hold the same K/V; routers are the same
config on both (`studies.precision`). Real keys: SmolLM2-135M-Instruct (the GGUF file `make model` fetches)
decodes a few tokens after a prefix of real prose (the Python standard library's docstrings); at every step
and layer its query is routed over float32 and over bf16 summaries of that layer's keys. Results go to
benchmarks/results/summary_precision.json and figures/summary_precision.png.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sparsekv as sk  # noqa: E402
from sparsekv.analysis import corpus
from sparsekv.studies import precision  # noqa: E402

MODEL = ROOT / "data" / "models" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GOAL = 0.99


def summarise(rows: list[dict], keys=("router",)) -> list[dict]:
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, rs in groups.items():
        ov = [r["overlap"] for r in rs]
        row = dict(zip(keys, key), calls=len(rs), overlap_mean=statistics.fmean(ov), overlap_min=min(ov),
                   share_identical=sum(o == 1.0 for o in ov) / len(ov),
                   mass32=statistics.fmean(r["mass32"] for r in rs), mass16=statistics.fmean(r["mass16"] for r in rs),
                   bytes_ratio=rs[0]["bytes_ratio"])
        if "needle32" in rs[0]:
            row["needle32"] = sum(r["needle32"] for r in rs) / len(rs)
            row["needle16"] = sum(r["needle16"] for r in rs) / len(rs)
        out.append(row)
    return out


def plot(real_rows, probe_summary, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sparsekv.suite import viz
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    ax = axes[0]
    names = sorted({r["router"] for r in real_rows})
    worst = 1.0
    for i, name in enumerate(names):
        layers = sorted({r["layer"] for r in real_rows})
        per = [[r["overlap"] for r in real_rows if r["router"] == name and r["layer"] == L] for L in layers]
        mean = [statistics.fmean(p) for p in per]
        lo = [min(p) for p in per]
        worst = min(worst, *mean)
        color = viz.router_color(name)
        ax.plot(layers, mean, marker=viz.router_marker(name), ls=("-", "--", ":", "-.")[i % 4], color=color,
                label=f"{name} (mean over steps)")
        ax.fill_between(layers, lo, mean, color=color, alpha=0.12)
    ax.axhline(GOAL, color="k", ls="--", lw=1, label=f"goal {GOAL}")
    ax.set(xlabel="layer", ylabel="blocks also picked with bf16 summaries (share)",
           title=f"SmolLM2-135M, real prose: worst layer mean {worst:.3f}")
    viz.legend_below(ax, ncol=2)                    # inside, "lower left" sat on the worst layers' bands
    ax = axes[1]
    labels = [f"{r['router']}\nstrength {r['strength']:g}" for r in probe_summary]
    x = range(len(probe_summary))
    ax.plot(list(x), [r["overlap_mean"] for r in probe_summary], "o", color=viz.COLORS[0], label="mean overlap")
    ax.plot(list(x), [r["overlap_min"] for r in probe_summary], "v", color=viz.COLORS[5], label="worst call")
    ax.axhline(GOAL, color="k", ls="--", lw=1, label=f"goal {GOAL}")
    ax.set_xticks(list(x), labels, fontsize=7, rotation=60)
    lo = min(r["overlap_min"] for r in probe_summary)
    ax.set(ylabel="blocks also picked with bf16 summaries (share)", ylim=(min(0.9, lo - 0.01), 1.001),
           title=f"needle probes (dots: the axis starts at {min(0.9, lo - 0.01):.2f}): worst overlap {lo:.3f}")
    viz.legend_outside(ax)
    viz.save(fig, path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe-length", type=int, default=16384)
    ap.add_argument("--real-length", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "summary_precision.json")
    ap.add_argument("--figure", type=Path, default=ROOT / "figures" / "summary_precision.png")
    args = ap.parse_args(argv)
    if args.quick:
        args.probe_length, args.real_length, args.steps = 4096, 1024, 2
    torch.manual_seed(0)
    probe_routers = {f"{s}@{b}": sk.Router(s, token_budget=b) for s in ("minmax", "mean") for b in (256, 2048)}
    probes = precision.probe_rows([args.probe_length], [4.0, 8.0, 16.0], [0.1, 0.5, 0.9], 64, probe_routers,
                                  num_kv_heads=8, gqa=4, head_dim=128)
    probe_summary = summarise(probes, ("router", "strength"))
    print("probes (block 64):")
    for r in probe_summary:
        print(f"  {r['router']:>12} strength {r['strength']:>4g}: overlap mean {r['overlap_mean']:.4f} min "
              f"{r['overlap_min']:.4f}; needle found fp32 {r['needle32']:.0%} bf16 {r['needle16']:.0%}", flush=True)
    if not MODEL.exists():
        print(f"ERROR: {MODEL} is missing; run `make model` first", file=sys.stderr)
        return 1
    model = sk.load_model(MODEL)
    tok = sk.load_tokenizer(MODEL)
    ids = corpus.take(tok, corpus.haystack("prose"), args.real_length + args.steps)
    engine = sk.Engine(model, block_size=16, num_blocks=-(-len(ids) // 16) * 2 + 16, progress=False)
    seq = engine.new_sequence()
    engine.prefill(seq, ids[: args.real_length])
    real_routers = {f"{s}@{b}": sk.Router(s, token_budget=b) for s in ("minmax", "mean") for b in (256, 1024)}
    real = precision.observe_real(engine, seq, ids[args.real_length:], real_routers)
    real_summary = summarise(real)
    print(f"SmolLM2-135M, {args.real_length} real tokens, block 16, {args.steps} steps x {model.config.n_layers} layers:")
    for r in real_summary:
        print(f"  {r['router']:>12}: overlap mean {r['overlap_mean']:.4f} min {r['overlap_min']:.4f} "
              f"(identical {r['share_identical']:.0%}); mass fp32 {r['mass32']:.4f} bf16 {r['mass16']:.4f}", flush=True)
    results = {"benchmark": "summary_precision", "date": date.today().isoformat(), "torch": torch.__version__,
               "goal": GOAL, "probe_length": args.probe_length, "real_length": args.real_length, "steps": args.steps,
               "model": MODEL.name, "probe_summary": probe_summary, "real_summary": real_summary,
               "probe_rows": probes, "real_rows": real}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    plot(real, probe_summary, args.figure)
    print(f"wrote {args.out} and {args.figure}")
    bad = [r for r in probes + real if not (r["overlap"] == r["overlap"] and r["mass16"] == r["mass16"])]
    if bad:
        print("ERROR: a NaN metric", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
