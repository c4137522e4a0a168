"""Physical floors for a decode step and a prefill, from the model's shape and this machine's measured rates.

    decode step   bytes it must read (the weights as held, and the K/V its attention reads) / measured read bandwidth
    prefill       FLOPs it must do (2 per weight per token, the last token's LM head, and attention's pairs) /
                  the fastest matmul rate measured in the same run (float32 or bfloat16, whichever is higher here:
                  the lower floor, so no engine beats it by choosing the other precision)

An engine's time over its floor says how far from the machine's limit it runs; both engines of a comparison get
the floor of the work they do (their own weight bytes and K/V element type), measured with the same rates.
"""
from __future__ import annotations

from dataclasses import dataclass

# Bytes per K/V element as llama.cpp stores them (ggml's block sizes: q8_0 34 bytes per 32, q4_0 18 per 32).
KV_ELEMENT_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


@dataclass(frozen=True)
class MachineRates:
    """What this machine sustains, measured in the run that uses it."""
    read_Bps: float            # bytes/s of a 1 GiB float32 reduction (`bench_cpu_decode.read_bandwidth`)
    f32_flops: float           # FLOP/s of a 2048^3 float32 matmul
    bf16_flops: float          # FLOP/s of the same matmul in bfloat16 (float32 accumulation; emulated where no AMX/AVX512_BF16)

    @property
    def flops(self) -> float:
        """The prefill floor's rate: the faster of the two."""
        return max(self.f32_flops, self.bf16_flops)

    def as_dict(self) -> dict:
        return {"read_bandwidth_Bps": self.read_Bps, "f32_matmul_flops": self.f32_flops,
                "bf16_matmul_flops": self.bf16_flops, "floor_flops": self.flops}


def measure(repeats: int = 5, n: int = 2048, bf16: bool = True) -> MachineRates:
    """Read bandwidth and square-matmul rates (float32 and bfloat16) on this machine, now. `bf16`: whether this
    process has bfloat16 dot products; without them ATen emulates the product on one thread (a 2048^3 one took over
    a minute under `--cpu alt`), so its rate is measured once on a 512^3 product, which is enough to show it is far
    below float32's, and the floor takes float32's."""
    import torch

    from benchmarks.bench_cpu_decode import peak_rate, read_bandwidth
    from sparsekv.core.profiling import median_time
    m = n if bf16 else 512
    a, b = torch.randn(m, m, dtype=torch.bfloat16), torch.randn(m, m, dtype=torch.bfloat16)
    rate = 2 * m ** 3 / (median_time(lambda: a @ b, repeats, 2) if bf16 else median_time(lambda: a @ b, 1, 0))
    return MachineRates(read_bandwidth(repeats), peak_rate(repeats, n), rate)


def decode_kv_bytes(cfg, n: int, kv_type: str) -> float:
    """K and V bytes one decode step reads at context n: every attention layer's kv heads over its tokens (a sliding
    layer over at most its window), at `kv_type`'s bytes per element."""
    per = 2 * cfg.n_kv_heads * cfg.head_dim * KV_ELEMENT_BYTES[kv_type]
    return sum(per * (min(n, w) if w else n) for w in cfg.store_windows)


def prefill_flops(cfg, n: int) -> float:
    """2 FLOPs per non-embedding weight per token, the last token's LM head, and attention: 4 * Hq * D per (query,
    key) pair, over every earlier key in a global layer and over at most `window` keys in a sliding one."""
    from sparsekv.serving.gpu import param_count
    dense = 2 * (param_count(cfg) - cfg.vocab_size * cfg.dim) * n + 2 * cfg.vocab_size * cfg.dim
    pairs = 0
    for w in cfg.store_windows:
        m = min(n, w) if w else n                        # query i sees min(i + 1, w) keys: a triangle, then a band
        pairs += m * (m + 1) // 2 + (max(n - w, 0) * w if w else 0)
    return dense + 4 * cfg.n_heads * cfg.head_dim * pairs


def decode_floor_s(weight_bytes: float, kv_bytes: float, rates: MachineRates) -> float:
    return (weight_bytes + kv_bytes) / rates.read_Bps


def prefill_floor_s(cfg, n: int, rates: MachineRates) -> float:
    return prefill_flops(cfg, n) / rates.flops
