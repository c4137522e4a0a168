"""The CPU configurations a baseline must hold under (`suite.cpuconfig`), and the record of CPU-gated paths a process
ran (`core.cpu_paths`), which keeps the paths whose bits depend on an optional CPU feature out of smoke baselines."""
import pytest
import torch
from conftest import make_store, rand_kv

from sparsekv.attention import decode
from sparsekv.core import cpu_paths
from sparsekv.model import quant
from sparsekv.suite import cpuconfig


def test_alt_leaves_nothing_a_plain_avx2_machine_lacks():
    """ATen, MKL and oneDNN each say which ISA they run (their own banners, read in a fresh process), and the
    extension is built for another -march without its bfloat16 prefill kernel. On a machine with AVX-512 the same
    check on the native configuration must see it: the check can fail."""
    alt = cpuconfig.describe("alt")
    assert cpuconfig.lacks_avx512(alt), alt
    assert alt["threads"] == 1 and alt["mkl"] != "?" and alt["onednn"] != "?", alt
    if "avx512f" in cpuconfig.cpu_flags():
        native = cpuconfig.describe("native")
        assert not cpuconfig.lacks_avx512(native), native


def test_a_configuration_at_a_thread_count_changes_only_the_thread_counts():
    """What `--cpu alt` benchmarks inherit (bench_vs_llamacpp, bench_prefill_avx2): the configuration, at their own
    threads; a bad count is refused before anything runs."""
    alt, at2 = cpuconfig.environment("alt"), cpuconfig.environment("alt", threads=2)
    assert at2 == {**alt, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"} and alt["OMP_NUM_THREADS"] == "1"
    assert cpuconfig.environment("native", threads=3) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    assert cpuconfig.environment("native") == {}
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(ValueError, match="threads must be a positive int"):
            cpuconfig.environment("alt", threads=bad)


@pytest.mark.parametrize("flags,alt_arch", [({"avx2", "fma", "avx512f", "avx512_bf16"}, "x86-64-v3"),
                                            ({"avx2", "fma"}, "x86-64")])
def test_avx2_is_the_x86_64_v3_build_on_every_cpu_with_avx2(monkeypatch, flags, alt_arch):
    """What a benchmark's `--cpu alt` runs ("as an AVX2 machine") is cpuconfig's "avx2": the x86-64-v3 build with
    the libraries capped at AVX2, on an AVX-512 CPU and on an AVX2-only one alike. "alt" differs on the AVX2-only
    CPU: there it is the portable build, which no AVX2 machine runs (a `make test` on an AVX2-only view of this CPU
    failed on that, 2026-12-07). Without AVX2 and FMA, "avx2" is refused."""
    monkeypatch.setattr(cpuconfig, "cpu_flags", lambda: set(flags))
    avx2, alt = cpuconfig.environment("avx2"), cpuconfig.environment("alt")
    assert avx2["SPARSEKV_CPU_ARCH"] == "x86-64-v3" and alt["SPARSEKV_CPU_ARCH"] == alt_arch
    assert {k: v for k, v in avx2.items() if k != "SPARSEKV_CPU_ARCH"} == \
        {k: v for k, v in alt.items() if k != "SPARSEKV_CPU_ARCH"}
    assert avx2["ATEN_CPU_CAPABILITY"] == "avx2" and avx2["ONEDNN_MAX_CPU_ISA"] == avx2["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert cpuconfig.environment("avx2", threads=2)["OMP_NUM_THREADS"] == "2"
    for without in ({"fma"}, {"avx2"}, set()):
        monkeypatch.setattr(cpuconfig, "cpu_flags", lambda: set(without))
        with pytest.raises(ValueError, match="name 'avx2' needs a CPU with AVX2 and FMA"):
            cpuconfig.environment("avx2")
        assert cpuconfig.environment("alt")["SPARSEKV_CPU_ARCH"] == "x86-64"


class _Said:
    """A stand-in for `subprocess.Popen` in `cpuconfig.build`: says what `cpu_decode.load` says with SPARSEKV_NO_EXT
    set, without starting Python (the real process runs in the AVX-512 case below, and in every `make kernels`)."""
    def __init__(self, *args, **kwargs):
        pass

    def communicate(self, timeout=None):
        return "SPARSEKV_NO_EXT is set\n", ""


@pytest.mark.parametrize("flags,processes", [({"avx2", "fma", "avx512f"}, 2), ({"avx2", "fma"}, 3), ({"sse2"}, 2)])
def test_make_kernels_builds_once_per_march_and_says_why_a_configuration_is_not_built(monkeypatch, flags, processes):
    """`make kernels` (`cpuconfig.build`): one process per distinct -march, so "alt" and "avx2" share a build on an
    AVX-512 CPU and not on an AVX2-only one; "avx2" is not built (and says why) on a CPU without AVX2 and FMA. With
    SPARSEKV_NO_EXT set no process compiles, and each says why it built nothing (real processes in the first case).
    "native" is this machine's -march unless SPARSEKV_CPU_ARCH names one (as `as-avx2` does: x86-64-v3), and then
    it shares that -march's build (a `make test-avx2` run found this test assuming it unset, 2026-12-07)."""
    import subprocess
    monkeypatch.setattr(cpuconfig, "cpu_flags", lambda: set(flags))
    monkeypatch.setenv("SPARSEKV_NO_EXT", "1")
    monkeypatch.delenv("SPARSEKV_CPU_ARCH", raising=False)
    started, run = [], subprocess.Popen if "avx512f" in flags else _Said
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(k["env"].get("SPARSEKV_CPU_ARCH")) or
                        run(*a, **k))
    got = cpuconfig.build()
    assert list(got) == list(cpuconfig.CONFIGS) and len(started) == processes, (got, started)
    assert started[0] is None and len(set(started)) == len(started)       # native first; no -march built twice
    for name, arch in (("native", "native"), ("alt", cpuconfig.alt_arch(flags))):
        assert got[name] == f"not built ({arch}): SPARSEKV_NO_EXT is set", got
    if {"avx2", "fma"} <= flags:
        assert got["avx2"] == "not built (x86-64-v3): SPARSEKV_NO_EXT is set", got
    else:
        assert got["avx2"].startswith("not built: name 'avx2' needs a CPU with AVX2 and FMA"), got
    for bad in ("alt", ["alt", "sse"], [None]):
        with pytest.raises(ValueError, match="names must be a list of configurations"):
            cpuconfig.build(bad)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(k["env"].get("SPARSEKV_CPU_ARCH")) or
                        _Said())
    assert cpuconfig.main(["native"]) == 0 and len(started) == processes + 1
    monkeypatch.setenv("SPARSEKV_CPU_ARCH", "x86-64-v3")
    started.clear()
    got = cpuconfig.build(["native", "alt"])
    assert len(started) == (1 if cpuconfig.alt_arch(flags) == "x86-64-v3" else 2), (got, started)
    assert got["native"] == "not built (x86-64-v3): SPARSEKV_NO_EXT is set", got
    with pytest.raises(SystemExit):
        cpuconfig.main(["nope"])


