"""Two facts, two questions: the probe behind "the next question" (an agent's second turn).

A context plants two facts at two depths; the user asks about the first, the assistant answers, and the
user then asks about the second. A cache that decided what to keep before it saw any question (kvpress's
query-agnostic setting) has to have kept both facts; a lossless cache with routing keeps everything and
lets each query choose.

Token layout (every piece tokenised on its own, so BPE never merges across a boundary and every method
gets the same ids):

    context  = chat head + intro + haystack with fact 1 and fact 2                 (what a press compresses)
    turn1    = question 1 + end of user turn + assistant head + answer prefix 1
    answer1  = answer 1's ids
    turn2    = rest of the assistant turn + user turn 2 with question 2 + answer prefix 2
    answer2  = answer 2's ids

`after` = turn1 + answer1 + turn2 + answer2 is fed after the context, teacher-forced: answer k is correct
when the argmax at every position before an answer-k token is that token (`correct`). The logits of
`after[:-1]` are all a method has to produce, so any cache (HF, kvpress, quantised, sparsekv routed)
is scored by the same function.

The loss task reuses the layout with no questions: `context` = the document's head, `after` = its tail.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from . import corpus
from .prompts import PASSKEY_FILLER, WORDS

_HAY, _A1, _A2 = "\x00SK-HAY\x00", "\x00SK-A1\x00", "\x00SK-A2\x00"


@dataclass(frozen=True)
class TwoFacts:
    """One two-question probe (or, with no answers, a document whose tail is scored by loss).

    context: prompt ids up to the end of the haystack; after: every id fed after it.
    answers: per question, the positions in `after` of its answer tokens ([] for the loss task).
    needles: [start, end) of each fact in `context`.
    """

    task: str
    context: list[int]
    after: list[int]
    answers: tuple[tuple[int, ...], ...]
    needles: tuple[tuple[int, int], ...]
    depths: tuple[float, ...]

    @property
    def length(self) -> int:
        return len(self.context) + len(self.after)


def _enc(tok, s: str) -> list[int]:
    return tok(s, add_special_tokens=False)["input_ids"]


def two_facts(tok, hay: list[int], length: int, task: str, intro: str, facts: tuple[str, str],
              questions: tuple[str, str], prefixes: tuple[str, str], answers: tuple[str, str],
              depths: tuple[float, float]) -> TwoFacts:
    """A `length`-token dialogue (context + both turns) with `facts` planted at `depths` of the haystack."""
    if not all(0.0 <= d <= 1.0 for d in depths) or depths[0] >= depths[1]:
        raise ValueError(f"depths must be increasing in [0, 1], got {depths}")
    messages = [{"role": "user", "content": intro + _HAY + "\n\n" + questions[0]},
                {"role": "assistant", "content": prefixes[0] + _A1 + "."},
                {"role": "user", "content": questions[1]}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    head, rest = text.split(_HAY)
    t1, rest = rest.split(_A1)
    t2 = rest + prefixes[1]
    pre, turn1, turn2 = _enc(tok, head), _enc(tok, t1), _enc(tok, t2)
    a1, a2 = _enc(tok, answers[0]), _enc(tok, answers[1])
    nds = [_enc(tok, "\n" + f + "\n") for f in facts]
    n_fill = length - len(pre) - sum(map(len, nds)) - len(turn1) - len(a1) - len(turn2) - len(a2)
    if n_fill < 2:
        raise ValueError(f"length {length} leaves no room for a haystack around two facts")
    if len(hay) < n_fill:
        raise ValueError(f"length: the haystack has {len(hay)} tokens, {n_fill} are needed")
    c1, c2 = round(depths[0] * n_fill), round(depths[1] * n_fill)
    context = pre + hay[:c1] + nds[0] + hay[c1:c2] + nds[1] + hay[c2:n_fill]
    s1 = len(pre) + c1
    s2 = s1 + len(nds[0]) + (c2 - c1)
    after = turn1 + a1 + turn2 + a2
    p1 = tuple(range(len(turn1), len(turn1) + len(a1)))
    p2 = tuple(range(len(after) - len(a2), len(after)))
    return TwoFacts(task, context, after, (p1, p2), ((s1, s1 + len(nds[0])), (s2, s2 + len(nds[1]))), depths)


def passkeys(tok, length: int, depths: tuple[float, float], seed: int) -> TwoFacts:
    """Two numbers in the passkey literature's filler: a pass key (asked first) and a door code (asked next)."""
    rng = random.Random(seed)
    key, code = rng.randrange(10000, 99999), rng.randrange(10000, 99999)
    hay = _enc(tok, PASSKEY_FILLER * (length // 8 + 16))
    return two_facts(tok, hay, length, "passkey",
                     "There is important information hidden inside a lot of irrelevant text. Find it and memorize "
                     "it. I will quiz you about it.\n\n",
                     (f"The pass key is {key}. Remember it. {key} is the pass key.",
                      f"The door code is {code}. Remember it. {code} is the door code."),
                     ("What is the pass key?", "Thanks. What is the door code?"),
                     ("The pass key is", "The door code is"), (f" {key}", f" {code}"), depths)


def prose_needles(tok, length: int, depths: tuple[float, float], seed: int) -> TwoFacts:
    """Two words planted in real prose (the standard library's docstrings): the vault's word, then the gate's."""
    rng = random.Random(seed)
    w1, w2 = rng.sample(WORDS, 2)
    hay = corpus.take(tok, corpus.haystack("prose"), length, offset=rng.randrange(0, 4096))
    return two_facts(tok, hay, length, "needle",
                     "Read the documentation below.\n\n",
                     (f"The secret word for the vault is {w1}.", f"The secret word for the gate is {w2}."),
                     ("What is the secret word for the vault?", "Thanks. What is the secret word for the gate?"),
                     ("The secret word for the vault is", "The secret word for the gate is"), (f" {w1}", f" {w2}"),
                     depths)


def document(tok, kind: str, length: int, tail: int, offset: int = 0) -> TwoFacts:
    """A real document of `length` tokens; its last `tail` tokens are scored by next-token loss."""
    if not 2 <= tail < length:
        raise ValueError(f"tail must be in [2, length), got {tail} for length {length}")
    ids = corpus.take(tok, corpus.haystack(kind), length, offset=offset)
    return TwoFacts(f"loss-{kind}", ids[:length - tail], ids[length - tail:], (), (), ())


PROBES = {"passkey": passkeys, "needle": prose_needles}


def correct(probe: TwoFacts, logits: torch.Tensor) -> list[bool]:
    """Per question, whether teacher-forced greedy decoding prints its answer.

    logits: [len(after) - 1, vocab], row i predicting after[i + 1] (the logits of after[:-1]). The first
    answer token of a question is never at position 0 of `after` (a turn precedes it).
    """
    if logits.shape[0] != len(probe.after) - 1:
        raise ValueError(f"logits must have {len(probe.after) - 1} rows (after[:-1]), got {logits.shape[0]}")
    pred = logits.argmax(-1).tolist()
    return [all(pred[p - 1] == probe.after[p] for p in pos) for pos in probe.answers]


def tail_loss(probe: TwoFacts, logits: torch.Tensor) -> float:
    """Mean next-token loss (nats) over after[1:], from the logits of after[:-1]."""
    target = torch.tensor(probe.after[1:])
    return float(torch.nn.functional.cross_entropy(logits.float(), target))
