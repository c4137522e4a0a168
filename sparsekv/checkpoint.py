"""Load a local Hugging Face checkpoint folder (config.json + *.safetensors) into `Model`.

Llama, Qwen2 and Mistral families. Nothing is downloaded: the folder must exist locally.
Mistral's sliding window is not applied (full attention), which matches it only for
contexts inside the window; `load_model` warns when a config sets one.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from .model import Model, ModelConfig

FAMILIES = ("llama", "qwen2", "mistral")


def config_from_hf(hf) -> ModelConfig:
    """A `ModelConfig` from a transformers config object of a supported family."""
    kind = getattr(hf, "model_type", "")
    if kind not in FAMILIES:
        raise ValueError(f"model_type must be one of {FAMILIES}, got {kind!r}")
    rope = getattr(hf, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    scaling = getattr(hf, "rope_scaling", None) or (rope if rope.get("rope_type", "default") != "default" else None)
    if getattr(hf, "sliding_window", None) and kind == "mistral":
        warnings.warn("sliding_window is ignored: sparsekv attends over the full context", stacklevel=3)
    return ModelConfig(
        vocab_size=hf.vocab_size, dim=hf.hidden_size, n_layers=hf.num_hidden_layers,
        n_heads=hf.num_attention_heads, n_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        intermediate_size=hf.intermediate_size, norm_eps=hf.rms_norm_eps, rope_theta=float(theta),
        rope_scaling=dict(scaling) if scaling else None,
        attention_bias=bool(getattr(hf, "attention_bias", kind == "qwen2")),
        tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        max_seq_len=getattr(hf, "max_position_embeddings", 131072), name=f"{kind}:{Path(str(hf.name_or_path)).name}",
    )


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> Model:
    """Load `path` (a local folder with config.json and *.safetensors) as a `Model` in `dtype`."""
    path = Path(path)
    if not path.is_dir() or not (path / "config.json").exists():
        raise FileNotFoundError(f"path must be a local checkpoint folder with config.json; {path} has none "
                                "(sparsekv never downloads weights)")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    from safetensors.torch import load_file
    from transformers import AutoConfig
    cfg = config_from_hf(AutoConfig.from_pretrained(str(path), local_files_only=True))
    model = Model(cfg, seed=None)
    state = {}
    for shard in shards:
        for name, t in load_file(str(shard)).items():
            state[name.removeprefix("model.")] = t
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    unexpected = [u for u in unexpected if "rotary_emb" not in u]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the {cfg.name} architecture: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(dtype).eval()
