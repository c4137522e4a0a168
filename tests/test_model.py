"""The store-backed model against transformers, chunked prefill, routed decode, forks."""
import pytest
import torch

import sparsekv as sk

transformers = pytest.importorskip("transformers")


def hf_pair(family, tmp_path, seed=0):
    """A tiny random transformers model, saved and loaded back through sparsekv.load_model."""
    kw = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if family == "llama":
        cfg = transformers.LlamaConfig(**kw)
        cls = transformers.LlamaForCausalLM
    else:
        cfg = transformers.Qwen2Config(**kw)
        cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(seed)
    hf = cls(cfg).eval()
    with torch.no_grad():                     # random, non-trivial norms and biases
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    return hf, sk.load_model(tmp_path)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_prefill_and_greedy_decode_match_transformers(family, tmp_path):
    hf, model = hf_pair(family, tmp_path)
    prompt = torch.randint(0, 97, (37,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = hf(prompt[None]).logits[0]                                  # [37, vocab]
        gen = hf.generate(prompt[None], max_new_tokens=20, do_sample=False, output_scores=True,
                          return_dict_in_generate=True, pad_token_id=0)
    engine = sk.Engine(model, block_size=8, num_blocks=64, chunk_size=16)
    seq = engine.new_sequence()
    logits = engine.prefill(seq, prompt)
    assert logits.shape == (97,) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, full[-1], rtol=1e-4, atol=1e-4)
    ours = []
    for i in range(20):
        torch.testing.assert_close(engine.last_logits(seq), gen.scores[i][0], rtol=1e-4, atol=1e-4)
        ours += engine.decode(seq, 1)
    assert ours == gen.sequences[0, 37:].tolist()


def test_chunked_prefill_equals_one_shot():
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    prompt = torch.randint(0, 256, (101,), generator=torch.Generator().manual_seed(2))
    ref = None
    for chunk in (101, 7, 16, 33):
        engine = sk.Engine(model, block_size=16, num_blocks=32, chunk_size=chunk)
        seq = engine.new_sequence()
        logits = engine.prefill(seq, prompt)
        if ref is None:
            ref = logits
        torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scorer", ["minmax", "mean", "repr", "oracle", "recency"])
def test_routing_every_block_gives_dense_tokens(scorer):
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    prompt = torch.randint(0, 256, (90,), generator=torch.Generator().manual_seed(3))
    every = sk.Router(scorer, top_k=64)                                   # more than the sequence has
    tokens = {}
    for name, router in (("dense", None), ("routed", every)):
        engine = sk.Engine(model, router=router, block_size=8, num_blocks=64)
        seq = engine.new_sequence()
        engine.prefill(seq, prompt)
        tokens[name] = engine.decode(seq, 12)
        if router is not None:
            assert engine.stats(seq).blocks_per_step > 0
    assert tokens["routed"] == tokens["dense"]


def test_sparse_router_reads_fewer_bytes_and_per_call_router_overrides():
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    prompt = torch.randint(0, 256, (400,), generator=torch.Generator().manual_seed(4))
    engine = sk.Engine(model, router=sk.Router("minmax", top_k=4), block_size=16, num_blocks=64, dense_layers=1)
    a, b = engine.new_sequence(), engine.new_sequence()
    engine.prefill(a, prompt)
    engine.prefill(b, prompt)
    engine.decode(a, 3)
    engine.decode(b, 3, router=None)                                       # dense for this call
    assert engine.stats(a).bytes_per_step < engine.stats(b).bytes_per_step
    assert engine.stats(a).ttft_s > 0 and engine.stats(a).tpot_s > 0


def test_forks_decode_independently():
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    prompt = torch.randint(0, 256, (45,), generator=torch.Generator().manual_seed(5))
    engine = sk.Engine(model, block_size=8, num_blocks=64)
    parent = engine.new_sequence()
    engine.prefill(parent, prompt)
    kv_before = [engine.store.gather(parent, l)[0].clone() for l in range(2)]
    child = engine.fork(parent)
    engine.decode(child, 10, sampler=lambda logits: int(torch.argsort(logits)[-2]))   # a different path
    for l in range(2):
        assert torch.equal(engine.store.gather(parent, l)[0], kv_before[l])            # parent's KV untouched
    solo = sk.Engine(model, block_size=8, num_blocks=64)
    s = solo.new_sequence()
    solo.prefill(s, prompt)
    assert engine.decode(parent, 6) == solo.decode(s, 6)


def test_missing_checkpoint_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        sk.load_model(tmp_path / "nope")


def test_engine_rejects_bad_input():
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    engine = sk.Engine(model, block_size=8, num_blocks=8)
    seq = engine.new_sequence()
    with pytest.raises(ValueError, match="token_ids must be in"):
        engine.prefill(seq, [1, 999])
    with pytest.raises(ValueError, match="call prefill first"):
        engine.decode(seq, 1)
    with pytest.raises(sk.StoreFullError):
        engine.prefill(seq, torch.zeros(100, dtype=torch.long))
    with pytest.raises(TypeError, match="router must be a Router"):
        sk.Engine(model, router="minmax")


def test_the_family_table_sets_what_each_family_changes():
    """`model.families`: the loader reads a config through its family's row (fixed switches, then what the checkpoint
    fills); the GGUF paths look a family up by architecture."""
    import warnings

    from sparsekv.model import families
    from sparsekv.model.checkpoint import config_from_hf
    kw = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=1, max_position_embeddings=512)
    llama = config_from_hf(transformers.LlamaConfig(**kw))
    assert (llama.block, llama.norm_offset, llama.qk_norm, llama.hidden_act, llama.embed_scale, llama.windows) == \
        ("prenorm", 0.0, False, "silu", 1.0, ())                      # the decoder's defaults: Llama's
    assert not llama.attention_bias and config_from_hf(transformers.Qwen2Config(**kw)).attention_bias  # Qwen2's default
    gemma = config_from_hf(transformers.Gemma3TextConfig(**kw, head_dim=16, sliding_window=16))
    assert (gemma.block, gemma.norm_offset, gemma.qk_norm, gemma.hidden_act, gemma.embed_scale) == \
        ("sandwich", 1.0, True, "gelu_tanh", 8.0)                      # sqrt(64)
    assert gemma.name.startswith("gemma3:") and gemma.windows == (16,) * 4     # every 6th layer would be global
    with pytest.warns(UserWarning, match="sliding_window is ignored"):
        mistral = config_from_hf(transformers.MistralConfig(**kw, sliding_window=64))
    assert mistral.windows == () and mistral.name.startswith("mistral:")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config_from_hf(transformers.MistralConfig(**kw, sliding_window=None))           # no window, no warning
    with pytest.raises(ValueError, match=r"model_type must be one of \('llama', 'qwen2', 'mistral', 'gemma3_text'\)"):
        families.of_model_type("phi3")
    assert families.of_gguf_arch("llama").permuted_qk and not families.of_gguf_arch("qwen2").permuted_qk
    assert families.of_gguf_arch("gemma3").gguf_tokenizer and not families.of_gguf_arch("llama").gguf_tokenizer
    assert families.of_gguf_arch("mistral") is None and families.of_gguf_arch("phi3") is None   # Mistral's say llama


