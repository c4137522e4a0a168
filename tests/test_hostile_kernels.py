"""Hostile and malformed input to the C++ CPU kernels (`kernels/cpu/`, their checks in `cpu/checks.h`) and to the
extension loader (`kernels/cpu_decode.load`).

Every operator registered in `cpu/register.cpp` is called with out-of-range, negative and empty arguments, wrong
dtypes and shapes, straight through `torch.ops.sparsekv_cpu.*`, and through the Python surfaces that reach it
(`cpu_decode.*`, `DecodePlan.sparse`). Each must raise ValueError (TypeError for a dtype or a non-tensor) with a
message naming the argument, before it reads or writes anything; one valid call per operator, against a float64
or torch reference, shows that the checks let good input through.

The cases of an operator run in one subprocess, so that a crash (a segfault, a division by zero) fails that test
instead of ending the run: the subprocess prints `case|name|PASS or FAIL|what happened` per case, the name before
the call so that a crash shows which case it was. The loader's tests run in this process (they load nothing).
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from sparsekv.kernels import cpu_decode

pytestmark = pytest.mark.skipif(not cpu_decode.available(),
                                reason=f"the CPU kernels did not build here: {cpu_decode.reason()}")
REPO = Path(__file__).resolve().parents[1]

PRELUDE = r'''
import math
import torch
from sparsekv.kernels import cpu_decode
assert cpu_decode.available(), cpu_decode.reason()
ops = torch.ops.sparsekv_cpu
torch.manual_seed(0)


def case(name, want, fn, says=""):
    """fn() must return True (want "ok": a valid call matched its reference) or raise `want` (an exception's type
    name) with `says` in its message."""
    print(f"case|{name}|", end="", flush=True)
    try:
        r = fn()
        got, msg = ("ok", "") if r is True else ("no error", f"returned {type(r).__name__}")
    except Exception as e:
        got, msg = type(e).__name__, (str(e).splitlines() or [""])[0]
    ok = got == want and says in msg
    print(f"{'PASS' if ok else 'FAIL'}|want {want} saying {says!r}, got {got}: {msg[:200]}", flush=True)


def close(a, b, rel):
    """|a - b| <= rel * max |b| everywhere, in float64."""
    a, b = a.double(), b.double()
    return a.shape == b.shape and bool((a - b).abs().max() <= rel * b.abs().max())
'''


def run_cases(snippet: str) -> None:
    """Run PRELUDE + `snippet` in a fresh interpreter; every case must have run, and passed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + snippet + '\nprint("done")\n'], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("case|")]
    last = lines[-1] if lines else "the setup, before any case"
    # a negative code is the signal that killed it: -11 a segfault, -8 a division by zero, -6 an abort
    assert proc.returncode == 0, f"the subprocess ended with code {proc.returncode} at: {last}\n{proc.stderr[-3000:]}"
    failed = [ln for ln in lines if ln.split("|")[2] != "PASS"]
    assert not failed, "\n".join(failed)
    assert lines and proc.stdout.splitlines()[-1] == "done", "the snippet stopped before its end"


