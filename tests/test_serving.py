"""Serving many requests (issue 20): batching changes time, never answers; nothing leaks; the simulator's arithmetic."""
import contextlib
import math

import pytest
import torch

import sparsekv as sk
from sparsekv.analysis import workloads as W
from sparsekv.serving import executors as X
from sparsekv.serving import scheduler as S
from sparsekv.serving import trace
from sparsekv.serving.policies import SCHEDULING_POLICIES, SchedulingPolicy, make_policy, register_scheduling_policy

POLICIES = sorted(SCHEDULING_POLICIES)


@pytest.fixture(scope="module")
def model():
    return sk.Model(sk.ModelConfig.from_name("tiny"))


@pytest.fixture(scope="module")
def requests(model):
    tr = W.multi_agent_build(agents=4, turns=2, system=64, tools=2, tool_len=16, snapshot=64, growth=16, message=16,
                             tool_result=16, vocab=model.config.vocab_size, decode_tokens=12)
    return trace.with_arrivals(tr, rate_per_s=float("inf"))             # a burst: everything contends


@pytest.fixture(scope="module")
def alone(model, requests):
    engine = sk.Engine(model, block_size=8, num_blocks=512, progress=False)
    return [S.solo_tokens(engine, r) for r in requests]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("num_blocks,cache,routed", [(512, True, False), (40, True, False), (40, False, True)])
def test_every_request_gets_its_solo_tokens_and_nothing_leaks(model, requests, alone, policy, num_blocks, cache, routed):
    router = sk.Router("minmax", token_budget=32) if routed else None
    engine = sk.Engine(model, block_size=8, num_blocks=num_blocks, progress=False, prefix_cache=cache)
    res = S.Scheduler(X.EngineExecutor(engine, router), S.SchedulerConfig(policy=policy, max_batch=6, batch_tokens=48)).run(requests)
    if routed:      # the reference for routed decode is routed decode alone
        solo = sk.Engine(model, router=router, block_size=8, num_blocks=512, progress=False)
        want = [S.solo_tokens(solo, r) for r in requests]
    else:
        want = alone
    assert [r.tokens for r in res.records] == want
    assert [r.rid for r in res.records] == [r.rid for r in requests]
    assert engine.store.pool.num_used == 0 and sum(engine.store.pool.ref_counts) == 0     # only the cache holds blocks
    assert engine.store.sequences == []
    assert res.peak_blocks <= num_blocks
    for r in res.records:
        assert len(r.tokens) == len(r.times) == 12 and r.ttft_s >= 0 and all(b >= a for a, b in zip(r.times, r.times[1:]))


@pytest.mark.parametrize("cache", [True, False])
def test_a_small_pool_preempts_and_still_answers_exactly(model, requests, cache):
    long = [trace.ServeRequest(r.rid, r.name, r.arrival_s, r.prompt, 48) for r in requests]      # outputs outgrow the pool
    solo = sk.Engine(model, block_size=8, num_blocks=512, progress=False)
    want = [S.solo_tokens(solo, r) for r in long]
    engine = sk.Engine(model, block_size=8, num_blocks=48, progress=False, prefix_cache=cache)
    res = S.Scheduler(X.EngineExecutor(engine), S.SchedulerConfig(policy="continuous", max_batch=6)).run(long)
    assert res.preemptions > 0 and any(r.preemptions for r in res.records)
    assert [r.tokens for r in res.records] == want
    assert engine.store.pool.num_used == 0


def test_policies_shape_their_iterations(model, requests):
    runs = {}
    for policy in ("fcfs_static", "chunked"):
        engine = sk.Engine(model, block_size=8, num_blocks=512, progress=False, prefix_cache=True)
        runs[policy] = S.Scheduler(X.EngineExecutor(engine), S.SchedulerConfig(policy=policy, max_batch=3, batch_tokens=40)).run(requests)
    static = runs["fcfs_static"].iterations
    for prev, it in zip(static, static[1:]):      # a static batch grows only from empty
        assert it.running <= prev.running or prev.running == 0 or it.prefill_tokens == 0 and it.running == prev.running
    assert all(it.decode_batch + it.prefill_tokens <= 40 for it in runs["chunked"].iterations)
    assert max(it.prefill_tokens for it in static) > 40                # whole prompts at once


def test_prefix_aware_admits_the_longest_cached_prefix_first():
    class W_:
        def __init__(self, n, hit):
            self.tokens, self.hit = [0] * n, hit
    ws = [W_(10, 0), W_(10, 32), W_(10, 16), W_(10, 32)]
    order = make_policy("prefix_aware").order(ws, lambda w: w.hit)
    assert [w.hit for w in order] == [32, 32, 16, 0] and order[0] is ws[1]            # stable among ties
    b = make_policy("buckets").order([W_(100, 0), W_(1000, 0), W_(120, 0)], lambda w: 0)
    assert [len(w.tokens) for w in b] == [100, 120, 1000]


