"""Named CPU configurations a notebook run can be forced into, so that a baseline is checked beyond the machine
that recorded it.

A smoke baseline recorded on one CPU must hold on any x86-64 CPU and at any thread count. Two machines differ in
the kernels their libraries pick: ATen's vectorised kernels (AVX-512 or AVX2), MKL's and oneDNN's GEMMs (by
vendor and ISA), the thread count (split reductions), and our own C++ extension (built with -march=native).
Each of those can be forced on any machine, which is what `alt` does:

    native   nothing forced: what this machine picks (AVX-512 here, both cores)
    alt      ATen's AVX2 kernels (or its default ones without AVX2), MKL and oneDNN capped at AVX2, one thread,
             and the C++ extension built for another -march (`alt_arch`): x86-64-v3 (AVX2 + FMA) on a machine
             with AVX-512, else x86-64 (neither)
    avx2     this CPU as an AVX2 machine, whatever else it has: alt's caps, one thread, and the extension built
             for x86-64-v3 on every CPU with AVX2 and FMA (ValueError on one without). What a benchmark's
             `--cpu alt` runs: on an AVX2-only CPU "alt" is the portable build, which no AVX2 machine runs

    python -m sparsekv notebooks smoke --cpu alt 02 09     # the baselines, under the other configuration

`environment(name)` is what a notebook's kernel process inherits (the runner sets it around papermill).
"""
from __future__ import annotations

import json
from pathlib import Path

CONFIGS = ("native", "alt", "avx2")


