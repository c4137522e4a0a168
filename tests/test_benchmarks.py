"""The CPU decode benchmark runs end to end on a tiny case, and its same-run correctness checks hold.

No timing is asserted here (this machine is shared); the benchmark's own checks are: dense equals SDPA,
the fused route selects what the torch router selects for every rotating query (up to rounding at a
near-tie), and the JSON carries a floor and a ratio for every variant it timed.
"""
import json

import pytest

from benchmarks import bench_cpu_decode


def test_the_cpu_benchmark_runs_and_checks_itself(tmp_path):
    out, fig = tmp_path / "cpu.json", tmp_path / "cpu.png"
    rc = bench_cpu_decode.main(["--contexts", "1100", "--dtypes", "float32", "bfloat16", "--no-flex", "--repeats", "1",
                                "--warmup", "0", "--rotate", "3", "--budget", "256", "--out", str(out),
                                "--figure", str(fig)])
    assert rc == 0 and fig.stat().st_size > 0
    d = json.loads(out.read_text())
    assert d["rotate"] == 3 and d["read_bandwidth_Bps"] > 0 and d["matmul_flops"] > 0
    for case in d["cases"]:
        assert case["correct"] and case["fused_route_mass_gap"] < 1e-5 and case["rotation_reuse"]   # 3 queries < calls
        timed = [k[:-2] for k in case if k.endswith("_s") and f"{k[:-2]}_floor_s" in case]
        assert {"sparse", "sparse_attn", "dense", "sdpa", "sdpa_grouped", "sparse_unfused"} <= set(timed)
        assert case["sdpa_kernel"].startswith("_scaled_dot_product") and case["sdpa_grouped_kernel"].startswith("_scaled")
        for v in timed:
            assert case[f"{v}_over_floor"] > 0 and case[f"{v}_bound"] in ("bytes", "compute")


