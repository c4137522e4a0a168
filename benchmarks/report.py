"""Render the committed benchmark results as Markdown tables, and keep the benchmarks page's copy current.

    python -m benchmarks.report            print the tables
    python -m benchmarks.report --write    re-render docs/benchmarks.md's tables (between its markers)
    python -m benchmarks.report --figures  redraw the benchmark figures from the committed results (`figures`)
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PAGE = RESULTS.parents[1] / "docs" / "benchmarks.md"      # the page that holds the markers


def cpu_decode_table(path: Path = RESULTS / "cpu_decode.json") -> str:
    d = json.loads(path.read_text())
    cold = "rotate" in d
    grouped = all("sdpa_grouped_s" in r for r in d["cases"])     # SDPA also in the GQA-free layout (later runs)
    lines = [f"CPU decode, {d['threads']} threads, torch {d['torch']}, {d['date']}, on {d.get('cpu', 'an unrecorded CPU')}"
             + (f" with a {d['llc_bytes'] / 2**20:.0f} MiB last-level cache" if d.get("llc_bytes") else "") + " "
             f"(read bandwidth {d['read_bandwidth_Bps'] / 1e9:.0f} GB/s, compute {d['matmul_flops'] / 1e9:.0f} GFLOP/s"
             + (f" from a square matmul, against {d['decode_matmul_flops'] / 1e9:.0f} for MKL at decode's shape"
                if "decode_matmul_flops" in d else " (matmul)") + "; "
             f"32 q / 8 kv heads, head dim 128, block 64, budget {d['config']['budget']} tokens). Time over each variant's "
             "floor (the larger of its byte and compute floors; the bound that applies in brackets), and speed-ups with "
             "the same work on both sides. sparsekv runs as the Engine does (a decode plan; fused C++ routing and "
             "attention, backend `cpp`)"
             + (f"; every timed call takes the next of {d['rotate']} decode queries, each with its own selection, "
                "so a call does not find its tiles in cache from the call before, as in a decode step (the "
                f"{d['llc_bytes'] / 2**20:.0f} MiB last-level cache holds a whole 128k-token selection, not the "
                "0.5-1 GiB pool). `warm`: one query repeated, its selection left in cache" if cold else "")
             + (". SDPA runs twice: 32 query heads over 8 kv heads with `enable_gqa` (kernel `"
                f"{d['cases'][0].get('sdpa_kernel', '?')}`), and in the GQA-free layout [1, H_kv, G, D] (kernel "
                f"`{d['cases'][0].get('sdpa_grouped_kernel', '?')}`), the same maths with equal head counts" if grouped else "")
             + ". The last columns are speed-ups over the paths the fused kernels replaced, measured in the same run:",
             "",
             "| context | dtype | routed / floor | attention alone / floor | dense / floor | SDPA / floor "
             + ("| SDPA [H_kv, G, D] / floor " if grouped else "") + "| Flex / floor "
             "| attention vs Flex | routed vs Flex routed | routed vs Flex attention alone | dense vs SDPA "
             + ("| dense vs SDPA [H_kv, G, D] " if grouped else "") +
             "| attention vs Flex, warm | routing: fused vs torch | attention: fused vs torch | dense: fused vs torch |",
             "| ---: | --- " + "| ---: " * (13 + 2 * grouped) + "|"]
    nan = float("nan")
    for r in d["cases"]:
        fl = lambda v: f"{r.get(f'{v}_over_floor', nan):.2f} ({r.get(f'{v}_bound', '?')})"
        x = lambda k: f"{r.get(k, nan):.2f}x"
        lines.append(f"| {r['context']} | {r['dtype']} | {fl('sparse')} | {fl('sparse_attn')} | {fl('dense')} | "
                     f"{fl('sdpa')} | " + (f"{fl('sdpa_grouped')} | " if grouped else "") +
                     f"{fl('flex')} | {x('attn_speedup_vs_flex')} | {x('routed_speedup_vs_flex_routed')} | "
                     f"{x('routed_speedup_vs_flex')} | {x('dense_speedup_vs_sdpa')} | "
                     + (f"{x('dense_speedup_vs_sdpa_grouped')} | " if grouped else "") + f"{x('attn_speedup_vs_flex_warm')} | "
                     f"{x('fused_route_speedup')} | {x('sparse_attn_speedup_vs_torch_path')} | "
                     f"{x('dense_speedup_vs_torch_path')} |")
    b16 = [r for r in d["cases"] if "bf16_summary_overlap" in r]
    if b16:
        lines += ["", "Routing over bfloat16 summaries (min rounded down, max rounded up, so Quest's bound never shrinks), "
                  "float32 K/V, same run:", "",
                  "| context | summary bytes vs float32 | blocks also picked with float32 summaries | routed / floor "
                  "| routed vs float32 summaries |", "| ---: | ---: | ---: | ---: | ---: |"]
        for r in b16:
            lines.append(f"| {r['context']} | {r['bf16_summary_bytes_ratio']:.2f} | {r['bf16_summary_overlap']:.1%} | "
                         f"{r.get('sparse_b16sum_over_floor', nan):.2f} ({r.get('sparse_b16sum_bound', '?')}) | "
                         f"{r['sparse_s'] / r['sparse_b16sum_s']:.2f}x |")
    return "\n".join(lines)


def prefix_match_table(path: Path = RESULTS / "prefix_match.json") -> str:
    d = json.loads(path.read_text())
    lines = [f"Prefix-cache lookup on {d['cases'][0]['tokens'] - 1}-token prompts ({d['date']}); vLLM publishes about "
             f"{d['vllm_published_sha256_ns_per_token']} ns/token for its SHA-256 block hashing:", "",
             "| block size | match (full hit) ns/token | insert ns/token | same-run pickle+SHA-256 peer ns/token | match vs peer |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for r in d["cases"]:
        lines.append(f"| {r['block_size']} | {r['match_hit_ns_per_token']:.1f} | {r['insert_ns_per_token']:.1f} | "
                     f"{r['peer_pickle_sha256_ns_per_token']:.1f} | {r['match_speedup_vs_peer']:.1f}x faster |")
    return "\n".join(lines)


def engine_tpot_table(path: Path = RESULTS / "engine_tpot.json") -> str:
    d = json.loads(path.read_text())
    lines = [f"Engine decode with the fused attention kernel against the torch path it replaced (routing runs the "
             f"fused route pass in both; {d['model']} model, "
             f"{d['threads']} threads, {d['date']}; median ms per output token, the same greedy tokens on both):", "",
             "| context | dense: torch path | dense: fused | speed-up | routed (minmax@" + str(d["budget"]) + "): torch path "
             "| routed: fused | speed-up |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in d["cases"]:
        lines.append(f"| {r['context']} | {1e3 * r['dense_torch_tpot_s']:.1f} | {1e3 * r['dense_cpp_tpot_s']:.1f} | "
                     f"{r['dense_speedup']:.2f}x | {1e3 * r['routed_torch_tpot_s']:.1f} | {1e3 * r['routed_cpp_tpot_s']:.1f} | "
                     f"{r['routed_speedup']:.2f}x |")
    return "\n".join(lines)


def summary_precision_table(path: Path = RESULTS / "summary_precision.json") -> str:
    d = json.loads(path.read_text())
    lines = [f"Routing over bf16 summaries against float32 summaries of the same keys ({d['date']}; "
             f"`python -m benchmarks.bench_summary_precision`): the share of the float32 selection that bf16 also "
             f"selects (mean and worst call), and the true attention mass each selection covers. Real keys: "
             f"{d['model']}, {d['real_length']} tokens of prose, block 16, {d['steps']} decode steps x every layer. "
             f"Probes: needles at {d['probe_length']} tokens, 3 depths each, block 64, 8 kv heads, D 128. The goal is "
             f"{d['goal']}:", "",
             "| keys | router | summary bytes vs float32 | overlap, mean | overlap, worst | mass covered, float32 | "
             "mass covered, bf16 | needle found, float32 / bf16 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in d["real_summary"]:
        lines.append(f"| SmolLM2 | {r['router']} | {r['bytes_ratio']:.2f} | {r['overlap_mean']:.4f} | "
                     f"{r['overlap_min']:.4f} | {r['mass32']:.4f} | {r['mass16']:.4f} | - |")
    for r in d["probe_summary"]:
        lines.append(f"| needle, strength {r['strength']:g} | {r['router']} | {r['bytes_ratio']:.2f} | "
                     f"{r['overlap_mean']:.4f} | {r['overlap_min']:.4f} | {r['mass32']:.4f} | {r['mass16']:.4f} | "
                     f"{r['needle32']:.0%} / {r['needle16']:.0%} |")
    return "\n".join(lines)


def _rss(r: dict) -> str:
    if r["sparsekv_peak_rss"] is None:
        return "not measured (this run's peak was the model load's; rerun)"
    hf = r.get("transformers_peak_rss")
    return f"{r['sparsekv_peak_rss'] / 2**30:.2f} / {hf / 2**30:.2f} GiB" if hf else \
        f"{r['sparsekv_peak_rss'] / 2**30:.2f} GiB / did not run"


def _matmul_rates(d: dict) -> str:
    """The matmul rate a prefill floor divides by: both measured rates where the run kept them (float32 and
    bfloat16; the floor takes the faster, which is bfloat16 wherever AMX or AVX512-BF16 runs it), else the one."""
    if "f32_matmul_flops" in d and "bf16_matmul_flops" in d:
        return (f"matmul rates (float32 {d['f32_matmul_flops'] / 1e9:.0f}, bfloat16 {d['bf16_matmul_flops'] / 1e9:.0f} "
                "GFLOP/s; the floor takes the faster, though both systems here compute in float32)")
    return f"matmul rate ({d['matmul_flops'] / 1e9:.0f} GFLOP/s)"


def gemma_speed_table(path: Path = RESULTS / "gemma_speed.json") -> str:
    d = json.loads(path.read_text())
    lines = [f"Gemma 3 270M against transformers {d.get('transformers', '')} on the same weights (float32) and the same "
             f"token ids (real prose), each run in its own process ({d['threads']} threads, {d['date']}; "
             f"`python -m benchmarks.bench_gemma_speed`). TTFT is the prefill; TPOT the median of "
             f"{d['steps']} dense greedy steps; memory the process's peak RSS and the K/V held at the end (sparsekv's includes "
             f"its routing summaries). Floors from "
             f"this run's measured {_matmul_rates(d)} and read bandwidth "
             f"({d['read_bandwidth_Bps'] / 1e9:.1f} GB/s): FLOPs for prefill, the float32 weights plus the K/V a step "
             "reads for decode:", "",
             "| tokens | TTFT sparsekv | TTFT transformers | prefill speed-up | prefill floor | TPOT sparsekv | "
             "TPOT transformers | decode speed-up | decode floor | peak RSS sparsekv / transformers | K/V held sparsekv / transformers | same tokens |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"]
    if d.get("schema", 1) >= 2:                  # runs with intervals: transformers' settings, and each row's spread
        st = next((r["transformers_settings"] for r in d["cases"] if "transformers_settings" in r), {})
        lines[0] = (f"{d.get('run_kind', 'full run').capitalize()}. " + lines[0][:-1] + f". Each TTFT and TPOT is the median "
                    f"of {d['repeats']} timed repeats (after an untimed warm-up) with their {d['interval']}. "
                    f"transformers: attention `{st.get('attn_implementation', '?')}`, prefill in chunks of "
                    f"{st.get('chunk', '?')} tokens into its DynamicCache (sliding layers keep their window), decode "
                    "variants " + ", ".join(f"`{k}` ({v['cache']}{', torch.compile' if v['torch_compile'] else ''})"
                                             for k, v in st.get("decode_variants", {}).items())
                    + "; the fastest at each length is compared (" + ", ".join(
                        f"{r['length']:,}: `{r['transformers_settings'].get('decode_compared', '?')}`"
                        for r in d["cases"] if "transformers_settings" in r) + "). A speed-up's verdict is "
                    f"sparsekv's: 'faster' or 'slower' only past a {d['noise_margin']:.0%} margin at its interval's "
                    "nearer end, else 'tie':")
    for r in d["cases"]:
        spreads = {"sparsekv_ttft_s": "sparsekv_ttft", "sparsekv_tpot_s": "sparsekv_tpot",
                   "transformers_ttft_s": "transformers_ttft", "transformers_tpot_s": "transformers_tpot",
                   "prefill_speedup": "prefill_speedup_interval", "decode_speedup": "decode_speedup_interval"}

        def hf(key, scale, fmt):
            if key not in r:
                return f"did not run: {r.get('transformers_failed', 'not measured')}"
            iv = r.get(spreads.get(key, ""))        # a run with intervals: the median [min-max], and a verdict
            if iv:
                cell = fmt.format(iv["median"] * scale)
                unit = cell[len(cell.rstrip(" smx")):]
                cell = f"{cell} [{fmt.format(iv['lo'] * scale)[:-len(unit) or None]}-{fmt.format(iv['hi'] * scale)}]"
                return cell + (f" {iv['verdict']}" if "verdict" in iv else "")
            return fmt.format(r[key] * scale)
        if "rss" not in d:          # results from before the peak was reset after loading: their peak is the load's
            r = {**r, "sparsekv_peak_rss": None, "transformers_peak_rss": None}
        lines.append(
            f"| {r['length']:,} | {hf('sparsekv_ttft_s', 1, '{:.1f} s')} | {hf('transformers_ttft_s', 1, '{:.1f} s')} | "
            f"{hf('prefill_speedup', 1, '{:.2f}x')} | {r['prefill_floor_s']:.1f} s | {hf('sparsekv_tpot_s', 1e3, '{:.0f} ms')} | "
            f"{hf('transformers_tpot_s', 1e3, '{:.0f} ms')} | {hf('decode_speedup', 1, '{:.2f}x')} | "
            f"{1e3 * r['decode_floor_s']:.0f} ms | {_rss(r)} | {r['sparsekv_kv_held'] / 2**20:.0f} / "
            f"{hf('transformers_kv_held', 2**-20, '{:.0f}')} MiB | {r.get('same_tokens', '-')} |")
    return "\n".join(lines)


def router_cost_table(path: Path = RESULTS / "router_cost.json") -> str:
    d = json.loads(path.read_text())
    names = d["routers"]
    g = d["geometry"]
    lines = [f"Routing cost per layer and step on this CPU (`python -m benchmarks.bench_router_cost`, {d['threads']} threads, "
             f"{d['date']}): SmolLM2's geometry ({g['kv_heads']} kv heads, {g['q_per_kv']} query heads each, head dim "
             f"{g['head_dim']}, blocks of {g['block_size']}), a {d['budget']}-token budget, the median of {d['calls']} "
             "calls on fresh queries; in brackets, the time over the fused `minmax` route's and the summary KiB each call "
             "reads:", "",
             "| tokens | " + " | ".join(names) + " |", "| ---: | " + " | ".join("---:" for _ in names) + " |"]
    for r in d["cases"]:
        lines.append(f"| {r['context']:,} | " + " | ".join(
            f"{r[f'{n}.us']:,.0f} us ({r[f'{n}.over_fused_minmax']:.1f}x, {r[f'{n}.summary_bytes'] / 1024:,.0f} KiB)"
            for n in names) + " |")
    return "\n".join(lines)


def _verdict(d: dict) -> str:
    from benchmarks.bench_vs_llamacpp import verdict
    return verdict(d).replace("\n", "; ") + "."


def _iv(s: dict, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    """A median with its interval: '1.23 [1.20-1.31]'."""
    return f"{fmt.format(s['median'] * scale)} [{fmt.format(s['lo'] * scale)}-{fmt.format(s['hi'] * scale)}]"


def _vs_cpu(d: dict, short: bool = False) -> str:
    """The CPU a run against llama.cpp measured, and how: as it is, or (`--cpu alt`) as an AVX2 machine runs it."""
    cpu, c = d.get("cpu", "an unrecorded CPU"), d.get("cpu_config") or {}
    if c.get("name") != "alt":
        return cpu
    if short:
        return f"{cpu}, AVX2 paths (`--cpu alt`)"
    return (f"{cpu}, run as an AVX2 machine (`--cpu alt`: sparsekv with ATen's {c['aten']} kernels, oneDNN capped at "
            f"{c['onednn_max_isa']}, MKL at {c['mkl_instructions']} and its extension built for -march "
            f"{c['extension_arch']}; llama.cpp built for AVX2 without AVX-512 by `make bench-peers-avx2`)")


def _vs_v2(d: dict) -> list[str]:
    """The table of a run with intervals (`bench_vs_llamacpp`, schema 2): every engine and configuration, with its
    settings, its median and interval, and its time over its floor; the comparisons with their verdicts; routed
    decode's quality and bytes beside the lossy K/V types'."""
    amx = "with AMX" if d.get("llama_cpp_amx") else "without AMX (rows are llama.cpp without its AMX matmuls)"
    configs = {k: v for c in d["cases"] for k, v in c["llamacpp_settings"].items()}
    lines = [f"sparsekv against llama.cpp ({d['run_kind']}): llama-cpp-python {d['llama_cpp_python']}, built {amx}, "
             f"{d['threads']} threads, {d['date']}, on {_vs_cpu(d)} (llama.cpp's build: "
             f"{d['llama_cpp_features'].replace(' | ', ', ')}). Same GGUF files and token ids of real prose, one process "
             f"(`python -m benchmarks.bench_vs_llamacpp`). llama.cpp's configurations, each with n_batch = n_ubatch = "
             f"{d['llama_settings']['n_batch']}, swa_full {d['llama_settings']['swa_full']}: "
             + "; ".join(f"`{k}` (flash_attn {v['flash_attn']}, K/V {v['kv_type']}, {'exact' if v['exact'] else 'lossy'})"
                         for k, v in configs.items())
             + f". sparsekv: `weights=\"gguf\"`, bfloat16 K/V, {d['activations']} activations into its decode matmuls, "
             f"{d['prefill']} prefill ({PREFILL_ATTENTION.get(d['prefill_attention'], d['prefill_attention'])} "
             f"attention); routed is `minmax` at a {d['budget_tokens']}-"
             f"token budget. Warm-up: {d['warmup']}. Then {d['repeats']} interleaved rounds of every prefill and of "
             f"{d['steps']} decode steps; each number is the median of the rounds with their {d['interval']}. Ratios pair "
             f"round with round; a verdict is 'faster' or 'slower' only when the ratio's whole interval is past 1 by "
             f"{d['noise_margin']:.0%}, else 'tie'. Floors from this run's read bandwidth "
             f"({d['read_bandwidth_Bps'] / 1e9:.1f} GB/s; decode: weights and K/V read) and matmul rate "
             f"({d['floor_flops'] / 1e9:.0f} GFLOP/s, the faster of float32 and bfloat16; prefill: FLOPs). Files: "
             + "; ".join(f"{k} `{v['path']}` (sha256 {v['sha256'][:12]}"
                         + (f", requantised from `{v['derived_from']}` by {v['quantiser']}" if "derived_from" in v else "")
                         + ")" for k, v in d["files"].items()) + ".",
             "", "Verdicts (`bench_vs_llamacpp.verdict`; dense and prefill against llama.cpp's fastest exact "
             "configuration, routed against each lossy one): " + _verdict(d), "",
             "| model | tokens | engine | prefill s | prefill / FLOP floor | TPOT ms | TPOT / byte floor | "
             "K/V read per step |", "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for c in d["cases"]:
        best = c["llamacpp_best_exact"]
        for k, t in c["tpot_s"].items():
            name = k.replace("llamacpp_", "llama.cpp ")
            if k.startswith("llamacpp_"):
                cfg = k[len("llamacpp_"):]
                name += "".join(f" (fastest exact {w})" for w in ("prefill", "tpot") if best[w] == cfg)
            pk = "sparsekv" if k == "sparsekv_dense" else k
            pre = c["prefill_s"].get(pk)
            lines.append(f"| {c['model']} | {c['length']:,} | {name} | {_iv(pre) if pre else '-'} | "
                         f"{_iv(c['prefill_over_floor'][pk], fmt='{:.1f}') if pre else '-'} | {_iv(t, 1e3)} | "
                         f"{_iv(c['tpot_over_floor'][k], fmt='{:.1f}')} | {c['kv_read_per_step'][k] / 1e6:.1f} MB |")
    lines += ["", "Routed decode beside its quality, measured in the same run (teacher-forced over the "
              f"{d['quality_tokens']} tokens after each prompt: top-1 agreement and KL against the reference named), and "
              "llama.cpp's lossy K/V types beside theirs; the ratio is routed's TPOT over the lossy configuration's:", "",
              "| model | tokens | engine | reference | K/V read per step | top-1 agreement | KL mean | KL p99 | "
              "routed / this |", "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for c in d["cases"]:
        q = c["quality"]
        for k in (k for k in q if k != "reference"):
            r = c["ratios"].get(f"routed_vs_{k}")
            lines.append(f"| {c['model']} | {c['length']:,} | {k.replace('llamacpp_', 'llama.cpp ')} | "
                         f"{q['reference'][k].replace('llamacpp_', 'llama.cpp ')} | "
                         f"{c['kv_read_per_step'][k] / 1e6:.2f} MB | {q[k]['top1_agreement']:.1%} | {q[k]['kl_mean']:.4f} | "
                         f"{q[k]['kl_p99']:.4f} | {_iv(r) + ' ' + r['verdict'] if r else '-'} |")
    lines += ["", "The first greedy token after the prompt, sparsekv dense against llama.cpp's exact configurations "
              "(decode then continues each engine's own tokens, so TPOT compares the same context lengths, not always "
              "the same tokens): " + "; ".join(_first_token(c) for c in d["cases"]) + "."]
    return lines


def _first_token(c: dict) -> str:
    """One case's first greedy token: the same in both engines, or where it differs, each side's logit gap between its
    own pick and the other's and the KL of the two distributions (`bench_vs_llamacpp.first_token_gaps`)."""
    where = f"{c['model']} at {c['length']:,}"
    if c.get("same_first_token"):
        return f"{where} the same"
    ft = c.get("first_token")
    if not ft:
        return f"{where} different (gaps not recorded in this run)"
    gaps = ", ".join(f"{k}: llama.cpp picks {v['token']}, gap {v['gap_sparsekv']:.3f} in sparsekv's logits and "
                     f"{v['gap_llamacpp']:.3f} in llama.cpp's, KL {v['kl']:.4f}" for k, v in ft.items()
                     if k != "sparsekv" and v["token"] != ft["sparsekv"])
    return f"{where} different (sparsekv picks {ft['sparsekv']}; {gaps})"