def test_lacks_avx512_reads_each_library_and_the_extension():
    plain = {"aten": "AVX2", "mkl": "Intel(R) AVX2", "onednn": "Intel AVX2", "extension_arch": "x86-64-v3",
             "bf16_prefill_kernel": False}
    assert cpuconfig.lacks_avx512(plain)
    for key, value in (("aten", "AVX512"), ("mkl", "Intel(R) AVX-512"), ("onednn", "Intel AVX10.1 and Intel AMX"),
                       ("extension_arch", "native"), ("bf16_prefill_kernel", True)):
        assert not cpuconfig.lacks_avx512({**plain, key: value}), key     # each one alone is caught


@pytest.fixture
def fresh_paths():
    cpu_paths.reset()
    yield
    cpu_paths.reset()


def test_a_bfloat16_prefill_records_its_gated_paths_and_float32_none(fresh_paths):
    store = make_store(layers=1, kv_heads=2, head_dim=32, block_size=4, num_blocks=8)
    seq = store.new_sequence()
    k, v = rand_kv(store, 12, torch.Generator().manual_seed(0))
    store.append(seq, k, v)
    q = torch.randn(5, 4, 32, generator=torch.Generator().manual_seed(1))
    decode.prefill_attention(q, store, seq, 0)
    assert cpu_paths.taken() == []                                        # float32: the portable kind
    decode.prefill_attention(q.bfloat16(), store, seq, 0, backend="torch")
    assert cpu_paths.taken() == ["bf16_prefill_sdpa"]


def test_a_bfloat16_prefill_matmul_is_recorded(fresh_paths):
    w = quant.QuantWeight(torch.randint(-128, 128, (8, 64), dtype=torch.int8), torch.rand(8, 4), torch.zeros(0), 8,
                          16, "test")
    lin = quant.QuantLinear(w)
    x = torch.randn(quant.DECODE_ROWS + 1, 64)
    lin(x)
    assert cpu_paths.taken() == []
    lin.set_prefill("bfloat16")
    lin(x)
    assert cpu_paths.taken() == ["bf16_matmul"]
    with pytest.raises(ValueError, match="path must be one of"):
        cpu_paths.take("avx512")
