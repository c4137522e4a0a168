"""The task family (analysis.tasks): every generator's instances hold what they claim, on both real tokenizers; the
check catches an instance that does not; asking on a fork equals scoring the whole prompt; a full budget is dense."""
import dataclasses

import pytest
import torch

import sparsekv as sk
from sparsekv.analysis import observe, tasks
from sparsekv.model import fetch

ROOT = fetch.__file__.rsplit("/sparsekv/", 1)[0]
MODELS = {"smollm2": fetch.model_path(fetch.SMOLLM2, ROOT), "gemma3-270m": fetch.model_path(fetch.GEMMA3_270M, ROOT)}
N = {"passkey": 12, "fact-prose": 12, "fact-code": 12, "multi-key": 12, "multi-value": 12, "variable": 12,
     "common-words": 3}


@pytest.fixture(scope="module", params=list(MODELS))
def tok(request):
    return sk.load_tokenizer(MODELS[request.param])


@pytest.mark.parametrize("task", tasks.TASKS)
def test_every_instance_holds_what_it_claims(tok, task):
    for seed in (0, 1):
        doc = tasks.make(task, tok, 2048, N[task], seed=seed)
        tasks.check(doc, tok)
        assert len(doc.questions) >= (1 if task in ("multi-value", "variable", "common-words") else N[task])
        assert doc == tasks.make(task, tok, 2048, N[task], seed=seed)              # seeded
    assert doc != tasks.make(task, tok, 2048, N[task], seed=2)


def test_multi_key_plants_a_similar_distractor_for_every_key(tok):
    doc = tasks.make("multi-key", tok, 2048, 12, seed=4)
    keys = [q.text.removeprefix("What is the pass key of the ").removesuffix("?") for q in doc.questions]
    for k in keys:
        adj, noun = k.split(" ", 1)
        partner = [o for o in keys if o != k and o.split(" ", 1)[0] == adj and o.split(" ", 1)[1][:3] == noun[:3]]
        assert partner, k


def test_two_turn_dialogues_are_counterbalanced_and_follow_a_true_first_answer(tok):
    """Each dialogue asks a question of the document, takes its true answer, then asks a second one in the model's own
    turn format; the questions are distinct, exactly half the dialogues ask the later fact first, and the instance
    is seeded. A bad count is refused."""
    doc = tasks.make("passkey", tok, 1024, 8, seed=5)
    dialogues = tasks.two_turn(tok, doc, 4, seed=1)
    assert dialogues == tasks.two_turn(tok, doc, 4, seed=1) and dialogues != tasks.two_turn(tok, doc, 4, seed=2)
    by_text = {q.text: q for q in doc.questions}
    asked = [d.first.text for d in dialogues] + [d.text for d in dialogues]
    assert len(set(asked)) == 8 and set(asked) <= set(by_text)
    depth = lambda q: doc.facts[q.facts[0]].depth
    assert [depth(d.first) > depth(d) for d in dialogues] == [False, True, False, True]
    for d in dialogues:
        alone = by_text[d.text]
        assert (d.answer, d.answer_text, d.facts, d.prefix) == (alone.answer, alone.answer_text, alone.facts, alone.prefix)
        head = d.first.ids + d.first.answer
        assert d.ids[:len(head)] == head and d.first.answer == by_text[d.first.text].answer
        turn = tok.decode(d.ids[len(head):])
        assert d.text in turn and turn.endswith(d.prefix)
        assert ("<|im_start|>user" in turn) if tok.chat_template else turn.startswith(".\n\nQuestion: ")
    for bad in (3, 0, 6, True, 2.0):
        with pytest.raises(ValueError, match="n must be an even int"):
            tasks.two_turn(tok, doc, bad)
    with pytest.raises(ValueError, match="every question must name one fact"):
        tasks.two_turn(tok, dataclasses.replace(doc, questions=dialogues), 2)


