"""The GGUF weights mode (`sparsekv.model.quant`, `kernels/cpu/qlinear.cpp`): each block format decoded exactly as
ggml dequantises it, the kernel against a float64 reference on odd shapes, and a real model whose weights equal the
float32 mode's and whose greedy tokens match it."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import sparsekv as sk
from sparsekv.kernels import cpu_decode
from sparsekv.model import fetch, quant

REPO = fetch.__file__.rsplit("/sparsekv/", 1)[0]
U = 2.0 ** -24                                    # float32 unit roundoff

kernel_only = pytest.mark.skipif(not cpu_decode.available(), reason="the CPU kernels could not be built")


def random_blocks(kind: str, rows: int, blocks: int, seed: int) -> np.ndarray:
    """Raw GGUF rows [rows, blocks * block bytes] of format `kind`: random code bytes, and float16 fields set to
    finite values of either sign (random bytes there could be inf or NaN)."""
    size, _, _ = quant.FORMATS[kind]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    halves = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}
    for at in halves[kind]:
        b[..., at:at + 2] = rng.normal(0, 0.05, (rows, blocks)).astype(np.float16)[..., None].view(np.uint8)
    return b.reshape(rows, -1)


@pytest.mark.parametrize("kind", sorted(quant.FORMATS))
def test_every_block_format_decodes_to_ggml_s_values_exactly(kind):
    import gguf
    raw = random_blocks(kind, rows=5, blocks=3, seed=len(kind))
    w = quant.from_gguf_bytes(raw, kind)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    assert w.shape == ref.shape
    np.testing.assert_array_equal(quant.dequantize(w).numpy(), ref)      # bit for bit, every weight


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        quant.from_gguf_bytes(np.zeros((2, 34), np.uint8), "Q3_K")
    with pytest.raises(ValueError, match="multiple of 34"):
        quant.from_gguf_bytes(np.zeros((2, 35), np.uint8), "Q8_0")


def layouts():
    """(bits, group, scale form, offset form) of every layout the formats produce, and the other forms on them;
    forms "plain" (float32), "half" (float16) or "factored"; offset None: no offset."""
    return [(4, 32, "half", "half"), (4, 32, "factored", "factored"), (4, 32, "plain", "plain"),
            (5, 32, "half", None), (6, 16, "factored", None), (6, 32, "plain", "half"), (8, 32, "half", None),
            (8, 32, "plain", "plain"), (8, 16, "plain", None), (8, 16, "factored", "factored")]


def random_table(N, ng, K, form, g) -> torch.Tensor:
    """A scale or offset table: float32 or float16 [N, ng], or factored uint8 (random int8 multipliers, float32
    supers)."""
    if form != "factored":
        return (torch.randn(N, ng, generator=g) * 0.1).to(torch.float16 if form == "half" else torch.float32)
    mult = torch.randint(-128, 128, (N, ng), generator=g, dtype=torch.int8).numpy()
    sup = (torch.rand(N, K // 256, generator=g) * 1e-3).numpy()
    return torch.from_numpy(quant.factor(mult, sup))


def random_weight(bits, group, scale, offset, N, K, g) -> quant.QuantWeight:
    codes = (torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8) if bits == 8
             else torch.randint(0, 256, (N, K * bits // 8), generator=g, dtype=torch.uint8))
    off = random_table(N, K // group, K, offset, g) if offset else torch.zeros(0)
    return quant.QuantWeight(codes, random_table(N, K // group, K, scale, g), off, bits, group)


def fits(K, scale, offset) -> int:
    """K rounded up to a multiple of 256 where a table is factored (the layout needs it)."""
    return -(-K // 256) * 256 if "factored" in (scale, offset) else K


@kernel_only
@pytest.mark.parametrize("bits,group,scale,offset", layouts())
@pytest.mark.parametrize("N,K,M", [(37, 96, 1), (5, 32, 2), (129, 576, 3), (64, 1536, 4), (7, 160, 5), (33, 64, 17),
                                   (9, 2336, 2)])          # 2336: 73 groups of 32, one scale chunk (64) and an odd tail
@pytest.mark.isa
def test_the_kernel_matches_a_float64_reference(bits, group, scale, offset, N, K, M):
    """Bound: each weight is rounded once (u |w|), and each lane's sum runs over K / 64 products, then 2 adds of the
    accumulators and 4 of the tree: |y - y64| <= (K / 64 + 8) u sum |w x| (a first-order gamma_n bound, doubled).
    A factored table needs K a multiple of 256: K is rounded up to one there. The reference multiplies a factored
    table out in float32 as the layout defines it (`quant.table`); the float64 part is everything after."""
    K = fits(K, scale, offset)
    g = torch.Generator().manual_seed(N * K + M)
    w = random_weight(bits, group, scale, offset, N, K, g)
    x = torch.randn(M, K, generator=g)
    lin = quant.QuantLinear(w)
    y = lin(x)
    W = quant.dequantize(w, torch.float64)                 # unrounded
    ref = x.double() @ W.T
    bound = 2 * (K / 64 + 8) * U * (x.double().abs() @ W.abs().T)
    assert y.dtype == torch.float32 and y.shape == (M, N)
    assert ((y.double() - ref).abs() <= bound).all(), float(((y.double() - ref).abs() / bound).max())
    # the dequantised copy a prefill chunk multiplies: each weight within one rounding
    assert ((lin.dequantized().double() - W).abs() <= U * W.abs()).all()


@kernel_only
def test_decode_rows_and_prefill_rows_agree():
    """A row through the kernel (M <= DECODE_ROWS) and the same row inside a prefill chunk (MKL over the dequantised
    weight) differ only by summation order: each float32 sum of K products is within K eps sum_k |w_k x_k| of the
    exact one whatever its order (the recursive-summation bound), so the two are within twice that. The bound holds on
    any CPU and BLAS; a fixed 1e-5 did not (MKL on an Intel Xeon differed by 1.5e-5 where an AMD EPYC stayed under)."""
    g = torch.Generator().manual_seed(3)
    w = random_weight(4, 32, "factored", "factored", 200, 768, g)
    lin = quant.QuantLinear(w)
    x = torch.randn(quant.DECODE_ROWS + 8, 768, generator=g)
    chunk = lin(x)
    rows = torch.cat([lin(x[i:i + 1]) for i in range(x.shape[0])])
    K, eps = x.shape[1], torch.finfo(torch.float32).eps
    bound = 2 * K * eps * (x.double().abs() @ quant.dequantize(w).double().abs().T)
    assert ((rows.double() - chunk.double()).abs() <= bound).all()


def test_wrong_input_dtype_is_a_type_error():
    g = torch.Generator().manual_seed(0)
    lin = quant.QuantLinear(random_weight(8, 32, "plain", None, 4, 32, g))
    with pytest.raises(TypeError, match="x must be float32"):
        lin(torch.zeros(1, 32, dtype=torch.bfloat16))


def test_load_model_checks_its_weights_argument(tmp_path):
    with pytest.raises(ValueError, match="weights must be one of"):
        sk.load_model(tmp_path, weights="int3")
    with pytest.raises(ValueError, match="needs a .gguf file"):
        sk.load_model(tmp_path, weights="gguf")
    with pytest.raises(ValueError, match="dtype must be torch.float32"):
        sk.load_model(tmp_path / "m.gguf", dtype=torch.bfloat16, weights="gguf")
    with pytest.raises(ValueError, match="activations must be one of"):
        sk.load_model(tmp_path / "m.gguf", weights="gguf", activations="int4")
    with pytest.raises(ValueError, match="needs weights='gguf'"):
        sk.load_model(tmp_path, activations="int8")


def _smollm2():
    path = fetch.model_path(fetch.SMOLLM2, REPO)
    if not path.is_file():
        pytest.skip("SmolLM2's GGUF is not fetched (make model)")
    return path


@kernel_only
def test_smollm2_in_gguf_mode_holds_the_file_s_weights_and_decodes_as_float32_does():
    path = _smollm2()
    f32 = sk.load_model(path)
    q4 = sk.load_model(path, weights="gguf")
    mods = dict(f32.named_modules())
    linears = [(n, m) for n, m in q4.named_modules() if isinstance(m, quant.QuantLinear)]
    fused = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}
    # every projection, the tied lm_head, and per layer the fused q/k/v and gate/up (all Q4_1: one layout)
    assert len(linears) == (7 + 2) * f32.config.n_layers + 1
    for name, m in linears:
        tail = next((t for t in fused if name.endswith(t)), None)
        if tail is None:
            ref = mods["lm_head" if name == "embed_tokens.table" else name].weight
        else:                                                           # its rows are its parts', in order
            head = name[:-len(tail)] + tail.split(".")[0]
            ref = torch.cat([mods[f"{head}.{part}"].weight for part in fused[tail]])
        assert torch.equal(m.dequantized(), ref), name                  # the q/k rows unpermuted as transformers does
    assert q4.layers[0].self_attn.q_proj.codes.untyped_storage().data_ptr() == \
        q4.layers[0].self_attn.qkv_proj.codes.untyped_storage().data_ptr()      # one copy: the parts are its rows
    held = quant.weight_bytes(q4)
    assert held["total"] < 0.25 * quant.weight_bytes(f32)["total"]
    tok = sk.load_tokenizer(path)
    ids = tok("The capital of France is Paris. The capital of Italy is", return_tensors=None)["input_ids"]
    runs = []
    for model in (f32, q4):
        eng = sk.Engine(model)
        seq = eng.new_sequence()
        first = eng.prefill(seq, ids)
        runs.append((first, eng.decode(seq, 32)))
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=0, atol=2e-3)   # summation order only
    assert runs[1][1] == runs[0][1]


def q8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_q8's rule in torch's float32 ops: d = max|x| / 127 per 32 values, q = round-half-even(x * (1 / d))."""
    xb = x.reshape(x.shape[0], -1, 32)
    d = xb.abs().amax(-1) / 127
    inv = torch.where(d != 0, 1 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
    q = torch.round(xb * inv[..., None]).to(torch.int8)
    return q.reshape(x.shape), d


@kernel_only
def test_int8_activations_are_quantised_by_the_stated_rule():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 160, generator=g) * torch.logspace(-3, 3, 5)[:, None]
    x[1, 32:64] = 0                                        # an all-zero block: d = 0, q = 0
    x[2, 64:96] = torch.arange(32) * 0.5 - 7.75            # ties at .5 after scaling in some lanes
    q, d = cpu_decode.quantize_q8(x)
    rq, rd = q8_reference(x)
    assert torch.equal(q, rq) and torch.equal(d, rd)
    assert int(q.abs().max()) <= 127 and (d[1, 1] == 0) and (q[1, 32:64] == 0).all()
    # each value within half a step of its code (plus the rounding of 1 / d)
    back = (q.reshape(5, -1, 32).double() * d.double()[..., None]).reshape(5, 160)
    assert ((back - x.double()).abs() <= (0.5 + 1e-5) * d.double().repeat_interleave(32, 1)).all()


