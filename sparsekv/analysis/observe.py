"""Observing a real model's decode: answers scored by teacher-forced greedy decoding, tail loss, attention
anatomy and a needle's key statistics, each on a fork of a prefilled prompt.

Scoring is teacher-forced greedy: a prompt is prefilled up to its last token (`prefill_probe`), then for each
method the last prompt token and the answer tokens are fed one decode step at a time (routed like decode), and
the answer counts as correct when every step's argmax is the next answer token, which is what greedy decoding
would print. The last prompt token is decoded, not prefilled, so routing decides every answer token.

Shapes: Hq query heads, nb logical blocks; ids are lists of ints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..model.engine import Engine
from ..routing.mass import block_attention_mass
from ..routing.router import Router
from ..storage.store import Sequence
from .metrics import attention_mass_recall
from .prompts import PromptProbe


@dataclass
class Answer:
    correct: bool
    steps: int                      # steps to decide: the first wrong token's step + 1, or every step when correct
    step_seconds: list[float] = field(default_factory=list)
    logprobs: torch.Tensor | None = None    # [len(answer), vocab] float32 log-softmax of every step (keep_logprobs)


def prefill_probe(engine: Engine, ids: list[int]) -> Sequence:
    """Prefill all but the last prompt token (the last is decoded per method, see the module docstring)."""
    seq = engine.new_sequence()
    engine.prefill(seq, ids[:-1])
    return seq


def score_answer(engine: Engine, seq: Sequence, last_token: int, answer: list[int], router: Router | None,
                 dense_layers: int | None = None, keep_logprobs: bool = False) -> Answer:
    """Teacher-forced greedy on a fork of `seq`: correct iff every step's argmax is the next answer token.
    `dense_layers`: leading layers read densely (None: the engine's).

    keep_logprobs: run every answer step, also after a wrong one (teacher-forced, so the contexts stay those of the
    true answer), and return each step's log-softmax in `Answer.logprobs` ([len(answer), vocab] float32), for
    `answer_agreement` with another method's steps. Without it, scoring stops at the first wrong token."""
    child = engine.fork(seq)
    try:
        feed = [last_token] + answer[:-1]
        wrong, kept = None, []
        for i, tok in enumerate(feed):
            logits = engine.feed(child, [tok], router=router, dense_layers=dense_layers)[-1]
            if keep_logprobs:
                kept.append(torch.log_softmax(logits.float(), -1))
            if wrong is None and int(torch.argmax(logits)) != answer[i]:
                wrong = i
                if not keep_logprobs:
                    break
        secs = [s.seconds for s in engine.stats(child).steps]
        return Answer(wrong is None, len(feed) if wrong is None else wrong + 1, secs,
                      torch.stack(kept) if keep_logprobs else None)
    finally:
        engine.finish(child)


def answer_agreement(reference: torch.Tensor, other: torch.Tensor) -> dict:
    """How closely `other`'s answer steps follow `reference`'s, both [A, vocab] log-probabilities of the same A
    teacher-forced steps (e.g. dense's and a router's `Answer.logprobs` on one question).

    Returns {"top1": the fraction of steps whose argmax agrees (ties to the lowest token id, as torch.argmax),
    "kl": the mean over steps of KL(reference || other) in nats, computed in float64, "steps": A}."""
    if not isinstance(reference, torch.Tensor) or not isinstance(other, torch.Tensor):
        raise TypeError("reference and other must be torch tensors of log-probabilities [A, vocab]")
    if reference.dim() != 2 or reference.shape != other.shape or reference.shape[0] == 0:
        raise ValueError(f"reference and other must both be [A, vocab] with A >= 1, got {tuple(reference.shape)} "
                         f"and {tuple(other.shape)}")
    p, q = reference.double(), other.double()
    w = p.exp()
    kl = torch.where(w > 0, w * (p - q), torch.zeros((), dtype=p.dtype)).sum(-1)     # 0 log 0 = 0
    top1 = (p.argmax(-1) == q.argmax(-1)).double()
    return {"top1": float(top1.mean()), "kl": float(kl.mean()), "steps": int(p.shape[0])}


def tail_nll(engine: Engine, seq: Sequence, tail: list[int], router: Router | None,
             dense_layers: int | None = None) -> tuple[float, list[float]]:
    """Mean next-token loss (nats) over `tail`, fed after `seq`'s tokens; `seq` ends just before tail[0]'s
    predecessor, i.e. its last token is fed first. Returns (mean loss, step seconds). `dense_layers`: leading
    layers read densely (None: the engine's).

    seq holds doc[:L - T - 1]; tail is doc[L - T - 1:L]: T steps predict doc[L - T:L].
    """
    losses, secs = tail_token_nll(engine, seq, tail, router, dense_layers)
    return float(losses.mean()), secs


def tail_token_nll(engine: Engine, seq: Sequence, tail: list[int], router: Router | None,
                   dense_layers: int | None = None) -> tuple[torch.Tensor, list[float]]:
    """`tail_nll`'s losses one per predicted token ([T] float32, nats), for paired per-token statistics."""
    child = engine.fork(seq)
    try:
        logits = engine.feed(child, tail[:-1], router=router, dense_layers=dense_layers)      # [T, vocab]
        target = torch.tensor(tail[1:])
        losses = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none")
        return losses, [s.seconds for s in engine.stats(child).steps]
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

    One row per (step, global layer; a hybrid model's sliding-window layers are skipped, `layer` is the store layer):
    blocks that hold 90% and 99% of each query head's mass (mean over
    heads, and per head in `blocks90_heads`: a few layers' heads spread wide, so a mean alone misleads),
    the attention sink's share (block 0), and each router's mass recall (mean over heads).
    """
    store, rows = engine.store, []

    def observe(child: Sequence, step: int, layer: int, q: torch.Tensor) -> None:
        v = store.view(child, layer)
        if v.window:                 # a sliding-window layer reads its whole window: nothing there is routed
            return
        mass = block_attention_mass(q, v.store, v.seq, v.layer)                  # [Hq, nb]
        cum = mass.sort(-1, descending=True).values.cumsum(-1)
        b90 = ((cum < 0.9).sum(-1) + 1).clamp_max(mass.shape[1])                 # [Hq]
        row = {"step": step, "layer": layer, "num_blocks": mass.shape[1],
               "blocks90": float(b90.float().mean()), "blocks90_heads": b90.tolist(),
               "blocks99": float(((cum < 0.99).sum(-1) + 1).clamp_max(mass.shape[1]).float().mean()),
               "sink": float(mass[:, 0].mean())}
        for name, r in routers.items():
            row[name] = float(attention_mass_recall(mass, r.select(q, v.store, v.seq, v.layer).blocks).mean())
        rows.append(row)

    observe_decode(engine, seq, tokens, observe)
    return rows


def key_statistics(engine: Engine, seq: Sequence, probe: PromptProbe) -> list[dict]:
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
        if store.view(child, layer).window:      # a sliding-window layer: the needle is out of its reach
            return
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