PAGED = r'''
import sparsekv as sk
from sparsekv.attention.plan import plan_decode

H, G, NB, bs, D = 2, 2, 6, 16, 64
k, v, q = torch.randn(H, NB, bs, D), torch.randn(H, NB, bs, D), torch.randn(H * G, D)
table = torch.tensor([4, 0, 5, 2])                 # nb = 4 of the pool's NB = 6 blocks: capacity 64 tokens
N = 3 * bs + 5                                     # a partial last block
dense = torch.arange(4).expand(H, 4).contiguous()
sel = torch.tensor([[0, 3, -1], [1, 2, 3]])
long = dict(dtype=torch.long)


def ref(blocks):
    """float64 attention of each query head over its kv head's selected tokens."""
    K, V = (t[:, table].reshape(H, -1, D)[:, :N].double() for t in (k, v))
    out = torch.empty(H * G, D, dtype=torch.float64)
    for h in range(H):
        tok = torch.cat([torch.arange(j * bs, min((j + 1) * bs, N)) for j in blocks[h].tolist() if j >= 0])
        out[h * G:(h + 1) * G] = (q[h * G:(h + 1) * G].double() @ K[h, tok].T / math.sqrt(D)).softmax(-1) @ V[h, tok]
    return out


def pd(q=q, k=k, v=v, table=table, blocks=dense, n=N, splits=2, min_token=0):
    return ops.paged_decode(q, k, v, table, blocks, n, splits, min_token)


def empty_pool(shape):
    return dict(k=torch.randn(shape), v=torch.randn(shape))


case("valid: every block", "ok", lambda: close(pd()[0], ref(dense), 1e-5))
case("valid: a selection padded with -1", "ok", lambda: close(pd(blocks=sel)[0], ref(sel), 1e-5))
case("valid: more splits than blocks, the same bits", "ok", lambda: torch.equal(pd(splits=40)[0], pd(splits=4)[0]))
# table entries against the pool's NB = 6 blocks
case("table entry NB", "ValueError", lambda: pd(table=torch.tensor([4, 0, 6, 2])), "table")
case("table entry -1", "ValueError", lambda: pd(table=torch.tensor([4, -1, 5, 2])), "table")
case("table entry 2**40", "ValueError", lambda: pd(table=torch.tensor([4, 0, 2 ** 40, 2])), "table")
# block ids against the table's nb = 4 entries
case("block id nb", "ValueError", lambda: pd(blocks=torch.tensor([[0, 4], [1, 2]])), "blocks")
case("block id -2", "ValueError", lambda: pd(blocks=torch.tensor([[0, -2], [1, 2]])), "blocks")
case("block id 2**62", "ValueError", lambda: pd(blocks=torch.tensor([[0, 2 ** 62], [1, 2]])), "blocks")
# num_tokens against the table's capacity nb * bs = 64; min_token within it; splits >= 1
case("num_tokens nb * bs + 1", "ValueError", lambda: pd(n=4 * bs + 1), "num_tokens")
case("num_tokens 0", "ValueError", lambda: pd(n=0), "num_tokens")
case("num_tokens -5", "ValueError", lambda: pd(n=-5), "num_tokens")
case("min_token -1", "ValueError", lambda: pd(min_token=-1), "min_token")
case("min_token num_tokens", "ValueError", lambda: pd(min_token=N), "min_token")
case("splits 0", "ValueError", lambda: pd(splits=0), "splits")
case("splits -3", "ValueError", lambda: pd(splits=-3), "splits")
# empty sizes: `% H` and `/ (2 * bs * D)` divided by zero before
case("no kv heads", "ValueError", lambda: pd(**empty_pool((0, NB, bs, D)), blocks=torch.zeros(0, 4, **long)),
     "k and v")
case("block size 0", "ValueError", lambda: pd(**empty_pool((H, NB, 0, D))), "k and v")
case("head dim 0", "ValueError", lambda: pd(q=torch.randn(H * G, 0), **empty_pool((H, NB, bs, 0))), "k and v")
case("no pool blocks", "ValueError", lambda: pd(**empty_pool((H, 0, bs, D))), "k and v")
case("no query heads", "ValueError", lambda: pd(q=torch.randn(0, D)), "q must be")
case("empty table", "ValueError", lambda: pd(table=torch.zeros(0, **long)), "table")
case("empty selection (K = 0)", "ValueError", lambda: pd(blocks=torch.zeros(H, 0, **long)), "blocks")
# dtypes, shapes, contiguity
case("q float64", "TypeError", lambda: pd(q=q.double()), "q must be float32")
case("k and v int32", "TypeError", lambda: pd(k=k.int(), v=v.int()), "k and v")
case("k float32, v bfloat16", "TypeError", lambda: pd(v=v.bfloat16()), "k and v")
case("table int32", "TypeError", lambda: pd(table=table.int()), "table must be int64")
case("blocks float32", "TypeError", lambda: pd(blocks=dense.float()), "blocks must be int64")
case("q rows not a multiple of H", "ValueError", lambda: pd(q=torch.randn(3, D)), "q must be")
case("q's head dim not k's", "ValueError", lambda: pd(q=torch.randn(H * G, D + 1)), "q must be")
case("table 2-d", "ValueError", lambda: pd(table=table[None]), "table")
case("blocks for 3 kv heads", "ValueError", lambda: pd(blocks=torch.zeros(3, 2, **long)), "blocks")
case("k not contiguous", "ValueError", lambda: pd(k=torch.randn(H, NB, D, bs).transpose(2, 3)), "contiguous")
# the Python wrapper: its split count no longer divides by zero, a non-tensor is a TypeError
case("wrapper: valid", "ok", lambda: close(cpu_decode.paged_decode(q, k, v, table, sel, N)[0], ref(sel), 1e-5))
case("wrapper: no kv heads", "ValueError",
     lambda: cpu_decode.paged_decode(q, *empty_pool((0, NB, bs, D)).values(), table, dense, N), "k and v")
case("wrapper: k a list", "TypeError", lambda: cpu_decode.paged_decode(q, [1.0], v, table, dense, N), "k must be")

# DecodePlan.sparse (public): its selection is checked as sparse_attention checks it
store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=8))
seq = store.new_sequence()
store.append(seq, torch.randn(1, N, H, D), torch.randn(1, N, H, D))
plan = plan_decode(store, seq, H * G, backend="cpp")
good = torch.tensor([[0, 2], [1, 3]])
case("plan.sparse: valid, as sparse_attention", "ok",
     lambda: torch.equal(plan.sparse(0, q, good)[0], sk.sparse_attention(q, store, seq, 0, good, backend="cpp")[0]))
case("plan.sparse: block id past the sequence", "ValueError", lambda: plan.sparse(0, q, torch.tensor([[0, 4], [1, 2]])),
     "blocks must hold logical indices")
case("plan.sparse: block id 10**6", "ValueError", lambda: plan.sparse(0, q, torch.tensor([[0, 10 ** 6], [1, 2]])),
     "blocks must hold logical indices")
case("plan.sparse: block id -2", "ValueError", lambda: plan.sparse(0, q, torch.tensor([[0, -2], [1, 2]])),
     "blocks must hold logical indices")
case("plan.sparse: a block twice", "ValueError", lambda: plan.sparse(0, q, torch.tensor([[1, 1], [0, 2]])), "twice")
case("plan.sparse: int32 blocks", "TypeError", lambda: plan.sparse(0, q, good.int()), "blocks")
case("plan.sparse: no sequence b = 1", "ValueError", lambda: plan.sparse(0, q, good, 1), "b must be")
'''