def int8_layouts():
    """The layouts qlinear_q8 takes: every one of `layouts()` but 8-bit codes in groups of 16 or with an offset."""
    return [lay for lay in layouts() if lay[0] != 8 or (lay[1] == 32 and lay[3] is None)]


@kernel_only
@pytest.mark.parametrize("bits,group,scale,offset", int8_layouts())
@pytest.mark.parametrize("N,K,M", [(37, 96, 1), (5, 32, 2), (129, 576, 3), (64, 1536, 4), (7, 160, 5), (33, 64, 17),
                                   (9, 2336, 2)])          # 2336: 73 groups of 32, one scale chunk (64) and an odd tail
@pytest.mark.isa
def test_the_int8_activation_kernel_matches_a_float64_reference(bits, group, scale, offset, N, K, M):
    """Against float64 over the kernel's own q and d, (q d) . W^T: the integer dots are exact, so the error is
    float32's on the per-group terms d s sum u q and d (o - s bias) sum q (bias: 0, 16, 32 for 4, 5, 6 bits; a
    product, a difference and an fma each, then up to K / 32 accumulations per lane and the tree): within
    4 (K / 32 + 8) u sum_k |q_k| d_k (|w_k| + 2 |o_k| + 2 |s_k| bias), a first-order bound with room (|s u| <=
    |w - o| + |s| bias). Against x . W^T in float64: each x within d / 2 of q d adds at most sum_k |w_k| d_k / 2."""
    K = fits(K, scale, offset)
    g = torch.Generator().manual_seed(N * K + M + 1)
    w = random_weight(bits, group, scale, offset, N, K, g)
    x = torch.randn(M, K, generator=g)
    y = cpu_decode.qlinear_q8(x, w.codes, w.scale, w.offset, bits, group)
    q, d = cpu_decode.quantize_q8(x)
    step = d.double().repeat_interleave(32, 1)                                      # [M, K]
    W = quant.dequantize(w, torch.float64)                                          # unrounded
    ref = (q.double() * step) @ W.T
    bias = 0 if bits in (4, 8) else 1 << (bits - 1)
    sc = quant.table(w.scale, K, group).double().abs().repeat_interleave(group, 1)
    off = (quant.table(w.offset, K, group).double().abs().repeat_interleave(group, 1) if w.offset.numel()
           else torch.zeros_like(sc))
    bound = 4 * (K / 32 + 8) * U * ((q.double().abs() * step) @ (W.abs() + 2 * off + 2 * bias * sc).T)
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert ((y.double() - ref).abs() <= bound).all(), float(((y.double() - ref).abs() / bound).max())
    qerr = 0.5 * (1 + 1e-5) * step @ W.abs().T
    assert ((y.double() - x.double() @ W.T).abs() <= qerr + bound).all()


