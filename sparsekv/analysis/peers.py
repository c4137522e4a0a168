"""Lossy KV peers on the real model, run through transformers: kvpress eviction and quantised KV caches.

The peers are the libraries themselves, not re-implementations: kvpress presses (context managers that
compress the cache at prefill) and transformers' `QuantizedCache` with a real backend (HQQ).
Prompt formatting is ours, not a pipeline's: every method gets the same token ids (`turns.TwoFacts`), so
the comparison is the cache and nothing else.

Protocol for one probe and one method (kvpress's own pipeline does the same):
1. prefill `context` (plus `turn1` when the press may see question 1) with the press active: the cache
   is compressed once, before the question (kvpress's query-agnostic setting);
2. feed the rest of `after` in one forward pass, at its true positions (position ids continue from the
   uncompressed length, as kvpress does), over whatever the cache kept;
3. return the logits of `after[:-1]` and the bytes the cache holds at the end.

A hybrid model (Gemma 3: most layers see a sliding window, a few are global) is compressed in its global layers
only, the policy kvpress itself applies to Gemma 3's multimodal class (`compressing`), so its sliding layers hold
their window exactly, as sparsekv's routers leave them; its dense and press caches are transformers' hybrid
`DynamicCache(config=...)`, which keeps a sliding layer's last window of tokens. HQQ's `QuantizedCache` has no
sliding layers: it quantises and holds every token of every layer.

kvpress and the quantisation backends are optional imports (`pip install -e ".[peers]"`).
"""
from __future__ import annotations

import contextlib
import copy
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .turns import TwoFacts

PRESSES = ("StreamingLLMPress", "SnapKVPress", "TOVAPress", "KnormPress", "ExpectedAttentionPress")


@dataclass(frozen=True)
class PeerMethod:
    """One lossy configuration.

    family: "dense" (transformers' DynamicCache, nothing compressed), "evict" (a kvpress press at
    `ratio`, the fraction of context tokens removed), or "quant" (QuantizedCache at `bits` through
    `backend`, `group` channels per scale/zero-point, the last `residual` tokens kept in full precision).
    sees_question: the press compresses context + question 1 (a query-aware press then knows question 1,
    never question 2).
    """

    name: str
    family: str
    press: str | None = None
    ratio: float = 0.0
    bits: int | None = None
    backend: str = "hqq"          # the one backend whose held bytes `held_bytes` can measure
    group: int = 64
    residual: int = 128
    sees_question: bool = False

    def __post_init__(self):
        if self.family not in ("dense", "evict", "quant"):
            raise ValueError(f"family must be 'dense', 'evict' or 'quant', got {self.family!r}")
        if self.family == "evict" and (self.press is None or not 0.0 <= self.ratio < 1.0):
            raise ValueError(f"an 'evict' method needs a press and a ratio in [0, 1), got {self.press!r}, {self.ratio}")
        if self.family == "quant" and self.bits not in (2, 4, 8):
            raise ValueError(f"a 'quant' method needs bits in (2, 4, 8), got {self.bits!r}")
        if self.family == "quant" and self.backend != "hqq":
            raise ValueError(f"a 'quant' method's backend must be 'hqq' (its bytes are measured), got {self.backend!r}")


@dataclass
class PeerRun:
    logits: torch.Tensor      # [len(after) - 1, vocab] float32
    held_bytes: int           # bytes of every tensor the cache holds after the run (all layers)
    cached_tokens: int        # tokens in the cache (per layer and kv head) after the run
    seconds: float            # wall time of prefill + rest


