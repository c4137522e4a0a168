"""The fused decode step (`sparsekv.model.fused`, `kernels/cpu/decode_layer.cpp`): one operator call per layer.

Checked against a float64 reference of the whole model (its dequantised weights, no cache) on fresh random weights
and inputs with odd sizes: GQA ratios 1 to 8, head dims 64, 128 and 256, a partial last block, both block layouts
(prenorm, and Gemma 3's sandwich with qk norms, norm offset, tanh-GELU and a query gain), fused and separate
projections. Against the general path: the same tokens, byte counts and tiles; and the store's rows and summaries
are those `BlockStore.write` keeps (recomputed from the rows, bit for bit).
"""
from __future__ import annotations

import pytest
import torch
from conftest import feed_last_against_all

import sparsekv as sk
from sparsekv.kernels import cpu_decode
from sparsekv.model import fused, quant
from sparsekv.model.model import Model, ModelConfig
from sparsekv.storage.summaries import cast, make_summary

kernel_only = pytest.mark.skipif(not cpu_decode.available(), reason="the CPU kernels are unavailable")


def _weight(N: int, K: int, bits: int, g: torch.Generator) -> quant.QuantWeight:
    group, offset = (32, True) if bits == 4 else (16, False)
    codes = (torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8) if bits == 4
             else torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8))
    scale = torch.rand(N, K // group, generator=g) * (0.6 / K ** 0.5) / (8 if bits == 4 else 128)
    off = -scale * (8 if bits == 4 else 0) + torch.randn(N, K // group, generator=g) * 0.002 if offset else torch.zeros(0)
    return quant.QuantWeight(codes, scale, off.contiguous() if offset else off, bits, group)


def models(cfg: ModelConfig, seed: int, fuse: bool, v_bits: int = 4) -> tuple[Model, Model]:
    """(gguf-mode model, float64 reference) with the same random weights: projections as random 4-bit codes (v
    and down as `v_bits`), norms random around their identity."""
    g = torch.Generator().manual_seed(seed)
    qm, ref = Model(cfg, seed=seed), Model(cfg, seed=seed).double()
    for lq, lr in zip(qm.layers, ref.layers):
        for name, p in lq.named_parameters():
            if name.endswith("norm.weight"):
                val = torch.randn(p.shape, generator=g) * 0.1 + (0.0 if cfg.norm_offset else 1.0)
                p.data.copy_(val)
                dict(lr.named_parameters())[name].data.copy_(val.double())
        for owner, attr in (("mix", "q_proj"), ("mix", "k_proj"), ("mix", "v_proj"), ("mix", "o_proj"),
                            ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj")):
            mq, mr = getattr(lq, owner), getattr(lr, owner)
            N, K = getattr(mq, attr).weight.shape
            w = _weight(N, K, v_bits if attr in ("v_proj", "down_proj") else 4, g)
            setattr(mq, attr, quant.QuantLinear(w))
            getattr(mr, attr).weight.data.copy_(quant.dequantize(w).double())
        if fuse:
            lq.mix.qkv_proj = quant.fuse([lq.mix.q_proj, lq.mix.k_proj, lq.mix.v_proj])
            lq.mlp.gate_up_proj = quant.fuse([lq.mlp.gate_proj, lq.mlp.up_proj])
    return qm, ref


def engine(model, fused_decode: bool, dtype=torch.float32, block_size: int = 16, **kw) -> sk.Engine:
    return sk.Engine(model, block_size=block_size, num_blocks=64, chunk_size=64, progress=False, kv_dtype=dtype,
                     summaries=("kmin", "kmax"), repr_keys=0, fused_decode=fused_decode, **kw)


CASES = [  # (n_heads, n_kv_heads, head_dim, block, windows): GQA 1..8, head dims 64, 128, 256, sliding layers
    (2, 2, 64, "prenorm", ()), (6, 3, 64, "prenorm", ()), (8, 2, 128, "sandwich", ()), (8, 1, 64, "prenorm", ()),
    (3, 1, 256, "sandwich", (11, 0, 11)), (4, 4, 128, "prenorm", ()), (4, 1, 64, "sandwich", (0, 20, 20)),
]


def _cfg(hq: int, h: int, d: int, block: str, windows: tuple = ()) -> ModelConfig:
    """A random model of Llama's layout (prenorm) or Gemma 3's (sandwich, qk norms, 1 + w norms, tanh-GELU, a
    query gain, scaled embeddings), with sliding-window layers where `windows` has them (their own RoPE base)."""
    gemma = block == "sandwich"
    return ModelConfig(vocab_size=97, dim=96, n_layers=len(windows) or 2, n_heads=hq, n_kv_heads=h, head_dim=d,
                       intermediate_size=160, norm_eps=1e-6, rope_theta=1e4, block=block,
                       norm_offset=1.0 if gemma else 0.0, qk_norm=gemma, hidden_act="gelu_tanh" if gemma else "silu",
                       attn_scale=0.3 / d ** 0.5 if gemma else 0.0, embed_scale=96 ** 0.5 if gemma else 1.0,
                       windows=windows, rope_theta_local=1e3 if windows else 0.0, max_seq_len=512, name="fused-test")


@pytest.mark.isa
@kernel_only
@pytest.mark.parametrize("hq,h,d,block,windows", CASES)
@pytest.mark.parametrize("fuse", [True, False])
def test_fused_decode_matches_a_float64_reference(hq, h, d, block, windows, fuse):
    cfg = _cfg(hq, h, d, block, windows)
    seed = hq * 1000 + h * 100 + d + fuse + len(windows)
    qm, ref = models(cfg, seed, fuse, v_bits=8 if d == 256 else 4)          # 8-bit v: q/k/v cannot fuse
    assert fused.why_not(qm, engine(qm, True).store) is None
    ids = torch.randint(0, cfg.vocab_size, (47,), generator=torch.Generator().manual_seed(seed))  # 47: partial blocks
    n = 29                                                          # prefill 29, then 18 decode steps: rows 13..15,
    with torch.inference_mode():                                   # a new block's row 0, and on to a partial one
        want = ref.train_forward(ids[None])[0, n:].float()          # [18, vocab], float64 maths
    outs = {}
    for f in (True, False):
        eng = engine(qm, f)
        seq = eng.new_sequence()
        eng.prefill(seq, ids[:n])
        outs[f] = (eng.feed(seq, ids[n:]), eng.stats(seq).steps)
        assert isinstance(eng._fused, fused.FusedDecode) == f                    # the path each engine took
    got, general = outs[True][0], outs[False][0]
    # The general path's own distance to float64 sets the scale: the fused step is at most 4x as far (and 1e-5
    # absolute). Measured here: both about 2e-6 of logits of size 1.
    err_f, err_g = (got - want).abs().max().item(), (general - want).abs().max().item()
    assert err_f <= 4 * err_g + 1e-5, (err_f, err_g)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for a, b in zip(*(outs[f][1] for f in (True, False))):          # the same bytes and tiles, step by step
        assert (a.kv_bytes, a.route_bytes, a.blocks_read, a.traffic) == (b.kv_bytes, b.route_bytes, b.blocks_read,
                                                                          b.traffic)


@kernel_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("summary_dtype", [torch.float32, torch.bfloat16])
def test_fused_writes_the_rows_and_summaries_the_store_keeps(dtype, summary_dtype):
    """After fused decode steps, every block's kmin/kmax equal those recomputed from its stored rows (directed
    rounding included), and the rows equal the general path's to its float32 rounding."""
    cfg = _cfg(6, 2, 64, "prenorm", (0, 9))
    qm, _ = models(cfg, 5, True)
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(5))
    stores, logits = {}, {}
    for f in (True, False):
        eng = engine(qm, f, dtype=dtype, summary_dtype=summary_dtype)
        seq = eng.new_sequence()
        eng.prefill(seq, ids[:13])
        logits[f] = eng.feed(seq, ids[13:])
        assert isinstance(eng._fused, fused.FusedDecode) == f                    # the path each engine took
        stores[f] = (eng.store, seq)
    # bf16 K/V: a row the two paths round to neighbouring bf16 values moves the logits by far less than this; a
    # wrong V row (v = 3k, say) by more than 0.1
    assert torch.allclose(logits[True], logits[False], atol=1e-5 if dtype == torch.float32 else 5e-3)
    (store, seq), (other, oseq) = stores[True], stores[False]
    assert len(store.stores) == 2                                    # a global group and a sliding one
    for gi, (sub, part, osub, opart) in enumerate(zip(store.stores, store.parts(seq), other.stores, other.parts(oseq))):
        c, first = sub.config, part.released                         # the sliding group released its early blocks
        table, otable = sub.block_table(part)[first:], osub.block_table(opart)[first:]
        pos = torch.arange(first * c.block_size, part.num_blocks * c.block_size)
        valid = (pos < part.num_tokens).view(-1, 1, c.block_size, 1)
        for layer in range(c.num_layers):
            k = sub.k[layer][table].float()                                           # [nb, H, bs, D]
            for name in c.summaries:
                s = make_summary(name)
                want = (torch.where(valid, k, torch.inf).amin(2) if name == "kmin"
                        else torch.where(valid, k, -torch.inf).amax(2))
                assert torch.equal(sub.summary(name)[layer][table], cast(want, c.summary_dtype, s.rounding)), name
            tol = 1e-5 if dtype == torch.float32 else 2 ** -7                         # bf16: one rounding step
            for mine, theirs in ((sub.k, osub.k), (sub.v, osub.v)):
                a, b = mine[layer][table].float(), theirs[layer][otable].float()
                assert torch.allclose(torch.where(valid, a, 0), torch.where(valid, b, 0), rtol=tol, atol=tol), (gi, layer)
        assert gi or set(c.summaries) == {"kmin", "kmax"}


@kernel_only
def test_routed_fused_decode_selects_as_the_general_path():
    """minmax routing inside the operator: the same selections' bytes and tiles as the plan's fused route, and
    with a budget covering every block, dense's tokens exactly."""
    cfg = _cfg(8, 2, 64, "prenorm")
    qm, _ = models(cfg, 9, True)
    ids = torch.randint(0, cfg.vocab_size, (150,), generator=torch.Generator().manual_seed(9))
    runs = {}
    for f in (True, False):
        for name, r in (("routed", sk.Router("minmax", token_budget=48)), ("all", sk.Router("minmax", top_k=64)),
                        ("dense", None)):
            eng = engine(qm, f, dense_layers=1 if name == "routed" else 0)
            seq = eng.new_sequence()
            eng.prefill(seq, ids[:131])
            runs[f, name] = (eng.feed(seq, ids[131:], router=r), eng.stats(seq).steps)
            assert isinstance(eng._fused, fused.FusedDecode) == f
    for name in ("routed", "all", "dense"):
        (lf, sf), (lg, sg) = runs[True, name], runs[False, name]
        # the same selection gives the same logits to float32 rounding; another selection of the same size (the
        # bytes cannot tell) moves them by far more (a query-blind one of equal size: 10 of 19 steps differ)
        assert torch.allclose(lf, lg, atol=1e-5), name
        assert [(s.kv_bytes, s.route_bytes, s.blocks_read) for s in sf] == \
               [(s.kv_bytes, s.route_bytes, s.blocks_read) for s in sg], name
    assert torch.allclose(runs[True, "all"][0], runs[True, "dense"][0], atol=1e-5)
    assert not torch.allclose(runs[True, "routed"][0], runs[True, "dense"][0], atol=1e-3)    # routing changed them
    assert runs[True, "routed"][1][0].kv_bytes < runs[True, "dense"][1][0].kv_bytes


@kernel_only
def test_the_operator_skips_the_head_when_feed_wants_only_the_last_logits():
    """Gemma's layout with a sliding layer, routed: feed(logits="last") through the operator equals the last row of
    feed(logits="all") bit for bit, with the same bytes per step, and calls the output head once."""
    cfg = _cfg(4, 1, 64, "sandwich", (0, 20, 20))
    qm, _ = models(cfg, 6, True)
    ids = torch.randint(0, cfg.vocab_size, (90,), generator=torch.Generator().manual_seed(6))
    eng = engine(qm, True)
    seq = eng.new_sequence()
    eng.prefill(seq, ids[:67])
    feed_last_against_all(eng, qm, seq, ids[67:], sk.Router("minmax", token_budget=32))
    assert isinstance(eng._fused, fused.FusedDecode)                 # both feeds went through the operator


@kernel_only
def test_steps_outside_the_operator_s_scope_take_the_general_path():
    """A router without a token budget (top-p, threshold) when every global layer is dense, a batch of two, and a
    recorded step: each decodes as the general path does (none raises, none corrupts the step)."""
    cfg = _cfg(4, 2, 64, "prenorm")
    qm, _ = models(cfg, 4, True)
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(4))
    out = {}
    for f in (True, False):
        eng = engine(qm, f, dense_layers=cfg.n_layers)
        for name, r in (("top_p", sk.Router("minmax", top_p=0.9)), ("threshold", sk.Router("minmax", threshold=2.0))):
            seq = eng.new_sequence()
            eng.prefill(seq, ids)
            out[f, name] = eng.feed(seq, ids[:5], router=r)
        seqs = [eng.new_sequence() for _ in range(2)]
        for s in seqs:
            eng.prefill(s, ids)
        out[f, "batch"] = [eng.decode_batch(seqs, router=None) for _ in range(3)]
    for name in ("top_p", "threshold"):
        assert torch.allclose(out[True, name], out[False, name], atol=1e-5), name
    assert out[True, "batch"] == out[False, "batch"]


def test_scope_is_checked_and_said(tmp_path):
    """Outside its scope the engine takes the general path, and `why_not` says why."""
    cfg = _cfg(4, 2, 64, "prenorm")
    model = Model(cfg, seed=0)                                            # float32 weights: not the gguf mode
    reason = fused.why_not(model, engine(model, True).store)
    assert reason is not None and ("gguf" in reason or "kernels" in reason)
    if cpu_decode.available():
        qm, _ = models(cfg, 1, True)
        eng = sk.Engine(qm, block_size=16, num_blocks=64, progress=False)             # default summaries
        assert "summaries" in fused.why_not(qm, eng.store)
        conv = Model(ModelConfig(**{**cfg.as_dict(), "mixers": ("conv", "attn")}), seed=0)
        assert "attention" in fused.why_not(conv, engine(conv, True).store)
        cold = sk.Engine(qm, block_size=16, num_blocks=64, progress=False, summaries=("kmin", "kmax"), repr_keys=0,
                         cold_dir=str(tmp_path), hot_blocks=8)
        assert "cold" in fused.why_not(qm, cold.store)
        half = engine(qm, True, summary_dtype=torch.float16)
        assert "float32 or bfloat16" in fused.why_not(qm, half.store)
        seq = half.new_sequence()                                      # out of scope: the general path decodes
        half.prefill(seq, list(range(20)))
        assert len(half.decode(seq, 2)) == 2 and half._fused is False
    with pytest.raises(TypeError, match="fused_decode"):
        sk.Engine(model, block_size=16, num_blocks=64, fused_decode=1)


@kernel_only
@pytest.mark.parametrize("hq,h,d,block,windows", [CASES[1], CASES[2], CASES[4]])
def test_int8_activations_in_the_operator_match_the_general_path(hq, h, d, block, windows):
    """`quant.set_activations(model, "int8")` before the Engine: the operator quantises each linear's input as the
    general path's QuantLinear does (qlinear_q8 both sides). The two paths' inputs differ by float32 rounding (torch's
    norms and attention against the operator's), which can move a value of x across a rounding edge of its int8 code,
    so the check is relative: the two int8 paths are far closer to each other than either is to float64 (both are
    about d / 2 per value away from it)."""
    cfg = _cfg(hq, h, d, block, windows)
    seed = 77 + hq + d
    qm, ref = models(cfg, seed, True, v_bits=8 if d == 256 else 4)
    ids = torch.randint(0, cfg.vocab_size, (47,), generator=torch.Generator().manual_seed(seed))
    n = 29
    with torch.inference_mode():
        want = ref.train_forward(ids[None])[0, n:].float()
    outs = {}
    for f in (True, False):
        eng = engine(qm, f)                               # built with float32 activations: the flags rebind per step
        seq = eng.new_sequence()
        eng.prefill(seq, ids[:n])
        for act in ("int8", "float32"):
            quant.set_activations(qm, act)
            outs[f, act] = eng.feed(eng.fork(seq), ids[n:])
        assert isinstance(eng._fused, fused.FusedDecode) == f
    assert torch.allclose(outs[True, "float32"], outs[False, "float32"], atol=1e-5)       # rebound to float32
    outs = {f: outs[f, "int8"] for f in (True, False)}
    between = (outs[True] - outs[False]).abs().max().item()
    to_exact = (outs[False] - want).abs().max().item()
    # Measured here: between 3e-7, 1.5e-4 (a code across an edge) and 6e-7; to float64 2e-4, 4e-3 and 4e-3. A float32
    # general path alone sits about 2e-6 from float64 (test above), so 2e-5 says int8 activations did change them.
    assert to_exact > 2e-5
    assert between <= 0.5 * to_exact, (between, to_exact)