@kernel_only
def test_int8_activations_bind_only_where_the_layout_has_them():
    g = torch.Generator().manual_seed(9)
    q8 = quant.QuantLinear(random_weight(8, 32, "half", None, 40, 64, g), activations="int8")
    q4 = quant.QuantLinear(random_weight(4, 32, "half", "half", 40, 64, g), activations="int8")
    q8g16 = quant.QuantLinear(random_weight(8, 16, "plain", None, 40, 64, g), activations="int8")
    x = torch.randn(2, 64, generator=g)
    assert q8.int8_activations and q4.int8_activations and not q8g16.int8_activations
    assert torch.equal(q8(x), cpu_decode.qlinear_q8(x, q8.codes, q8.scale, q8.offset, 8, 32))
    assert torch.equal(q4(x), cpu_decode.qlinear_q8(x, q4.codes, q4.scale, q4.offset, 4, 32))
    assert torch.equal(q8g16(x), cpu_decode.qlinear(x, q8g16.codes, q8g16.scale, q8g16.offset, 8, 16))
    chunk = torch.randn(quant.DECODE_ROWS + 1, 64, generator=g)                     # a prefill chunk: float32
    assert torch.equal(q8(chunk), torch.nn.functional.linear(chunk, q8.dequantized()))
    q8.set_activations("float32")
    assert not q8.int8_activations and torch.equal(q8(x), cpu_decode.qlinear(x, q8.codes, q8.scale, q8.offset, 8, 32))
    with pytest.raises(ValueError, match="activations must be one of"):
        q8.set_activations("int4")
    assert q8.activations == "float32"                                               # a refused call changes nothing
    with pytest.raises(ValueError, match="x must be finite"):
        cpu_decode.qlinear_q8(torch.full((1, 64), float("nan")), q8.codes, q8.scale, q8.offset, 8, 32)
    with pytest.raises(ValueError, match="no offset"):
        cpu_decode.qlinear_q8(x, q8g16.codes, q8g16.scale, q8g16.offset, 8, 16)


