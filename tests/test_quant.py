"""The GGUF weights mode (`sparsekv.model.quant`, `kernels/cpu/qlinear.cpp`): each block format decoded exactly as
ggml dequantises it, the kernel against a float64 reference on odd shapes, and a real model whose weights equal the
float32 mode's and whose greedy tokens match it."""
from __future__ import annotations

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
@pytest.mark.parametrize("N,K,M", [(37, 96, 1), (5, 32, 2), (129, 576, 3), (64, 1536, 4), (7, 160, 5), (33, 64, 17)])
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
