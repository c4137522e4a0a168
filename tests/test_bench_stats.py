"""The peer benchmarks' helpers: statistics of repeats (`benchmarks.repeats`), floors (`benchmarks.floors`), llama.cpp's
configurations (`benchmarks.llama_peer`) and the verdict line (`bench_vs_llamacpp.verdict`). Exact where the logic is.
"""
import pytest

from benchmarks import floors, repeats
from benchmarks.llama_peer import CONFIGS, DEFAULT_CONFIGS, LlamaConfig
from sparsekv.model.model import ModelConfig


def test_a_spread_is_the_median_and_the_min_max_with_its_coverage():
    s = repeats.spread([3.0, 1.0, 2.0])
    assert (s.median, s.lo, s.hi, s.n) == (2.0, 1.0, 3.0, 3)          # invariant 1: lo <= median <= hi
    assert s.coverage == 0.75                                          # invariant 3: 1 - 2 * 0.5**3
    assert repeats.spread([5.0]).coverage == 0.0                       # one value promises nothing
    assert repeats.spread([1.0, 2.0, 3.0, 4.0]).median == 2.5
    assert s.scaled(1e3).as_dict() == {"median": 2000.0, "lo": 1000.0, "hi": 3000.0, "n": 3, "coverage": 0.75}
    assert repeats.Spread.from_dict(s.as_dict()) == s                  # what a results JSON holds reads back
    with pytest.raises(ValueError):
        repeats.spread([])


def test_ratios_pair_round_with_round():
    # Drift: round 2 is slow for both engines. Paired, the ratio is 0.5 every round; unpaired medians would say 1.0.
    a, b = [1.0, 1.0, 4.0], [2.0, 2.0, 8.0]
    r = repeats.paired_ratio(a, b)
    assert (r.median, r.lo, r.hi) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError):
        repeats.paired_ratio([1.0], [1.0, 2.0])


@pytest.mark.parametrize("values, expected", [
    ([0.80, 0.85, 0.94], "faster"),       # the whole interval below 1 - 5%
    ([0.80, 0.85, 0.96], "tie"),          # its top is inside the margin
    ([0.80, 0.90, 1.10], "tie"),          # it straddles 1
    ([1.06, 1.20, 1.30], "slower"),       # the whole interval above 1 + 5%
    ([1.04, 1.20, 1.30], "tie"),          # its bottom is inside the margin
])
def test_a_verdict_needs_the_whole_interval_past_the_margin(values, expected):
    assert repeats.verdict(repeats.spread(values)) == expected


def test_the_fastest_is_the_lowest_median_and_ties_are_broken_stably():
    s = {"b": repeats.Spread(1.0, 0.9, 1.2, 3), "a": repeats.Spread(1.0, 0.9, 1.1, 3), "c": repeats.Spread(2.0, 1, 3, 3)}
    assert repeats.fastest(s) == "a"                                   # equal medians: the lower interval top
    assert repeats.fastest({"x": s["b"], "y": repeats.Spread(1.0, 0.9, 1.2, 3)}) == "x"   # then the name


def _cfg(**kw):
    return ModelConfig(vocab_size=100, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=128,
                       **kw)


def test_decode_kv_bytes_count_each_layer_over_its_window_at_the_types_width():
    g = _cfg()
    assert floors.decode_kv_bytes(g, 100, "f16") == 4 * 100 * 2 * 2 * 16 * 2       # layers x tokens x K,V x heads x D x 2 B
    assert floors.decode_kv_bytes(g, 100, "q8_0") == 4 * 100 * 2 * 2 * 16 * 34 / 32
    s = _cfg(windows=(8, 8, 8, 0))                                                   # three sliding layers of 8
    assert floors.decode_kv_bytes(s, 100, "bf16") == (3 * 8 + 100) * 2 * 2 * 16 * 2
    assert floors.decode_kv_bytes(s, 5, "bf16") == 4 * 5 * 2 * 2 * 16 * 2           # shorter than the window