@kernel_only
def test_smollm2_int8_activations_stay_within_their_bound_on_the_model_s_own_states():
    """The tied lm_head (Q8_0) with int8 activations, on the final hidden states SmolLM2's decode steps feed it over
    real text (captured by a hook): each logit within the activations' rounding bound of the float32-activation
    kernel's (sum_k |w_k| d_k / 2), plus both kernels' float32 error bounds (test_the_kernel_matches_a_float64_reference
    and the int8 one); and the tokens both pick, where the float32 one's margin exceeds the bound, the same."""
    path = _smollm2()
    model = sk.load_model(path, weights="gguf", activations="int8")
    head = model.lm_head
    assert head.int8_activations and model.layers[0].self_attn.qkv_proj.int8_activations
    tok = sk.load_tokenizer(path)
    from sparsekv.analysis import corpus
    ids = [tok.bos_token_id] + corpus.take(tok, corpus.haystack("prose"), 63)
    seen = []
    hook = head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().reshape(-1, args[0].shape[-1])))
    try:
        eng = sk.Engine(model, progress=False)
        seq = eng.new_sequence()
        eng.prefill(seq, ids[:16])
        seen.clear()
        eng.feed(seq, ids[16:], router=None)
    finally:
        hook.remove()
    x = torch.cat(seen)                                                  # [47, 576]: one row per decode step
    assert x.shape[0] == len(ids) - 16
    y8 = torch.cat([head(r[None]) for r in x])
    head.set_activations("float32")
    y32 = torch.cat([head(r[None]) for r in x])
    _, d = cpu_decode.quantize_q8(x)
    W = head.dequantized().double()
    K = head.in_features
    bound = (0.5 * (1 + 1e-5) * d.double().repeat_interleave(32, 1) @ W.abs().T
             + 2 * (K / 64 + 8 + 2 * (K / 32 + 8)) * U * (x.double().abs() @ W.abs().T))
    assert ((y8.double() - y32.double()).abs() <= bound).all()
    top2 = y32.topk(2, -1)
    clear = (top2.values[:, 0] - top2.values[:, 1]).double() > 2 * bound.max(-1).values
    assert clear.any() and torch.equal(y8.argmax(-1)[clear], y32.argmax(-1)[clear])