@pytest.mark.isa
def test_paged_decode_refuses_what_it_cannot_read():
    run_cases(PAGED)


ROUTE = r'''
H, G, NB, D = 2, 3, 7, 40                          # a head dim off the 32-lane grid
q = torch.randn(H * G, D)
lo = torch.randn(H, NB, D)
hi = lo + torch.rand(H, NB, D)
table = torch.tensor([6, 0, 3, 1, 5])              # nb = 5 of NB = 7
long = dict(dtype=torch.long)


def scores():
    """Quest's bound in float64: [H, G, nb]."""
    a, b, qq = lo[:, table].double(), hi[:, table].double(), q.double().view(H, G, 1, D)
    return torch.maximum(qq * a[:, None], qq * b[:, None]).sum(-1) / math.sqrt(D)


def route_valid():
    blocks, mass = ops.route_topk(q, lo, hi, table, 0, 3, 1, 1)
    want = scores().softmax(-1).mean(1)
    key = want.clone()
    key[:, 0] = key[:, -1] = 2                     # the sink and local blocks are forced in
    return close(mass, want, 1e-5) and torch.equal(blocks, key.topk(3, -1).indices.sort(-1).values)


def nan_ranks_last(lo, hi, nb):
    """NaN masses (from NaN or infinite inputs) rank last: the selection still holds the forced blocks (the first 2,
    the last 2), then distinct blocks in range."""
    t = torch.randperm(lo.shape[1])[:nb]
    blocks, _ = ops.route_topk(torch.randn(H * G, D), lo, hi, t, 0, nb // 3, 2, 2)
    rows = blocks.tolist()
    return (bool(((blocks >= 0) & (blocks < nb)).all()) and all(len(set(r)) == len(r) for r in rows)
            and all({0, 1, nb - 2, nb - 1} <= set(r) for r in rows))


OPS = {"minmax_scores": lambda q=q, a=lo, b=hi, table=table, **kw: ops.minmax_scores(q, a, b, table),
       "route_topk": lambda q=q, a=lo, b=hi, table=table, kind=0, top_k=3, sink=1, local=1:
       ops.route_topk(q, a, b, table, kind, top_k, sink, local)}
case("minmax_scores: valid", "ok", lambda: close(ops.minmax_scores(q, lo, hi, table), scores(), 1e-5))
case("route_topk: valid", "ok", route_valid)
for name, op in OPS.items():
    # table entries against the summaries' NB = 7 blocks
    case(f"{name}: table entry NB", "ValueError", lambda: op(table=torch.tensor([6, 0, 7])), "table")
    case(f"{name}: table entry -1", "ValueError", lambda: op(table=torch.tensor([6, -1, 3])), "table")
    case(f"{name}: table entry 2**50", "ValueError", lambda: op(table=torch.tensor([2 ** 50])), "table")
    # empty sizes: `% H` divided by zero before
    case(f"{name}: empty table", "ValueError", lambda: op(table=torch.zeros(0, **long)), "table")
    case(f"{name}: no kv heads", "ValueError", lambda: op(a=torch.randn(0, NB, D), b=torch.randn(0, NB, D)),
         "summaries")
    case(f"{name}: head dim 0", "ValueError",
         lambda: op(q=torch.randn(H * G, 0), a=torch.randn(H, NB, 0), b=torch.randn(H, NB, 0)), "summaries")
    case(f"{name}: no query heads", "ValueError", lambda: op(q=torch.randn(0, D)), "q must be")
    # dtypes, shapes
    case(f"{name}: q float64", "TypeError", lambda: op(q=q.double()), "q must be float32")
    case(f"{name}: kmin float32, kmax bfloat16", "TypeError", lambda: op(b=hi.bfloat16()), "summaries")
    case(f"{name}: table int32", "TypeError", lambda: op(table=table.int()), "table must be int64")
    case(f"{name}: summaries of two shapes", "ValueError", lambda: op(b=hi[:, :5].contiguous()), "summaries")
    case(f"{name}: q's head dim not the summaries'", "ValueError", lambda: op(q=torch.randn(H * G, D - 1)), "q must be")
# route_topk's scalars
route = OPS["route_topk"]
case("route_topk: kind 3", "ValueError", lambda: route(kind=3), "kind")
case("route_topk: top_k 0", "ValueError", lambda: route(top_k=0), "top_k")
case("route_topk: sink -1", "ValueError", lambda: route(sink=-1), "sink")
case("route_topk: local 0", "ValueError", lambda: route(local=0), "local")
# NaN and infinite inputs: garbage in, still the forced blocks and a selection in range out (before, NaN keys
# broke nth_element's ordering and the forced blocks went missing)
big = dict(lo=torch.full((H, 400, D), float("nan")), hi=torch.full((H, 400, D), float("nan")))
case("route_topk: NaN summaries", "ok", lambda: nan_ranks_last(big["lo"], big["hi"], 300))
mixed = torch.randn(H, 400, D)
mixed[:, ::3] = float("inf")
case("route_topk: infinite summaries", "ok", lambda: nan_ranks_last(-mixed, mixed, 300))
case("wrapper: route_topk with a list", "TypeError", lambda: cpu_decode.route_topk(q, lo, [0], table, 0, 3, 1, 1),
     "b must be")
'''