@pytest.mark.parametrize("n", [1, 7, 8, 9, 50])
def test_prefill_flops_count_attention_pairs_as_a_triangle_then_a_band(n):
    from sparsekv.serving.gpu import param_count
    s = _cfg(windows=(8, 0, 8, 0))
    pairs = sum(sum(min(i + 1, w) if w else i + 1 for i in range(n)) for w in (8, 0, 8, 0))   # brute force
    dense = 2 * (param_count(s) - s.vocab_size * s.dim) * n + 2 * s.vocab_size * s.dim
    assert floors.prefill_flops(s, n) == dense + 4 * s.n_heads * s.head_dim * pairs


def test_floors_divide_by_the_measured_rates():
    rates = floors.MachineRates(read_Bps=1e9, f32_flops=1e11, bf16_flops=4e11)
    assert rates.flops == 4e11                                         # the faster rate: the lower floor
    assert floors.decode_floor_s(3e8, 1e8, rates) == pytest.approx(0.4)
    g = _cfg()
    assert floors.prefill_floor_s(g, 10, rates) == pytest.approx(floors.prefill_flops(g, 10) / 4e11)


def test_llama_configs_keep_their_invariants():
    with pytest.raises(ValueError):
        LlamaConfig(False, "q8_0")                 # invariant 1: a quantised V needs flash attention
    with pytest.raises(ValueError):
        LlamaConfig(True, "q5_1")                  # not a type this benchmark knows
    assert [c.exact for c in map(CONFIGS.get, ("fa0-f16", "fa1-bf16", "fa1-q8_0", "fa1-q4_0"))] == \
        [True, True, False, False]                 # invariant 2
    assert all(CONFIGS[c].name == c for c in CONFIGS)
    assert any(CONFIGS[c].exact for c in DEFAULT_CONFIGS) and not all(CONFIGS[c].exact for c in DEFAULT_CONFIGS)


def _ratio(values):
    s = repeats.spread(values)
    return {**s.as_dict(), "verdict": repeats.verdict(s)}


def test_the_verdict_line_calls_each_length_with_its_interval():
    from benchmarks.bench_vs_llamacpp import verdict
    case = {"model": "m", "length": 2048, "ratios": {"dense_vs_llamacpp": _ratio([0.8, 0.85, 0.9]),
                                                     "prefill_vs_llamacpp": _ratio([0.9, 1.0, 1.1]),
                                                     "routed_vs_llamacpp_fa1-q8_0": _ratio([1.1, 1.2, 1.3])}}
    assert verdict({"schema": 2, "cases": [case]}) == (
        "m: at 2,048: dense decode faster (0.85x, 0.80-0.90), prefill tie (1.00x, 0.90-1.10), "
        "routed vs fa1-q8_0 slower (1.20x, 1.10-1.30)")
    old = {"cases": [{"model": "m", "length": 2048, "routed_vs_llamacpp": 0.9, "dense_vs_llamacpp": 1.1,
                      "prefill_vs_llamacpp": 0.5}]}                  # results without intervals: the first rendering
    assert verdict(old) == "m: routed decode from 2,048 tokens, dense decode at no length measured; " \
                           "prefill faster at every length"


def test_unpaired_ratios_span_the_intervals_far_ends():
    r = repeats.ratio_bounds(repeats.Spread(2.0, 1.0, 4.0, 3), repeats.Spread(1.0, 0.5, 2.0, 3))
    assert (r.median, r.lo, r.hi, r.n) == (2.0, 0.5, 8.0, 3)          # 1 / 2 and 4 / 0.5