# -- bfloat16 prefill (load_model(..., prefill="bfloat16")) ------------------------------------------------------------

@kernel_only
@pytest.mark.parametrize("bits,group,scale,offset", [layouts()[0], layouts()[-1]])
def test_a_bfloat16_prefill_chunk_stays_within_its_rounding_bound(bits, group, scale, offset):
    """A prefill chunk in bfloat16 against the float64 product of the same x and dequantised W: x and W are each
    rounded to bfloat16 (relative error at most u = 2^-8 each, so at most 2u + u^2 per product), then summed with
    float32 accumulation (at most K eps per sum, recursive summation) and the sum rounded to bfloat16 (u), whatever
    the BLAS: |y - y_64| <= (2u + u^2 + K eps) sum_k |x_k w_k| + u |y_64|. The float32 chunk of the same rows stays
    within K eps sum_k |x_k w_k|, far tighter: the option changes the arithmetic, and only by its stated rounding."""
    g = torch.Generator().manual_seed(bits)
    K = 512 if "factored" in (scale, offset) else 160
    w = random_weight(bits, group, scale, offset, 45, K, g)
    lin = quant.QuantLinear(w)
    x = torch.randn(quant.DECODE_ROWS + 7, K, generator=g)
    exact = x.double() @ quant.dequantize(w).double().T
    mag = x.double().abs() @ quant.dequantize(w).double().abs().T
    f32 = lin(x)
    lin.set_prefill("bfloat16")
    b16 = lin(x)
    assert b16.dtype == torch.float32 and lin.prefill == "bfloat16"
    u, eps = 2.0 ** -8, torch.finfo(torch.float32).eps
    assert ((b16.double() - exact).abs() <= (2 * u + u * u + K * eps) * mag + u * exact.abs()).all()
    assert ((f32.double() - exact).abs() <= K * eps * mag).all()
    assert (b16 - f32).abs().max() > 0                               # the bfloat16 path ran
    with pytest.raises(ValueError, match="prefill must be one of"):
        lin.set_prefill("float16")
    assert lin.prefill == "bfloat16"                                 # a rejected call changes nothing


def test_load_model_checks_its_prefill_argument(tmp_path):
    with pytest.raises(ValueError, match="prefill must be one of"):
        sk.load_model(tmp_path / "m.gguf", weights="gguf", prefill="float16")
    with pytest.raises(ValueError, match="prefill='bfloat16' needs weights='gguf'"):
        sk.load_model(tmp_path, prefill="bfloat16")


