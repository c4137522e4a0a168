"""kvpress's SnapKV keeps what SnapKV's algorithm keeps, and a compressed cache answers at the right positions.

The equal-bytes study found SnapKV far below StreamingLLM on SmolLM2's passkey task (0 of 32 question-aware at 1/8).
These tests pin what the diagnosis (benchmarks/snapkv_needle.py) established, so that the low accuracy is known to be
the method's on this model and not the harness's:
1. the positions kvpress's SnapKV keeps per layer and kv head are the top scores of a float64 SnapKV written from the
   algorithm (`analysis.press_reference.snapkv_scores`: its own RoPE, softmax, window mean, average pooling, GQA
   mean), question-aware, through `peers.prefill_caches` and `peers.compressing` alike;
2. feeding a press's cache with `peers.feed` (one pass, positions continuing from the uncompressed length) gives the
   logits of one decode step per token at explicit positions;
3. `press_reference.kept_mask` reads the kept positions back from the key rows (a press gathers, never changes).
"""
import copy

import pytest
import torch

import sparsekv as sk
from sparsekv.analysis import peers, press_reference, tasks
from sparsekv.model import fetch
from sparsekv.model.checkpoint import converted_folder

ROOT = fetch.__file__.rsplit("/sparsekv/", 1)[0]
SMOL = fetch.model_path(fetch.SMOLLM2, ROOT)


def _capture_inputs(hf):
    """Hooks that record each attention layer's input hidden states: (the dict layer -> tensor, the handles)."""
    seen, handles = {}, []
    for layer in hf.model.layers:
        def hook(module, args, kwargs, output):
            seen[module.layer_idx] = kwargs["hidden_states"].detach().clone()
        handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    return seen, handles


def _assert_keeps_the_reference_top(hf, mask, hidden, ratio, tol=1e-6):
    """Each layer and kv head keeps int(T (1 - ratio)) positions, all scoring at least the reference's k-th score and
    every dropped one at most it (up to `tol` of the largest score: a near-tie may fall either way)."""
    T = mask.shape[-1]
    n_kept = int(T * (1 - ratio))
    for i, h in sorted(hidden.items()):
        ref = press_reference.snapkv_scores(hf.model.layers[i].self_attn, h, hf.config)         # (KV, T)
        assert mask[i].sum(-1).tolist() == [n_kept] * mask.shape[1], i
        kth = ref.topk(n_kept, -1).values[:, -1:]                                               # (KV, 1)
        slack = tol * ref[:, :-64].max()
        assert (ref[mask[i]].view(mask.shape[1], -1) >= kth - slack).all(), f"layer {i} kept a low score"
        assert (ref.masked_fill(mask[i], -1.0) <= kth + slack).all(), f"layer {i} dropped a high score"


def _decode_steps(hf, cache, ids, start):
    with torch.no_grad():
        return torch.cat([hf(input_ids=torch.tensor([[t]]), past_key_values=cache,
                             position_ids=torch.tensor([[start + j]]), use_cache=True).logits[0]
                          for j, t in enumerate(ids)])


@pytest.mark.parametrize("ratio", [0.5, 0.875])
def test_snapkv_keeps_the_float64_reference_s_top_on_a_random_llama(tiny_llama_hf, ratio):
    hf, T = tiny_llama_hf, 640                    # 1/8 of 640 keeps 80 positions: the window of 64 and 16 more
    ids = torch.randint(0, 101, (T,), generator=torch.Generator().manual_seed(11)).tolist()
    methods = [peers.PeerMethod("dense", "dense"), peers.PeerMethod("snap", "evict", "SnapKVPress", ratio)]
    hidden, handles = _capture_inputs(hf)
    try:
        caches = peers.prefill_caches(hf, ids, methods)
    finally:
        for h in handles:
            h.remove()
    mask = press_reference.kept_mask(caches["dense"], caches["snap"])
    assert mask.shape == (3, 2, T) and mask[..., -64:].all()                   # the window always stays
    _assert_keeps_the_reference_top(hf, mask, hidden, ratio)