def _cpuinfo(field: str) -> str | None:
    """The value of `field` for the first processor in /proc/cpuinfo (Linux; None elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    from ..core.cpu_paths import cpu_flags as flags
    return flags()


def cpu_model() -> str:
    """This CPU's model name (/proc/cpuinfo, else platform.processor(), else "?"): machines differ between runs, and
    a result says which it was measured on."""
    import platform
    return _cpuinfo("model name") or platform.processor() or "?"


def alt_arch(flags: set[str] | None = None) -> str:
    """A -march for the C++ extension other than this machine's: AVX2 without AVX-512 where the CPU has AVX-512
    (the SIMD layer then takes its AVX2 path), else plain x86-64 (its portable path)."""
    flags = cpu_flags() if flags is None else flags
    return "x86-64-v3" if {"avx512f", "avx2", "fma"} <= flags else "x86-64"


def environment(name: str, threads: int | None = None) -> dict[str, str]:
    """Environment variables that force configuration `name` (see the module docstring); with `threads`, OpenMP and
    MKL at that many threads instead of the configuration's (a benchmark run as an AVX2 machine at its own count)."""
    if name not in CONFIGS:
        raise ValueError(f"name must be one of {list(CONFIGS)}, got {name!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    flags = cpu_flags() if name != "native" else set()
    if name == "avx2" and not {"avx2", "fma"} <= flags:
        raise ValueError("name 'avx2' needs a CPU with AVX2 and FMA (/proc/cpuinfo's flags), and this one has "
                         f"{sorted(flags & {'avx2', 'fma'}) or 'neither'}")
    if name == "native":
        env = {}
    else:
        env = {"ATEN_CPU_CAPABILITY": "avx2" if "avx2" in flags else "default",
               "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "SPARSEKV_CPU_ARCH": "x86-64-v3" if name == "avx2" else alt_arch(flags)}
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


# What a process started with a configuration's environment actually runs: each library's own word for its ISA.
# MKL and oneDNN say it only when asked (MKL_VERBOSE, ONEDNN_VERBOSE) and only once they run something: a float32
# GEMM (MKL) and a convolution large enough for oneDNN's JIT kernels.
_PROBE = r"""
import json, torch
out = {"aten": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
torch.randn(64, 64) @ torch.randn(64, 64)
torch.nn.functional.conv2d(torch.randn(1, 64, 32, 32), torch.randn(64, 64, 3, 3), padding=1)
from sparsekv.kernels import cpu_decode
out["extension_arch"] = cpu_decode.arch()
out["extension"] = cpu_decode.available()
out["bf16_prefill_kernel"] = cpu_decode.bf16_prefill_available()
print("PROBE " + json.dumps(out))
"""


def describe(name: str, timeout: float = 600) -> dict:
    """What configuration `name` runs on this machine, read from a fresh process started with its environment:
    ATen's kernel capability, MKL's and oneDNN's ISA (their verbose banners), the thread count, the extension's
    -march and whether its bfloat16 prefill kernel is built (building the extension if needed). A baseline records
    it for both configurations (`suite.regression`); tests/test_notebooks.py checks that "alt" leaves nothing an
    AVX2 machine lacks."""
    import os
    import subprocess
    import sys
    env = {**os.environ, **environment(name), "MKL_VERBOSE": "1", "ONEDNN_VERBOSE": "1"}
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"the {name!r} configuration's probe failed: {run.stderr[-2000:]}")
    lines = run.stdout.splitlines()
    out = json.loads(next(line for line in lines if line.startswith("PROBE "))[6:])
    mkl = next((line for line in lines if line.startswith("MKL_VERBOSE oneMKL")), "")
    out["mkl"] = mkl.split(" for ", 1)[-1].split(" enabled processors")[0].split(", Lnx")[0].strip() or "?"
    isa = next((line for line in lines if line.startswith("onednn_verbose") and ",isa:" in line), "")
    out["onednn"] = isa.split(",isa:", 1)[-1].strip() or "?"
    out["cpu"] = cpu_model()
    return out


def lacks_avx512(d: dict) -> bool:
    """Whether a `describe` result uses nothing a plain AVX2 + FMA machine lacks: no AVX-512 (or AVX10) or AMX in
    ATen, MKL or oneDNN, and no extension build with AVX-512 or the bfloat16 prefill kernel."""
    words = ("AVX512", "AVX-512", "AVX10", "AMX")
    libs = " ".join(str(d[k]) for k in ("aten", "mkl", "onednn")).upper()
    portable_build = d["extension_arch"] in ("x86-64-v3", "x86-64") and not d["bf16_prefill_kernel"]
    return not any(w in libs for w in words) and portable_build


def build(names=CONFIGS, timeout: float = 900) -> dict[str, str]:
    """Build the C++ extension for each configuration in `names` that this CPU can take, all at once, each in a
    fresh process started with its environment (a process loads one build: two would register the same operators).
    Configurations that build for the same -march share one build ("alt" and "avx2" on a CPU with AVX-512). What
    `make kernels` runs, so that no test compiles one on a fresh clone (each build takes 30 s of two cores).

    Returns {name: what happened}: "ready", the reason the extension could not be built (the torch path then runs,
    as `kernels.cpu_decode.load` says), or why this CPU cannot take the configuration ("avx2" without AVX2 and FMA).
    Never raises for a build that fails: a machine without a compiler still runs every test."""
    import os
    import subprocess
    import sys
    if isinstance(names, str) or any(n not in CONFIGS for n in names):
        raise ValueError(f"names must be a list of configurations among {list(CONFIGS)}, got {names!r}")
    out, runs = {}, {}                  # runs: -march -> (process, [the configurations it builds for])
    code = ("from sparsekv.kernels import cpu_decode as c; "
            "print('ready' if c.load() else c.reason() or 'unavailable', flush=True)")
    for name in dict.fromkeys(names):
        try:
            env = {**os.environ, **environment(name)}
        except ValueError as exc:
            out[name] = f"not built: {exc}"
            continue
        env.pop("OMP_NUM_THREADS", None)            # the compiler's jobs are ninja's, not OpenMP's
        arch = env.get("SPARSEKV_CPU_ARCH") or "native"    # as `cpu_decode.arch` reads it in that process
        if arch in runs:
            runs[arch][1].append(name)
            continue
        proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        runs[arch] = (proc, [name])
    for arch, (proc, which) in runs.items():
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            stdout = f"timed out after {timeout:.0f} s"
        said = (stdout.strip().splitlines() or [stderr.strip().splitlines()[-1] if stderr.strip() else "?"])[-1]
        for name in which:
            out[name] = said if said == "ready" else f"not built ({arch}): {said}"
    return {n: out[n] for n in dict.fromkeys(names)}


def main(argv: list[str] | None = None) -> int:
    """`python -m sparsekv kernels [CONFIG ...]`: build the extension for each configuration (default: all) and say
    what each got. Exit status 0 even where none could be built (the torch path runs)."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m sparsekv kernels", description=main.__doc__)
    ap.add_argument("configs", nargs="*", metavar="CONFIG", help=f"among {', '.join(CONFIGS)} (default: all)")
    args = ap.parse_args(argv)
    if bad := [c for c in args.configs if c not in CONFIGS]:
        ap.error(f"CONFIG must be among {', '.join(CONFIGS)}, got {' '.join(bad)}")
    for name, said in build(args.configs or list(CONFIGS)).items():
        print(f"cpu extension, {name}: {said}")
    return 0