@pytest.mark.isa
def test_routing_refuses_what_it_cannot_read():
    run_cases(ROUTE)


QLINEAR = r'''
N, K = 24, 64
codes = torch.randint(-128, 128, (N, K), dtype=torch.int8)
scale = torch.rand(N, K // 32) * 0.01
none = torch.zeros(0)
W = codes.float() * scale.repeat_interleave(32, 1)             # w = fma(code, scale, 0): one rounding, as here
x = torch.randn(3, K)


def q8(x):
    """x quantised per 32 values as the kernel does: d = max|x| / 127, q = nearbyint(x * (1 / d))."""
    xb = x.view(x.shape[0], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    return torch.round(xb * (1 / d)), d


def quantize_valid():
    qx, d = ops.quantize_q8(x)
    want_q, want_d = q8(x)
    return torch.equal(qx.float(), want_q.view_as(x)) and torch.equal(d, want_d[..., 0])


def q8_valid():
    qx, d = q8(x)
    return close(ops.qlinear_q8(x, codes, scale, none, 8, 32), (qx * d).view_as(x).double() @ W.double().T, 1e-5)


def lin(op, x=x, codes=codes, scale=scale, offset=none, bits=8, group=32):
    return getattr(ops, op)(x, codes, scale, offset, bits, group)


def deq(codes=codes, scale=scale, offset=none, bits=8, group=32):
    return ops.qdequant(codes, scale, offset, bits, group)


case("qlinear: valid", "ok", lambda: close(lin("qlinear"), x.double() @ W.double().T, 1e-5))
case("qlinear_q8: valid", "ok", q8_valid)
case("quantize_q8: valid", "ok", quantize_valid)
case("qdequant: valid", "ok", lambda: torch.equal(deq(), W))
for op in ("qlinear", "qlinear_q8"):
    case(f"{op}: no output rows (codes [0, K])", "ValueError",
         lambda: lin(op, codes=codes[:0], scale=scale[:0]), "codes")
    case(f"{op}: no input columns (codes [N, 0])", "ValueError",
         lambda: lin(op, x=x[:, :0], codes=codes[:, :0], scale=scale[:, :0]), "codes")
    case(f"{op}: bits 7", "ValueError", lambda: lin(op, bits=7), "bits")
    case(f"{op}: group 64", "ValueError", lambda: lin(op, group=64), "group")
    case(f"{op}: scale of one group per row", "ValueError", lambda: lin(op, scale=scale[:, :1].contiguous()), "scale")
    case(f"{op}: scale int32", "TypeError", lambda: lin(op, scale=scale.int()), "scale")
    case(f"{op}: 8-bit codes as uint8", "TypeError", lambda: lin(op, codes=codes.view(torch.uint8)), "codes")
    case(f"{op}: x of another K", "ValueError", lambda: lin(op, x=torch.randn(3, K + 32)), "x must be")
    case(f"{op}: x float64", "TypeError", lambda: lin(op, x=x.double()), "x must be float32")
case("qlinear_q8: 8-bit codes in groups of 16", "ValueError",
     lambda: lin("qlinear_q8", scale=torch.rand(N, K // 16), group=16), "groups of 32")
case("qlinear_q8: NaN x", "ValueError", lambda: lin("qlinear_q8", x=torch.full((1, K), float("nan"))), "finite")
case("quantize_q8: K 0", "ValueError", lambda: ops.quantize_q8(torch.randn(2, 0)), "K a positive multiple")
case("quantize_q8: K 33", "ValueError", lambda: ops.quantize_q8(torch.randn(2, 33)), "K a positive multiple")
case("quantize_q8: NaN x", "ValueError", lambda: ops.quantize_q8(torch.full((1, 32), float("nan"))), "finite")
case("quantize_q8: int32 x", "TypeError", lambda: ops.quantize_q8(torch.zeros(1, 32, dtype=torch.int32)), "x must be")
case("qdequant: no output rows", "ValueError", lambda: deq(codes=codes[:0], scale=scale[:0]), "codes")
case("qdequant: bits 3", "ValueError", lambda: deq(bits=3), "bits")
case("qdequant: offset of another shape", "ValueError", lambda: deq(offset=torch.zeros(N, 5)), "offset")
case("wrapper: qlinear with a list", "TypeError", lambda: cpu_decode.qlinear([1.0], codes, scale, none, 8, 32),
     "x must be")
'''


@pytest.mark.isa
def test_the_quantised_linears_refuse_what_they_cannot_read():
    run_cases(QLINEAR)