def test_head_dim_is_resolved_once_and_checked():
    """ModelConfig's invariants 1-4: head_dim is resolved at construction and kept by replace; the rules it needs
    are refused with the field named."""
    import dataclasses
    c = sk.ModelConfig(dim=64, n_heads=4, n_kv_heads=2)
    assert c.head_dim == 16                                                  # 1: 0 -> dim // n_heads
    assert sk.ModelConfig(dim=640, n_heads=4, n_kv_heads=1, head_dim=256).head_dim == 256     # 1: given, kept
    wider = dataclasses.replace(c, n_heads=2)
    assert wider.head_dim == 16                                              # 2: replace keeps the resolved width
    assert dataclasses.replace(c, n_heads=2, head_dim=0).head_dim == 32      # 2: ... unless derived again
    assert sk.ModelConfig(**c.as_dict()).head_dim == 16                      # the saved form holds the resolved width
    assert sk.ModelConfig(dim=60, n_heads=4, n_kv_heads=2, positions="none").head_dim == 15    # 3: NoPE: odd is fine
    for kw, exc, words in [(dict(dim=66, n_heads=4), ValueError, "needs n_heads \\(4\\) to divide dim \\(66\\)"),
                           (dict(dim=60, n_heads=4), ValueError, "head_dim must be even with rotary"),          # 3
                           (dict(head_dim=-8), ValueError, "head_dim must be >= 0"),
                           (dict(head_dim=16.0), TypeError, "head_dim must be an int"),
                           (dict(n_kv_heads=0), ValueError, "n_kv_heads must be >= 1"),                      # 4
                           (dict(n_heads=6, n_kv_heads=4, head_dim=16), ValueError, "multiple of n_kv_heads")]:  # 4
        with pytest.raises(exc, match=words):
            sk.ModelConfig(**{"n_kv_heads": 2, **kw})