def hf_model(folder: str | Path):
    """The transformers model of a converted checkpoint folder (float32, SDPA attention, eval mode)."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True,
                                                attn_implementation="sdpa").eval()


REGISTERED_PRESSES: dict[str, type] = {}     # presses beside kvpress's own, by class name (`register_press`)


def register_press(cls: type) -> type:
    """Make a press class nameable by a method (`methods.presses([cls.__name__], ...)`): one class in one file, a
    kvpress `BasePress` (a `ScorerPress` subclass needs only its `score`) taking `compression_ratio`. Returns `cls`,
    so it works as a decorator. Nothing registers on import: call it where the press is defined or used. A name
    kvpress already uses, or one registered to another class, is a ValueError."""
    import kvpress
    if not isinstance(cls, type) or not issubclass(cls, kvpress.BasePress):
        raise TypeError(f"cls must be a kvpress.BasePress subclass, got {cls!r}")
    name = cls.__name__
    if hasattr(kvpress, name) or REGISTERED_PRESSES.get(name, cls) is not cls:
        raise ValueError(f"press name {name!r} is taken (by kvpress or another registered press)")
    REGISTERED_PRESSES[name] = cls
    return cls


def make_press(method: PeerMethod):
    """The method's press at its ratio: a registered press (`register_press`), else kvpress's class of that name."""
    import kvpress
    cls = REGISTERED_PRESSES.get(method.press) or getattr(kvpress, method.press, None)
    if not isinstance(cls, type) or not issubclass(cls, kvpress.BasePress):
        raise ValueError(f"press must name a kvpress press or a registered one ({sorted(REGISTERED_PRESSES)}), "
                         f"got {method.press!r}")
    return cls(compression_ratio=method.ratio)


def global_layers(config) -> list[int] | None:
    """Indices of a hybrid model's global (full-attention) layers, or None when no layer slides."""
    types = getattr(config, "layer_types", None) or ()
    if not any(t == "sliding_attention" for t in types):
        return None
    return [i for i, t in enumerate(types) if t == "full_attention"]


def make_cache(hf, method: PeerMethod):
    """The method's empty cache: QuantizedCache (HQQ) for "quant"; otherwise a DynamicCache, hybrid (sliding
    layers keep their window) when the model has sliding layers."""
    from transformers import DynamicCache, QuantizedCache
    if method.family == "quant":
        return QuantizedCache(backend=method.backend, config=hf.config, nbits=method.bits,
                              q_group_size=method.group, residual_length=method.residual)
    return DynamicCache(config=hf.config) if global_layers(hf.config) is not None else DynamicCache()


class _LayerRope(torch.nn.Module):
    """A hybrid model's rotary embedding bound to one layer type: kvpress calls `rotary_emb(x, position_ids)`,
    while Gemma 3's embedding needs the layer type to pick its frequencies."""

    def __init__(self, rope, layer_type: str):
        super().__init__()
        self.rope, self.layer_type = rope, layer_type

    def forward(self, x, position_ids):
        return self.rope(x, position_ids, layer_type=self.layer_type)


@contextlib.contextmanager
def compressing(hf, method: PeerMethod):
    """Prefill under `method`'s press (nothing for "dense" and "quant"). On a hybrid model the press hooks the
    global layers only, each given its own layer type's RoPE; elsewhere it is kvpress's own context manager."""
    if method.family != "evict":
        yield
        return
    press = make_press(method)
    glob = global_layers(hf.config)
    if glob is None:
        with press(hf):
            yield
        return
    press.post_init_from_model(hf)
    hooks = []
    try:
        for i in glob:
            attn = hf.model.layers[i].self_attn
            attn.rotary_emb = _LayerRope(hf.model.rotary_emb, hf.config.layer_types[i])
            hooks.append(attn.register_forward_hook(press.forward_hook, with_kwargs=True))
        yield
    finally:
        for h in hooks:
            h.remove()


def one_pass_is_causal(cache) -> bool:
    """Whether tokens fed in one forward pass over `cache` stay causal. transformers builds every layer's attention
    mask from one `cache_position`, counted from `cache.get_seq_length()` (its first layer's tokens seen). A full-
    attention layer holding fewer tokens than that count gets a mask that lets each new token see the new tokens
    after it: a hybrid model's global layer that a press compressed, while its sliding layers count every token
    (Gemma 3: layer 0 slides). Sliding layers and HQQ's quantised layers keep the count and are not checked."""
    n = cache.get_seq_length()
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if getattr(layer, "is_sliding", False) or hasattr(layer, "_quantized_keys") or not isinstance(
                keys, torch.Tensor) or keys.numel() == 0:
            continue
        if keys.shape[-2] != n:
            return False
    return True