def _case(model, n):
    s = lambda m: {"median": m, "lo": 0.9 * m, "hi": 1.1 * m, "n": 3, "coverage": 0.75}
    engines = ("llamacpp_fa0-f16", "llamacpp_fa1-q8_0", "sparsekv_dense", "sparsekv_routed")
    settings = {"fa0-f16": {"flash_attn": False, "kv_type": "f16", "exact": True},
                "fa1-q8_0": {"flash_attn": True, "kv_type": "q8_0", "exact": False}}
    return {"model": model, "length": n, "llamacpp_settings": settings,
            "llamacpp_best_exact": {"prefill": "fa0-f16", "tpot": "fa0-f16"},
            "tpot_s": {k: s(0.01) for k in engines}, "tpot_over_floor": {k: s(2.0) for k in engines},
            "prefill_s": {"llamacpp_fa0-f16": s(1.0), "llamacpp_fa1-q8_0": s(1.0), "sparsekv": s(0.5)},
            "prefill_over_floor": {"llamacpp_fa0-f16": s(4.0), "llamacpp_fa1-q8_0": s(4.0), "sparsekv": s(2.0)},
            "kv_read_per_step": {k: 1e6 for k in engines},
            "quality": {"reference": {"sparsekv_routed": "sparsekv_dense", "llamacpp_fa1-q8_0": "llamacpp_fa0-f16"},
                        **{k: {"top1_agreement": 0.9, "kl_mean": 0.01, "kl_p99": 0.1, "positions": 64}
                           for k in ("sparsekv_routed", "llamacpp_fa1-q8_0")}},
            "ratios": {"dense_vs_llamacpp": _ratio([1.0, 1.02, 1.04]), "prefill_vs_llamacpp": _ratio([0.4, 0.5, 0.6]),
                       "routed_vs_llamacpp_fa1-q8_0": _ratio([0.7, 0.8, 0.9])},
            "llamacpp_prefill_s": 1.0, "sparsekv_prefill_s": 0.5}


def test_the_report_renders_a_run_with_intervals_settings_and_labels(tmp_path):
    import json

    from benchmarks import report
    d = {"schema": 2, "run_kind": "short verification run", "date": "2026-12-05", "llama_cpp_python": "0.3.36",
         "llama_cpp_amx": False, "llama_cpp_features": "CPU : AVX2 = 1 | REPACK = 1", "threads": 1, "cpu": "Xeon",
         "llama_settings": {"n_batch": 512, "swa_full": False}, "activations": "int8", "prefill": "bfloat16",
         "prefill_attention": "kernel", "budget_tokens": 128, "warmup": "one untimed eval", "repeats": 3, "steps": 4,
         "interval": repeats.INTERVAL, "noise_margin": 0.05, "read_bandwidth_Bps": 2e10, "floor_flops": 4e11,
         "quality_tokens": 64, "files": {"m": {"path": "m.gguf", "sha256": "ab" * 32}},
         "cases": [_case("m", 512)], "agreement": [], "overhead": []}
    path = tmp_path / "vs_llamacpp.json"
    path.write_text(json.dumps(d))
    text = report.vs_llamacpp_table(path)
    assert "short verification run" in text and "without AMX" in text            # what ran, and the build's label
    assert "`fa1-q8_0` (flash_attn True, K/V q8_0, lossy)" in text               # every configuration's settings
    assert "dense decode tie (1.02x, 1.00-1.04)" in text                         # a verdict inside the margin
    assert "| m | 512 | llama.cpp fa0-f16 (fastest exact prefill) (fastest exact tpot) | 1.00 [0.90-1.10] |" in text
    assert "| m | 512 | sparsekv_routed | sparsekv_dense | 1.00 MB | 90.0% | 0.0100 | 0.1000 | - |" in text
    assert "| m | 512 | llama.cpp fa1-q8_0 | llama.cpp fa0-f16 | 1.00 MB | 90.0% | 0.0100 | 0.1000 | " \
           "0.80 [0.70-0.90] faster |" in text                                  # routed against the lossy type


def test_the_summary_has_every_length_of_every_run_with_intervals_and_skips_runs_without_them(tmp_path):
    import json

    from benchmarks import report
    d = {"schema": 2, "date": "2026-12-06", "cpu": "EPYC", "cases": [_case("m", 512), _case("m", 2048)]}
    (tmp_path / "vs_llamacpp_a.json").write_text(json.dumps(d))
    (tmp_path / "vs_llamacpp_b.json").write_text(json.dumps({"schema": 1, "cases": [_case("old", 512)]}))
    text = report.vs_llamacpp_summary(sorted(tmp_path.glob("vs_llamacpp*.json")))
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [r.split(" | ")[2:4] for r in rows] == [["m", "512"], ["m", "2,048"]]    # every length; schema 1 left out
    assert rows[0] == ("| `vs_llamacpp_a` | EPYC, 2026-12-06 | m | 512 | 0.50 [0.40-0.60] faster | 1.02 [1.00-1.04] "
                       "tie | fa1-q8_0 0.80 [0.70-0.90] faster | 90.0%, 0.010 |")
    assert report.vs_llamacpp_summary([tmp_path / "vs_llamacpp_b.json"]) == ""


