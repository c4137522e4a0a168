"""llama.cpp as a peer: its configurations, one context per configuration, and the GGUF files it is fed.

A configuration is what changes llama.cpp's speed or its numbers at a fixed thread count (as llama-bench records
them beside every result: `-fa`, `-ctk/-ctv`, `-b/-ub`, `-t`): flash attention off or on, and the K/V cache's
element type. The K/V types split the configurations in two:

  exact  f16 and bf16: 16-bit K/V, as sparsekv's dense cache (bf16); the dense comparison takes the fastest of these;
  lossy  q8_0 (and q4_0): 8.5 (4.5) bits per element; llama.cpp stores a quantised V only with flash attention on.
         Routed decode (which reads fewer K/V bytes, with a measured quality cost) is set beside these.

`LlamaCpp.settings()` records every setting that was passed and every one left to the binding, so a JSON row says
what ran. The binding's defaults differ from llama.cpp's own: llama-cpp-python 0.3.36 turns flash attention off
unless asked (llama.cpp's CLI: auto, on for the CPU), and keeps a full-size sliding-window cache (`swa_full`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GGML_TYPES = {"f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2}    # ggml_type ids (ggml.h), for type_k / type_v
EXACT_KV = ("f16", "bf16")
N_BATCH = 512              # llama.cpp's logical batch (and n_ubatch): sparsekv's prefill chunk is 512 tokens too
# A sliding-window cache of the window only. The binding's default keeps a full-size one, which costs Gemma 3 dearly
# (measured here on 2026-12-01 at 16k: prefill 97.3 s and 50.2 ms per token, against 43.1 s and 23.1 ms with
# swa_full=False); SmolLM2 has no sliding layers, so the setting does not touch it.
SWA_FULL = False


@dataclass(frozen=True)
class LlamaConfig:
    """One llama.cpp configuration.

    Invariants: 1. a quantised K/V type runs with flash attention on (llama.cpp refuses a quantised V without it);
    2. `exact` is True exactly for the 16-bit K/V types."""
    flash_attn: bool           # llama.cpp's fused attention kernel (ggml_flash_attn_ext); off: mul_mat + softmax
    kv_type: str               # type_k and type_v alike: a key of GGML_TYPES

    def __post_init__(self):
        if self.kv_type not in GGML_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(GGML_TYPES)}, got {self.kv_type!r}")
        if self.kv_type not in EXACT_KV and not self.flash_attn:
            raise ValueError(f"llama.cpp stores a {self.kv_type} V cache only with flash attention on")

    @property
    def name(self) -> str:
        return f"fa{int(self.flash_attn)}-{self.kv_type}"

    @property
    def exact(self) -> bool:
        return self.kv_type in EXACT_KV


CONFIGS = {c.name: c for c in (LlamaConfig(False, "f16"), LlamaConfig(True, "f16"), LlamaConfig(False, "bf16"),
                               LlamaConfig(True, "bf16"), LlamaConfig(True, "q8_0"), LlamaConfig(True, "q4_0"))}
DEFAULT_CONFIGS = ("fa0-f16", "fa1-f16", "fa0-bf16", "fa1-bf16", "fa1-q8_0")   # q4_0 on request (--llama-configs)


class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level API, in one configuration: eval ids, read the last logits."""

    def __init__(self, path: Path, n_ctx: int, threads: int, config: LlamaConfig = CONFIGS["fa0-f16"],
                 logits_all: bool = False):
        from llama_cpp import Llama
        self.config, self.threads = config, threads
        t = GGML_TYPES[config.kv_type]
        self.kwargs = dict(n_ctx=n_ctx, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=threads, n_threads_batch=threads,
                           flash_attn=config.flash_attn, type_k=t, type_v=t, swa_full=SWA_FULL)
        self.llm = Llama(model_path=str(path), logits_all=logits_all, verbose=False, **self.kwargs)
        self.vocab = self.llm.n_vocab()

    def settings(self) -> dict:
        """Every setting passed to llama.cpp (the rest are the binding's defaults: n_gpu_layers 0, mmap on)."""
        return {"config": self.config.name, "exact": self.config.exact, "kv_type": self.config.kv_type,
                **{k: v for k, v in self.kwargs.items() if k not in ("type_k", "type_v")}}

    def reset(self) -> None:
        self.llm.reset()          # n_tokens = 0: the next eval removes every cached position from 0 on

    def eval(self, ids: list[int]) -> None:
        self.llm.eval(ids)

    def last_logits(self) -> np.ndarray:
        import llama_cpp
        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab,)).copy()

    def all_logits(self, n: int) -> np.ndarray:
        """Logits of the last n positions evaluated [n, vocab] (needs logits_all)."""
        return np.asarray(self.llm.scores[self.llm.n_tokens - n:self.llm.n_tokens], dtype=np.float32)

    def step(self, tok: int) -> int:
        self.llm.eval([tok])
        return int(np.argmax(self.last_logits()))

    def teacher_forced(self, ids: list[int]) -> np.ndarray:
        """The next-token logits after each of `ids`, fed one at a time from the current position [len(ids), vocab]."""
        rows = []
        for t in ids:
            self.llm.eval([t])
            rows.append(self.last_logits())
        return np.stack(rows)


def weight_bytes(path: Path) -> int:
    """The file's tensor bytes: what llama.cpp's decode step reads as weights."""
    from sparsekv.model.gguf_file import read_header
    return sum(t.n_bytes for t in read_header(path).tensors)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# llama_ftype ids (llama.h) of the formats llama.cpp's CPU matmuls accelerate (ggml's repack and llamafile's
# tinyBLAS both cover Q8_0 and Q4_0; neither covers the Q4_1 SmolLM2 ships as).
FTYPES = {"Q8_0": 7, "Q4_0": 2}


def requantize(src: Path, dst: Path, ftype: str, threads: int = 2) -> str:
    """Write `src` re-quantised to `ftype` at `dst` with llama.cpp's own quantiser (every weight matrix, the token
    embedding and output included), unless `dst` exists; returns dst's sha256. From Q4_1, Q8_0 holds each Q4_1
    value to within half a step of 1/127 of its block's largest magnitude (both use blocks of 32): a near-copy of
    the shipped weights in a format llama.cpp accelerates. The output is a function of the input alone (the
    quantiser has no seed and the GGUF writer no timestamp), so the sha256 pins it."""
    import llama_cpp
    if not dst.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.nthread, params.ftype, params.allow_requantize = threads, FTYPES[ftype], True
        tmp = dst.with_suffix(".partial")
        if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError(f"llama_model_quantize failed on {src} -> {ftype}")
        tmp.rename(dst)
    return sha256(dst)