def _layer_masks(hf, cache, n_new: int, pos: torch.Tensor, start_seen: int) -> dict | None:
    """Per-layer-type attention masks that keep `n_new` tokens fed in one pass over `cache` causal, or None where the
    model or cache does not allow it. For a hybrid model whose full-attention layers all hold one length `g` (a press
    compressed them alike) while its sliding layers count `start_seen` tokens: the full-attention mask is built at
    cache positions g, g + 1, ... over those layers' g + n_new keys, the sliding mask at the counted positions, each
    by transformers' own mask builders. The model must take a mapping {layer type: mask} (Gemma 3's text model does,
    as `generate` prepares it)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
    types = getattr(hf.config, "layer_types", None)
    if not types or set(types) != {"full_attention", "sliding_attention"} or len(types) != len(cache.layers):
        return None
    lengths = {layer.keys.shape[-2] for layer, t in zip(cache.layers, types) if t == "full_attention"}
    if len(lengths) != 1:
        return None
    (g,), embeds = lengths, torch.empty((1, n_new, 1), dtype=hf.dtype)
    kw = dict(config=hf.config, inputs_embeds=embeds, attention_mask=None, past_key_values=cache, position_ids=pos)
    return {"full_attention": create_causal_mask(cache_position=torch.arange(g, g + n_new), **kw),
            "sliding_attention": create_sliding_window_causal_mask(
                cache_position=torch.arange(start_seen, start_seen + n_new), **kw)}


@torch.no_grad()
def feed(hf, cache, ids: list[int], start: int) -> torch.Tensor:
    """The logits [len(ids), vocab] of `ids` fed after `cache` at positions start, start + 1, ... (kvpress continues a
    compressed cache's positions from the uncompressed length), each token seeing only the cache and the tokens before
    it, as one decode step per token would (tested). One forward pass when `one_pass_is_causal(cache)`; on a hybrid
    model whose press compressed the global layers, one pass with per-layer-type masks (`_layer_masks`); else one
    token per forward. `cache` is updated in place."""
    if not ids:
        raise ValueError("ids must hold at least one token, got none")
    pos = torch.arange(start, start + len(ids))[None]
    if one_pass_is_causal(cache):
        return hf(input_ids=torch.tensor([list(ids)]), past_key_values=cache, position_ids=pos, use_cache=True).logits[0]
    seen = cache.get_seq_length()
    masks = _layer_masks(hf, cache, len(ids), pos, seen)
    if masks is not None:
        return hf(input_ids=torch.tensor([list(ids)]), past_key_values=cache, position_ids=pos, attention_mask=masks,
                  cache_position=torch.arange(seen, seen + len(ids)), use_cache=True).logits[0]
    return torch.cat([hf(input_ids=torch.tensor([[t]]), past_key_values=cache, position_ids=torch.tensor([[start + i]]),
                         use_cache=True).logits[0] for i, t in enumerate(ids)])


@torch.no_grad()
def prefill_caches(hf, ids: list[int], methods: list[PeerMethod]) -> dict:
    """Every method's cache after prefilling `ids`, from one dense forward pass: name -> cache, the same tensors that
    prefilling once per method (`make_cache` under `compressing`) leaves (tested bit for bit).

    Why one pass is enough: a press compresses a layer's cache in a hook after that layer's attention has run on the
    whole prefill, and HQQ's `QuantizedCache` returns its input unquantised on the first update, so no method changes
    the hidden states a prefill computes; each differs only in what its cache keeps. Here every press's `compress`
    runs in one hook on the dense cache's K/V of each layer it compresses (kvpress's layers, or a hybrid model's
    global layers), with that layer's own RoPE as in `compressing`; each quantised cache receives, layer by layer,
    the K/V states the dense cache's `update` was given. A transformers prefill of n tokens costs one forward
    instead of len(methods); the caches are held at once (a press's copy keeps its sliding layers' windows)."""
    for m in methods:
        if not isinstance(m, PeerMethod):
            raise TypeError(f"methods must be PeerMethods, got {type(m).__name__}")
    presses = {m.name: make_press(m) for m in methods if m.family == "evict"}
    for press in presses.values():
        press.post_init_from_model(hf)
    glob = global_layers(hf.config)
    dense = make_cache(hf, PeerMethod("dense", "dense"))
    states, kept = {}, {name: {} for name in presses}
    update = dense.update

    def recording(keys, values, layer_idx, cache_kwargs=None):
        states[layer_idx] = (keys, values)
        return update(keys, values, layer_idx, cache_kwargs)

    def compress(module, args, kwargs, output):
        layer = dense.layers[module.layer_idx]
        for name, press in presses.items():
            kept[name][module.layer_idx] = press.compress(module, kwargs["hidden_states"], layer.keys, layer.values,
                                                          output[1], kwargs)
        return output

    hooks = []
    dense.update = recording
    try:
        if presses:
            for i in range(hf.config.num_hidden_layers) if glob is None else glob:
                attn = hf.model.layers[i].self_attn
                attn.rotary_emb = (hf.model.rotary_emb if glob is None
                                   else _LayerRope(hf.model.rotary_emb, hf.config.layer_types[i]))
                hooks.append(attn.register_forward_hook(compress, with_kwargs=True))
        hf.model(input_ids=torch.tensor([list(ids)]), past_key_values=dense, use_cache=True)
    finally:
        for h in hooks:
            h.remove()
        del dense.update
    out = {}
    for m in methods:
        if m.family == "quant":
            cache = make_cache(hf, m)
            for i in sorted(states):
                cache.update(*states[i], i)
        else:
            cache = copy.deepcopy(dense)
            for i, (keys, values) in kept.get(m.name, {}).items():
                cache.layers[i].keys, cache.layers[i].values = keys, values
        out[m.name] = cache
    return out


def held_bytes(cache) -> tuple[int, int]:
    """(bytes, tokens) of every tensor a DynamicCache or QuantizedCache holds, summed over layers."""
    total, tokens = 0, 0
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
        for name in ("_quantized_keys", "_quantized_values"):
            q = getattr(layer, name, None)
            total += _quantized_bytes(q) if q is not None else 0
        tokens = layer.get_seq_length() if hasattr(layer, "get_seq_length") else layer.keys.shape[-2]
    return total, tokens


def _quantized_bytes(q) -> int:
    """Bytes of HQQ's quantised tensor (packed codes, plus the tensors of its meta: scale and zero-point)."""
    if not isinstance(q, tuple):
        raise TypeError(f"expected HQQ's (codes, meta) tuple, got {type(q).__name__}: only backend 'hqq' is measured")
    codes, meta = q
    extra = sum(v.numel() * v.element_size() for v in meta.values() if isinstance(v, torch.Tensor))
    return codes.numel() * codes.element_size() + extra