def test_decode_rounds_discard_warm_up_until_a_compiled_step_settles(monkeypatch):
    from benchmarks import bench_gemma_speed as g
    clock = [0.0]
    monkeypatch.setattr(g.time, "perf_counter", lambda: clock[0])
    costs = iter([9.0, 9.0, 5.0, 5.0, 1.0, 1.0] + [0.1] * 100)      # compile, recompiles, then steady steps of 0.1 s

    def step(t):
        clock[0] += next(costs)
        return t + 1
    r = g._rounds(step, 0, steps=2, rounds=3, settle=5)
    assert r.warmup_rounds == 5          # medians 9, 5, 1, 0.1, 0.1: the 5th is the first within 1.5x of the one before
    assert r.tpot == pytest.approx([0.1, 0.1, 0.1])     # every timed round is steady
    assert r.tokens == list(range(16))   # 8 rounds of 2 steps, warm-up included
    plain = g._rounds(lambda t: t, 0, steps=2, rounds=3)
    assert plain.warmup_rounds == 1 and len(plain.tpot) == 3


def test_the_gemma_speed_table_renders_intervals_verdicts_settings_and_both_matmul_rates(tmp_path):
    """A run with repeats: each time its median [min-max], each speed-up with sparsekv's verdict, transformers'
    settings, and the floor's matmul rates named by dtype (the faster, bfloat16 on AMX, is the floor although both
    systems compute in float32)."""
    import json

    from benchmarks import report
    sp = lambda m: {"median": m, "lo": 0.9 * m, "hi": 1.1 * m, "n": 3, "coverage": 0.75}
    case = {"length": 8192, "prefill_floor_s": 2.0, "decode_floor_s": 0.04, "same_tokens": True,
            "sparsekv_ttft_s": 10.0, "sparsekv_ttft": sp(10.0), "sparsekv_tpot_s": 0.1, "sparsekv_tpot": sp(0.1),
            "transformers_ttft_s": 20.0, "transformers_ttft": sp(20.0), "transformers_tpot_s": 0.1,
            "transformers_tpot": sp(0.1), "sparsekv_kv_held": 2**26, "transformers_kv_held": 2**25,
            "sparsekv_peak_rss": 2**31, "transformers_peak_rss": 2**31, "sparsekv_base_rss": 2**30,
            "transformers_base_rss": 2**30, "prefill_speedup": 2.0,
            "prefill_speedup_interval": {**sp(2.0), "verdict": "faster"}, "decode_speedup": 1.0,
            "decode_speedup_interval": {**sp(1.0), "verdict": "tie"},
            "transformers_settings": {"attn_implementation": "sdpa", "chunk": 512, "decode_compared": "static",
                                      "decode_variants": {"static": {"cache": "StaticCache", "torch_compile": False}}}}
    d = {"schema": 2, "run_kind": "full run", "date": "2026-12-06", "transformers": "5.2", "threads": 2, "steps": 16,
         "repeats": 3, "interval": repeats.INTERVAL, "noise_margin": 0.05, "rss": "request peak", "read_bandwidth_Bps": 2e10,
         "f32_matmul_flops": 4e11, "bf16_matmul_flops": 2.5e12, "matmul_flops": 2.5e12, "cases": [case]}
    path = tmp_path / "gemma_speed.json"
    path.write_text(json.dumps(d))
    text = report.gemma_speed_table(path)
    assert "float32 400, bfloat16 2500 GFLOP/s; the floor takes the faster" in text
    assert "attention `sdpa`" in text and "`static` (StaticCache)" in text
    assert "the fastest at each length is compared (8,192: `static`)" in text
    row = [line for line in text.splitlines() if line.startswith("| 8,192")][0]
    assert "| 10.0 s [9.0-11.0 s] | 20.0 s [18.0-22.0 s] | 2.00x [1.80-2.20x] faster |" in row
    assert "| 100 ms [90-110 ms] | 100 ms [90-110 ms] | 1.00x [0.90-1.10x] tie |" in row
    del d["f32_matmul_flops"], d["bf16_matmul_flops"]                  # an older run kept only the floor's rate
    path.write_text(json.dumps(d))
    assert "matmul rate (2500 GFLOP/s)" in report.gemma_speed_table(path)


