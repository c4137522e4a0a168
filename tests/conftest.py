import importlib.util
import os
from pathlib import Path

import pytest
import torch

import sparsekv as sk

REPO = Path(__file__).resolve().parents[1]      # the repository root the suite tests run against

# The tests' own threads: the cores idle now (OMP_NUM_THREADS wins if set), so a busy neighbour costs a core rather
# than a stall at every parallel op (sparsekv.suite.threads). Notebooks get their own choice from the runner.
from sparsekv.suite import threads as _threads  # noqa: E402

# Under pytest-xdist (`make test` runs one worker per core) the cores are split between the workers up front, and the
# notebook kernels a worker starts inherit its share: two workers that each took the idle cores when they started
# would oversubscribe every core (sparsekv.suite.threads: a stall at every parallel op).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
torch.set_num_threads(_threads.choose())

# Triton's interpreter is chosen when functions are decorated: triton.language's own helpers at
# `import triton`, the kernels at their import. Import both here, first, with the flag set; the
# kernel tests set it again while they run (it is also checked per call), and every other test
# keeps "auto" on the torch path.
if importlib.util.find_spec("triton") is not None and not torch.cuda.is_available():
    _prev = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    import triton  # noqa: F401

    import sparsekv.kernels.block_score  # noqa: F401
    import sparsekv.kernels.paged_decode  # noqa: F401
    if _prev is None:
        del os.environ["TRITON_INTERPRET"]


