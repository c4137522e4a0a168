"""Agent traffic as real chat messages, tokenised by a real model's tokenizer.

`workloads.py` builds traces from random token ids, where a shared prefix is shared by
construction. With a real tokenizer, what the cache sees is the token ids of *rendered text*,
and BPE can merge characters across the boundary between the text a cache holds and the text
that follows it: the ids of the shared part then change and the cache misses from there on.

Two layouts of the same conversation, both through the model's chat template:
    "template"    the whole rendered text tokenised at once, as most serving stacks do. When a
                  reply begins with whitespace (code often starts on a new line), BPE merges the
                  generation prompt's final newline into the reply's first token ("\n" + "\n   "
                  -> one token), so the previous turn's prompt ids stop being a prefix;
    "segmented"   the template's own pieces and each message's content tokenised separately and
                  concatenated: no merge crosses a message boundary, and each turn's prompt ids
                  extend the previous turn's exactly. (The model sees slightly different ids at a
                  few boundaries; the parity of its answers is not at stake here, only the cache.)

Invariants:
    1. A trace's requests are the same conversation in both layouts (same messages, same order).
    2. `extends_previous(trace)` counts, per agent, turns whose prompt ids start with the previous
       turn's prompt ids plus its reply: the token-level condition for a full prefix-cache hit.
"""
from __future__ import annotations

import random

import torch

from ..analysis import corpus
from ..serving.trace import Request, Trace

LAYOUTS = ("template", "segmented")
_MARK = "\x00SPARSEKV-MSG{}\x00"
_TASKS = ("Add a function that validates the lobby settings.", "Write a test for the matchmaking queue.",
          "Fix the bug where players join a full game.", "Explain what the previous change does.",
          "Refactor the scoring code into its own module.", "Add type hints to the game state class.")


def conversation(tok, agents: int = 3, turns: int = 3, system_tokens: int = 512, reply_tokens: int = 96,
                 seed: int = 0) -> list[list[dict]]:
    """Per agent, the messages of each turn: a shared system prompt (real docs), user tasks, and
    assistant replies (real code that starts on a new line, as a model's code answer often does;
    that leading newline is where whole-text tokenisation merges across the boundary)."""
    rng = random.Random(seed)
    docs = corpus.take(tok, corpus.prose(), system_tokens)
    system = "You are a coding agent working on a game lobby. Tools and their documentation:\n\n" + tok.decode(docs)
    code = tok(corpus.code(), add_special_tokens=False)["input_ids"]
    out = []
    for a in range(agents):
        msgs = [{"role": "system", "content": system}]
        history = []
        for t in range(turns):
            task = rng.choice(_TASKS)
            log = f"\n[tool log] agent {a}, turn {t}: {rng.randrange(1, 99)} tests passed"
            msgs = msgs + [{"role": "user", "content": task + (log if t else "")}]
            history.append(list(msgs))
            start = rng.randrange(0, len(code) - reply_tokens)
            reply = "\n" + tok.decode(code[start:start + reply_tokens]).strip("\n")
            msgs = msgs + [{"role": "assistant", "content": reply}]
        out.append(history)
    return out


def render(tok, messages: list[dict], layout: str) -> list[int]:
    """Prompt ids of one turn (ending where the assistant's reply starts)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"] if s else []
    if layout == "template":
        return enc(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    marked = [{**m, "content": _MARK.format(i)} for i, m in enumerate(messages)]
    text = tok.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    ids = []
    for i, m in enumerate(messages):
        piece, text = text.split(_MARK.format(i), 1)
        ids += enc(piece) + enc(m["content"])
    return ids + enc(text)


def chat_trace(tok, layout: str, agents: int = 3, turns: int = 3, system_tokens: int = 512,
               reply_tokens: int = 96, seed: int = 0, decode_tokens: int = 4) -> Trace:
    """The conversation as a trace of requests in `layout`, turn by turn across agents."""
    conv = conversation(tok, agents, turns, system_tokens, reply_tokens, seed)
    reqs = [Request(f"agent{a}/turn{t}", torch.tensor(render(tok, conv[a][t], layout)), None, decode_tokens)
            for t in range(turns) for a in range(agents)]
    return Trace(f"chat-{layout}", reqs, notes=f"{agents} agents x {turns} turns, real text, {layout} layout")


def first_divergence(a: list[int], b: list[int]) -> int:
    """Index of the first position where a and b differ (len of the shorter if one is a prefix)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def extends_previous(tok, layout: str, agents: int = 3, turns: int = 3, system_tokens: int = 512,
                     reply_tokens: int = 96, seed: int = 0) -> tuple[int, int, list[int]]:
    """(turns that extend their predecessor token for token, turns compared, where each broke).

    A turn extends its predecessor when its prompt ids start with the previous prompt's ids and
    then the reply's text: rendering the previous turn with its reply included must be a prefix.
    """
    conv = conversation(tok, agents, turns, system_tokens, reply_tokens, seed)
    ok, total, breaks = 0, 0, []
    for a in range(agents):
        for t in range(1, turns):
            prev, cur = render(tok, conv[a][t - 1], layout), render(tok, conv[a][t], layout)
            total += 1
            d = first_divergence(prev, cur)
            if d == len(prev):
                ok += 1
            else:
                breaks.append(len(prev) - d)        # tokens of the cached prompt lost at its end
    return ok, total, breaks