def test_kept_mask_reads_back_the_gathered_positions_and_refuses_foreign_rows(tiny_llama_hf):
    hf = tiny_llama_hf
    dense = peers.prefill_caches(hf, list(range(1, 41)), [peers.PeerMethod("dense", "dense")])["dense"]
    kept = copy.deepcopy(dense)
    pick = torch.tensor([[7, 0, 39], [5, 6, 1]])                   # per kv head, in any order
    for layer in kept.layers:
        idx = pick[None, :, :, None].expand(1, -1, -1, layer.keys.shape[-1])
        layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
    mask = press_reference.kept_mask(dense, kept)
    assert mask.shape == (3, 2, 40)
    assert mask[:, 0].nonzero()[:, 1].unique().tolist() == [0, 7, 39]          # head 0's picks, sorted
    assert mask[:, 1].nonzero()[:, 1].unique().tolist() == [1, 5, 6]
    kept.layers[1].keys = kept.layers[1].keys + 1.0                            # a row no press could produce
    with pytest.raises(ValueError, match="layer 1"):
        press_reference.kept_mask(dense, kept)


@pytest.fixture(scope="module")
def smol():
    if not SMOL.exists():
        pytest.skip("the real model is missing: run `make model`")
    torch.set_num_threads(1)
    return sk.load_tokenizer(SMOL), peers.hf_model(converted_folder(SMOL))


def test_question_aware_snapkv_on_smollm2_keeps_the_reference_s_top_and_answers_at_the_right_positions(smol):
    """The study's question-aware path (`peers.compressing` over the document and the question, then `peers.feed`)
    on a 320-token passkey document: the kept set is the float64 reference's, and feeding the answer after the
    compressed cache equals decode steps at positions T, T + 1, ..."""
    tok, hf = smol
    doc = tasks.make("passkey", tok, 320, 2, seed=500_000)
    q = doc.questions[0]
    ids, ratio = doc.ids + q.ids[:-1], 0.5
    T = len(ids)
    dense = peers.prefill_caches(hf, ids, [peers.PeerMethod("dense", "dense")])["dense"]
    m = peers.PeerMethod("snap", "evict", "SnapKVPress", ratio, sees_question=True)
    cache = peers.make_cache(hf, m)
    hidden, handles = _capture_inputs(hf)
    try:
        with torch.no_grad(), peers.compressing(hf, m):
            hf.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    mask = press_reference.kept_mask(dense, cache)
    assert mask.shape == (hf.config.num_hidden_layers, hf.config.num_key_value_heads, T)
    _assert_keeps_the_reference_top(hf, mask, hidden, ratio)
    rest = [q.ids[-1]] + q.answer[:-1]
    one_pass = peers.feed(hf, copy.deepcopy(cache), rest, T)
    assert torch.allclose(one_pass, _decode_steps(hf, copy.deepcopy(cache), rest, T), atol=1e-3, rtol=0)


def test_a_new_press_is_one_class_in_one_file(tiny_llama_hf):
    """Adding a press to the study: tests/toy_press.py (one class) and one `register_press` call; then a method names
    it, its cache comes from the same prefill as every other peer's, and its bytes from the byte model."""
    from toy_press import KeepRecentPress

    from sparsekv import methods as mt
    from sparsekv.studies.equal_bytes import run as rn
    peers.register_press(KeepRecentPress)
    assert peers.register_press(KeepRecentPress) is KeepRecentPress          # the same class again: no change
    (m,) = mt.presses(["KeepRecentPress"], [0.25])
    ids = list(range(1, 81))
    cache = peers.prefill_caches(tiny_llama_hf, ids, [rn._peer(m)])[m.name]
    dense = peers.prefill_caches(tiny_llama_hf, ids, [peers.PeerMethod("d", "dense")])["d"]
    mask = press_reference.kept_mask(dense, cache)                          # (layers, kv heads, 80)
    assert mask[..., -20:].all() and not mask[..., :-20].any()              # a quarter of 80 kept: the newest 20
    with pytest.raises(ValueError, match="is taken"):
        peers.register_press(type("SnapKVPress", (KeepRecentPress,), {}))
    with pytest.raises(ValueError, match="press must name a kvpress press or a registered one"):
        peers.make_press(peers.PeerMethod("x", "evict", press="NoSuchPress", ratio=0.5))
