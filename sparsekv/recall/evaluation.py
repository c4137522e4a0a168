"""End-to-end recall through the engine: answer accuracy under each router and budget.

For each example, the context (up to and including the first query token) is prefilled once,
densely; the sequence is then forked per router, and the queries and answers are fed token by
token (teacher forcing) through routed decode. Each router is scored on the logits after every
query token. Prefilling once and forking keeps a sweep over many routers cheap.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..model.engine import Engine
from ..model.model import Model
from ..routing.router import Router
from . import tasks


@dataclass
class RouterResult:
    correct: list[bool] = field(default_factory=list)     # one per scored answer
    depths: list[float] = field(default_factory=list)     # depth of the fact each answer needs
    bytes_read: int = 0                                    # attention K/V + routing bytes, all feed steps
    answers: int = 0

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / max(1, len(self.correct))

    @property
    def bytes_per_answer(self) -> float:
        return self.bytes_read / max(1, self.answers)


def evaluate_routers(model: Model, batch: tasks.Batch, routers: dict[str, Router | None], block_size: int = 16,
                     dense_layers: int = 0) -> dict[str, RouterResult]:
    """Score every router (None = dense decode) on every example of `batch`."""
    B, T = batch.tokens.shape
    out = {name: RouterResult() for name in routers}
    engine = Engine(model, block_size=block_size, num_blocks=(len(routers) + 1) * (-(-T // block_size) + 2),
                    chunk_size=2048, dense_layers=dense_layers, progress=False)
    for b in range(B):
        tokens, targets = batch.tokens[b], batch.targets[b]
        fq = int(batch.first_query[b])
        base = engine.new_sequence()
        first = engine.prefill(base, tokens[:fq + 1])
        scored = (targets[fq:T - 1] != -100).nonzero().flatten()
        answers = targets[fq:T - 1][scored]
        for name, router in routers.items():
            seq = engine.fork(base)
            rows = engine.feed(seq, tokens[fq + 1:T - 1], router=router) if T - 1 > fq + 1 else first[None, :0]
            logits = torch.cat([first[None], rows])
            ok = (logits[scored].argmax(-1) == answers).tolist()
            res = out[name]
            res.correct += ok
            res.depths += batch.depths[b][: len(ok)].tolist()
            st = engine.stats(seq)
            res.bytes_read += sum(s.kv_bytes + s.route_bytes for s in st.steps)
            res.answers += len(ok)
            engine.finish(seq)
        engine.finish(base)
    return out


def evaluate_hf(model, batch: tasks.Batch, routers: dict[str, Router | None], block_size: int = 64,
                dense_layers: int = 0) -> dict[str, RouterResult]:
    """The same teacher-forced scoring for a transformers causal LM, routed via `sparsekv.recall.hf`.

    Token ids are the task's (all below 1,024, so valid in any real vocabulary): a real model
    answers through its induction heads (copy what followed an earlier occurrence). The model
    must have been loaded with attn_implementation="sparsekv" (or have it set on its config).
    Quality only: the HF cache is not paged (see sparsekv.recall.hf).
    """
    from . import hf as skhf
    out = {name: RouterResult() for name in routers}
    B, T = batch.tokens.shape
    for name, router in routers.items():
        reg = skhf.register(router, block_size=block_size, dense_layers=dense_layers)
        model.config._attn_implementation = reg.name
        res = out[name]
        for b in range(B):
            tokens, targets, fq = batch.tokens[b], batch.targets[b], int(batch.first_query[b])
            dev = next(model.parameters()).device
            with torch.no_grad():
                o = model(tokens[None, :fq + 1].to(dev), use_cache=True)
                rows, past = [o.logits[0, -1].float().cpu()], o.past_key_values
                for tok in tokens[fq + 1:T - 1].tolist():
                    o = model(torch.tensor([[tok]], device=dev), past_key_values=past, use_cache=True)
                    rows.append(o.logits[0, -1].float().cpu())
                    past = o.past_key_values
            logits = torch.stack(rows)
            scored = (targets[fq:T - 1] != -100).nonzero().flatten()
            ok = (logits[scored].argmax(-1) == targets[fq:T - 1][scored]).tolist()
            res.correct += ok
            res.depths += batch.depths[b][: len(ok)].tolist()
            res.answers += len(ok)
        res.bytes_read = sum(s["kv_bytes"] + s["route_bytes"] for s in reg.steps)   # as in evaluate_routers
    return out