def test_the_simulator_adds_up_its_costs_exactly():
    """One request alone on a known cost model: TTFT = its prefill + one decode step, TPOT = one decode step."""
    cm = X.CostModel(p=(0.01, 0.001, 0.0), d=(0.005, 0.002, 0.0001))
    req = trace.ServeRequest(0, "r", 1.5, torch.arange(40), 4)
    res = S.Scheduler(X.SimExecutor(cm, 8, 64), S.SchedulerConfig(policy="continuous", prefill_chunk=16)).run([req])
    rec = res.records[0]
    prefill = sum(cm.prefill_s(n, c) for n, c in ((16, 0), (16, 16), (8, 32)))
    assert rec.ttft_s == pytest.approx(prefill + cm.decode_s(1, 41))
    assert rec.tpot_s == pytest.approx(sum(cm.decode_s(1, 41 + i) for i in (1, 2, 3)) / 3)
    assert res.iterations[0].start_s == 1.5                           # idle until the arrival


def test_cost_model_fit_recovers_known_coefficients():
    truth = X.CostModel(p=(0.002, 1e-5, 2e-8), d=(0.003, 4e-4, 1e-6))
    ops = [X.Op("prefill", n, c, c + n, truth.prefill_s(n, c)) for n in (16, 64, 256) for c in (0, 512, 2048)]
    ops += [X.Op("decode", b, 0, r, truth.decode_s(b, r)) for b in (1, 4, 8) for r in (100, 5000, 20000)]
    fit = X.CostModel.fit(ops)
    for a, b in zip(fit.p + fit.d, truth.p + truth.d):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12)
    with pytest.raises(ValueError, match="at least 3"):
        X.CostModel.fit(ops[:2])


def test_bad_configuration_and_a_request_that_cannot_fit(model):
    with pytest.raises(ValueError, match="policy must be one of"):
        S.SchedulerConfig(policy="lottery")
    with pytest.raises(ValueError, match="admit"):
        S.SchedulerConfig(admit="some")
    with pytest.raises(ValueError, match="rate_per_s"):
        trace.with_arrivals(W.Trace("t", [], ""), 0)
    engine = sk.Engine(model, block_size=8, num_blocks=4, progress=False)
    big = trace.ServeRequest(0, "big", 0.0, torch.arange(100), 2)
    with pytest.raises(RuntimeError, match="raise num_blocks"):
        S.Scheduler(X.EngineExecutor(engine)).run([big])


def test_a_new_policy_is_one_registered_class():
    @register_scheduling_policy
    class Reverse(SchedulingPolicy):
        name = "test_lifo"
        chunked = True

        def order(self, waiting, cached):
            return list(reversed(waiting))
    try:
        assert isinstance(make_policy("test_lifo"), Reverse)
    finally:
        del SCHEDULING_POLICIES["test_lifo"]


def test_decode_batch_rejects_bad_input_and_a_full_pool_changes_nothing(model):
    engine = sk.Engine(model, block_size=8, num_blocks=6, progress=False)
    a, b = engine.new_sequence(), engine.new_sequence()
    engine.prefill(a, torch.arange(24))
    engine.prefill(b, torch.arange(24))
    with pytest.raises(ValueError, match="repeat"):
        engine.decode_batch([a, a])
    c = engine.new_sequence()
    with pytest.raises(ValueError, match="prefill it first"):
        engine.decode_batch([a, c])
    before = (a.num_tokens, b.num_tokens, engine.tokens(a), engine.store.num_free_blocks)
    with pytest.raises(sk.StoreFullError):
        engine.decode_batch([a, b])                                   # each needs a 4th block; none is left for both
    assert before == (a.num_tokens, b.num_tokens, engine.tokens(a), engine.store.num_free_blocks)
    assert math.isfinite(float(engine.last_logits(a)[0]))


def test_separated_serving_adds_prefill_transfer_and_decode_exactly():
    from sparsekv.serving import disagg
    cm = X.CostModel(p=(0.01, 0.001, 0.0), d=(0.005, 0.002, 0.0))
    reqs = [trace.ServeRequest(0, "a", 0.0, torch.arange(40), 3), trace.ServeRequest(1, "b", 0.0, torch.arange(100, 140), 3)]
    res = disagg.separated(cm, reqs, 8, 64, 4, kv_bytes_per_token=1000, link_bytes_per_s=1e6, prefill_chunk=64)
    a, b = res.records
    pre = cm.prefill_s(40, 0)
    assert a.ttft_s == pytest.approx(pre + 40 * 1000 / 1e6 + cm.decode_s(1, 0))       # its own decode step alone
    assert b.ttft_s > a.ttft_s                              # b's prompt waited for a's on the prefill device
    co = disagg.colocated(cm, reqs, 8, 64, 4, 64)
    assert [r.rid for r in co.records] == [0, 1] and co.records[0].ttft_s == pytest.approx(pre + cm.decode_s(1, 41))


# -- GPU-scale projections (serving.gpu) --------------------------------------------------------------