PREFILL = r'''
available = ops.bf16_prefill_available()
T, N, H, G, D = 8, 20, 2, 2, 64
q, k, v = (torch.randn(*s).bfloat16() for s in ((T, H * G, D), (N, H, D), (N, H, D)))
q0, k0 = 12, 0                                     # the queries are the last T of the N keys


def pf(q=q, k=k, v=v, q0=q0, k0=k0, window=0, scale=D ** -0.5):
    return ops.prefill_attn_bf16(q, k, v, q0, k0, window, scale)


def reference():
    """float64 causal attention: query t (position q0 + t) sees keys j <= q0 + t - k0."""
    out = torch.empty(T, H * G, D, dtype=torch.float64)
    for t in range(T):
        n = q0 + t - k0 + 1
        for h in range(H * G):
            s = q[t, h].double() @ k[:n, h // G].double().T * D ** -0.5
            out[t, h] = s.softmax(-1) @ v[:n, h // G].double()
    return out


case("bf16_prefill_available: a bool", "ok", lambda: isinstance(available, bool))
case("valid", "ok" if available else "RuntimeError", lambda: close(pf(), reference(), 2e-2))
case("no queries (T = 0)", "ValueError", lambda: pf(q=q[:0], q0=N), "q must be non-empty")
case("no query heads", "ValueError", lambda: pf(q=q[:, :0]), "q must be non-empty")
case("head dim 0", "ValueError", lambda: pf(q=q[..., :0], k=k[..., :0], v=v[..., :0]), "q must be non-empty")
case("no kv heads", "ValueError", lambda: pf(k=k[:, :0], v=v[:, :0]), "heads")
case("q0 past the keys", "ValueError", lambda: pf(q0=13), "positions")
case("q0 2**63 - 4: q0 + T overflows", "ValueError", lambda: pf(q0=2 ** 63 - 4), "positions")
case("k0 -1", "ValueError", lambda: pf(k0=-1), "positions")
case("k0 2**63 - 8: k0 + N overflows", "ValueError", lambda: pf(q0=2 ** 63 - 8, k0=2 ** 63 - 8), "positions")
case("window -1", "ValueError", lambda: pf(window=-1), "window")
case("scale NaN", "ValueError", lambda: pf(scale=float("nan")), "scale")
case("scale 0", "ValueError", lambda: pf(scale=0.0), "scale")
case("q float32", "TypeError", lambda: pf(q=q.float()), "bfloat16")
case("k and v of two shapes", "ValueError", lambda: pf(v=v[:10]), "one shape")
'''


@pytest.mark.isa
def test_prefill_attention_refuses_what_it_cannot_read():
    run_cases(PREFILL)


# The float32 prefill kernel (prefill_attn_f32.cpp): built on every CPU, float32 or bf16 input, head dims of 16.
PREFILL_F32 = PREFILL.split("\ncase(")[0].replace("ops.prefill_attn_bf16", "ops.prefill_attn_f32") + r'''
case("f32_prefill_vectorized: a bool", "ok", lambda: isinstance(ops.f32_prefill_vectorized(), bool))
case("valid, bf16", "ok", lambda: close(pf(), reference(), 1e-5))
case("valid, float32 q over bf16 k, v", "ok", lambda: close(pf(q=q.float()), reference(), 1e-5))
case("valid, head dim 48", "ok", lambda: pf(q=q[..., :48], k=k[..., :48], v=v[..., :48]).shape == (T, H * G, 48))
case("no queries (T = 0)", "ValueError", lambda: pf(q=q[:0], q0=N), "q must be non-empty")
case("no query heads", "ValueError", lambda: pf(q=q[:, :0]), "q must be non-empty")
case("head dim 0", "ValueError", lambda: pf(q=q[..., :0], k=k[..., :0], v=v[..., :0]), "q must be non-empty")
case("head dim 40", "ValueError", lambda: pf(q=q[..., :40], k=k[..., :40], v=v[..., :40]), "multiple of 16")
case("no kv heads", "ValueError", lambda: pf(k=k[:, :0], v=v[:, :0]), "heads")
case("3 query heads over 2", "ValueError", lambda: pf(q=q[:, :3]), "heads")
case("q 2-d", "ValueError", lambda: pf(q=q[0]), "3-d")
case("q0 past the keys", "ValueError", lambda: pf(q0=13), "positions")
case("q0 2**63 - 4: q0 + T overflows", "ValueError", lambda: pf(q0=2 ** 63 - 4), "positions")
case("k0 -1", "ValueError", lambda: pf(k0=-1), "positions")
case("k0 after q0", "ValueError", lambda: pf(k0=13), "positions")
case("k0 2**63 - 8: k0 + N overflows", "ValueError", lambda: pf(q0=2 ** 63 - 8, k0=2 ** 63 - 8), "positions")
case("window -1", "ValueError", lambda: pf(window=-1), "window")
case("scale NaN", "ValueError", lambda: pf(scale=float("nan")), "scale")
case("scale inf", "ValueError", lambda: pf(scale=float("inf")), "scale")
case("scale -1", "ValueError", lambda: pf(scale=-1.0), "scale")
case("q float64", "TypeError", lambda: pf(q=q.double()), "float32 or bfloat16")
case("k float32, v bf16", "TypeError", lambda: pf(k=k.float()), "both float32 or both bfloat16")
case("k and v float16", "TypeError", lambda: pf(k=k.half(), v=v.half()), "float32 or bfloat16")
case("k and v of two shapes", "ValueError", lambda: pf(v=v[:10]), "one shape")
case("wrapper: q a list", "TypeError", lambda: cpu_decode.prefill_attn_f32([1.0], k, v, q0, k0, 0, 0.125), "q must be")
case("wrapper: window a float", "TypeError", lambda: cpu_decode.prefill_attn_f32(q, k, v, q0, k0, 0.5, 0.125),
     "window")
case("wrapper: q0 past the keys", "ValueError", lambda: cpu_decode.prefill_attn_f32(q, k, v, 13, 0, 0, 0.125), "q0")
'''