@kernel_only
def test_smollm2_bfloat16_prefill_keeps_the_float32_prefill_s_answers():
    """SmolLM2 over 640 tokens of real prose and of real code, prefilled in bfloat16 (matmuls and attention) against
    float32: the next-token distribution after each within KL 1e-2 (measured on an AMD EPYC: 7e-4 after 1,024 tokens
    of prose at 1 thread, 1.7e-4 here; Gemma 3 270M 8e-5) and the same top token; the attention ran in bfloat16 (the
    model's prefill_dtype). Greedy continuations of free text are not compared: a near tie a few tokens on moves
    with any rounding (they first differed at the 4th token here)."""
    path = _smollm2()
    tok = sk.load_tokenizer(path)
    from sparsekv.analysis import corpus
    prompts = [[tok.bos_token_id] + corpus.take(tok, corpus.haystack(kind), 639) for kind in ("prose", "code")]
    last = {}
    for prefill in ("float32", "bfloat16"):
        model = sk.load_model(path, weights="gguf", prefill=prefill)
        assert model.prefill_dtype == quant.PREFILL[prefill]
        eng = sk.Engine(model, chunk_size=256, progress=False)
        for i, ids in enumerate(prompts):
            seq = eng.new_sequence()
            last[prefill, i] = eng.prefill(seq, ids)
            eng.finish(seq)
    for i in range(len(prompts)):
        a, b = last["float32", i], last["bfloat16", i]
        kl = torch.nn.functional.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True, reduction="sum")
        assert 0 < float(kl) < 1e-2 and int(a.argmax()) == int(b.argmax()), (i, float(kl))


# -- the weights a prefill holds (quant.held_weights) -----------------------------------------------------------------

@kernel_only
@pytest.mark.parametrize("prefill", ["float32", "bfloat16"])
def test_a_held_weight_is_dequantised_once_gives_the_same_bits_and_is_freed(monkeypatch, prefill):
    """Within `held_weights` a prefill chunk dequantises W at its first chunk only, in the prefill dtype; each chunk's
    output is bit for bit the unheld one's; on exit (also by an exception) nothing stays held, and a nested block
    keeps the outer one's hold. A decode row holds nothing."""
    g = torch.Generator().manual_seed(5)
    lin = quant.QuantLinear(random_weight(4, 32, "plain", "plain", 40, 96, g))
    model = torch.nn.Sequential(lin)
    quant.set_prefill(model, prefill)
    chunks = [torch.randn(quant.DECODE_ROWS + 3 + i, 96, generator=g) for i in range(3)]
    want = [lin(x) for x in chunks]
    calls = []
    real = lin.dequantized
    monkeypatch.setattr(lin, "dequantized", lambda: calls.append(1) or real())
    with quant.held_weights(model):
        assert quant.held_bytes(model) == 0
        lin(torch.randn(1, 96, generator=g))                             # a decode row: the kernel, nothing held
        assert quant.held_bytes(model) == 0
        got = [lin(x) for x in chunks]
        with quant.held_weights(model):
            lin(chunks[0])
        assert quant.held_bytes(model) == 40 * 96 * (4 if prefill == "float32" else 2)      # the outer hold survives
        assert lin._held.dtype == quant.PREFILL[prefill]
    assert len(calls) == 1 and quant.held_bytes(model) == 0
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(RuntimeError, match="boom"):
        with quant.held_weights(model):
            lin(chunks[0])
            raise RuntimeError("boom")
    assert quant.held_bytes(model) == 0 and not lin._hold


def test_changing_the_prefill_dtype_drops_a_held_weight():
    """set_prefill inside a hold: the next chunk dequantises anew, in the new dtype."""
    g = torch.Generator().manual_seed(6)
    lin = quant.QuantLinear(random_weight(4, 32, "plain", "plain", 24, 64, g))
    x = torch.randn(quant.DECODE_ROWS + 2, 64, generator=g)
    with quant.held_weights(lin):
        lin(x)
        lin.set_prefill("bfloat16")
        assert lin._held is None
        y = lin(x)
        assert lin._held.dtype == torch.bfloat16
    lin2 = quant.QuantLinear(random_weight(4, 32, "plain", "plain", 24, 64, torch.Generator().manual_seed(6)))
    lin2.set_prefill("bfloat16")
    assert torch.equal(y, lin2(x))


@contextlib.contextmanager
def _dequantisations():
    """While open, counts each QuantLinear's `dequantized` calls: yields {id(module): calls}."""
    real, counts = quant.QuantLinear.dequantized, {}

    def counted(self):
        counts[id(self)] = counts.get(id(self), 0) + 1
        return real(self)
    quant.QuantLinear.dequantized = counted
    try:
        yield counts
    finally:
        quant.QuantLinear.dequantized = real


