"""Long-context probes on a real model: passkey, a needle in real text, tail loss, attention anatomy.

Every probe builds token ids once, so every method (dense, each router and budget, a peer) gets
the same prompt token ids. Prompts are assembled from separately tokenised pieces (the chat
template's head, the haystack, the needle, the question and the template's tail with an answer
prefix), so a BPE merge never crosses a piece boundary and the needle's ids are known exactly.

Scoring is teacher-forced greedy: a prompt is prefilled up to its last token, then for each
method the last prompt token and the answer tokens are fed one decode step at a time (routed
like decode), and the answer counts as correct when every step's argmax is the next answer
token, which is what greedy decoding would print. The last prompt token is decoded, not
prefilled, so routing decides every answer token.

Shapes: Hq query heads, nb logical blocks; ids are lists of ints.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..routing.mass import block_attention_mass
from ..model.engine import Engine
from .metrics import attention_mass_recall
from ..routing.router import Router
from ..storage.store import Sequence

PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
PASSKEY_INTRO = ("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
                 "I will quiz you about the pass key.\n\n")
WORDS = ("cardamom", "lighthouse", "saxophone", "glacier", "pomegranate", "origami", "tangerine", "cathedral",
         "nebula", "harpsichord", "walrus", "marzipan")
_MARK = "\x00SPARSEKV-HAYSTACK\x00"


@dataclass(frozen=True)
class Probe:
    """One prompt with a planted fact and its answer.

    ids:     prompt token ids (chat template applied, answer prefix included); len(ids) == length
    answer:  the answer's token ids, as the tokenizer writes them after the prompt
    needle:  [start, end) token positions of the planted fact inside ids
    """

    task: str
    ids: list[int]
    answer: list[int]
    needle: tuple[int, int]
    depth: float
    length: int


@dataclass
class Answer:
    correct: bool
    steps: int                      # decode steps run (stops at the first wrong token)
    step_seconds: list[float] = field(default_factory=list)


def template_parts(tok, intro: str, question: str, answer_prefix: str) -> tuple[list[int], list[int]]:
    """Token ids of the chat template before and after the haystack (user turn, then the assistant's
    answer prefix)."""
    text = tok.apply_chat_template([{"role": "user", "content": intro + _MARK + question}],
                                   add_generation_prompt=True, tokenize=False)
    pre, post = text.split(_MARK)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    return enc(pre), enc(post + answer_prefix)


def answer_ids(tok, answer: str) -> list[int]:
    """The answer's ids, tokenised as its own piece (leading space included), like every piece of a probe."""
    ids = tok(answer, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"answer {answer!r} tokenises to nothing")
    return ids


def plant(tok, hay: list[int], length: int, depth: float, intro: str, needle: str, question: str,
          answer_prefix: str, answer: str, task: str) -> Probe:
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
    return Probe(task, ids, answer_ids(tok, answer), (start, start + len(nd)), depth, length)