@pytest.mark.isa
def test_the_float32_prefill_kernel_refuses_what_it_cannot_read():
    run_cases(PREFILL_F32)


DECODE_LAYER = r'''
Hq, H, D, dim, inter, bs, NB = 4, 2, 64, 64, 96, 16, 8


def lin(N, K, group=32):
    """8-bit codes, float32 scales, no offset: w = code * scale."""
    return [torch.randint(-128, 128, (N, K), dtype=torch.int8), torch.rand(N, K // group) / (128 * K ** 0.5),
            torch.zeros(0)]


def W(part):
    return part[0].double() * part[1].double().repeat_interleave(32, 1)


norms = [torch.rand(dim) + 0.5, torch.rand(dim) + 0.5] + [torch.zeros(0)] * 4      # a prenorm layer: two norms
L = [lin((Hq + 2 * H) * D, dim), lin(dim, Hq * D), lin(2 * inter, dim), lin(dim, inter)]   # qkv, o, gate_up, down
w = norms + [t for part in L for t in part]
meta = [Hq, H, D, 1, 1, 0, 0] + [8, 32, 0] * 4
fmeta = [1e-6, 0.0, 0.0]
cs, sn = torch.rand(D), torch.rand(D)
table = torch.tensor([5, 1, 7, 2])                 # nb = 4 of NB = 8: capacity 64 tokens
N = 3 * bs + 6
block, row = 2, (N - 1) % bs                       # the new token's slot: the last block's physical id, its row
kp, vp = torch.randn(H, NB, bs, D), torch.randn(H, NB, bs, D)
lo = torch.randn(H, NB, D)
dense = torch.arange(4).expand(H, 4).contiguous()
long = dict(dtype=torch.long)


def call(**kw):
    """decode_layer on fresh copies of the pools and summaries; a refused call must leave them as they were."""
    a = dict(x=torch.randn(1, dim, generator=torch.Generator().manual_seed(1)), w=w, meta=meta, fmeta=fmeta, cos=cs,
             sin=sn, k=kp.clone(), v=vp.clone(), sums=[lo.clone(), lo + 1], kinds=[0, 1], table=table, blocks=dense,
             block=block, row=row, n=N, min_token=0, splits=2, route=-1, top_k=4, sink=1, local=1)
    a.update(kw)
    state = [a["k"], a["v"], *a["sums"]]
    kept = [t.clone() for t in state]
    try:
        return ops.decode_layer(*a.values()), a
    except Exception:
        if not all(torch.equal(t, s) for t, s in zip(kept, state)):
            raise AssertionError("a refused call wrote the pools or the summaries")
        raise


def meta_with(i, value):
    m = list(meta)
    m[i] = value
    return m


def w_with(i, t):
    ws = list(w)
    ws[i] = t
    return ws


def w_linear(j, part, group=32):
    ws = list(w)
    ws[6 + 3 * j:9 + 3 * j] = part
    return ws


def reference():
    """The layer in float64: RMSNorm, the qkv projection, RoPE, the new row stored, attention, o, the MLP."""
    (y, _), a = call()
    x = a["x"].double()[0]
    rms = lambda t, g: t / torch.sqrt((t * t).mean() + 1e-6) * g.double()
    rope = lambda t: t * cs.double() + torch.cat([-t[:, D // 2:], t[:, :D // 2]], -1) * sn.double()
    p = W(L[0]) @ rms(x, norms[0])
    qq, kk, vv = rope(p[:Hq * D].view(Hq, D)), rope(p[Hq * D:(Hq + H) * D].view(H, D)), p[(Hq + H) * D:].view(H, D)
    K, V = kp.double(), vp.double()
    K[:, block, row], V[:, block, row] = kk, vv
    K, V = (t[:, table].reshape(H, -1, D)[:, :N] for t in (K, V))
    G = Hq // H
    o = torch.cat([(qq[h * G:(h + 1) * G] @ K[h].T / math.sqrt(D)).softmax(-1) @ V[h] for h in range(H)])
    x = x + W(L[1]) @ o.reshape(-1)
    gu = W(L[2]) @ rms(x, norms[1])
    g, u = gu[:inter], gu[inter:]
    return close(y[0], x + W(L[3]) @ (g * torch.sigmoid(g) * u), 1e-5)


def routed_equals_dense():
    (yd, _), _ = call()
    (yr, sel), _ = call(route=0, top_k=4)          # top_k >= nb: routing picks every block, ascending
    return torch.equal(yr, yd) and torch.equal(sel, dense)


case("valid: dense, against float64", "ok", reference)
case("valid: routed over every block, as dense", "ok", routed_equals_dense)
# table entries, block ids, num_tokens, min_token, splits (attention's), and the new token's slot
case("table entry NB", "ValueError", lambda: call(table=torch.tensor([5, 1, 8, 2])), "table")
case("table entry -3", "ValueError", lambda: call(table=torch.tensor([5, -3, 7, 2])), "table")
case("routed: table entry NB", "ValueError", lambda: call(table=torch.tensor([5, 1, 8, 2]), route=0), "table")
case("block id nb", "ValueError", lambda: call(blocks=torch.tensor([[0, 4], [1, 2]])), "blocks")
case("block id -2", "ValueError", lambda: call(blocks=torch.tensor([[0, -2], [1, 2]])), "blocks")
case("num_tokens nb * bs + 1", "ValueError", lambda: call(n=4 * bs + 1), "num_tokens")
case("num_tokens 0", "ValueError", lambda: call(n=0), "num_tokens")
case("min_token num_tokens", "ValueError", lambda: call(min_token=N), "min_token")
case("splits 0", "ValueError", lambda: call(splits=0), "splits")
case("slot block NB", "ValueError", lambda: call(block=NB), "block must be")
case("slot block -1", "ValueError", lambda: call(block=-1), "block must be")
case("slot row bs", "ValueError", lambda: call(row=bs), "row")
# meta: sizes (H = 0 divided by zero before), flags
case("meta H 0", "ValueError", lambda: call(meta=meta_with(1, 0)), "Hq, H, D")
case("meta D 0", "ValueError", lambda: call(meta=meta_with(2, 0)), "Hq, H, D")
case("meta Hq 3, not a multiple of H", "ValueError", lambda: call(meta=meta_with(0, 3)), "Hq, H, D")
case("meta Hq 2**61 (Hq D overflows)", "ValueError", lambda: call(meta=meta_with(0, 2 ** 61)), "qkv projection")
case("meta sandwich 2", "ValueError", lambda: call(meta=meta_with(5, 2)), "sandwich")
case("meta act 2", "ValueError", lambda: call(meta=meta_with(6, 2)), "act")
case("meta int8 flag 2", "ValueError", lambda: call(meta=meta_with(9, 2)), "int8 flag")
case("meta bits 7", "ValueError", lambda: call(meta=meta_with(7, 7)), "linear 0 (w[6..8]): qlinear: bits")
case("meta one entry short", "ValueError", lambda: call(meta=meta[:-1]), "meta")
case("fmeta two entries", "ValueError", lambda: call(fmeta=fmeta[:2]), "fmeta")
# norm weights against dim and D (read for dim or D floats before, whatever their size)
case("input norm empty", "ValueError", lambda: call(w=w_with(0, torch.zeros(0))), "w[0]")
case("post-attention norm dim - 1", "ValueError", lambda: call(w=w_with(1, torch.rand(dim - 1))), "w[1]")
case("q norm D - 1", "ValueError", lambda: call(w=w_with(4, torch.rand(D - 1))), "w[4]")
case("k norm float64", "TypeError", lambda: call(w=w_with(5, torch.rand(D).double())), "w[5]")
case("sandwich without its pre-MLP norm", "ValueError",
     lambda: call(meta=meta_with(5, 1), w=w_with(3, torch.rand(dim))), "w[2]")
case("prenorm with a pre-MLP norm", "ValueError", lambda: call(w=w_with(2, torch.rand(dim))), "w[2] and w[3]")
case("w one tensor short", "ValueError", lambda: call(w=w[:-1]), "w must hold")
# the linears' shapes along the layer
case("o of dim + 32 outputs", "ValueError", lambda: call(w=w_linear(1, lin(dim + 32, Hq * D))), "linear 1 (o)")
case("down of another K", "ValueError", lambda: call(w=w_linear(3, lin(dim, inter + 32))), "linear 3 (down)")
case("gate_up of an odd width", "ValueError", lambda: call(w=w_linear(2, lin(2 * inter + 1, dim))), "even width")
case("qkv of another K", "ValueError", lambda: call(w=w_linear(0, lin((Hq + 2 * H) * D, dim + 32))), "linear 0")
case("int8 activations, 8-bit codes in groups of 16", "ValueError",
     lambda: call(w=w_linear(1, lin(dim, Hq * D, 16)), meta=meta[:10] + [8, 16, 1] + meta[13:]), "groups of 32")
# summaries, routing
case("summary kind 2", "ValueError", lambda: call(kinds=[0, 2]), "kinds")
case("a kind short", "ValueError", lambda: call(kinds=[0]), "one kind per summary")
case("summary of another NB", "ValueError", lambda: call(sums=[lo[:, :5].contiguous(), lo[:, :5] + 1]), "summary 0")
case("route_kind 1", "ValueError", lambda: call(route=1), "route_kind")
case("routing without summaries", "ValueError", lambda: call(route=0, sums=[], kinds=[]), "kmin and kmax")
case("routing with top_k 0", "ValueError", lambda: call(route=0, top_k=0), "top_k")
# x, cos/sin, pools
case("x float64", "TypeError", lambda: call(x=torch.randn(1, dim).double()), "x must be float32")
case("x of two rows", "ValueError", lambda: call(x=torch.randn(2, dim)), "x must be")
case("cos of D - 1", "ValueError", lambda: call(cos=cs[:-1]), "cos and sin")
case("k bfloat16, v float32", "TypeError", lambda: call(k=kp.bfloat16()), "k and v")
case("pools of head dim D + 1", "ValueError",
     lambda: call(k=torch.randn(H, NB, bs, D + 1), v=torch.randn(H, NB, bs, D + 1)), "k and v")
'''


