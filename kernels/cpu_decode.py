"""The fused CPU kernels (`kernels/cpu/`), built once with torch's C++ extension tools.

    paged_decode.cpp   decode attention over selected (or all) K/V tiles, in place
    route.cpp          block scoring, and scoring + block distribution + top-k in one pass
    qlinear.cpp        weight-only 4- and 8-bit matmuls over a GGUF file's own codes (`sparsekv.model.quant`), and
                       8-bit codes against int8 activations (qlinear_q8, llama.cpp's Q8_0 dot product)
    decode_layer.cpp   one decoder layer of a decode step in one call (`sparsekv.model.fused`), from the three above
    prefill_attn.cpp   chunked-prefill attention from bfloat16 pair products (built for AVX512-BF16 only)
    prefill_attn_f32.cpp  the same design in float32 FMAs, for every other CPU (fast with AVX2 + FMA or AVX-512)
    simd.h             the 16-lane vector type both are written in (AVX-512, or portable loops)
    register.cpp       the torch.library registration (torch.ops.sparsekv_cpu.*)
    ops.cpp            the build's first translation unit: every file above but prefill_attn_f32.cpp, included
                       whole (one parse of ATen's headers instead of six: about 25 CPU-seconds a build, not 60)

Why a C++/OpenMP operator and not Triton or torch: on the CPU, the torch path gathers the selected tiles
with `index_select` (writing them out and reading them back) and multiplies 4-row decode queries with MKL,
far from this machine's FMA peak; Triton's CPU path is an interpreter. The operator reads each selected
K/V row once, in place from the store's head-major pool, shares it across the G query heads of its GQA
group, and keeps an online softmax per (kv head, split), so its cost is the bytes it must read.

It is registered with `torch.library` as `torch.ops.sparsekv_cpu.paged_decode` (and `minmax_scores`,
`route_topk`) and compiled on first use into `build/torch_extensions/` of a source checkout, or into
`$XDG_CACHE_HOME/sparsekv/torch_extensions` (default `~/.cache/...`) for an installed package, or into
`SPARSEKV_EXT_DIR` when set; its name carries a hash of every source, header and flag and of the CPU, so an
edit rebuilds and a build is never loaded on another CPU. A build runs in a private folder under one flock and
its library is renamed into place, so a process that loads it finds none or a whole one (`_build`). If the build
fails, `load()` returns None after one warning that names the reason, and the torch path runs instead. So it does, without building or loading
anything, when the folder or the library already in it could hold another user's code: writable by the group
or by everyone, or owned by another uid than this process's (loading a library runs its code).

Every operator checks its arguments before its loops (`cpu/checks.h`): shapes, dtypes, contiguity, non-empty
sizes, and every index against the range it addresses, raising ValueError (TypeError for a dtype) through torch.

Flags: -O3, OpenMP, `-march=$SPARSEKV_CPU_ARCH` (default `native`; `x86-64-v3` is what an AVX2 machine
builds, `x86-64` a build with neither AVX2 nor FMA), and -ffp-contract=off without -ffast-math: with the
fixed reduction order and exp of `cpu/simd.h`, every -march gives the same bits, and so does every thread
count (`splits_for` reads no thread count). tests/test_cpu_kernel.py checks both.

Shapes: q [Hq, D] float32; k, v [H, NB, bs, D] contiguous (one layer, head-major) float32 or bfloat16;
table [nb] int64 physical ids in [0, NB); blocks [H, K] int64 logical ids per head in [0, nb), -1 for padding
(skipped).
"""
from __future__ import annotations

import hashlib
import os
import stat
import threading
import warnings
from pathlib import Path

import torch

_DIR = Path(__file__).resolve().parent / "cpu"
# What the compiler is given: two translation units (ops.cpp includes the other files whole). What the name hashes:
# every file either reads.
_SOURCES = (_DIR / "ops.cpp", _DIR / "prefill_attn_f32.cpp")
_HEADERS = (_DIR / "paged_decode.cpp", _DIR / "route.cpp", _DIR / "qlinear.cpp", _DIR / "decode_layer.cpp",
            _DIR / "prefill_attn.cpp", _DIR / "register.cpp", _DIR / "simd.h", _DIR / "checks.h")
_lock = threading.Lock()
_state: dict = {}


def build_dir() -> Path:
    """Where the extension is built: $SPARSEKV_EXT_DIR, else build/torch_extensions of a source checkout (the
    folder above kernels/ holds pyproject.toml), else the user's cache (an installed package's folder may be
    read-only and is shared by every user)."""
    env = os.environ.get("SPARSEKV_EXT_DIR")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "kernels").is_dir():
        return root / "build" / "torch_extensions"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "sparsekv" / "torch_extensions"


