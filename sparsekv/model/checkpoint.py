"""Load a local checkpoint into `Model`: a Hugging Face folder (config.json + *.safetensors) or a GGUF file.

Llama, Qwen2 and Mistral families, and Gemma 3 (text): what each changes is one row of `families.FAMILIES`.
Nothing is downloaded: the folder or file must exist locally.
A `.gguf` file is read once through transformers (which dequantises it to float32, about 20 s for SmolLM2-135M; its
metadata parsed once, `_one_reader_per_file`) and converted into a safetensors folder beside it,
`converted-<sha256>/` (the file's full sha256), with the tokenizer and its chat template; later loads read that
folder (about 1 s). The key is the file's hash, so a changed file is converted again, and nothing is written outside
the file's own folder. The folder is published whole and trusted only when its manifest names the file's sha256 and
lists exactly its files (`model.cache_folder`); one that does not is refused with a ValueError, never loaded,
rebuilt over or deleted. Folders named by the older 16-digit key (`converted-<sha256[:16]>/`) are no longer read.
Mistral's sliding window is not applied (full attention), which matches it only for
contexts inside the window; `load_model` warns when a config sets one. Gemma 3's is (`ModelConfig.windows`).

Gemma 3's tokenizer is not transformers' (its GGUF tokenizer for Gemma 3 is wrong: see `model.tokenizer`): for a
Gemma 3 file `load_tokenizer` builds a SentencePiece one from the file's own vocabulary.
"""
from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import torch

from . import cache_folder, families
from .model import Model, ModelConfig


def config_from_hf(hf) -> ModelConfig:
    """A `ModelConfig` from a transformers config object of a supported family (`families`): the family's fixed
    switches and what its reader takes from the config."""
    family = families.of_model_type(getattr(hf, "model_type", ""))
    if family.window_ignored and getattr(hf, "sliding_window", None):
        warnings.warn("sliding_window is ignored: sparsekv attends over the full context", stacklevel=3)
    return ModelConfig(**family.switches, **family.read(hf, family),
                       name=f"{family.name}:{Path(str(hf.name_or_path)).name}")


WEIGHTS = ("float32", "gguf")


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, weights: str = "float32",
               activations: str = "float32", prefill: str = "float32") -> Model:
    """Load `path` (a local folder with config.json and *.safetensors, or a `.gguf` file) as a `Model` in `dtype`.

    weights: "float32" (the default and the parity reference: every weight dequantised to `dtype`) or "gguf" (a
    `.gguf` file's own quantised tensors, multiplied in place by the CPU kernel: `model.quant`; float32 only).
    activations (weights="gguf" only): "float32" (the default), or "int8": a decode step's rows of x quantised to
    int8 per 32 values before every `quant.QuantLinear` (the fused layer step's too), as llama.cpp's dot products
    take them (`quant.set_activations` switches a loaded model).
    prefill (weights="gguf" only): "float32" (the default), or "bfloat16": a prefill chunk's matmuls and attention in
    bfloat16 with float32 accumulation, several times faster where the CPU has bfloat16 dot products
    (`quant.set_prefill`).
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    from .quant import ACTIVATIONS
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
    if activations != "float32" and weights != "gguf":
        raise ValueError(f"activations={activations!r} needs weights='gguf' (float32 weights take float32 "
                         f"activations), got weights={weights!r}")
    from .quant import PREFILL
    if prefill not in PREFILL:
        raise ValueError(f"prefill must be one of {tuple(PREFILL)}, got {prefill!r}")
    if prefill != "float32" and weights != "gguf":
        raise ValueError(f"prefill={prefill!r} needs weights='gguf', got weights={weights!r}")
    if weights == "gguf":
        if Path(path).suffix != ".gguf":
            raise ValueError(f"weights='gguf' needs a .gguf file as path, got {path}")
        if dtype != torch.float32:
            raise ValueError(f"weights='gguf' runs in float32; dtype must be torch.float32, got {dtype}")
        from .quant import quantize_from_gguf, set_activations, set_prefill
        return set_prefill(set_activations(quantize_from_gguf(load_model(path, dtype), path), activations), prefill)
    path = _checkpoint_folder(path)
    if not path.is_dir() or not (path / "config.json").exists():
        raise FileNotFoundError(f"path must be a local checkpoint folder with config.json; {path} has none "
                                "(sparsekv never downloads weights)")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    from safetensors.torch import load_file
    from transformers import AutoConfig
    cfg = config_from_hf(AutoConfig.from_pretrained(str(path), local_files_only=True))
    with torch.device("meta"):          # no random init of weights the checkpoint then overwrites (3 s for Gemma 3)
        model = Model(cfg, seed=None)
    model = model.to_empty(device="cpu")
    model.reset_buffers()
    if cfg.tie_embeddings:              # to_empty makes a new tensor per module: tie them again
        model.lm_head.weight = model.embed_tokens.weight
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


def load_tokenizer(path: str | Path):
    """The tokenizer of a checkpoint folder or a `.gguf` file: transformers' (with its chat template), or for a Gemma 3
    GGUF file a SentencePiece tokenizer built from the file's vocabulary (cached beside it; `model.tokenizer`)."""
    from transformers import AutoTokenizer
    gguf = Path(path)
    if gguf.suffix == ".gguf" and gguf.is_file():
        if _gguf_family_tokenizer(gguf):
            from .tokenizer import GGUFTokenizer
            return GGUFTokenizer.from_gguf(gguf, cache=True)
    folder = _checkpoint_folder(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"path must be a local checkpoint folder or .gguf file, got {path}")
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def converted_folder(gguf: str | Path) -> Path:
    """Where the safetensors conversion of `gguf` is cached, `converted-<sha256>/`, whether or not it exists yet; one
    that exists is checked first (a ValueError when its manifest does not vouch for it: `model.cache_folder`), so a
    caller that reads it directly (transformers' `from_pretrained`) reads a checked folder."""
    return _converted(Path(gguf))[0]