@pytest.mark.isa
def test_decode_layer_refuses_what_it_cannot_read_before_it_writes():
    run_cases(DECODE_LAYER)


# -- the extension loader ------------------------------------------------------------------------------------

@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """load() as in a new process, its folder `tmp_path / "ext"` (SPARSEKV_EXT_DIR), and no build ever run: the
    library already loaded in this process stays loaded and the loader's state comes back afterwards."""
    from torch.utils import cpp_extension
    saved = dict(cpu_decode._state)
    cpu_decode._state.clear()
    d = tmp_path / "ext"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("SPARSEKV_EXT_DIR", str(d))
    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("the loader built in a refused folder"))
    yield d
    cpu_decode._state.clear()
    cpu_decode._state.update(saved)


def refused(match: str) -> None:
    """load() warns once naming `match`, returns None, and says why after (silently)."""
    with pytest.warns(RuntimeWarning, match=match):
        assert cpu_decode.load() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                  # the second ask is silent
        assert not cpu_decode.available() and match in cpu_decode.reason()


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777], ids=oct)
def test_the_loader_refuses_a_folder_other_users_can_write(fresh_loader, mode):
    fresh_loader.chmod(mode)                                            # group- or world-writable (sticky too)
    refused("writable by other users")


def test_the_loader_refuses_a_library_other_users_can_write(fresh_loader):
    so = fresh_loader / f"{cpu_decode._name()}.so"                      # the very name it would load
    so.write_bytes(b"not a library")
    so.chmod(0o664)
    refused("writable by other users")
    assert str(so) in cpu_decode.reason()                               # the library named, not the folder