def exact_attention(q, K, V, blocks=None, block_size=None):
    """float64 softmax(q K^T / sqrt(d)) V and its log-sum-exp, per query head, over every token of K, V
    [N, H, D] or, with `blocks` [H, K] (-1 padded) and `block_size`, over the selected blocks' tokens."""
    import math
    Hq, D = q.shape
    H = K.shape[1]
    G = Hq // H
    out, lse = torch.empty(Hq, D, dtype=torch.float64), torch.empty(Hq, dtype=torch.float64)
    for h in range(Hq):
        kh, vh = K[:, h // G].double(), V[:, h // G].double()
        if blocks is not None:
            tok = torch.cat([torch.arange(b * block_size, min((b + 1) * block_size, len(K)))
                             for b in blocks[h // G].tolist() if b >= 0])
            kh, vh = kh[tok], vh[tok]
        s = q[h].double() @ kh.T / math.sqrt(D)
        out[h], lse[h] = s.softmax(-1) @ vh, torch.logsumexp(s, -1)
    return out, lse


def make_store(layers=2, kv_heads=2, head_dim=16, block_size=4, num_blocks=16, dtype=torch.float32, repr_keys=2,
               device="cpu"):
    return sk.BlockStore(sk.StoreConfig(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                                        block_size=block_size, num_blocks=num_blocks, dtype=dtype,
                                        repr_keys=repr_keys, device=device))


def rand_kv(store, T, gen=None):
    c = store.config
    shape = (c.num_layers, T, c.num_kv_heads, c.head_dim)
    return (torch.randn(shape, generator=gen).to(c.dtype), torch.randn(shape, generator=gen).to(c.dtype))


def snapshot(store):
    """Everything observable about a store, to prove a rejected call changed nothing."""
    return (store.pool.ref_counts.copy(), store.pool.free_queue(), list(store._fill),
            [(s.seq_id, s.num_tokens, s.block_ids) for s in store.sequences],
            store.k.clone(), store.v.clone(), store.kmin.clone(), store.kmax.clone(), store.kmean.clone())


def assert_same(a, b):
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        else:
            assert x == y


def feed_last_against_all(eng, model, seq, ids, router=None):
    """Feed `ids` on two forks of `seq`: a with logits="all", b with logits="last". Asserts what "last" promises: b's
    one row is a's last bit for bit, with the same bytes at every step, and `model`'s output head ran once for b.
    Returns (a, b) for the caller's own checks."""
    a, b = eng.fork(seq), eng.fork(seq)
    every = eng.feed(a, ids, router=router)
    calls = []
    hook = model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    try:
        last = eng.feed(b, ids, router=router, logits="last")
    finally:
        hook.remove()
    assert len(calls) == 1 and last.shape == (1, every.shape[1])
    assert torch.equal(last, every[-1:]) and torch.equal(eng.last_logits(a), eng.last_logits(b))
    assert [s.kv_bytes for s in eng.stats(a).steps] == [s.kv_bytes for s in eng.stats(b).steps]
    return a, b


# Seconds each unit of work took in a recorded `make test` (a test module, or one notebook run: its tests' call,
# setup and teardown summed), to start the longest first: `SPARSEKV_RECORD_DURATIONS=tests/durations.json make test`
# rewrites it. Stale or missing entries only change the order in which tests start, never what runs or what passes.
# SPARSEKV_TEST_DURATIONS reads another file (tests/test_conftest.py).
DURATIONS = Path(os.environ.get("SPARSEKV_TEST_DURATIONS") or REPO / "tests" / "durations.json")


def _unit(nodeid: str) -> str:
    """xdist's unit of work for a test: its module (`pytest_xdist_make_scheduler`), or the test itself in
    test_notebooks.py."""
    path = nodeid.split("::")[0]
    return nodeid if path.endswith("test_notebooks.py") else Path(path).stem


@pytest.hookimpl(optionalhook=True)     # xdist's hook: without xdist installed, pytest must not reject it
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist each test module runs whole on one worker, so a module-scoped fixture (a loaded model, a
    prefilled engine, a Ray session) is built once; the notebook runs in test_notebooks.py, most of the suite's time,
    are spread one by one.

    This is xdist's loadscope schedule with `_unit` as the scope. It replaces `--dist loadgroup` with xdist_group
    marks, which pytest 9.2 silently turned into one unit per test: xdist 3.8 writes the group into `item._nodeid`,
    which pytest 9.2's `nodeid` no longer reads. Modules were then split over the workers and their module fixtures
    built once per worker (2026-12-05: the SmolLM2 fixture of test_questions three times, two Ray clusters for
    test_sweep). tests/test_conftest.py checks the units a real run hands out.

    The units start in collection order, which `pytest_collection_modifyitems` sorts longest first. xdist 3.8's
    loadscope re-sorts them by their number of tests unless told not to (`--no-loadscope-reorder`), which started
    every notebook run, one test each, after the modules: the three longest units of a CI-like run (notebooks 13 and
    22, and 22 under the other configuration) started in its last four minutes (2026-12-07)."""
    from xdist.scheduler import LoadScopeScheduling
    config.option.loadscopereorder = False

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByUnit(config, log)


def pytest_collection_modifyitems(config, items):
    """Order the units (a module, or one notebook run) longest first by their recorded seconds (DURATIONS): xdist
    hands out units in collection order, so the long ones no longer start last on one worker while the other idles
    (longest-processing-time-first). Tests keep their order inside a module."""
    import json
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(_unit(item.nodeid), i)
    items.sort(key=lambda item: (-seconds.get(_unit(item.nodeid), 0.0), first[_unit(item.nodeid)]))


_durations: dict[str, float] = {}
_skipped: set[str] = set()              # units with a test skipped here (no Chromium, no llama.cpp, ...)


def pytest_runtest_logreport(report):
    """Sum each test's phases (under xdist this runs on the controller, which receives every worker's reports)."""
    if os.environ.get("SPARSEKV_RECORD_DURATIONS"):
        unit = _unit(report.nodeid)
        _durations[unit] = _durations.get(unit, 0.0) + report.duration
        if report.skipped:
            _skipped.add(unit)


def recorded_durations(measured: dict[str, float], skipped: set[str], before: dict[str, float]) -> dict[str, float]:
    """The file's new contents: each unit's measured seconds; a unit with a test skipped here (test_browser without
    Chromium) keeps the larger of that and the seconds recorded where all of it ran (CI), so CI still starts it early."""
    return {k: round(max(v, before.get(k, 0.0)) if k in skipped else v, 1) for k, v in sorted(measured.items())}


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("SPARSEKV_RECORD_DURATIONS")
    if path and _durations and not os.environ.get("PYTEST_XDIST_WORKER"):
        import json
        before = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        Path(path).write_text(json.dumps(recorded_durations(_durations, _skipped, before), indent=0) + "\n")


@pytest.fixture
def cpu_as(monkeypatch):
    """cpu_as(flags, cap): this process's CPU as `core.cpu_paths` sees it, /proc/cpuinfo's `flags` and oneDNN's ISA
    cap (ONEDNN_MAX_CPU_ISA; None: uncapped), for the tests of what each CPU-gated choice takes."""
    from sparsekv.core import cpu_paths

    def set_cpu(flags, cap):
        monkeypatch.setattr(cpu_paths, "cpu_flags", lambda: set(flags))
        monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
        if cap is None:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    return set_cpu


@pytest.fixture
def store():
    return make_store()


def kv_for(tokens, start, store):
    """Deterministic K/V for tokens at positions start.. (so cached content can be checked)."""
    c = store.config
    pos = torch.arange(start, start + len(tokens), dtype=torch.float32)
    val = torch.as_tensor(tokens, dtype=torch.float32) * 1000 + pos
    k = val[None, :, None, None].expand(c.num_layers, -1, c.num_kv_heads, c.head_dim).contiguous()
    return k, -k


def prefix_run(store, cache, tokens, ns=None):
    """attach + append the rest + insert; returns the live sequence and the cached token count."""
    seq = store.new_sequence()
    hit = cache.attach(seq, tokens, ns)
    store.append(seq, *kv_for(tokens[hit:], hit, store))
    cache.insert(seq, tokens, ns)
    return seq, hit


@pytest.fixture
def sc():
    """A one-layer store of 8 blocks of 4 tokens and a PrefixCache over it (test_prefix_cache, test_hostile_state)."""
    from sparsekv.storage.prefix_cache import PrefixCache
    store = make_store(layers=1, kv_heads=1, head_dim=4, block_size=4, num_blocks=8, repr_keys=0)
    return store, PrefixCache(store)


@pytest.fixture(scope="module")
def tiny_llama_hf():
    """transformers' LlamaForCausalLM with random weights: 3 layers, GQA 2, every layer global (kvpress hooks all).
    Shared by the peer tests (test_questions, test_tail_loss)."""
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(cfg).eval()