def prepare(gguf: str | Path) -> Path:
    """Build the caches beside a GGUF file that a first load would otherwise build: its safetensors conversion and
    its tokenizer (Gemma 3's SentencePiece cache). `make model` runs it after the fetch, so that tests and notebooks
    started in parallel never convert the same file twice. Returns the conversion folder."""
    with _one_reader_per_file():        # the conversion and Gemma 3's tokenizer read the same metadata
        folder = _checkpoint_folder(gguf)
        load_tokenizer(gguf)
    return folder


def _gguf_family_tokenizer(gguf: Path) -> bool:
    """Whether the family of a GGUF file builds its tokenizer from the file's vocabulary (`Family.gguf_tokenizer`)."""
    from .tokenizer import gguf_architecture
    family = families.of_gguf_arch(gguf_architecture(gguf))
    return family is not None and family.gguf_tokenizer


def _converted(gguf: Path) -> tuple[Path, str]:
    """The conversion folder of `gguf` (checked when it exists) and the file's sha256."""
    from .cache_folder import sha256_file
    digest = sha256_file(gguf)
    folder = cache_folder.path(gguf, "converted", digest)
    if folder.exists() or folder.is_symlink():
        cache_folder.check(folder, digest)
    return folder, digest


def _checkpoint_folder(path: str | Path) -> Path:
    """A folder for `path`: itself, or for a `.gguf` file its converted copy (converting it if needed)."""
    path = Path(path)
    if path.suffix != ".gguf":
        return path
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path} (fetch the real model with `make model`)")
    folder, digest = _converted(path)
    if not folder.exists():
        _convert_gguf(path, folder, digest)
    return folder


@contextlib.contextmanager
def _one_reader_per_file():
    """Within the block, every `gguf.GGUFReader(path)` of the same file is one reader. transformers builds a fresh
    reader for a GGUF file's config, again for its weights and again for its tokenizer (as does `model.tokenizer`
    for Gemma 3's), and each parses the whole metadata element by element: about 26 s for Gemma 3's 262,144-token
    vocabulary on one core (2026-12-07), most of a conversion. A reader only reads (a memory map of the file), so
    sharing one changes nothing it returns; `_convert_gguf`'s output is byte for byte the same (both real models,
    2026-12-07: CHANGELOG)."""
    import gguf as gguf_py
    if getattr(gguf_py.GGUFReader, "shares_readers", False):      # inside another such block: its readers
        yield
        return
    real, readers = gguf_py.GGUFReader, {}

    def shared(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = real(path, mode)
        return readers[key]

    shared.shares_readers = True
    gguf_py.GGUFReader = shared
    try:
        yield
    finally:
        gguf_py.GGUFReader = real


def _convert_gguf(gguf: Path, folder: Path, digest: str) -> None:
    """Dequantise `gguf` through transformers and publish config, weights and tokenizer as the cache `folder`."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _one_reader_per_file():
        # Gemma 3's tokenizer comes from the file itself (load_tokenizer); transformers' is wrong and is not kept
        tok = None if _gguf_family_tokenizer(gguf) else AutoTokenizer.from_pretrained(str(gguf.parent),
                                                                                    gguf_file=gguf.name)
        hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = hf.config.to_dict()
    config.pop("quantization_config", None)          # the weights below are plain float32
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)           # safetensors stores a shared tensor once

    def write(out: Path) -> None:
        (out / "config.json").write_text(json.dumps(config, indent=1))
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt", "source": gguf.name})
        if tok is not None:
            tok.save_pretrained(str(out))

    cache_folder.publish(folder, gguf, digest, write)