def arch() -> str:
    """The -march the extension is built for: $SPARSEKV_CPU_ARCH, default "native"."""
    return os.environ.get("SPARSEKV_CPU_ARCH", "native") or "native"


def cflags() -> list[str]:
    # -ffp-contract=off and no -ffast-math: the compiler fuses and reorders nothing (simd.h, reproducibility)
    return ["-O3", f"-march={arch()}", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]


def _cpu_flags() -> bytes:
    """This CPU's feature flags (Linux), so that a -march=native build is never loaded on another CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.encode()
    except OSError:
        pass
    return b""


def _name() -> str:
    """The extension's name: a hash of its sources, headers, flags and the CPU it is built for
    (cpp_extension tracks only sources)."""
    h = hashlib.sha256()
    for p in _SOURCES + _HEADERS:
        h.update(p.read_bytes())
    h.update(" ".join(cflags()).encode() + _cpu_flags())
    return f"sparsekv_cpu_{h.hexdigest()[:12]}"


def _refuse_shared(path: Path) -> None:
    """PermissionError unless only this user can write `path` (the extension folder, or a library in it): it must
    be owned by this process's uid and be neither group- nor world-writable. POSIX only (elsewhere no uid)."""
    if not hasattr(os, "getuid"):
        return
    st, uid = path.stat(), os.getuid()
    if st.st_uid != uid:
        raise PermissionError(f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid}); not loaded: "
                              "set SPARSEKV_EXT_DIR to a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); not loaded: "
                              "`chmod go-w` it or set SPARSEKV_EXT_DIR to a folder of your own")


def _load_built(d: Path, name: str) -> bool:
    """Load an already-built library directly: no compiler, no ninja run and no lock file, which
    cpp_extension.load takes in every new process (a process killed while holding it would leave every
    later one waiting). False if there is none, or it does not load (a build cut short); PermissionError if
    another user could have written it (`_refuse_shared`)."""
    so = d / f"{name}.so"
    if not so.is_file():
        return False
    _refuse_shared(so)
    try:
        torch.ops.load_library(str(so))
    except OSError:
        return False
    return True


