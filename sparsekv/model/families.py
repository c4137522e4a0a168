"""The model families the loaders read, in one table: what each changes in the decoder and in loading.

The decoder (`model.Model`) never asks which family it runs: it reads `ModelConfig`'s switches. A family says which
switches it sets, how its transformers config fills the rest, and what its GGUF files need:

    family   transformers      GGUF arch   block     RMSNorm    q/k norm  MLP     embed x    windows     q/k rows
    llama    llama             llama       prenorm   w          no        SwiGLU  1          none        permuted
    qwen2    qwen2             qwen2       prenorm   w          no        SwiGLU  1          none        as stored
    mistral  mistral           (llama)     prenorm   w          no        SwiGLU  1          ignored     (llama's)
    gemma3   gemma3_text       gemma3      sandwich  (1 + w)    yes       GeGLU   sqrt(dim)  per layer   as stored

Read per checkpoint, for every family: the shapes, norm eps, rotary base (Gemma 3: one for global layers, one for
sliding ones) and scaling, q/k/v bias (Qwen2's default is on), tied embeddings and the context length. SmolLM2 is a
`llama`; Mistral's GGUF files name the `llama` architecture, so a GGUF is read through that row. "q/k rows":
llama.cpp stores a llama file's attn_q/attn_k rows permuted for its rotary, which `quant.quantize_from_gguf` undoes
for HF's rotate-half. Gemma 3's tokenizer is built from the GGUF's own vocabulary (transformers' is wrong for it:
`model.tokenizer`).

Adding a family is one reader (the fields its config fills) and one `Family` row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _read_llama(hf, family: "Family") -> dict:
    """Llama, Qwen2 and Mistral: the shapes, the rotary base and HF's rope scaling (llama3's rule among them)."""
    rope = getattr(hf, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    scaling = getattr(hf, "rope_scaling", None) or (rope if rope.get("rope_type", "default") != "default" else None)
    return dict(
        vocab_size=hf.vocab_size, dim=hf.hidden_size, n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads, n_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        head_dim=getattr(hf, "head_dim", None) or 0,          # 0: ModelConfig derives dim // n_heads
        intermediate_size=hf.intermediate_size, norm_eps=hf.rms_norm_eps, rope_theta=float(theta),
        rope_scaling=dict(scaling) if scaling else None,
        attention_bias=bool(getattr(hf, "attention_bias", family.bias_default)),
        tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        max_seq_len=getattr(hf, "max_position_embeddings", 131072))


def _read_gemma3(hf, family: "Family") -> dict:
    """Gemma 3 (text): per-layer sliding or full attention, each with its own rotary base; GeGLU (transformers'
    gelu_pytorch_tanh); embeddings scaled by sqrt(dim); q.k scaled by query_pre_attn_scalar^-0.5. Read from
    transformers' config (which the GGUF's metadata and Gemma3TextConfig's defaults fill)."""
    rope = getattr(hf, "rope_parameters", None) or {}
    glob, loc = rope.get("full_attention", {}), rope.get("sliding_attention", {})
    for part in (glob, loc):
        if part.get("rope_type", "default") != "default":
            raise ValueError(f"Gemma 3 rope_type {part.get('rope_type')!r} is not supported (default only)")
    if getattr(hf, "final_logit_softcapping", None) or getattr(hf, "attn_logit_softcapping", None):
        raise ValueError("Gemma 3 with logit softcapping is not supported (the 270M model has none)")
    windows = tuple(hf.sliding_window if t == "sliding_attention" else 0 for t in hf.layer_types)
    return dict(
        vocab_size=hf.vocab_size, dim=hf.hidden_size, n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads,
        n_kv_heads=hf.num_key_value_heads, head_dim=hf.head_dim, intermediate_size=hf.intermediate_size,
        norm_eps=hf.rms_norm_eps, rope_theta=float(glob.get("rope_theta", 1e6)),
        rope_theta_local=float(loc.get("rope_theta", 1e4)), windows=windows,
        hidden_act={"gelu_pytorch_tanh": "gelu_tanh"}.get(hf.hidden_activation, hf.hidden_activation),
        embed_scale=float(hf.hidden_size) ** 0.5, attn_scale=float(hf.query_pre_attn_scalar) ** -0.5,
        attention_bias=bool(getattr(hf, "attention_bias", family.bias_default)),
        tie_embeddings=bool(hf.tie_word_embeddings), max_seq_len=hf.max_position_embeddings)


PRENORM = dict(block="prenorm", norm_offset=0.0, qk_norm=False)     # Llama's: x + mix(norm x), x + mlp(norm x)
SANDWICH = dict(block="sandwich", norm_offset=1.0, qk_norm=True)    # Gemma 3's: a norm after the mixer and the MLP too


@dataclass(frozen=True)
class Family:
    """One row of the table (see the module docstring)."""

    name: str                        # the family, and the prefix of a loaded ModelConfig's name ("gemma3:<folder>")
    model_type: str                  # transformers' config.model_type read as this family
    gguf_arch: str | None            # GGUF general.architecture naming it (None: its files name another family's)
    switches: dict                   # ModelConfig fields the family fixes (block, RMSNorm offset, q/k norm)
    read: Callable                   # read(hf_config, family) -> the ModelConfig fields a checkpoint fills
    bias_default: bool = False       # q/k/v bias when the config does not say (Qwen2: on)
    window_ignored: bool = False     # a config's sliding_window is not applied (full attention; the loader warns)
    permuted_qk: bool = False        # llama.cpp stored attn_q/attn_k rows permuted for its rotary (undone on load)
    gguf_tokenizer: bool = False     # the tokenizer is built from the GGUF's vocabulary, not transformers'


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "llama", "llama", PRENORM, _read_llama, permuted_qk=True),
    Family("qwen2", "qwen2", "qwen2", PRENORM, _read_llama, bias_default=True),
    Family("mistral", "mistral", None, PRENORM, _read_llama, window_ignored=True),
    Family("gemma3", "gemma3_text", "gemma3", SANDWICH, _read_gemma3, gguf_tokenizer=True),
)}
MODEL_TYPES = tuple(f.model_type for f in FAMILIES.values())       # the transformers model_types a loader reads


def of_model_type(model_type: str) -> Family:
    """The family of a transformers `model_type`; ValueError naming the ones read."""
    for f in FAMILIES.values():
        if f.model_type == model_type:
            return f
    raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")


def of_gguf_arch(arch: str) -> Family | None:
    """The family whose GGUF files name `arch` (general.architecture), or None for an architecture no row names."""
    return next((f for f in FAMILIES.values() if f.gguf_arch == arch), None)