@torch.no_grad()
def run(hf, probe: TwoFacts, method: PeerMethod) -> PeerRun:
    """Prefill with the method's cache (and press), feed the rest of `after`; see the module docstring."""
    t0 = time.perf_counter()
    k = len(probe.after) - 1
    head = 0
    if method.sees_question:
        head = probe.answers[0][0] if probe.answers else 0    # question 1 is `after` up to its answer
    pre = torch.tensor([probe.context + probe.after[:head]])
    cache = make_cache(hf, method)
    with compressing(hf, method):
        hidden = hf.model(input_ids=pre, past_key_values=cache, use_cache=True).last_hidden_state
    parts = [hf.lm_head(hidden[0, pre.shape[1] - head:pre.shape[1]])] if head else []
    rest = probe.after[head:k]
    if rest:
        parts.append(feed(hf, cache, rest, pre.shape[1]))
    logits = torch.cat(parts).float()
    nbytes, tokens = held_bytes(cache)
    return PeerRun(logits, nbytes, tokens, time.perf_counter() - t0)


def residual_tokens(probe: TwoFacts, method: PeerMethod) -> int:
    """Full-precision tokens a QuantizedCache holds after `run`: the first update (the prefill) is quantised
    whole; the rest arrives in one chunk, which stays in the residual (HF requantises only when a later
    update finds the residual full, and `run` makes no later update)."""
    head = probe.answers[0][0] if method.sees_question and probe.answers else 0
    return len(probe.after) - 1 - head


def hf_generate_timing(hf_model, ids: list[int], new_tokens: int) -> dict:
    """transformers' own `generate` (its default cache, greedy) on `ids`: TTFT and median TPOT (s).

    Times are read by a logits processor, which generate calls once per step: the first call
    ends the prefill, the gaps between later calls are decode steps.
    """
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps = []

    class Clock(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                logits_processor=LogitsProcessorList([Clock()]))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft_s": stamps[0] - t0, "tpot_s": statistics.median(gaps) if gaps else float("nan"),
            "tokens": out[0, len(ids):].tolist()}