# A run of the protocol before issue 57 (schema 1) is shown with what it did not do, until a run of the current one
# replaces it on the same CPU.
SCHEMA1_CAVEAT = ("**Measured before issue 57's protocol, so llama.cpp was not at its best:** flash attention off "
                  "(llama-cpp-python's default), K/V float16 only, its prefill one cold evaluation, no intervals, and "
                  "the verdict below counts any ratio under 1.00 as a win, with no noise margin. Kept until a run of "
                  "the current protocol (`bench_vs_llamacpp`: flash attention and K/V type swept, warmed up, repeated, "
                  "medians with intervals) replaces it on this CPU.")


def vs_llamacpp_table(path: Path = RESULTS / "vs_llamacpp.json") -> str:
    if not path.exists():
        return "sparsekv against llama.cpp: not yet measured (`make bench-peers`, then `python -m benchmarks.bench_vs_llamacpp`)."
    d = json.loads(path.read_text())
    act, pre = d.get("activations", "float32"), d.get("prefill", "float32")
    lines = _vs_v2(d) if d.get("schema", 1) >= 2 else [SCHEMA1_CAVEAT, "", f"sparsekv (`weights=\"gguf\"`: the file's own codes; bfloat16 K/V; {act} activations into its decode "
             f"matmuls; {pre} prefill matmuls and attention"
             + (", the attention in its own kernel" if d.get("prefill_attention") == "kernel" else "")
             + ") against llama.cpp (llama-cpp-python "
             f"{d['llama_cpp_python']}, float16 K/V) on the same GGUF files and the same token ids of real prose, in one "
             f"process, {d['threads']} threads, {d['date']}, on {d.get('cpu', 'an unrecorded CPU')}"
             + (f" (llama.cpp's build: {d['llama_cpp_features'].replace(' | ', ', ')}; `make bench-peers` builds it without AMX)" if d.get("llama_cpp_features") else "")
             + f" (`python -m benchmarks.bench_vs_llamacpp`). TPOT: the median of "
             f"{(d['repeats'] - 1) * d['steps']} greedy steps per engine in {d['repeats'] - 1} interleaved rounds after a "
             f"warm-up round; routed is `minmax` at a {d['budget_tokens']}-token budget. Floors: a step's bytes (weights "
             f"as held, K/V and summaries read) over this run's read bandwidth ({d['read_bandwidth_Bps'] / 1e9:.1f} GB/s):",
             "", "Where sparsekv is no slower than llama.cpp in this run (`bench_vs_llamacpp.verdict`, from the rows below): "
             + _verdict(d), "", "| model | tokens | weights held sparsekv / llama.cpp | prefill sparsekv / llama.cpp | TPOT llama.cpp | "
             "TPOT sparsekv dense | TPOT sparsekv routed | dense / llama.cpp | routed / llama.cpp | x floor: llama.cpp, dense, routed |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in d["cases"] if d.get("schema", 1) < 2 else []:        # later runs: every engine's row in `_vs_v2`
        lines.append(
            f"| {r['model']} | {r['length']:,} | {r['sparsekv_weight_bytes'] / 1e6:.0f} / {r['llamacpp_weight_bytes'] / 1e6:.0f} MB | "
            f"{r['sparsekv_prefill_s']:.1f} / {r['llamacpp_prefill_s']:.1f} s | "
            f"{1e3 * r['llamacpp_tpot_s']:.1f} ms | {1e3 * r['sparsekv_dense_tpot_s']:.1f} ms | "
            f"{1e3 * r['sparsekv_routed_tpot_s']:.1f} ms | {r['dense_vs_llamacpp']:.2f}x | {r['routed_vs_llamacpp']:.2f}x | "
            f"{r['llamacpp_over_floor']:.1f} / {r['sparsekv_dense_over_floor']:.1f} / {r['sparsekv_routed_over_floor']:.1f} |")
    if d["agreement"]:                          # a quick run may skip it (--skip-agreement)
        lines += ["", "Agreement with llama.cpp's next-token distributions over held-out prose, and greedy "
                  "continuations (32 tokens) from short prompts:", "",
                  "| model | positions | weights | top-1 agreement | KL mean (nats) | KL p99 | identical continuations | "
                  "first divergence | largest logit gap there (either side) |",
                  "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for a in d["agreement"]:
        for w in [w for w in ("gguf", "gguf-fused", "gguf-fused-int8", "gguf-fused-int8-bf16", "float32")
                  if f"{w}_top1_agreement" in a]:
            gaps = [max(m["ours"], m["llamacpp"]) for m in a.get(f"{w}_divergence_margins", [])]
            gap = f"{max(gaps):.3f}" if gaps else "-"
            lines.append(f"| {a['model']} | {a['tokens']} | {w} | {a[f'{w}_top1_agreement']:.1%} | {a[f'{w}_kl_mean']:.4f} | "
                         f"{a[f'{w}_kl_p99']:.4f} | {a[f'{w}_greedy_identical']} of {a['greedy_prompts']} | "
                         f"{a[f'{w}_greedy_first_divergence']} | {gap} |")
    pre = [r for r in d["cases"] if r.get("sparsekv_prefill_f32_s")]
    if pre:
        sdpa = all(r.get("sparsekv_prefill_sdpa_s") or r.get("sparsekv_prefill_kernel_s") for r in pre)
        chose = {PREFILL_ATTENTION.get(r.get("prefill_attention", d["prefill_attention"]), "?") for r in pre}
        if sdpa:
            lines += ["", f"What the {d['prefill']} prefill buys, in the same run: sparsekv's prefill with float32 "
                      f"matmuls and attention, with {d['prefill']} ones and SDPA's attention, and with {d['prefill']} "
                      "ones and its own prefill attention kernel (`kernels/cpu/prefill_attn.cpp`: GQA folded into the "
                      "rows, bf16 pair products, float32 scores and sums), each once, and llama.cpp's. The engine's "
                      f"choice here (backend \"auto\"): {', '.join(sorted(chose))}.", "",
                      f"| model | tokens | prefill float32 / {d['prefill']} SDPA / {d['prefill']} kernel | "
                      "float32 / kernel | SDPA / kernel | llama.cpp |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        else:
            lines += ["", f"What the {d['prefill']} prefill buys, in the same run: sparsekv's prefill with float32 and "
                      f"with {d['prefill']} matmuls and attention, and llama.cpp's:", "",
                      f"| model | tokens | prefill float32 / {d['prefill']} | ratio | llama.cpp |",
                      "| --- | ---: | ---: | ---: | ---: |"]
        for r in pre:
            f, b = r["sparsekv_prefill_f32_s"], r["sparsekv_prefill_s"]
            if sdpa and r.get("sparsekv_prefill_kernel_s"):      # the engine took SDPA (AMX), the kernel timed apart
                a, b = b, r["sparsekv_prefill_kernel_s"]
                lines.append(f"| {r['model']} | {r['length']:,} | {f:.1f} / {a:.1f} / {b:.1f} s | {f / b:.2f}x | "
                             f"{a / b:.2f}x | {r['llamacpp_prefill_s']:.1f} s |")
            elif sdpa:
                a = r["sparsekv_prefill_sdpa_s"]
                lines.append(f"| {r['model']} | {r['length']:,} | {f:.1f} / {a:.1f} / {b:.1f} s | {f / b:.2f}x | "
                             f"{a / b:.2f}x | {r['llamacpp_prefill_s']:.1f} s |")
            else:
                lines.append(f"| {r['model']} | {r['length']:,} | {f:.1f} / {b:.1f} s | {f / b:.2f}x | "
                             f"{r['llamacpp_prefill_s']:.1f} s |")
    lines += _kernel_buys(d)
    heads = [r for r in d["cases"] if r.get("lm_head_s")]
    if heads:
        lines += ["", "What int8 activations buy, in the same run: the lm_head's decode matmul alone (8-bit codes, one row "
                  "of x), and sparsekv's dense TPOT, each with float32 and with int8 activations, interleaved:", "",
                  "| model | tokens | lm_head float32 / int8 | ratio | dense TPOT float32 / int8 | ratio |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in heads:
            f, i = r["lm_head_s"]["float32"], r["lm_head_s"]["int8"]
            tf, ti = r.get("sparsekv_dense_f32act_tpot_s"), r["sparsekv_dense_tpot_s"]
            dense = f"{1e3 * tf:.1f} / {1e3 * ti:.1f} ms | {tf / ti:.2f}x" if tf else "- | -"
            lines.append(f"| {r['model']} | {r['length']:,} | {1e3 * f:.1f} / {1e3 * i:.1f} ms | {f / i:.2f}x | {dense} |")
    if d.get("overhead"):
        o = d["overhead"]
        lines += ["", f"Where a dense SmolLM2 step goes at {o[0]['tokens']:,} tokens (torch.profiler): the time inside "
                  "compute kernels (matmuls, `qlinear`, `paged_decode`, the fused step's `decode_layer`) and the rest (Python and small torch ops), per "
                  f"layer of {o[0]['layers']}:", "", "| engine | TPOT | in kernels | the rest, per layer |",
                  "| --- | ---: | ---: | ---: |"]
        for r in o:
            lines.append(f"| {r['config']} | {1e3 * r['tpot_s']:.1f} ms | {1e3 * r['kernel_s']:.1f} ms | "
                         f"{r['other_per_layer_us']:.0f} us |")
    return "\n".join(lines)


def _kernel_buys(d: dict) -> list[str]:
    """For a float32-prefill run whose engine took the extension's float32 kernel: what the kernel buys over SDPA, the
    same prefill timed in the same rounds with backend "torch" (`bench_vs_llamacpp.other_prefill`): the paired ratio
    where the run records it, else (runs before 2026-12-07's second) the ratio of the medians with the wider interval
    from their far ends (`repeats.ratio_bounds`)."""
    from benchmarks.repeats import Spread, ratio_bounds
    rows = [r for r in d["cases"] if r.get("prefill_attention") == "f32_prefill_kernel"
            and "sparsekv_sdpa" in r.get("prefill_s", {})]
    if not rows:
        return []
    lines = ["", "What its float32 prefill kernel buys, in the same run: sparsekv's float32 prefill with SDPA's attention "
             "(backend \"torch\") and with its own kernel (`kernels/cpu/prefill_attn_f32.cpp`, the engine's choice), "
             "each in every round:", "",
             "| model | tokens | SDPA | kernel | kernel / SDPA | ratio of |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        a, b = (Spread.from_dict(r["prefill_s"][key]) for key in ("sparsekv_sdpa", "sparsekv"))
        paired = r.get("ratios", {}).get("prefill_vs_sparsekv_sdpa")
        x = Spread.from_dict(paired) if paired else ratio_bounds(b, a)
        lines.append(f"| {r['model']} | {r['length']:,} | {a.median:.1f} [{a.lo:.1f}-{a.hi:.1f}] s | {b.median:.1f} "
                     f"[{b.lo:.1f}-{b.hi:.1f}] s | {x.median:.2f} [{x.lo:.2f}-{x.hi:.2f}] | "
                     + ("rounds, paired |" if paired else "medians; interval from the far ends |"))
    return lines


# what sparsekv's prefill attention ran, as a run records it (`bench_vs_llamacpp.prefill_path`; older runs: the first
# two)
PREFILL_ATTENTION = {"kernel": "its own kernel", "sdpa": "SDPA", "sdpa_amx": "SDPA on AMX tiles",
                     "bf16_prefill_kernel": "its own AVX512-BF16 kernel",
                     "bf16_prefill_f32_kernel": "its own float32-FMA kernel",
                     "f32_prefill_kernel": "its own float32-FMA kernel"}

START, END = "<!-- bench:start (generated by python -m benchmarks.report) -->", "<!-- bench:end -->"


def vs_llamacpp_summary(paths: list[Path]) -> str:
    """One line per (run, model, length) of the runs with intervals (schema 2): sparsekv's time over llama.cpp's
    fastest exact configuration for prefill and dense decode, routed decode's over each lossy configuration, and
    routed's quality against dense in the same run; every length of every run, never a chosen cell. Empty where no
    run has the schema."""
    runs = [(p, json.loads(p.read_text())) for p in paths]
    runs = [(p, d) for p, d in runs if d.get("schema", 1) >= 2]
    if not runs:
        return ""
    lines = ["Against llama.cpp at its best, every run of the current protocol (sparsekv's time over llama.cpp's "
             "fastest exact configuration, median [min-max of the paired repeats] and the verdict; routed decode "
             "against each lossy K/V type, with its own quality against sparsekv dense in the same run):", "",
             "| run | CPU, date | model | tokens | prefill | dense decode | routed decode vs lossy K/V | "
             "routed top-1, KL vs dense |", "| --- | --- | --- | ---: | --- | --- | --- | --- |"]
    for p, d in runs:
        for c in d["cases"]:
            r = c["ratios"]
            lossy = "; ".join(f"{k[len('routed_vs_llamacpp_'):]} {_iv(v)} {v['verdict']}" for k, v in r.items()
                              if k.startswith("routed_vs_llamacpp_") and k != "routed_vs_llamacpp_exact") or "-"
            q = c["quality"].get("sparsekv_routed")
            lines.append(f"| `{p.stem}` | {_vs_cpu(d, short=True)}, {d['date']} | {c['model']} | "
                         f"{c['length']:,} | {_iv(r['prefill_vs_llamacpp'])} {r['prefill_vs_llamacpp']['verdict']} | "
                         f"{_iv(r['dense_vs_llamacpp'])} {r['dense_vs_llamacpp']['verdict']} | {lossy} | "
                         + (f"{q['top1_agreement']:.1%}, {q['kl_mean']:.3f} |" if q else "- |"))
    return "\n".join(lines)


def vs_llamacpp_tables(results: Path = RESULTS) -> str:
    """A summary of every run with intervals, then one table per committed run against llama.cpp
    (`vs_llamacpp*.json`: each run names its CPU; the verdicts depend on it, so runs on two machines are all shown)."""
    paths = sorted(results.glob("vs_llamacpp*.json"))
    if not paths:
        return vs_llamacpp_table(results / "vs_llamacpp.json")
    summary = vs_llamacpp_summary(paths)
    return "\n\n".join(([summary] if summary else []) + [vs_llamacpp_table(p) for p in paths])


def cpu_decode_tables(results: Path = RESULTS) -> str:
    """One table per committed run of bench_cpu_decode (`cpu_decode*.json`; each names its CPU where it recorded it)."""
    return "\n\n".join(cpu_decode_table(p) for p in sorted(results.glob("cpu_decode*.json")))


def prefill_table(path: Path) -> str:
    """One run of bench_prefill_avx2 (`prefill_*.json`): per case the medians of SDPA (float32, bfloat16), the float32
    kernel over bfloat16 values, the AVX512-BF16 kernel where built, and which the engine's "auto" takes (runs before
    that field: "-")."""
    d = json.loads(path.read_text())
    names = {"smollm2-135m": "SmolLM2-135M", "gemma-3-270m": "Gemma 3 270M"}
    bf16 = d.get("bf16_prefill_kernel", False)
    lines = [f"Prefill attention, `{path.stem}` (`python -m benchmarks.bench_prefill_avx2 --cpu {d['cpu_config']}`): "
             f"{d['cpu']}, {d['cpu_config']} (extension -march {d['extension_arch']}, ATen {d['aten_capability']}"
             + (", oneDNN with AMX tiles" if d.get("amx_bf16") else "") + f"), {d['threads']} thread(s), "
             f"{d['date']}; the last {d['chunk']}-query chunk of an N-token prefill, median of {d['repeats']} after "
             f"{d['warmup']} warm-up:", "",
             "| shape | N | window | SDPA f32 | SDPA bf16 | f32 kernel (bf16 in) | SDPA bf16 / f32 kernel | "
             + ("bf16 kernel | SDPA bf16 / bf16 kernel | " if bf16 else "") + "auto takes |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | " + ("---: | ---: | " if bf16 else "") + "--- |"]
    for c in d["cases"]:
        ms = lambda k: f"{1e3 * c[k]:.1f} ms"                                   # noqa: E731
        lines.append(f"| {names.get(c['model'], c['model'])} | {c['N']:,} | {c['window'] or '-'} | "
                     f"{ms('sdpa_float32_s')} | {ms('sdpa_bfloat16_s')} | {ms('f32_kernel_bfloat16_s')} | "
                     f"{c['f32_kernel_vs_sdpa_bfloat16']:.2f}x | "
                     + (f"{ms('bf16_kernel_s')} | {c['sdpa_bfloat16_s'] / c['bf16_kernel_s']:.2f}x | " if bf16 else "")
                     + f"{c.get('auto', '-')} |")
    return "\n".join(lines)


def prefill_tables(results: Path = RESULTS) -> str:
    """Every committed run of bench_prefill_avx2 (each names its CPU and configuration)."""
    return "\n\n".join(prefill_table(p) for p in sorted(results.glob("prefill_*.json")))


def held_weights_table(path: Path = RESULTS / "held_weights.json") -> str:
    """One run of bench_held_weights: per (model, prefill dtype, length) the prefill with and without
    `quant.held_weights` (medians, min-max), the paired ratio with its verdict, and the bytes held while it runs; then
    its serving cases (a scheduler's run held or not: the ratios of its prefill chunks, decode steps and their sum).
    Either part is left out where the run has none; "" without a run."""
    if not path.is_file():
        return ""
    d = json.loads(path.read_text())
    lines = [f"Weights held, `{path.stem}` (`python -m benchmarks.bench_held_weights`): {d['cpu']}, {d['threads']} "
             f"threads, {d['date']}, chunks of {d['chunk']} tokens; {d['warmup']}, then {d['repeats']} rounds, "
             f"{d['order']}; median [min-max]; the ratio pairs round with round, 'faster' or 'slower' only past a 5% "
             "margin. An Engine's prefill holds for a bfloat16 prefill only (`EngineConfig.hold_weights`); a "
             "scheduler's run holds in either dtype (`Engine.holding_weights`)"
             + "".join(f"; {p} not run: {why}" for p, why in d.get("skipped_prefills", {}).items()) + "."]
    if d["cases"]:
        lines += ["", "| model | prefill | tokens | held | per chunk | held / per chunk | held while it runs |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for c in d["cases"]:
        h, u, r = c["held_s"], c["unheld_s"], c["held_vs_unheld"]
        lines.append(f"| {c['model']} | {c['prefill']} | {c['length']:,} | {_iv(h)} s | {_iv(u)} s | {_iv(r)} {r['verdict']} | "
                     f"{c['held_bytes'] / 2**20:.0f} MiB |")
    if d.get("serving"):
        lines += ["", "Served (`Scheduler.run` inside `quant.held_weights`, or not): one burst of distinct prompts, "
                  "every request in one batch, the \"chunked\" policy; the seconds of the run's prefill chunks, of its "
                  "decode steps and their sum, held / per op, paired by round. A decode step wider than "
                  "`quant.DECODE_ROWS` rows multiplies by a dequantised W, as a chunk does.", "",
                  "| model | prefill | requests x tokens, new | prefill chunks | decode steps (wider) | whole run | "
                  "same tokens | held while it runs |", "| --- | --- | --- | ---: | ---: | ---: | --- | ---: |"]
        for c in d["serving"]:
            cell = {k: f"{_iv(c[k]['held_vs_unheld'])} {c[k]['held_vs_unheld']['verdict']}"
                    for k in ("chunks", "steps", "run")}
            lines.append(f"| {c['model']} | {c['prefill']} | {c['requests']} x {c['prompt_tokens']:,}, "
                         f"{c['new_tokens']} | {cell['chunks']} | {cell['steps']} ({c['decode_steps_wider']} of "
                         f"{c['decode_steps']}) | {cell['run']} | {'yes' if c['same_tokens'] else 'NO'} | "
                         f"{c['held_bytes'] / 2**20:.0f} MiB |")
    return "\n".join(lines)


def decode_rows_table(path: Path = RESULTS / "decode_rows.json") -> str:
    """The run of bench_decode_rows: per (model, activations) and batch width, the linear maps of a decode step
    through the codes kernel against the held float32 W (medians, min-max), the paired ratio kernel / held with its
    verdict, and the first width where the kernel is slower; "" without a run."""
    if not path.is_file():
        return ""
    d = json.loads(path.read_text())
    lines = [f"Decode batch width, `{path.stem}` (`python -m benchmarks.bench_decode_rows`): {d['cpu']}, {d['threads']} "
             f"threads, {d['date']}; every linear map of a decode step (`quant.step_linears`, the lm_head included) for x "
             f"of R rows, through the "
             f"kernel that reads the codes in place against torch's matmul by the float32 W a run holds; "
             f"{d['warmup']}, then {d['repeats']} rounds, {d['order']}; median [min-max], the ratio paired by round, "
             f"'faster' (the kernel) or 'slower' only past a 5% margin. `QuantLinear` takes the kernel for up to "
             f"`quant.DECODE_ROWS` = {d['decode_rows']} rows.", "",
             "| model | activations | rows | codes kernel | held W | kernel / held |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for run in d["runs"]:
        for c in run["cases"]:
            r = c["kernel_vs_held"]
            lines.append(f"| {run['model']} | {run['activations']} | {c['rows']} | {_iv(c['kernel_s'], 1e3)} ms | "
                         f"{_iv(c['held_s'], 1e3)} ms | {_iv(r)} {r['verdict']} |")
    lines += ["", "First width where the kernel is slower: " + "; ".join(
        f"{run['model']} {run['activations']} {run['first_rows_kernel_slower'] or 'none measured'}" for run in d["runs"]) + "."]
    return "\n".join(lines)


def held_weights_tables(results: Path = RESULTS) -> str:
    """Every committed run of bench_held_weights (`held_weights*.json`: the prefill run, the serving run)."""
    return "\n\n".join(held_weights_table(p) for p in sorted(results.glob("held_weights*.json")))


def tables() -> str:
    extra = [t for t in (held_weights_tables(), decode_rows_table()) if t]
    return (cpu_decode_tables() + "\n\n" + summary_precision_table() + "\n\n" + engine_tpot_table() + "\n\n"
            + prefix_match_table() + "\n\n" + gemma_speed_table() + "\n\n" + router_cost_table() + "\n\n"
            + vs_llamacpp_tables() + "\n\n" + prefill_tables() + "".join("\n\n" + t for t in extra))


def page_section(text: str) -> str:
    if START not in text or END not in text:
        raise ValueError(f"the page has no benchmark markers ({START!r} ... {END!r})")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def write_page(page: Path = PAGE) -> bool:
    text = page.read_text()
    if page_section(text) == tables():
        return False
    head, rest = text.split(START, 1)
    page.write_text(head + START + "\n" + tables() + "\n" + END + rest.split(END, 1)[1])
    return True


def figures() -> list[Path]:
    """Redraw every benchmark figure whose data the committed JSON holds, with each benchmark's own `plot` (the
    figures change with the drawing code; the measurements do not): cpu_decode, summary_precision, gemma_speed and
    vs_llamacpp (each machine's file). Returns the paths written."""
    from benchmarks import bench_cpu_decode, bench_gemma_speed, bench_summary_precision, bench_vs_llamacpp
    root = RESULTS.parents[1]
    out = []
    for f in sorted(RESULTS.glob("cpu_decode*.json")):          # each run's figure: figures/<its name>.png
        bench_cpu_decode.plot(json.loads(f.read_text()), root / "figures" / f"{f.stem}.png")
        out.append(root / "figures" / f"{f.stem}.png")
    d = json.loads((RESULTS / "summary_precision.json").read_text())
    bench_summary_precision.plot(d["real_rows"], d["probe_summary"], root / "figures" / "summary_precision.png")
    out.append(root / "figures" / "summary_precision.png")
    d = json.loads((RESULTS / "gemma_speed.json").read_text())
    bench_gemma_speed.plot(d["cases"], RESULTS / "gemma_speed.png")
    out.append(RESULTS / "gemma_speed.png")
    for f in sorted(RESULTS.glob("vs_llamacpp*.json")):
        bench_vs_llamacpp.plot(json.loads(f.read_text()), f.with_suffix(".png"))
        out.append(f.with_suffix(".png"))
    return out


if __name__ == "__main__":
    import sys
    if "--figures" in sys.argv:
        for p in figures():
            print("drew", p.relative_to(RESULTS.parents[1]))
    elif "--write" in sys.argv:
        print("docs/benchmarks.md re-rendered" if write_page() else "docs/benchmarks.md already current")
    else:
        print(tables())