def test_a_span_gives_every_value_its_ends_and_one_value_once():
    assert repeats.span_text([0.92, 0.87, 0.89]) == "0.87-0.92x"
    assert repeats.span_text([1.004, 0.996]) == "1.00x"                    # both ends print alike
    assert repeats.span_text([2.0, 4.44], digits=1) == "2.0-4.4x"
    with pytest.raises(ValueError, match="no ratios"):
        repeats.span_text([])


def test_a_run_as_an_avx2_machine_is_labelled_wherever_it_is_shown(tmp_path):
    """`--cpu alt` runs both engines on their AVX2 paths on a CPU with AVX-512: the summary row, the run's header and
    its figure say so, and say what was forced; a run as the CPU is keeps the plain CPU name."""
    import json

    from benchmarks import report
    from benchmarks.bench_vs_llamacpp import cpu_label
    alt = {"name": "alt", "aten": "AVX2", "extension_arch": "x86-64-v3", "onednn_max_isa": "AVX2",
           "mkl_instructions": "AVX2", "llama_cpp_path": "build/llama-avx2/llama_cpp"}
    d = {"schema": 2, "date": "2026-12-07", "cpu": "Xeon", "cpu_config": alt, "cases": [_case("m", 512)]}
    (tmp_path / "vs_llamacpp_alt.json").write_text(json.dumps(d))
    (tmp_path / "vs_llamacpp_native.json").write_text(json.dumps({**d, "cpu_config": {**alt, "name": "native"}}))
    rows = [r for r in report.vs_llamacpp_summary(sorted(tmp_path.glob("*.json"))).splitlines() if r.startswith("| `")]
    assert rows[0].startswith("| `vs_llamacpp_alt` | Xeon, AVX2 paths (`--cpu alt`), 2026-12-07 |")
    assert rows[1].startswith("| `vs_llamacpp_native` | Xeon, 2026-12-07 |")
    long = report._vs_cpu(d)
    assert "ATen's AVX2 kernels" in long and "-march x86-64-v3" in long and "without AVX-512" in long
    assert cpu_label(d) == "Xeon as an AVX2 machine (--cpu alt)" and cpu_label({"cpu": "Xeon"}) == "Xeon"


@pytest.mark.parametrize("flags, cap, expected", [
    ({"avx512_bf16"}, None, True),
    ({"amx_bf16"}, "AVX512_CORE_AMX", True),
    ({"avx512_bf16", "amx_bf16"}, "AVX2", False),         # `--cpu alt`: oneDNN capped at AVX2 emulates bfloat16
    ({"avx512_bf16"}, "avx512_core", False),             # below AVX512_CORE_BF16, whatever the case
    ({"avx2", "fma"}, None, False),                      # an AVX2-only CPU
])
def test_the_bfloat16_prefill_is_chosen_only_where_this_process_has_bfloat16_dot_products(cpu_as, flags, cap,
                                                                                          expected):
    from benchmarks import bench_vs_llamacpp as b
    cpu_as(flags, cap)
    assert b.native_bf16() is expected


