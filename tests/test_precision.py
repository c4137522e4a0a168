"""studies.precision: routing over bf16 summaries compared with float32 ones on the same keys."""
import torch

import sparsekv as sk
from sparsekv.studies import precision


def _pair(k, v, bs=16, dtypes=("fp32", "bf16")):
    n, H, D = k.shape
    cfg = sk.StoreConfig(num_layers=1, num_kv_heads=H, head_dim=D, block_size=bs, num_blocks=-(-n // bs) + 1)
    out = []
    for dt in dtypes:
        s = precision.twin(cfg, dt)
        sq = s.new_sequence()
        s.append(sq, k[None], v[None])
        out += [s, sq]
    return out


def test_identical_summaries_overlap_fully_and_cover_the_same_mass():
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(300, 2, 64, generator=g), torch.randn(300, 2, 64, generator=g)
    q = torch.randn(6, 64, generator=g)
    rows = precision.compare(q, *_pair(k, v, dtypes=("fp32", "fp32")), 0, {"minmax": sk.Router("minmax", top_k=5)})
    assert rows[0]["overlap"] == 1.0 and rows[0]["mass32"] == rows[0]["mass16"] and rows[0]["bytes_ratio"] == 1.0


def test_near_ties_move_under_bf16_and_the_rows_say_what_it_costs():
    """Blocks built to tie within bf16 rounding: the overlap drops below 1, bytes halve, masses stay in [0, 1]."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(1, 64, generator=g)
    steps = [2.0 ** -9 * (j % 7) if j % 3 else 0.05 * (j % 5) for j in range(48)]
    k = torch.cat([base * (1 + st) + 2.0 ** -12 * torch.randn(16, 1, 64, generator=g) for st in steps])
    v = torch.randn(k.shape, generator=g)
    routers = {"minmax": sk.Router("minmax", top_k=6), "mean": sk.Router("mean", top_k=6)}
    rows = precision.compare(base.expand(2, 64).clone(), *_pair(k, v), 0, routers)
    by = {r["router"]: r for r in rows}
    assert by["minmax"]["bytes_ratio"] == 0.5
    assert min(r["overlap"] for r in rows) < 1.0
    assert all(0.0 <= r["mass16"] <= 1.0 + 1e-6 and 0.0 <= r["overlap"] <= 1.0 for r in rows)


def test_probe_rows_report_the_needle_for_both_precisions():
    rows = precision.probe_rows([512], [16.0], [0.5], 16, {"minmax": sk.Router("minmax", token_budget=64)},
                                num_kv_heads=2, gqa=2, head_dim=64)
    assert len(rows) == 1
    r = rows[0]
    assert r["needle32"] and r["needle16"]         # a strong needle is found with either summary precision
    assert r["overlap"] > 0.5 and r["length"] == 512


def test_observe_real_runs_on_a_model_s_own_queries():
    model = sk.Model(sk.ModelConfig.from_name("tiny"))
    eng = sk.Engine(model, block_size=8, num_blocks=64, progress=False)
    seq = eng.new_sequence()
    eng.prefill(seq, list(range(1, 60)))
    rows = precision.observe_real(eng, seq, [3, 4], {"minmax": sk.Router("minmax", top_k=3)})
    assert len(rows) == 2 * model.config.n_layers and {r["step"] for r in rows} == {0, 1}
    assert eng.store.pool.num_free == eng.store.config.num_blocks - seq.num_blocks   # the fork was released
