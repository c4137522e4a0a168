"""Prompts with a planted fact, for a real model: a passkey in repeated filler, a needle in real prose or code.

Every probe builds token ids once, so every method (dense, each router and budget, a peer) gets the same
prompt token ids. Prompts are assembled from separately tokenised pieces (the chat template's head, the
haystack, the needle, the question and the template's tail with an answer prefix), so a BPE merge never
crosses a piece boundary and the needle's ids are known exactly. Scoring them is `analysis.observe`.

    probe = passkey(tok, 4096, depth=0.5, key=52718)     # a PromptProbe: ids, answer ids, needle span
"""
from __future__ import annotations

import random
from dataclasses import dataclass

PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
PASSKEY_INTRO = ("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
                 "I will quiz you about the pass key.\n\n")
WORDS = ("cardamom", "lighthouse", "saxophone", "glacier", "pomegranate", "origami", "tangerine", "cathedral",
         "nebula", "harpsichord", "walrus", "marzipan")
_MARK = "\x00SPARSEKV-HAYSTACK\x00"


@dataclass(frozen=True)
class PromptProbe:
    """One prompt with a planted fact and its answer.

    ids:     prompt token ids (chat template or completion format, answer prefix included); len(ids) == length
    answer:  the answer's token ids, as the tokenizer writes them after the prompt
    needle:  [start, end) token positions of the planted fact inside ids
    """

    task: str
    ids: list[int]
    answer: list[int]
    needle: tuple[int, int]
    depth: float
    length: int


def template_parts(tok, intro: str, question: str, answer_prefix: str) -> tuple[list[int], list[int]]:
    """Token ids before and after the haystack. With a chat template (an instruct model): the user turn around
    intro, haystack and question, then the assistant's answer prefix. Without one (a base model, e.g. Gemma 3 270M):
    completion style, BOS + intro, haystack, then "Question: <question>\nAnswer: <answer prefix>"."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    if getattr(tok, "chat_template", None) is None:
        lead = question[:len(question) - len(question.lstrip())]            # the blank lines before the question
        return (tok(intro, add_special_tokens=True)["input_ids"],
                enc(f"{lead}Question: {question.strip()}\nAnswer: {answer_prefix}"))
    text = tok.apply_chat_template([{"role": "user", "content": intro + _MARK + question}],
                                   add_generation_prompt=True, tokenize=False)
    pre, post = text.split(_MARK)
    return enc(pre), enc(post + answer_prefix)


def followup_ids(tok, question: str, answer_prefix: str) -> list[int]:
    """The ids that close a first answer and ask a second question (the second turn of a dialogue), up to and
    including the second answer prefix: with a chat template, the end of the assistant's turn, a user turn asking
    `question`, and the assistant's generation prompt; without one (completion style, as `template_parts`), "."
    then "\n\nQuestion: <question>\nAnswer: <answer prefix>". Each piece is tokenised on its own, so the ids of the
    first answer end where they did."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    if getattr(tok, "chat_template", None) is None:
        return enc(".") + enc(f"\n\nQuestion: {question.strip()}\nAnswer: {answer_prefix}")
    text = tok.apply_chat_template([{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK},
                                    {"role": "user", "content": question.strip()}],
                                   add_generation_prompt=True, tokenize=False)
    return enc(text.split(_MARK, 1)[1] + answer_prefix)


def answer_ids(tok, answer: str) -> list[int]:
    """The answer's ids, tokenised as its own piece (leading space included), like every piece of a probe."""
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"answer {answer!r} tokenises to nothing")
    return ids


def plant(tok, hay: list[int], length: int, depth: float, intro: str, needle: str, question: str,
          answer_prefix: str, answer: str, task: str) -> PromptProbe:
    """A `length`-token prompt: template head, intro, haystack with `needle` at `depth`, question, answer prefix."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    pre, post = template_parts(tok, intro, "\n\n" + question, answer_prefix)
    nd = tok("\n" + needle + "\n", add_special_tokens=False)["input_ids"]
    n_fill = length - len(pre) - len(post) - len(nd)
    if n_fill < 1:
        raise ValueError(f"length must leave room for a haystack: {length} <= {len(pre) + len(post) + len(nd)}")
    if len(hay) < n_fill:
        raise ValueError(f"length: the haystack has {len(hay)} tokens, {n_fill} are needed")
    cut = round(depth * n_fill)
    ids = pre + hay[:cut] + nd + hay[cut:n_fill] + post
    start = len(pre) + cut
    return PromptProbe(task, ids, answer_ids(tok, answer), (start, start + len(nd)), depth, length)


def passkey(tok, length: int, depth: float, key: int, filler_ids: list[int] | None = None) -> PromptProbe:
    """Passkey retrieval (the repeated-sentence filler of the passkey literature)."""
    hay = filler_ids or tok(PASSKEY_FILLER * (length // 8 + 16), add_special_tokens=False)["input_ids"]
    return plant(tok, hay, length, depth, PASSKEY_INTRO, f"The pass key is {key}. Remember it. {key} is the pass key.",
                 "What is the pass key?", "The pass key is", f" {key}", "passkey")


def text_needle(tok, hay: list[int], kind: str, length: int, depth: float, seed: int) -> PromptProbe:
    """A fact planted in real text: a secret word in prose, or a constant in Python source."""
    rng = random.Random(seed)
    if kind == "prose":
        word = rng.choice(WORDS)
        return plant(tok, hay, length, depth, "Read the documentation below.\n\n",
                     f"The secret word for the vault is {word}.", "What is the secret word for the vault?",
                     "The secret word for the vault is", f" {word}", "needle-prose")
    if kind == "code":
        pin = rng.randrange(10000, 99999)
        return plant(tok, hay, length, depth, "Read the Python code below.\n\n",
                     f"VAULT_PIN = {pin}  # the PIN of the vault", "In the code above, what is the value of VAULT_PIN?",
                     "VAULT_PIN =", f" {pin}", "needle-code")
    raise ValueError(f"kind must be 'prose' or 'code', got {kind!r}")