def test_the_router_cost_benchmark_runs_and_charges_what_each_router_reads(tmp_path):
    from benchmarks import bench_router_cost
    out = tmp_path / "rc.json"
    assert bench_router_cost.main(["--contexts", "1100", "16400", "--calls", "2", "--threads", "1",
                                   "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    for case in d["cases"]:
        assert case["fused_equals_torch"] >= 0.9
        assert case["minmax (fused).summary_bytes"] == case["minmax (torch).summary_bytes"] \
            == case["blocks"] * 3 * 2 * 64 * 4
        assert case["labels.summary_bytes"] == case["minmax (fused).summary_bytes"]    # r = 2 D / block: Quest's bytes
        assert case["halves (fused).summary_bytes"] == case["halves (torch).summary_bytes"] \
            == case["minmax (fused).summary_bytes"]                                     # two half means: Quest's bytes
        assert case["halves_fused_equals_torch"] >= 0.9
        assert all(case[f"{r}.us"] > 0 for r in d["routers"])
    big = d["cases"][-1]                              # 1,025 blocks: 16 complete groups of 64, 4 refined, and the tail
    assert big["hminmax-g64-k4.summary_bytes"] < big["minmax (fused).summary_bytes"]


def test_the_llama_cpp_benchmark_runs_on_a_short_prompt(tmp_path):
    """Only where its peer is installed (`make bench-peers`; never in `make test`'s set-up): every engine on the same
    ids, each with a spread over its rounds, a floor and its settings; the exact comparison takes an exact
    configuration; routed decode carries its quality and a ratio against the lossy configuration; the figure."""
    import pytest
    pytest.importorskip("llama_cpp")
    from benchmarks import bench_vs_llamacpp
    from sparsekv.model import fetch
    if not fetch.model_path(fetch.SMOLLM2, bench_vs_llamacpp.ROOT).is_file():
        pytest.skip("SmolLM2's GGUF is not fetched")
    out = tmp_path / "vs.json"
    assert bench_vs_llamacpp.main(["--models", "smollm2", "--lengths", "300", "--steps", "2", "--repeats", "2",
                                   "--llama-configs", "fa0-f16", "fa1-bf16", "fa1-q8_0", "--quality-tokens", "8",
                                   "--skip-agreement", "--skip-profile", "--run-kind", "test", "--threads", "1",
                                   "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    (case,) = d["cases"]
    engines = {"llamacpp_fa0-f16", "llamacpp_fa1-bf16", "llamacpp_fa1-q8_0", "sparsekv_dense", "sparsekv_routed"}
    assert engines <= set(case["tpot_s"]) and engines <= set(case["decode_floor_s"])
    for k in engines:
        t = case["tpot_s"][k]
        assert 0 < t["lo"] <= t["median"] <= t["hi"] and t["n"] == 2 and case["tpot_over_floor"][k]["median"] > 0
    assert case["llamacpp_best_exact"]["tpot"] in ("fa0-f16", "fa1-bf16")           # never the lossy one
    assert case["llamacpp_settings"]["fa1-q8_0"]["flash_attn"] is True and not case["llamacpp_settings"]["fa1-q8_0"]["exact"]
    assert case["ratios"]["dense_vs_llamacpp"]["verdict"] in ("faster", "slower", "tie")
    assert "routed_vs_llamacpp_fa1-q8_0" in case["ratios"]
    assert case["quality"]["sparsekv_routed"]["positions"] == 8 and case["quality"]["llamacpp_fa1-q8_0"]["kl_mean"] >= 0
    assert case["kv_read_per_step"]["llamacpp_fa1-q8_0"] < case["kv_read_per_step"]["llamacpp_fa0-f16"]
    assert case["sparsekv_weight_bytes"] < case["llamacpp_weight_bytes"] * 1.5        # the file's codes, not float32
    assert d["files"]["smollm2"]["sha256"] and d["run_kind"] == "test"
    assert out.with_suffix(".png").stat().st_size > 0
    # the prefill attention the engine took, and the other one timed beside it where there is one
    from benchmarks import report
    assert case["prefill_attention"] in ("sdpa_amx", "bf16_prefill_kernel", "bf16_prefill_f32_kernel", "sdpa")
    other = bench_vs_llamacpp.other_prefill(case["prefill_attention"])
    if other is not None:
        assert case[f"sparsekv_prefill_{other[1]}_s"] > 0
        assert "| smollm2 | 300 |" in report.vs_llamacpp_table(out).split("What the")[1]


def test_the_prefill_benchmark_runs_as_an_avx2_machine_and_says_which(tmp_path):
    """--quick under the "alt" configuration (the x86-64-v3 extension, ATen at AVX2): the kernel's output matches SDPA
    in float32 to rounding, and the JSON names the CPU, the configuration and the shared machine."""
    import pytest

    from benchmarks import bench_prefill_avx2
    from sparsekv.suite.cpuconfig import cpu_flags
    if not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("this CPU cannot run an x86-64-v3 build")
    out = tmp_path / "pf.json"
    assert bench_prefill_avx2.main(["--quick", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["cpu"] and d["cpu_config"] == "alt" and d["extension_arch"] == "x86-64-v3" and d["shared_machine"]
    assert d["threads"] == 1 and d["f32_prefill_vectorized"] and not d["bf16_prefill_kernel"]
    (case,) = d["cases"]
    assert case["f32_kernel_bfloat16_max_diff_vs_sdpa_f32"] < 1e-4 and case["f32_kernel_float32_max_diff_vs_sdpa_f32"] < 1e-4
    assert case["f32_kernel_vs_sdpa_bfloat16"] > 0 and case["sdpa_float32_gflops"] > 0
    # as an AVX2 machine: oneDNN is capped below AMX, so "auto" takes the float32 kernel, and the table says so
    assert d["amx_bf16"] is False and case["auto"] == "bf16_prefill_f32_kernel"
    from benchmarks import report
    table = report.prefill_table(out)
    assert "bf16_prefill_f32_kernel |" in table and "alt (extension -march x86-64-v3" in table


def test_the_llama_cpp_benchmark_times_the_prefill_attention_the_engine_did_not_take():
    """What the engine's prefill attention buys is measured against the other one: SDPA where "auto" takes a kernel,
    the kernel where it takes SDPA on AMX (a float32 prefill's kernel too), nothing where "auto" takes plain SDPA."""
    from benchmarks.bench_vs_llamacpp import other_prefill
    assert other_prefill("bf16_prefill_kernel") == ("torch", "sdpa")
    assert other_prefill("bf16_prefill_f32_kernel") == ("torch", "sdpa")
    assert other_prefill("f32_prefill_kernel") == ("torch", "sdpa")
    assert other_prefill("sdpa_amx") == ("cpp", "kernel")
    assert other_prefill("sdpa") is None


def test_the_first_token_probe_records_both_picks_and_their_gaps(tmp_path):
    """Only where llama.cpp is installed: every exact configuration and both sparsekv prefills on the same short
    prompt, each pair's picks, gaps and KL; a pick that agrees has no gap, and the gaps are never negative (each side
    prefers its own pick)."""
    pytest.importorskip("llama_cpp")
    from benchmarks import bench_first_token, bench_vs_llamacpp
    from sparsekv.model import fetch
    if not fetch.model_path(fetch.SMOLLM2, bench_vs_llamacpp.ROOT).is_file():
        pytest.skip("SmolLM2's GGUF is not fetched")
    out = tmp_path / "ft.json"
    assert bench_first_token.main(["--model", "smollm2", "--length", "200", "--threads", "1", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert set(d["sparsekv"]) == {"bfloat16", "float32"} and set(d["llamacpp"]) == {"fa0-f16", "fa1-f16"}
    for gaps in [*d["sparsekv"].values(), d["sparsekv_bf16_vs_f32"], *d["llamacpp"].values()]:
        for k, g in gaps.items():
            if k == "sparsekv":
                continue
            assert g["gap_sparsekv"] >= 0 and g["gap_llamacpp"] >= 0 and g["kl"] >= -1e-9
            assert (g["token"] == gaps["sparsekv"]) == (g["gap_sparsekv"] == 0 == g["gap_llamacpp"])
    with pytest.raises(SystemExit):
        bench_first_token.main(["--length", "1"])


def layer_weights(c) -> int:
    """Weights in one layer of a model with config `c`: q, k, v (dim x (Hq + 2 H) D), o ((Hq D) x dim), gate and up
    (dim x 2 I) and down (I x dim)."""
    return c.dim * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads * c.head_dim * c.dim \
        + 3 * c.dim * c.intermediate_size


def test_the_held_weights_benchmark_times_both_and_records_the_bytes_held(tmp_path):
    """SmolLM2 at 600 tokens in chunks of 256 (3 chunks), float32, 2 rounds: both variants timed in every round, the
    paired ratio with a verdict, and the bytes held equal to the W a prefill chunk multiplies by, in float32: per
    layer q, k, v (dim x (Hq + 2 H) D), o ((Hq D) x dim), gate and up (dim x 2 I) and down (I x dim); the lm_head
    multiplies one row, through the decode kernel, and holds nothing."""
    from benchmarks import bench_held_weights
    out = tmp_path / "held.json"
    # one thread, the worker's share of the cores (tests/conftest.py): at the benchmark's default of 2, three pytest
    # workers on 2 cores stalled at every parallel op, and this test took 338 s of make test against 34 s alone
    # (2026-12-07), the last unit to finish
    assert bench_held_weights.main(["--quick", "--threads", "1", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    (case,) = d["cases"]
    assert d["threads"] == 1 and case["chunks"] == 3 and case["held_s"]["n"] == case["unheld_s"]["n"] == 2
    assert case["held_vs_unheld"]["verdict"] in ("faster", "slower", "tie")
    import sparsekv as sk
    from benchmarks.bench_vs_llamacpp import model_file
    c = sk.load_model(model_file("smollm2", 1)[0], weights="gguf").config
    assert case["held_bytes"] == 4 * c.n_layers * layer_weights(c)
    (serve,) = d["serving"]          # 18 prompts of 14 tokens (one chunk), 2 new: one decode step of all 18 rows
    assert serve["requests"] == 18 and serve["max_batch"] == 18 and serve["same_tokens"] is True
    assert 0 < serve["decode_steps_wider"] <= serve["decode_steps"] and serve["preemptions"] == 0
    # a wide decode batch multiplies the lm_head too (a chunk multiplies its last row only, through the kernel)
    assert serve["held_bytes"] == case["held_bytes"] + 4 * c.vocab_size * c.dim
    assert serve["prefill"] == "float32"
    for k in ("chunks", "steps", "run"):
        assert serve[k]["held_s"]["n"] == serve[k]["unheld_s"]["n"] == 2
        assert serve[k]["held_vs_unheld"]["verdict"] in ("faster", "slower", "tie")
    for bad in (["--serve-new", "0"], ["--lengths", "--serve-requests", "0"], ["--lengths", "1"]):
        with pytest.raises(SystemExit):
            bench_held_weights.main([*bad, "--out", str(tmp_path / "refused.json")])
    assert not (tmp_path / "refused.json").exists()


def test_the_decode_rows_benchmark_times_both_paths_at_each_width_and_refuses_bad_arguments(tmp_path):
    """SmolLM2, float32 activations, 1 and 24 rows, 2 rounds, one thread: both paths timed in every round over the
    linear maps of a decode step (the lm_head included), the paired ratio with its verdict, and the bytes held: each
    map's float32 W once."""
    from benchmarks import bench_decode_rows
    from sparsekv.model import fetch
    if not fetch.model_path(fetch.SMOLLM2, bench_decode_rows.ROOT).is_file():
        pytest.skip("SmolLM2's GGUF is not fetched")
    out = tmp_path / "rows.json"
    assert bench_decode_rows.main(["--quick", "--threads", "1", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    (run,) = d["runs"]
    assert d["threads"] == 1 and d["decode_rows"] == 16 and run["activations"] == "float32"
    assert [c["rows"] for c in run["cases"]] == [1, 24]
    for c in run["cases"]:
        assert c["kernel_s"]["n"] == c["held_s"]["n"] == 2 and c["kernel_vs_held"]["verdict"] in ("faster", "slower", "tie")
    import torch

    import sparsekv as sk
    from benchmarks.bench_vs_llamacpp import model_file
    from sparsekv.model import quant
    model = sk.load_model(model_file("smollm2", 1)[0], weights="gguf")
    layers = quant.step_linears(model)                  # fused q, k, v and gate, up: 4 per layer and the lm_head
    c = model.config
    assert run["linears"] == len(layers) == 4 * c.n_layers + 1
    # each W counted once: the parts of a fused projection not again
    assert run["weight_bytes_held"] == 4 * (c.n_layers * layer_weights(c) + c.vocab_size * c.dim)
    x = torch.randn(24, layers[0].in_features)           # the kernel at any width is the matmul by W, to rounding
    torch.testing.assert_close(layers[0].codes_matmul(x), x @ layers[0].dequantized().T, rtol=1e-4, atol=1e-4)
    for bad in (["--repeats", "1"], ["--rows", "0"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            bench_decode_rows.main([*bad, "--out", str(tmp_path / "refused.json")])
    assert not (tmp_path / "refused.json").exists()