def test_variable_questions_need_their_whole_chain(tok):
    doc = tasks.make("variable", tok, 2048, 12, seed=5)
    for q in doc.questions:
        chain = [doc.facts[i].text for i in q.facts]
        assert chain[0].endswith(q.answer_text.strip()) and len(chain) == 4
        for prev, nxt in zip(chain, chain[1:]):
            assert nxt.endswith("VAR " + prev.split()[1])                          # each hop names the one before
        assert q.text.endswith(chain[-1].split()[1] + "?")


@pytest.mark.parametrize("breakage", ["span", "haystack", "answer"])
def test_the_check_catches_a_broken_instance(tok, breakage):
    doc = tasks.make("passkey", tok, 2048, 6, seed=0)
    if breakage == "span":
        f = doc.facts[2]
        bad = dataclasses.replace(doc, facts=doc.facts[:2] + (dataclasses.replace(f, span=(f.span[0] + 40, f.span[1] + 40)),)
                                  + doc.facts[3:])
    elif breakage == "haystack":                                     # the answer's value also sits in the filler
        value = doc.questions[0].answer_text
        ids = list(doc.ids)
        extra = tok(value, add_special_tokens=False)["input_ids"]
        ids[10:10 + len(extra)] = extra
        bad = dataclasses.replace(doc, ids=ids)
    else:
        q = doc.questions
        bad = dataclasses.replace(doc, questions=(q[0], dataclasses.replace(q[1], answer_text=q[0].answer_text)) + q[2:])
    with pytest.raises(AssertionError):
        tasks.check(bad, tok)


def test_bad_arguments_are_refused(tok):
    with pytest.raises(ValueError, match="task must be one of"):
        tasks.make("needle", tok, 1024)
    with pytest.raises(ValueError, match="even"):
        tasks.make("multi-key", tok, 1024, 5)
    with pytest.raises(ValueError, match="multiple of 3"):
        tasks.make("multi-value", tok, 1024, 4)
    with pytest.raises(ValueError, match="no room"):
        tasks.make("passkey", tok, 200, 12)


@pytest.fixture(scope="module")
def smol():
    model = sk.load_model(MODELS["smollm2"])
    return model, sk.load_tokenizer(MODELS["smollm2"])


def test_asking_on_a_fork_equals_scoring_the_whole_prompt_and_a_full_budget_is_dense(smol):
    model, tok = smol
    doc = tasks.make("passkey", tok, 400, 2, seed=1)
    engine = sk.Engine(model, block_size=16, num_blocks=256, progress=False)
    seq = engine.new_sequence()
    engine.prefill(seq, doc.ids)
    full = sk.Router("minmax", top_k=seq.num_blocks + 8)
    for q in doc.questions:
        asked = tasks.ask(engine, seq, q)
        whole = observe.prefill_probe(engine, doc.ids + q.ids)
        direct = observe.score_answer(engine, whole, q.ids[-1], q.answer, None)
        engine.finish(whole)
        assert (asked.correct, asked.steps) == (direct.correct, direct.steps)
        kept = tasks.ask(engine, seq, q, keep_logprobs=True)           # every step's log-probabilities, same verdict
        assert (kept.correct, kept.steps) == (asked.correct, asked.steps) and asked.logprobs is None
        assert kept.logprobs.shape == (len(q.answer), model.config.vocab_size)
        assert torch.allclose(kept.logprobs.logsumexp(-1), torch.zeros(len(q.answer)), atol=1e-4)
        assert kept.correct == (kept.logprobs.argmax(-1).tolist() == q.answer)
        wrong = dataclasses.replace(q, answer=[q.answer[0] + 1] + q.answer[1:])
        w, kw = tasks.ask(engine, seq, wrong), tasks.ask(engine, seq, wrong, keep_logprobs=True)
        assert (w.correct, w.steps) == (kw.correct, kw.steps) == (False, 1)   # it stops at step 1; kept runs on
        assert len(w.step_seconds) == 1 and kw.logprobs.shape[0] == len(q.answer) == len(kw.step_seconds)
        for rule in ("dense", "routed"):
            routed = tasks.ask(engine, seq, q, full, rule=rule)
            assert (routed.correct, routed.steps) == (asked.correct, asked.steps)
    with pytest.raises(ValueError, match="rule"):
        tasks.ask(engine, seq, doc.questions[0], rule="quest")