def test_the_first_token_s_gaps_say_how_near_a_tie_the_two_engines_picks_are():
    import torch

    from benchmarks.bench_vs_llamacpp import first_token_gaps
    ours = torch.tensor([0.0, 2.0, 1.9, -1.0])
    theirs = {"fa1-f16": torch.tensor([0.0, 1.95, 2.0, -1.0]), "fa0-f16": ours.clone()}
    g = first_token_gaps(ours, theirs)
    assert g["sparsekv"] == 1 and g["fa1-f16"]["token"] == 2 and g["fa0-f16"]["token"] == 1
    assert g["fa1-f16"]["gap_sparsekv"] == pytest.approx(0.1) and g["fa1-f16"]["gap_llamacpp"] == pytest.approx(0.05)
    assert g["fa0-f16"]["gap_sparsekv"] == 0.0 and g["fa0-f16"]["kl"] == pytest.approx(0.0, abs=1e-12)
    p, q = torch.softmax(theirs["fa1-f16"].double(), -1), torch.softmax(ours.double(), -1)
    assert g["fa1-f16"]["kl"] == pytest.approx(float((p * (p / q).log()).sum()))       # KL(llama.cpp || sparsekv)


def test_the_report_says_where_the_first_greedy_tokens_differ_and_by_how_much():
    from benchmarks import report
    same = {"model": "m", "length": 2048, "same_first_token": True}
    old = {"model": "m", "length": 32768, "same_first_token": False}
    new = {**old, "first_token": {"sparsekv": 5, "fa1-f16": {"token": 7, "gap_sparsekv": 0.0312, "gap_llamacpp": 0.0101,
                                                               "kl": 0.00123},
                                  "fa0-f16": {"token": 5, "gap_sparsekv": 0.0, "gap_llamacpp": 0.0, "kl": 0.0}}}
    assert report._first_token(same) == "m at 2,048 the same"
    assert report._first_token(old) == "m at 32,768 different (gaps not recorded in this run)"
    assert report._first_token(new) == ("m at 32,768 different (sparsekv picks 5; fa1-f16: llama.cpp picks 7, gap 0.031 "
                                        "in sparsekv's logits and 0.010 in llama.cpp's, KL 0.0012)")


def test_what_the_float32_prefill_kernel_buys_is_paired_where_recorded_else_spans_the_far_ends():
    """A float32-prefill run whose engine took its own kernel renders kernel / SDPA: the paired ratio where the run
    records it, else the medians' ratio with the interval from the far ends (kernel 8-12 s over SDPA 10-16 s:
    0.5-1.2); other runs render nothing."""
    from benchmarks import report

    def s(m, lo, hi):
        return {"median": m, "lo": lo, "hi": hi, "n": 3, "coverage": 0.75}
    case = {"model": "m", "length": 16384, "prefill_attention": "f32_prefill_kernel",
            "prefill_s": {"sparsekv": s(9.0, 8.0, 12.0), "sparsekv_sdpa": s(12.0, 10.0, 16.0)}}
    old = report._kernel_buys({"cases": [case]})
    assert old[-1] == ("| m | 16,384 | 12.0 [10.0-16.0] s | 9.0 [8.0-12.0] s | 0.75 [0.50-1.20] | medians; interval "
                       "from the far ends |")
    new = report._kernel_buys({"cases": [{**case, "ratios": {"prefill_vs_sparsekv_sdpa": s(0.76, 0.74, 0.8)}}]})
    assert new[-1].endswith("| 0.76 [0.74-0.80] | rounds, paired |")
    assert report._kernel_buys({"cases": [{**case, "prefill_attention": "sdpa_amx"}]}) == []