def passkey(tok, length: int, depth: float, key: int, filler_ids: list[int] | None = None) -> Probe:
    """Passkey retrieval (the repeated-sentence filler of the passkey literature)."""
    hay = filler_ids or tok(PASSKEY_FILLER * (length // 8 + 16), add_special_tokens=False)["input_ids"]
    return plant(tok, hay, length, depth, PASSKEY_INTRO, f"The pass key is {key}. Remember it. {key} is the pass key.",
                 "What is the pass key?", "The pass key is", f" {key}", "passkey")


def text_needle(tok, hay: list[int], kind: str, length: int, depth: float, seed: int) -> Probe:
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


# -- scoring ---------------------------------------------------------------------------------

def prefill_probe(engine: Engine, ids: list[int]) -> Sequence:
    """Prefill all but the last prompt token (the last is decoded per method, see the module docstring)."""
    seq = engine.new_sequence()
    engine.prefill(seq, ids[:-1])
    return seq


def score_answer(engine: Engine, seq: Sequence, last_token: int, answer: list[int], router: Router | None) -> Answer:
    """Teacher-forced greedy on a fork of `seq`: correct iff every step's argmax is the next answer token."""
    child = engine.fork(seq)
    try:
        feed = [last_token] + answer[:-1]
        for i, tok in enumerate(feed):
            logits = engine.feed(child, [tok], router=router)[-1]
            if int(torch.argmax(logits)) != answer[i]:
                return Answer(False, i + 1, [s.seconds for s in engine.stats(child).steps])
        return Answer(True, len(feed), [s.seconds for s in engine.stats(child).steps])
    finally:
        engine.finish(child)


def tail_nll(engine: Engine, seq: Sequence, tail: list[int], router: Router | None) -> tuple[float, list[float]]:
    """Mean next-token loss (nats) over `tail`, fed after `seq`'s tokens; `seq` ends just before tail[0]'s
    predecessor, i.e. its last token is fed first. Returns (mean loss, step seconds).

    seq holds doc[:L - T - 1]; tail is doc[L - T - 1:L]: T steps predict doc[L - T:L].
    """
    child = engine.fork(seq)
    try:
        logits = engine.feed(child, tail[:-1], router=router)                       # [T, vocab]
        target = torch.tensor(tail[1:])
        nll = torch.nn.functional.cross_entropy(logits.float(), target).item()
        return nll, [s.seconds for s in engine.stats(child).steps]
    finally:
        engine.finish(child)


def observe_decode(engine: Engine, seq: Sequence, tokens: list[int], observe) -> None:
    """Dense decode of `tokens` on a fork of `seq`, calling observe(child, step, layer, q) at every
    attention layer (child: the fork; q [Hq, D]: that layer's decode query). The fork is released
    afterwards, also when `observe` raises."""
    child = engine.fork(seq)
    try:
        for step, tok in enumerate(tokens):
            engine.feed(child, [tok], router=None,
                        observer=lambda layer, q, s=step: observe(child, s, layer, q))
    finally:
        engine.finish(child)


def anatomy(engine: Engine, seq: Sequence, tokens: list[int], routers: dict[str, Router]) -> list[dict]:
    """Dense decode of `tokens` on a fork, measuring each attention layer's true block mass.

    One row per (step, layer): blocks that hold 90% and 99% of each query head's mass (mean over
    heads, and per head in `blocks90_heads`: a few layers' heads spread wide, so a mean alone misleads),
    the attention sink's share (block 0), and each router's mass recall (mean over heads).
    """
    store, rows = engine.store, []

    def observe(child: Sequence, step: int, layer: int, q: torch.Tensor) -> None:
        mass = block_attention_mass(q, store, child, layer)                       # [Hq, nb]
        cum = mass.sort(-1, descending=True).values.cumsum(-1)
        b90 = ((cum < 0.9).sum(-1) + 1).clamp_max(mass.shape[1])                 # [Hq]
        row = {"step": step, "layer": layer, "num_blocks": mass.shape[1],
               "blocks90": float(b90.float().mean()), "blocks90_heads": b90.tolist(),
               "blocks99": float(((cum < 0.99).sum(-1) + 1).clamp_max(mass.shape[1]).float().mean()),
               "sink": float(mass[:, 0].mean())}
        for name, r in routers.items():
            row[name] = float(attention_mass_recall(mass, r.select(q, store, child, layer).blocks).mean())
        rows.append(row)

    observe_decode(engine, seq, tokens, observe)
    return rows


# -- statistics and peers ----------------------------------------------------------------------

def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (95% by default)."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def hf_generate_timing(hf_model, ids: list[int], new_tokens: int) -> dict:
    """transformers' own `generate` (its default cache, greedy) on `ids`: TTFT and median TPOT (s).

    Times are read by a logits processor, which generate calls once per step: the first call
    ends the prefill, the gaps between later calls are decode steps.
    """
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps = []

    class Clock(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                logits_processor=LogitsProcessorList([Clock()]))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft_s": stamps[0] - t0, "tpot_s": statistics.median(gaps) if gaps else float("nan"),
            "tokens": out[0, len(ids):].tolist()}


def key_statistics(engine: Engine, seq: Sequence, probe: Probe) -> list[dict]:
    """How peaked a real needle is, in the synthetic probes' units, at the decode of the prompt's last token.

    `seq` holds probe.ids[:-1] (see `prefill_probe`). Per (layer, query head):
        strength   (max needle logit - mean background logit) / background std, where logits are
                   q.k / sqrt(D), the needle is probe.needle's tokens and the background is every
                   other token outside the first block (the sink): the probes' `strength`, whose
                   background has std 1;
        channels   participation ratio (sum |c_i|)^2 / sum c_i^2 of the per-channel terms
                   c_i = q_i k_i of the strongest needle key: the effective number of channels
                   carrying its logit (a probe planted on c channels gives c).
    """
    child = engine.fork(seq)
    store, rows = engine.store, []
    lo, hi = probe.needle
    bs = store.config.block_size

    def observe(layer: int, q: torch.Tensor) -> None:
        k, _ = store.gather(child, layer)                                     # [N, H, D]
        H, D = k.shape[1], k.shape[2]
        G = q.shape[0] // H
        s = torch.einsum("hd,nhd->hn", q.float(), k.float().repeat_interleave(G, 1)) / math.sqrt(D)   # [Hq, N]
        bg = torch.ones(s.shape[1], dtype=torch.bool)
        bg[:bs], bg[lo:hi] = False, False
        best = s[:, lo:hi].argmax(-1) + lo                                    # [Hq]
        z = (s[:, lo:hi].amax(-1) - s[:, bg].mean(-1)) / s[:, bg].std(-1)
        c = q.float() * k[best, torch.arange(q.shape[0]) // G].float()        # [Hq, D]
        pr = c.abs().sum(-1) ** 2 / (c * c).sum(-1).clamp_min(1e-30)
        for h in range(q.shape[0]):
            rows.append({"layer": layer, "head": h, "strength": float(z[h]), "channels": float(pr[h])})

    try:
        engine.feed(child, [probe.ids[-1]], router=None, observer=observe)
    finally:
        engine.finish(child)
    return rows
