"""Run a command on this CPU as an AVX2-only machine would see itself: CI's CPU may be one, and none was ever lent
to check the suite on (issue 57), so the suite's CPU-dependent branches are checked here instead.

    python -m sparsekv as-avx2 -- make test
        Every view of the CPU that the code reads says AVX2 + FMA: /proc/cpuinfo with the AVX-512, AMX and later
        flags removed (a private mount namespace binds a copy over it, so no other process sees it), and
        cpuconfig's "avx2" caps (ATen's AVX2 kernels, MKL and oneDNN capped at AVX2, the extension built for
        x86-64-v3), at the machine's own threads. The instructions still run on this CPU: a stray AVX-512 one
        would go unseen.

    python -m sparsekv as-avx2 --emulate EPYC-Rome -- python -m pytest -n 0 -m isa
        The same, under qemu-user emulating that CPU model (its cpuid says AVX2 and FMA, no AVX-512, no AMX), so an
        AVX-512 or AMX instruction anywhere (torch, MKL, oneDNN, the extension) ends the process with SIGILL. About
        8,000 times slower at a float32 matmul, so `make test-avx2` runs only the kernels' own checks and one
        8-token decode of SmolLM2 there (marker `isa`). qemu-user follows no exec: a child process (a compiler, a
        pytest-xdist worker) runs natively. The command gets SPARSEKV_EMULATED_CPU=MODEL, so a test can tell that it
        runs emulated.

What it does not stand in for: an AVX2 machine's clocks, caches and memory (timings mean nothing here), and MKL's
vendor dispatch (without --emulate the CPU still says Intel).

Needs Linux, root (the mount namespace; CI runs as root) and util-linux's `unshare`; --emulate needs qemu-user
(`apt-get install qemu-user`). The command's exit status is returned (128 + N for signal N, as a shell does).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import cpuconfig

# /proc/cpuinfo flags no AVX2-only CPU has: AVX-512 and its successors, AMX, and the VEX-encoded VNNI/IFMA of CPUs
# that have AVX-512 or AMX beside them
MASKED_PREFIXES = ("avx512", "avx10", "amx", "avx_vnni", "avx_ifma", "avx_ne_convert")
MODEL_SUFFIX = " (as AVX2: AVX-512 and AMX masked)"
EMULATED = "SPARSEKV_EMULATED_CPU"       # set to --emulate's model for the command it runs
# binds the file named by $0 over /proc/cpuinfo in the new mount namespace, then becomes the command
_BIND = 'mount --bind "$0" /proc/cpuinfo && exec "$@"'


def masked(flag: str) -> bool:
    """Whether an AVX2-only view of the CPU drops `flag` (a /proc/cpuinfo flag word)."""
    return flag.startswith(MASKED_PREFIXES)


def mask_cpuinfo(text: str) -> str:
    """/proc/cpuinfo's `text` as an AVX2-only CPU's: every `flags` line without the masked words (`masked`), every
    `model name` with MODEL_SUFFIX once (so a result recorded under it says so); every other line as it was.
    Idempotent."""
    out = []
    for line in text.splitlines(keepends=True):
        key, sep, value = line.partition(":")
        body, end = value.rstrip("\n"), "\n" if line.endswith("\n") else ""
        if sep and key.strip() == "flags":
            line = f"{key}: {' '.join(w for w in body.split() if not masked(w))}{end}"
        elif sep and key.strip() == "model name" and not body.endswith(MODEL_SUFFIX):
            line = f"{key}:{body}{MODEL_SUFFIX}{end}"
        out.append(line)
    return "".join(out)


def environment() -> dict[str, str]:
    """cpuconfig's "avx2" caps without its thread counts: a command under the view runs at its own threads."""
    env = cpuconfig.environment("avx2")
    return {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def command(argv: list[str], cpuinfo: Path, emulate: str | None = None) -> list[str]:
    """The argv that runs `argv` in a private mount namespace with `cpuinfo` bound over /proc/cpuinfo, under
    `qemu-x86_64 -cpu EMULATE` when given."""
    qemu = ["qemu-x86_64", "-cpu", emulate] if emulate else []
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _BIND, str(cpuinfo), *qemu, *argv]


def qemu_models() -> list[str]:
    """The CPU models this machine's qemu-x86_64 emulates (`qemu-x86_64 -cpu help`, which exits with status 1)."""
    run = subprocess.run(["qemu-x86_64", "-cpu", "help"], capture_output=True, text=True)
    return [m.group(1) for m in re.finditer(r"^x86\s+(\S+)", run.stdout, re.MULTILINE)]


def check_host(emulate: str | None) -> None:
    """SystemExit with the reason unless this machine can run a command under the view (and emulate `emulate`)."""
    if not sys.platform.startswith("linux"):
        raise SystemExit(f"as-avx2: needs Linux (/proc/cpuinfo and mount namespaces); this is {sys.platform}")
    if os.geteuid() != 0:
        raise SystemExit("as-avx2: needs root, for the private mount namespace that binds the masked /proc/cpuinfo "
                         "(CI runs as root)")
    packages = {"unshare": "util-linux", "mount": "mount"} | ({"qemu-x86_64": "qemu-user"} if emulate else {})
    for tool, package in packages.items():
        if shutil.which(tool) is None:
            raise SystemExit(f"as-avx2: no `{tool}` on PATH (apt-get install {package})")
    if emulate is not None and emulate not in qemu_models():
        raise SystemExit(f"as-avx2: --emulate must be a CPU model of `qemu-x86_64 -cpu help` (e.g. EPYC-Rome), "
                         f"got {emulate!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsekv as-avx2", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emulate", metavar="MODEL", default=None,
                    help="run under qemu-x86_64 emulating this CPU model (e.g. EPYC-Rome): AVX-512 raises SIGILL")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("give the command after --, e.g. `python -m sparsekv as-avx2 -- make test`")
    check_host(args.emulate)
    env = {**os.environ, **environment()}          # ValueError from cpuconfig on a CPU without AVX2 and FMA
    if args.emulate:
        env[EMULATED] = args.emulate
    text = Path("/proc/cpuinfo").read_text()
    dropped = sorted(f for f in cpuconfig.cpu_flags() if masked(f))
    with tempfile.TemporaryDirectory(prefix="sparsekv-avx2-") as d:
        view = Path(d) / "cpuinfo"
        view.write_text(mask_cpuinfo(text))
        view.chmod(0o644)
        print(f"as-avx2: /proc/cpuinfo without {len(dropped)} flags ({', '.join(dropped) or 'none here'}); "
              f"ATen, MKL, oneDNN at AVX2; extension -march {env['SPARSEKV_CPU_ARCH']}"
              + (f"; under qemu-x86_64 -cpu {args.emulate}" if args.emulate else ""), file=sys.stderr, flush=True)
        rc = subprocess.run(command(cmd, view, args.emulate), env=env).returncode
    return 128 - rc if rc < 0 else rc              # killed by signal N: 128 + N, as a shell says (SIGILL: 132)


if __name__ == "__main__":
    sys.exit(main())