def test_the_loader_refuses_a_folder_another_user_owns(fresh_loader, monkeypatch):
    uid = os.stat(fresh_loader).st_uid
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)                  # as another user would see it
    refused(f"owned by uid {uid}")


def test_the_loader_keeps_what_it_builds_private(monkeypatch, tmp_path):
    """Under umask 002 (group-writable by default) the folder it makes and the library it builds are still only
    this user's to write, so that the next process loads them."""
    from torch.utils import cpp_extension
    saved = dict(cpu_decode._state)
    d = tmp_path / "new" / "ext"

    def build(name, build_directory, **kw):                             # what a build leaves under umask 002
        so = Path(build_directory) / f"{name}.so"
        so.write_bytes(b"")
        so.chmod(0o775)
    old = os.umask(0o002)
    try:
        cpu_decode._state.clear()
        monkeypatch.setenv("SPARSEKV_EXT_DIR", str(d))
        monkeypatch.setattr(cpp_extension, "load", build)
        assert cpu_decode.load() is not None                            # the op this process already holds
        assert stat.S_IMODE(d.stat().st_mode) == 0o755
        assert stat.S_IMODE((d / f"{cpu_decode._name()}.so").stat().st_mode) == 0o755
    finally:
        os.umask(old)
        cpu_decode._state.clear()
        cpu_decode._state.update(saved)


def test_a_build_appears_whole_or_not_at_all(monkeypatch, tmp_path):
    """A process loading without a lock (`_load_built`) must never find a half-written library: the build runs in a
    private folder and its library is renamed into place; a lock file a killed builder left behind blocks nothing
    (flock dies with its process); a library another process finished while this one waited is loaded, not rebuilt."""
    import fcntl

    from torch.utils import cpp_extension
    saved = dict(cpu_decode._state)
    d = tmp_path / "ext"
    d.mkdir(mode=0o700)
    name = cpu_decode._name()
    (d / f"{name}.lock").write_text("")                                  # left by a builder that was killed
    seen = []

    def build(name, build_directory, **kw):
        assert Path(build_directory) != d and Path(build_directory).parent == d
        seen.append(sorted(p.name for p in d.iterdir() if p.suffix == ".so"))     # nothing at the final name yet
        (Path(build_directory) / f"{name}.so").write_bytes(b"\x7fELF" + bytes(64))
    try:
        cpu_decode._state.clear()
        monkeypatch.setenv("SPARSEKV_EXT_DIR", str(d))
        monkeypatch.setattr(cpp_extension, "load", build)
        assert cpu_decode.load() is not None                            # the op this process already holds
        assert seen == [[]]
        assert sorted(p.name for p in d.iterdir()) == [f"{name}.lock", f"{name}.so"]  # the private folder is gone
        with open(d / f"{name}.lock") as f:                              # and the lock is free
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("built what another had built"))
        assert cpu_decode._build(d, name) is False                     # found whole under the lock: not rebuilt
    finally:
        cpu_decode._state.clear()
        cpu_decode._state.update(saved)