def test_a_routed_gpu_projection_charges_the_summaries_a_router_reads_from_the_store():
    """The roofline's routed step reads the routed K/V and every block's summaries, and a tiered store holds those
    summaries in HBM. The summary bytes are checked against what `Router.select` reports reading from a real
    bf16 store, so a projection that drops them (or counts them another way) fails here."""
    from sparsekv.serving import gpu
    cfg = sk.ModelConfig.from_name("tiny")                       # 2 attention layers, 2 kv heads, head dim 16
    C, budget, bs = 16 * 37 + 5, 64, 16
    layout = gpu.CacheLayout(block_size=bs)
    store = sk.BlockStore(sk.StoreConfig(num_layers=len(cfg.attn_layers), num_kv_heads=cfg.n_kv_heads,
                                         head_dim=cfg.head_dim, block_size=bs, num_blocks=64, dtype="bf16",
                                         summaries=("kmin", "kmax")))
    seq = store.new_sequence()
    kv = torch.randn(len(cfg.attn_layers), C, cfg.n_kv_heads, cfg.head_dim).to(torch.bfloat16)
    store.append(seq, kv, kv)
    sel = sk.Router("minmax", token_budget=budget).select(torch.randn(cfg.n_heads, cfg.head_dim), store, seq, 0)
    measured = sel.traffic.summary_bytes * len(cfg.attn_layers)          # every layer routes
    assert gpu.summary_bytes(cfg, C, layout) == measured == store.summary_bytes() // 64 * seq.num_blocks
    routed, dense = gpu.sequence_cache(cfg, C, budget, layout), gpu.sequence_cache(cfg, C, None, layout)
    kv_rows = 2 * len(cfg.attn_layers) * cfg.n_kv_heads * cfg.head_dim * 2 * ((budget // bs - 1) * bs + C % bs)
    assert routed.read == kv_rows + measured                      # routed rows plus every block's summaries
    assert dense.read == 2 * len(cfg.attn_layers) * cfg.n_kv_heads * cfg.head_dim * 2 * C
    # the step time charges them: at least weights + batch * (rows + summaries) over the bandwidth
    step = gpu.decode_step_s(cfg, gpu.H200, 8, C, budget, layout, step_overhead_s=0.0)
    assert step * gpu.H200.bandwidth * 0.8 == pytest.approx(gpu.param_count(cfg) * 2 + 8 * (kv_rows + measured))
    # a tiered store keeps every block's summaries hot: what fits is bounded by them, not by the budget alone
    big = sk.ModelConfig.from_name("llama-1b")
    free = gpu.H200.hbm_bytes - gpu.param_count(big) * 2
    n = gpu.max_batch(big, gpu.H200, 1 << 20, 2048, tiered=True, layout=layout)
    assert n * gpu.summary_bytes(big, 1 << 20, layout) <= free < (n + 1) * gpu.summary_bytes(big, 1 << 20, layout) * 1.2
    with pytest.raises(ValueError, match="tiered needs a routing budget"):
        gpu.max_batch(big, gpu.H200, 1 << 20, tiered=True)


def test_both_executors_satisfy_the_executor_protocol(model):
    """The scheduler drives one interface: the real engine and the simulator both implement all of it."""
    from sparsekv.serving.executors import CostModel, Executor
    engine = sk.Engine(model, block_size=8, num_blocks=64, progress=False)
    assert isinstance(X.EngineExecutor(engine), Executor)
    assert isinstance(X.SimExecutor(CostModel(), 8, 64), Executor)
    assert not isinstance(object(), Executor)


def test_the_scheduler_refuses_what_is_not_an_executor_and_runs_inside_its_session(model):
    """A scheduler is built over an Executor only (a TypeError names the argument), and `run` enters the executor's
    `session` once, around the whole run, leaving it however the run ends. The simulator's session holds nothing."""
    from sparsekv.serving.executors import CostModel

    names = ("start", "prefill", "decode", "publish", "finish", "free_blocks", "used_blocks", "blocks_needed",
             "cached", "hit_rate")
    partial = type("Partial", (), {"block_size": 8, **{n: (lambda self, *a: None) for n in names}})   # no session
    with pytest.raises(TypeError, match="executor must be an Executor"):
        S.Scheduler(partial())
    with X.SimExecutor(CostModel(), 8, 64).session() as held:
        assert held is None

    events = []

    class Watched(X.SimExecutor):
        @contextlib.contextmanager
        def session(self):
            events.append("enter")
            try:
                yield
            finally:
                events.append("exit")

        def prefill(self, seq, tokens):
            events.append("prefill")
            return super().prefill(seq, tokens)
    reqs = [trace.ServeRequest(i, f"r{i}", 0.0, torch.arange(20) + 100 * i, 2) for i in range(3)]
    S.Scheduler(Watched(CostModel(p=(1e-3, 0, 0), d=(1e-3, 0, 0)), 8, 64)).run(reqs)
    assert events[0] == "enter" and events[-1] == "exit" and events.count("enter") == 1
    assert "prefill" in events
    events.clear()
    with pytest.raises(RuntimeError, match="raise num_blocks"):
        S.Scheduler(Watched(CostModel(), 8, 2)).run(reqs)          # the pool cannot hold a prompt
    assert events == ["enter", "exit"]