def test_the_held_weights_table_gives_each_case_its_ratio_verdict_and_bytes(tmp_path):
    import json

    from benchmarks import report

    def s(m, lo, hi):
        return {"median": m, "lo": lo, "hi": hi, "n": 4, "coverage": 0.875}
    d = {"cpu": "C", "threads": 2, "date": "2026-12-07", "chunk": 512, "repeats": 4, "warmup": "w", "order": "o",
         "skipped_prefills": {"bfloat16": "no bfloat16 dot products in this process"},
         "cases": [{"model": "m", "prefill": "float32", "length": 8192, "held_bytes": 3 * 2**20,
                    "held_s": s(9.0, 8.5, 9.5), "unheld_s": s(10.0, 9.8, 10.4),
                    "held_vs_unheld": {**s(0.9, 0.88, 0.93), "verdict": "faster"}}]}
    path = tmp_path / "held_weights.json"
    path.write_text(json.dumps(d))
    assert "Served" not in report.held_weights_table(path)                  # a run from before the serving part
    ratio = {k: {"held_vs_unheld": {**s(m, m - 0.01, m + 0.01), "verdict": v}}
             for k, m, v in (("chunks", 0.95, "tie"), ("steps", 0.6, "faster"), ("run", 0.8, "faster"))}
    d["serving"] = [{"model": "m", "prefill": "bfloat16", "requests": 24, "prompt_tokens": 512, "new_tokens": 32,
                     "decode_steps": 55, "decode_steps_wider": 40, "same_tokens": True, "held_bytes": 5 * 2**20,
                     **ratio}]
    path.write_text(json.dumps(d))
    served = report.held_weights_table(path)
    assert served.splitlines()[-1] == ("| m | bfloat16 | 24 x 512, 32 | 0.95 [0.94-0.96] tie | 0.60 [0.59-0.61] faster "
                                       "(40 of 55) | 0.80 [0.79-0.81] faster | yes | 5 MiB |")
    (tmp_path / "held_weights_serving.json").write_text(json.dumps({**d, "cases": []}))     # a serving-only run
    both = report.held_weights_tables(tmp_path)
    assert both.count("`python -m benchmarks.bench_held_weights`") == 2
    assert both.count("| model | prefill | tokens |") == 1 and both.count("| model | prefill | requests") == 2
    d["serving"] = []
    path.write_text(json.dumps(d))
    text = report.held_weights_table(path)
    assert "bfloat16 not run: no bfloat16 dot products" in text
    assert text.splitlines()[-1] == ("| m | float32 | 8,192 | 9.00 [8.50-9.50] s | 10.00 [9.80-10.40] s | "
                                     "0.90 [0.88-0.93] faster | 3 MiB |")
    assert report.held_weights_table(tmp_path / "absent.json") == ""


def test_the_decode_rows_table_gives_each_width_its_ratio_and_the_first_slower_width(tmp_path):
    import json

    from benchmarks import report

    def s(m, lo, hi):
        return {"median": m, "lo": lo, "hi": hi, "n": 5, "coverage": 0.94}
    run = {"model": "m", "activations": "int8", "first_rows_kernel_slower": 16,
           "cases": [{"rows": 1, "kernel_s": s(0.02, 0.019, 0.021), "held_s": s(0.05, 0.049, 0.052),
                      "kernel_vs_held": {**s(0.4, 0.39, 0.42), "verdict": "faster"}},
                     {"rows": 16, "kernel_s": s(0.143, 0.14, 0.15), "held_s": s(0.13, 0.12, 0.14),
                      "kernel_vs_held": {**s(1.1, 1.07, 1.11), "verdict": "slower"}}]}
    d = {"cpu": "C", "threads": 2, "date": "2026-12-07", "repeats": 5, "decode_rows": 16, "warmup": "w", "order": "o",
         "runs": [run, {**run, "activations": "float32", "first_rows_kernel_slower": None}]}
    path = tmp_path / "decode_rows.json"
    path.write_text(json.dumps(d))
    lines = report.decode_rows_table(path).splitlines()
    assert "| m | int8 | 16 | 143.00 [140.00-150.00] ms | 130.00 [120.00-140.00] ms | 1.10 [1.07-1.11] slower |" in lines
    assert lines[-1] == "First width where the kernel is slower: m int8 16; m float32 none measured."
    assert report.decode_rows_table(tmp_path / "absent.json") == ""


def test_both_ways_warms_up_each_side_then_alternates_which_runs_first():
    from benchmarks import repeats
    calls = []

    def run(side):
        calls.append(side)
        return len(calls)
    a, b = repeats.both_ways(run, 3)
    assert calls == [True, False, True, False, False, True, True, False]
    assert a == [3, 6, 7] and b == [4, 5, 8]