@kernel_only
def test_an_engine_prefill_of_several_chunks_holds_the_weights_and_keeps_its_logits():
    """SmolLM2 in gguf mode, 300 tokens in chunks of 64 (5 chunks): a bfloat16 prefill dequantises every QuantLinear
    once for the whole prompt, gives the last logits of the same prefill without the hold bit for bit, and holds
    nothing after the call; a float32 prefill (where holding measured a tie) and hold_weights=False dequantise once
    per chunk."""
    path = _smollm2()
    tok = sk.load_tokenizer(path)
    from sparsekv.analysis import corpus
    ids = [tok.bos_token_id] + corpus.take(tok, corpus.haystack("prose"), 299)
    model = sk.load_model(path, weights="gguf", prefill="bfloat16")

    def prefill(**kw):
        with _dequantisations() as counts:
            eng = sk.Engine(model, chunk_size=64, progress=False, **kw)
            return eng.prefill(eng.new_sequence(), ids), set(counts.values())
    held, once = prefill()
    assert once == {1} and quant.held_bytes(model) == 0
    plain, each = prefill(hold_weights=False)
    assert each == {5} and torch.equal(held, plain)
    quant.set_prefill(model, "float32")
    assert prefill()[1] == {5}
    with pytest.raises(TypeError, match="hold_weights must be a bool"):
        sk.Engine(model, hold_weights=1)


@kernel_only
def test_a_scheduler_run_holds_the_weights_across_its_chunks_and_wide_decode_batches():
    """SmolLM2 in gguf mode with a bfloat16 prefill, 18 prompts of 40 tokens served as one batch under "chunked"
    (chunks of at most 512 tokens through `Engine.extend`, decode batches of up to 18 rows, wider than DECODE_ROWS):
    `Scheduler.run` holds the weights for the run (`EngineExecutor.session`), so each QuantLinear a chunk or a wide
    batch multiplies is dequantised once in the whole run, every request gets the tokens of the run without the hold,
    and nothing stays held after; hold_weights=False dequantises at every such op. `Engine.holding_weights` itself
    holds across `extend` calls, in float32 too (unlike `Engine.prefill`), and not with hold_weights=False."""
    from sparsekv.serving.executors import EngineExecutor
    from sparsekv.serving.scheduler import Scheduler, SchedulerConfig
    from sparsekv.serving.trace import ServeRequest
    path = _smollm2()
    tok = sk.load_tokenizer(path)
    from sparsekv.analysis import corpus
    text = corpus.take(tok, corpus.haystack("prose"), 18 * 39)
    reqs = [ServeRequest(i, f"p{i}", 0.0, torch.tensor([tok.bos_token_id] + text[39 * i:39 * (i + 1)]), 3)
            for i in range(18)]
    model = sk.load_model(path, weights="gguf", prefill="bfloat16")
    assert quant.DECODE_ROWS < 18

    def serve(**kw):
        with _dequantisations() as counts:
            eng = sk.Engine(model, block_size=16, num_blocks=128, progress=False, **kw)
            ex = EngineExecutor(eng)
            res = Scheduler(ex, SchedulerConfig(max_batch=18, batch_tokens=512)).run(reqs)
        assert max(o.tokens for o in ex.ops if o.kind == "decode") > quant.DECODE_ROWS     # a wide batch ran
        return [r.tokens for r in res.records], counts, eng
    held, once, eng = serve()
    assert set(once.values()) == {1} and quant.held_bytes(model) == 0
    assert id(model.lm_head) in once                     # only a wide decode batch multiplies the lm_head's W
    plain, each, _ = serve(hold_weights=False)
    assert held == plain and set(each) == set(once) and min(each.values()) > 1
    seq = eng.new_sequence()
    with eng.holding_weights():
        eng.extend(seq, reqs[0].prompt[:20])
        first = quant.held_bytes(model)
        eng.extend(seq, reqs[0].prompt[20:])
        assert first > 0 and quant.held_bytes(model) == first
    assert quant.held_bytes(model) == 0
    quant.set_prefill(model, "float32")
    with eng.holding_weights():
        eng.extend(seq, reqs[1].prompt[:20])
        assert quant.held_bytes(model) == 2 * first                  # the same W, in float32
    assert quant.held_bytes(model) == 0
    plain = sk.Engine(model, block_size=16, num_blocks=64, progress=False, hold_weights=False)
    with plain.holding_weights():
        plain.extend(plain.new_sequence(), reqs[1].prompt[:20])
        assert quant.held_bytes(model) == 0
