"""`suite.avx2_view`: this CPU as an AVX2-only machine sees itself (`make test-avx2`), its masked /proc/cpuinfo kept to
one mount namespace; qemu's emulated CPU, under which an AVX-512 instruction stops the process; and, run only under
that emulation, the engine's decode there against this CPU's, bit for bit."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparsekv.suite import avx2_view, cpuconfig

SAMPLE = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
          "flags\t\t: fpu sse2 avx f16c fma avx2 avx512f avx512_bf16 avx_vnni amx_tile amx_bf16 avx512vl\n"
          "vmx flags\t: vnmi avx512f_is_not_a_vmx_flag\nbogomips\t: 4000.00\n\n"
          "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: avx2 fma avx512f\n")
ROOT = Path(__file__).resolve().parents[1]


def test_the_masked_cpuinfo_drops_avx512_and_amx_and_keeps_every_other_line():
    out = avx2_view.mask_cpuinfo(SAMPLE)
    flags = [line.split(":", 1)[1].split() for line in out.splitlines() if line.startswith("flags")]
    assert flags == [["fpu", "sse2", "avx", "f16c", "fma", "avx2"], ["avx2", "fma"]]      # both processors
    assert out.count("(as AVX2: AVX-512 and AMX masked)") == 2                           # a result says so
    assert "vmx flags\t: vnmi avx512f_is_not_a_vmx_flag\n" in out                        # only `flags` lines
    assert "bogomips\t: 4000.00\n\nprocessor\t: 1\n" in out and len(out.splitlines()) == len(SAMPLE.splitlines())
    assert avx2_view.mask_cpuinfo(out) == out                                            # idempotent
    assert not any(map(avx2_view.masked, ("avx", "avx2", "fma", "f16c", "sse4_2")))
    assert all(map(avx2_view.masked, ("avx512f", "avx512_fp16", "amx_int8", "avx_vnni", "avx10_1")))


def test_the_command_binds_the_view_in_its_own_namespace_then_runs_under_qemu_if_asked(tmp_path):
    view = tmp_path / "cpuinfo"
    plain = avx2_view.command(["make", "test"], view)
    assert plain[:4] == ["unshare", "--mount", "--propagation", "private"] and plain[-3:] == [str(view), "make", "test"]
    emulated = avx2_view.command(["python", "-V"], view, "EPYC-Rome")
    assert emulated[-5:] == ["qemu-x86_64", "-cpu", "EPYC-Rome", "python", "-V"]


def test_it_refuses_what_it_cannot_run(monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        avx2_view.main([])
    assert e.value.code == 2 and "give the command after --" in capsys.readouterr().err
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match="needs root"):
        avx2_view.main(["--", "true"])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "qemu-x86_64" else f"/usr/bin/{tool}")
    with pytest.raises(SystemExit, match=r"no `qemu-x86_64` on PATH \(apt-get install qemu-user\)"):
        avx2_view.main(["--emulate", "EPYC-Rome", "--", "true"])
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(avx2_view, "qemu_models", lambda: ["EPYC-Rome", "Haswell"])
    with pytest.raises(SystemExit, match="--emulate must be a CPU model .* got 'EPYC-Bogus'"):
        avx2_view.main(["--emulate", "EPYC-Bogus", "--", "true"])
    monkeypatch.setattr(cpuconfig, "cpu_flags", lambda: {"sse2"})                # nothing to view as AVX2
    with pytest.raises(ValueError, match="name 'avx2' needs a CPU with AVX2 and FMA"):
        avx2_view.main(["--", "true"])


def _can_view() -> bool:
    return (sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("unshare") is not None
            and {"avx2", "fma"} <= cpuconfig.cpu_flags())


PROBE = ("import os; from sparsekv.suite.cpuconfig import cpu_flags, cpu_model; f = cpu_flags(); "
         "print(sorted(x for x in f if x.startswith(('avx', 'amx', 'fma'))), os.environ['SPARSEKV_CPU_ARCH'], "
         "os.environ.get('ONEDNN_MAX_CPU_ISA'), cpu_model().endswith('masked)'))")


@pytest.mark.skipif(not _can_view(), reason="needs Linux, root, unshare and a CPU with AVX2 and FMA")
def test_a_command_under_the_view_sees_an_avx2_machine_and_nothing_else_does():
    before = Path("/proc/cpuinfo").read_text()
    run = subprocess.run([sys.executable, "-m", "sparsekv", "as-avx2", "--", sys.executable, "-c", PROBE],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "['avx', 'avx2', 'fma'] x86-64-v3 AVX2 True"
    assert "as-avx2: /proc/cpuinfo without" in run.stderr
    assert Path("/proc/cpuinfo").read_text() == before                  # the masked copy stayed in its namespace


# a function of one instruction and `ret`, run from an executable page: its exit status says whether the CPU has it
EXEC = ("import ctypes, mmap, sys; code = bytes.fromhex(sys.argv[1]); "
        "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC); page.write(code); "
        "ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(page)))(); print('ran')")
VPXOR_YMM = "c5fdefc0c3"          # vpxor ymm0, ymm0, ymm0 (AVX2); ret
VPXORD_ZMM = "62f17d48efc0c3"     # vpxord zmm0, zmm0, zmm0 (AVX-512F); ret


@pytest.mark.skipif(not _can_view() or shutil.which("qemu-x86_64") is None,
                    reason="needs what the view needs, and qemu-user")
def test_under_emulation_an_avx512_instruction_stops_the_process():
    """What makes `make test-avx2`'s emulated run a check of the instructions: qemu's EPYC-Rome runs an AVX2
    instruction and stops an AVX-512 one with SIGILL. Where this CPU has AVX-512, the same instruction runs natively,
    so it is the emulated CPU that stops it."""
    def run(code, *view):
        return subprocess.run([*view, sys.executable, "-c", EXEC, code], capture_output=True, text=True, cwd=ROOT,
                              timeout=300)
    view = [sys.executable, "-m", "sparsekv", "as-avx2", "--emulate", "EPYC-Rome", "--"]
    ok = run(VPXOR_YMM, *view)
    assert ok.returncode == 0 and ok.stdout.strip() == "ran", ok.stderr[-2000:]
    stopped = run(VPXORD_ZMM, *view)
    assert stopped.returncode == 128 + 4 and "ran" not in stopped.stdout, (stopped.returncode, stopped.stderr[-2000:])
    assert "Illegal instruction" in stopped.stderr                       # SIGILL
    if "avx512f" in cpuconfig.cpu_flags():
        native = run(VPXORD_ZMM)
        assert native.returncode == 0 and native.stdout.strip() == "ran", native.stderr[-2000:]



def decode_bits(path: str) -> dict:
    """SmolLM2 in gguf mode: a 12-token prompt, one chunk of at most quant.DECODE_ROWS rows (so every linear map runs
    the codes kernel, none MKL), then 8 greedy tokens: the tokens, the first logits' bits and ATen's capability."""
    import hashlib

    import torch

    import sparsekv as sk
    model, tok = sk.load_model(path, weights="gguf"), sk.load_tokenizer(path)
    ids = tok("The capital of France is Paris. The capital of Italy is", return_tensors=None)["input_ids"][:12]
    eng = sk.Engine(model)
    seq = eng.new_sequence()
    first = eng.prefill(seq, ids)
    return {"tokens": eng.decode(seq, 8), "aten": torch.backends.cpu.get_cpu_capability(),
            "logits": hashlib.sha256(first.float().numpy().tobytes()).hexdigest()}


# decode_bits in a child process, which qemu-user does not follow
CHILD = ("import json, sys; sys.path.insert(0, 'tests'); from test_avx2_view import decode_bits; "
         "print('DECODE ' + json.dumps(decode_bits(sys.argv[1])))")
CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "SPARSEKV_CPU_ARCH", avx2_view.EMULATED)


@pytest.mark.isa
@pytest.mark.skipif(avx2_view.EMULATED not in os.environ,
                    reason="compares an emulated CPU with this one: runs in `make test-avx2`'s --emulate step")
def test_the_engine_decodes_the_same_bits_on_the_emulated_cpu_as_on_this_one():
    """SmolLM2 in gguf mode, decoded in this process (qemu's AVX2-only AMD EPYC Rome: its cpuid, ATen's AVX2 kernels,
    the x86-64-v3 extension) and in a child process: this CPU's native paths, without the view's caps (AVX-512 here).
    The same greedy tokens and the same bits of the first logits: the extension's kernels and ATen's ops between
    them give the same bits on both CPUs (2026-12-07: 326 s, both together)."""
    import json

    from sparsekv.model import fetch
    path = fetch.model_path(fetch.SMOLLM2, ROOT)
    if not path.is_file():
        pytest.skip("SmolLM2's GGUF is not fetched (make model)")
    here = decode_bits(str(path))
    env = {k: v for k, v in os.environ.items() if k not in CAPS}
    run = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    there = json.loads(next(ln for ln in run.stdout.splitlines() if ln.startswith("DECODE "))[7:])
    assert here["aten"] == "AVX2" and here["tokens"] and here["logits"]
    assert (here["tokens"], here["logits"]) == (there["tokens"], there["logits"]), (here, there)