def _build(d: Path, name: str) -> bool:
    """Build the library into `d / f"{name}.so"` in one rename, so that a process loading it without a lock
    (`_load_built`) finds no file or a whole one, never a linker's half-written output (a CI run's notebook kernel
    died while three test workers started at once on a fresh clone). Builders hold an flock on `d / f"{name}.lock"`,
    which the kernel releases when a process dies (cpp_extension's own lock file outlives a killed builder): the
    first builds in a private folder, the others wait, then find its library. True when this call built and loaded
    it; False when another process had built it meanwhile (load it with `_load_built`)."""
    import fcntl
    import shutil
    import tempfile

    from torch.utils import cpp_extension
    so = d / f"{name}.so"
    with open(d / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if so.is_file():
                return False
            stage = Path(tempfile.mkdtemp(prefix=f"{name}.build-", dir=d))
            try:
                cpp_extension.load(name=name, sources=[str(p) for p in _SOURCES], build_directory=str(stage),
                                   extra_cflags=cflags(), extra_ldflags=["-fopenmp"], is_python_module=False,
                                   verbose=False)
                built = stage / f"{name}.so"            # the linker's mode follows the umask: keep it ours alone
                built.chmod(stat.S_IMODE(built.stat().st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
                os.replace(built, so)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
            return True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load():
    """The compiled operator (torch.ops.sparsekv_cpu.paged_decode), or None if it cannot be built or its folder
    is not private to this user (`_refuse_shared`)."""
    with _lock:
        if "op" in _state:
            return _state["op"]
        op = None
        if os.environ.get("SPARSEKV_NO_EXT"):
            _state["reason"] = "SPARSEKV_NO_EXT is set"
        else:
            try:
                d, name = build_dir(), _name()
                d.mkdir(mode=0o755, parents=True, exist_ok=True)          # not group-writable under umask 002
                _refuse_shared(d)
                if not _load_built(d, name) and not _build(d, name) and not _load_built(d, name):
                    raise OSError(f"{d / (name + '.so')} was built by another process but does not load")
                op = torch.ops.sparsekv_cpu.paged_decode
            except Exception as exc:      # no compiler, headers or OpenMP, or a shared folder: fall back, say why once
                _state["reason"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                warnings.warn(f"sparsekv: the fused CPU decode kernel could not be built or loaded ({_state['reason']}); "
                              "decode runs on the torch path", RuntimeWarning, stacklevel=2)
        _state["op"] = op
        return op


def available() -> bool:
    return load() is not None


def reason() -> str | None:
    """Why the kernel is unavailable (None when it loaded or was never tried)."""
    return _state.get("reason")


SPLIT_ITEMS = 32      # (kv head, split) work items to aim for: enough for 16 threads twice


def splits_for(num_heads: int, width: int) -> int:
    """Splits per kv head: about SPLIT_ITEMS (head, split) items in all, at least 4 blocks each (`width` =
    entries per head; no host read of the selection is needed). The thread count is deliberately not an input:
    the split merge's order then never changes with it, so neither do the output's bits."""
    return max(1, min(-(-SPLIT_ITEMS // num_heads), width // 4 or 1))


def _ops(**tensors):
    """torch.ops.sparsekv_cpu, once the arguments meant to be tensors are (a TypeError naming the first that is not).
    Everything else about them the operators check themselves (`cpu/checks.h`): one place for each check."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if load() is None:
        raise RuntimeError(f"the fused CPU kernels are unavailable: {reason()}")
    return torch.ops.sparsekv_cpu


def paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, blocks: torch.Tensor,
                 num_tokens: int, splits: int | None = None, min_token: int = 0):
    """(out [Hq, D] float32, lse [Hq] float32); see the module docstring for shapes. `min_token`: the first token
    attended (a sliding window's start): earlier rows of the selected blocks weigh 0. Table entries must lie in
    [0, NB), block ids in [-1, nb), num_tokens in [1, nb * bs], min_token in [0, num_tokens), splits >= 1: the
    operator raises ValueError (TypeError for a dtype) otherwise."""
    ops = _ops(q=q, k=k, v=v, table=table, blocks=blocks)
    if splits is None:                  # a k or blocks the operator refuses gets 1 here and its message there
        H, K = (k.shape[0], blocks.shape[1]) if k.dim() == 4 and blocks.dim() == 2 else (0, 0)
        splits = splits_for(H, K) if H > 0 and K > 0 else 1
    return ops.paged_decode(q, k, v, table, blocks, num_tokens, splits, min_token)


def minmax_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Quest's bound [H, G, nb] float32 for q [Hq, D] float32 over one layer's head-major summaries
    kmin, kmax [H, NB, D] (float32 or bfloat16, read in place) at the blocks of `table` [nb]."""
    return _ops(q=q, kmin=kmin, kmax=kmax, table=table).minmax_scores(q, kmin, kmax, table)


def route_topk(q: torch.Tensor, a: torch.Tensor, b: torch.Tensor, table: torch.Tensor, kind: int, top_k: int,
               sink: int, local: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing in one pass (`cpu/route.cpp`): q [Hq, D] float32 scored against head-major summaries
    a, b [H, NB, D] at the blocks of `table` [nb] (kind 0: minmax over a = kmin, b = kmax; kind 1: mean,
    q . a), softmax per query head, the group's mean, then the top `top_k` with the first `sink` and
    last `local` blocks forced in. Returns (blocks [H, min(top_k, nb)] int64 ascending, mass [H, nb])."""
    blocks, mass = _ops(q=q, a=a, b=b, table=table).route_topk(q, a, b, table, kind, top_k, sink, local)
    return blocks, mass


def qlinear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int,
            group: int) -> torch.Tensor:
    """y [M, N] float32 = x [M, K] float32 . W^T for W held as codes (`cpu/qlinear.cpp`: bits 4, uint8 [N, K / 2]
    packed in GGUF's nibble order; bits 6, uint8 [N, 3 K / 4], those nibbles then the high 2 bits; bits 8, int8
    [N, K]) with scale and offset (offset may be empty) float32 [N, K / group], or factored as the K-quants store
    them (uint8 [N, K / group + 4 K / 256]: int8 multipliers, then a float32 per 256 weights):
    w = fma(code, scale, offset)."""
    return _ops(x=x, codes=codes, scale=scale, offset=offset).qlinear(x, codes, scale, offset, bits, group)


def qlinear_q8(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int,
               group: int) -> torch.Tensor:
    """y [M, N] float32 = q8(x) . W^T for W of 8-bit codes int8 [N, K] in groups of 32 with no offset (GGUF's Q8_0):
    x [M, K] float32 (finite) quantised first per 32 values as `quantize_q8` does, then integer dot products
    scaled per group (`cpu/qlinear.cpp`), as llama.cpp's own Q8_0 dot products are."""
    return _ops(x=x, codes=codes, scale=scale, offset=offset).qlinear_q8(x, codes, scale, offset, bits, group)


def quantize_q8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 (K a multiple of 32, finite) -> (q int8 [M, K], d float32 [M, K / 32]): per 32 values,
    d = max|x| / 127 and q = nearbyint(x * (1 / d)), 0 where d = 0; |q| <= 127 and x ~ q * d."""
    q, d = _ops(x=x).quantize_q8(x)
    return q, d


def qdequant(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """W [N, K] float32 from the layout of `qlinear` (the same fma per weight)."""
    return _ops(codes=codes, scale=scale, offset=offset).qdequant(codes, scale, offset, bits, group)


def bf16_prefill_available() -> bool:
    """Whether the extension holds the bfloat16 prefill attention kernel (`cpu/prefill_attn.cpp`): built, and built
    for a CPU with AVX512-BF16 dot products (-march)."""
    return load() is not None and bool(torch.ops.sparsekv_cpu.bf16_prefill_available())


def prefill_attn_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q0: int, k0: int, window: int,
                      scale: float) -> torch.Tensor:
    """Causal attention of a prefill chunk: q [T, Hq, D] bfloat16, token t at position q0 + t; k, v [N, H, D]
    bfloat16, key j at position k0 + j (k0 <= q0, q0 + T <= k0 + N); Hq a multiple of H, D a multiple of 32.
    Query t sees key j iff k0 + j <= q0 + t and, for window w > 0, q0 + t - (k0 + j) < w. Returns [T, Hq, D]
    float32: scores, softmax and sums in float32 from bfloat16 pair products, each key's weight rounded to bfloat16
    once (`cpu/prefill_attn.cpp`)."""
    from ..core.checks import check_int, check_tensor
    check_tensor("q", q, (None, None, None), dtype=torch.bfloat16, device=torch.device("cpu"))
    T, Hq, D = q.shape
    check_tensor("k", k, (None, None, D), dtype=torch.bfloat16, device=torch.device("cpu"))
    check_tensor("v", v, tuple(k.shape), dtype=torch.bfloat16, device=torch.device("cpu"))
    N, H = k.shape[:2]
    if H == 0 or Hq % H:
        raise ValueError(f"q must have a multiple of k's {H} heads, got {Hq}")
    if D % 32:
        raise ValueError(f"the head dim must be a multiple of 32, got {D}")
    check_int("k0", k0, lo=0)
    check_int("q0", q0, lo=k0, hi=k0 + N - T)
    check_int("window", window, lo=0)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale < float("inf"):
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    if not bf16_prefill_available():
        raise RuntimeError("the bfloat16 prefill kernel is unavailable: "
                           f"{reason() or 'the extension was built without AVX512-BF16'}")
    return torch.ops.sparsekv_cpu.prefill_attn_bf16(q, k, v, q0, k0, window, float(scale))


def f32_prefill_vectorized() -> bool:
    """Whether the extension's float32 prefill kernel (`cpu/prefill_attn_f32.cpp`) is built with vector FMAs (AVX2 +
    FMA or AVX-512): where it is not (a plain x86-64 build) it still computes the same bits, in slow loops."""
    return load() is not None and bool(torch.ops.sparsekv_cpu.f32_prefill_vectorized())


def prefill_attn_f32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q0: int, k0: int, window: int,
                     scale: float) -> torch.Tensor:
    """Causal attention of a prefill chunk in float32 FMAs (`cpu/prefill_attn_f32.cpp`): q [T, Hq, D] float32 or
    bfloat16, token t at position q0 + t; k, v [N, H, D] both float32 or both bfloat16 (widened exactly), key j at
    position k0 + j (k0 <= q0, q0 + T <= k0 + N); Hq a multiple of H, D a multiple of 16. Query t sees key j iff
    k0 + j <= q0 + t and, for window w > 0, q0 + t - (k0 + j) < w. Returns [T, Hq, D] float32, the same bits on
    every instruction set and at every thread count.

        >>> q, k, v = torch.randn(5, 4, 64), torch.randn(9, 2, 64), torch.randn(9, 2, 64)
        >>> out = prefill_attn_f32(q, k, v, q0=4, k0=0, window=0, scale=0.125)     # the last 5 of 9 tokens
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1).repeat_interleave(2, 0),
        ...     v.transpose(0, 1).repeat_interleave(2, 0), attn_mask=torch.ones(5, 9).tril(4).bool(), scale=0.125)
        >>> bool((out - ref.transpose(0, 1)).abs().max() < 1e-5)
        True
    """
    from ..core.checks import check_int, check_tensor
    floats = (torch.float32, torch.bfloat16)
    check_tensor("q", q, (None, None, None), dtype=floats, device=torch.device("cpu"))
    T, Hq, D = q.shape
    check_tensor("k", k, (None, None, D), dtype=floats, device=torch.device("cpu"))
    check_tensor("v", v, tuple(k.shape), dtype=k.dtype, device=torch.device("cpu"))
    N, H = k.shape[:2]
    if H == 0 or Hq % H:
        raise ValueError(f"q must have a multiple of k's {H} heads, got {Hq}")
    if D % 16:
        raise ValueError(f"the head dim must be a multiple of 16, got {D}")
    check_int("k0", k0, lo=0)
    check_int("q0", q0, lo=k0, hi=k0 + N - T)
    check_int("window", window, lo=0)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale < float("inf"):
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    return _ops(q=q, k=k, v=v).prefill_attn_f32(q, k, v, q0, k0, window, float(scale))
