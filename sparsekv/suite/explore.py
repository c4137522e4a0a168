"""What the live explorers compute (the widgets in `suite.explorers` only draw it).

Each function is deterministic in its arguments, fast at the explorers' sizes (well under a second on
two cores, except `router_reads`, which runs the real model), and returns a small dataclass that the
explorer draws and the tests check without a browser:

    routing_view(scorer, token_budget, block_size, strength, channels, depth)  -> RoutingView
    prefix_view(base, edited, block_size, tok=None)                          -> PrefixView
    ReadsSession(engine, tok, document).view(question, routers, layer)         -> ReadsView
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..analysis import metrics, probes, sweeps
from ..core.checks import check_int
from ..routing.mass import block_attention_mass
from ..routing.router import Router
from ..storage.block_table import BlockTable
from ..storage.prefix_cache import Explanation, PrefixCache

# -- routing -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RoutingView:
    """One router on one planted-needle decode step.

    selected, oracle: [H, nb] bool, the router's blocks and the oracle's top blocks (same count per kv head).
    mass:             [H, nb] float, the true attention mass per block (mean over the kv head's query heads).
    """

    scorer: str
    token_budget: int
    block_size: int
    selected: np.ndarray
    oracle: np.ndarray
    mass: np.ndarray
    needle_blocks: list[int]
    result: metrics.RouteEval
    blocks: torch.Tensor          # the router's selection [H, K], exactly what Router.select returned

    @property
    def summary(self) -> str:
        r = self.result
        return (f"{self.scorer} at {self.token_budget} tokens (block {self.block_size}): mass recall {r.mass_recall:.1%}, "
                f"needle found {r.needle_recall:.0%}, relative error {r.rel_error:.2e}, "
                f"bytes {r.bytes_ratio:.1%} of dense ({(r.kv_bytes + r.route_bytes) / 1024:.0f} KiB)")


def routing_view(scorer: str = "minmax", token_budget: int = 512, block_size: int = 64, strength: float = 8.0,
                 channels: int = 8, depth: float = 0.5, length: int = 8192, num_kv_heads: int = 2, head_dim: int = 64,
                 seed: int = 0) -> RoutingView:
    """Plant a needle (`analysis.probes.needle`), route one query with `Router(scorer, token_budget=...)`,
    and measure it against dense attention and the oracle."""
    cfg = probes.ProbeConfig(length=length, num_kv_heads=num_kv_heads, gqa=4, head_dim=head_dim, strength=strength,
                             channels=channels, seed=seed)
    probe = probes.needle(cfg, depth, block_size=block_size)
    router = Router(scorer, token_budget=token_budget)
    store, seq = sweeps.probe_store(probe, block_size, reads=router.scorer.reads)
    sel = router.select(probe.q, store, seq, 0)
    mass = block_attention_mass(probe.q, store, seq, 0)                               # [Hq, nb]
    result = metrics.evaluate(router, probe.q, store, seq, 0, needle_blocks=probe.needle_blocks(block_size), mass=mass)
    nb, H = seq.num_blocks, num_kv_heads
    k = int(sel.num_selected.max())
    oracle = metrics.oracle_top_k(mass, k, H)
    return RoutingView(scorer, token_budget, block_size, _mask(sel.blocks, nb), _mask(oracle, nb),
                       mass.view(H, -1, nb).mean(1).numpy(), probe.needle_blocks(block_size), result, sel.blocks)


def _mask(blocks: torch.Tensor, nb: int) -> np.ndarray:
    return metrics.selected_mask(blocks, nb).numpy()


# -- prefix cache --------------------------------------------------------------------------------

Segments = list[tuple[str, str]]          # (segment name, text) in prompt order


def agent_prompt(timestamp_first: bool = True, tool_order: str = "registered", history_edit: str | None = None) -> Segments:
    """A small agent prompt: system, a timestamp, tool definitions, a history and a question.

    timestamp_first: the timestamp right after the system prompt (True) or just before the question.
    tool_order: "registered", "reversed" or "alphabetical". history_edit: replaces the second history line.
    """
    tools = [("search_docs", "Search the project documentation. Args: query (str), limit (int)."),
             ("read_file", "Read a file from the repository. Args: path (str), start (int), end (int)."),
             ("run_tests", "Run the test suite. Args: pattern (str), timeout_s (int)."),
             ("open_issue", "Open an issue in the tracker. Args: title (str), body (str), labels (list).")]
    if tool_order == "reversed":
        tools = tools[::-1]
    elif tool_order == "alphabetical":
        tools = sorted(tools)
    elif tool_order != "registered":
        raise ValueError(f"tool_order must be 'registered', 'reversed' or 'alphabetical', got {tool_order!r}")
    history = ["user: the nightly build failed on the decode kernel test.",
               "assistant: I read the log; the failure is a tolerance of 1e-6 on a bf16 path.",
               "user: can you check whether the tolerance or the kernel is wrong?",
               "assistant: I will run the kernel test against the float64 reference first."]
    if history_edit is not None:
        history[1] = history_edit
    segs = [("system", "You are a careful coding agent for the sparsekv repository. Answer briefly and cite files.")]
    stamp = ("timestamp", "Current time: 2026-11-30 09:41:07 UTC.")
    if timestamp_first:
        segs.append(stamp)
    segs += [(f"tool {name}", f"Tool {name}: {doc}") for name, doc in tools]
    segs += [(f"history {i}", line) for i, line in enumerate(history)]
    if not timestamp_first:
        segs.append(stamp)
    segs.append(("question", "user: what should the agent do next?"))
    return segs


def word_tokens(text: str) -> list[int]:
    """A deterministic stand-in tokenizer (one id per whitespace-separated word, by CRC-32) for model-free use."""
    return [zlib.crc32(w.encode()) % 50_000 for w in text.split()]


@dataclass(frozen=True)
class PrefixView:
    """How an edited prompt reuses the cache a base prompt left behind.

    status: per block of the edited prompt, "hit", "miss" or "tail" (the partial last block, never cached).
    spans:  (segment name, first token, end token) of each segment in the edited prompt.
    """

    block_size: int
    num_tokens: int
    hit_tokens: int
    status: list[str]
    spans: list[tuple[str, int, int]]
    explanation: Explanation

    @property
    def recomputed_tokens(self) -> int:
        return self.num_tokens - self.hit_tokens

    @property
    def summary(self) -> str:
        return (f"{self.hit_tokens} of {self.num_tokens} tokens reused, {self.recomputed_tokens} recomputed; "
                f"{self.explanation}")


def prefix_view(base: Segments, edited: Segments, block_size: int = 16, tok=None) -> PrefixView:
    """Cache `base` (its full blocks), then match `edited` against it: hits, the first miss and why.

    tok: a tokenizer with `encode` (each segment encoded on its own, so spans are exact), or None for
    `word_tokens`.
    """
    enc = (lambda s: word_tokens(s)) if tok is None else (lambda s: list(tok.encode(s, add_special_tokens=False)))

    def ids_of(segs: Segments):
        ids, spans = [], []
        for name, text in segs:
            t = enc(text + "\n")
            spans.append((name, len(ids), len(ids) + len(t)))
            ids += t
        return ids, spans

    base_ids, _ = ids_of(base)
    ids, spans = ids_of(edited)
    n = max(len(base_ids), len(ids))
    table = BlockTable(block_size, 2 * (-(-n // block_size)) + 2)     # the cache's bookkeeping, no K/V
    cache = PrefixCache(table)
    seq = table.new_sequence()
    table.reserve(seq, len(base_ids))
    cache.insert(seq, base_ids)
    table.free(seq)
    m = cache.match(ids)
    why = cache.explain(ids)
    full = len(ids) // block_size
    status = ["hit" if b < len(m.block_ids) else "miss" for b in range(full)]
    if len(ids) % block_size:
        status.append("tail")
    return PrefixView(block_size, len(ids), m.num_tokens, status, spans, why)


# -- what does the router read (real model) -------------------------------------------------------

@dataclass(frozen=True)
class ReadsView:
    """Per method ("dense" and each router): the answer, and per document block the share of
    (layer, kv head) pairs that read it at the answer's first step (at one layer, or over all layers)."""

    answers: dict[str, str]
    weights: dict[str, np.ndarray]       # method -> [nb_doc] in [0, 1] (dense: all ones)
    block_texts: list[str]               # the document's text per block
    layer: int | None


def facts_document(tok, length: int = 512, kind: str = "filler", seed: int = 0) -> list[int]:
    """About `length` tokens of text with two facts planted at 30% and 70% of it: a pass key and a door code.

    kind: "filler" (the passkey literature's repeated filler, as notebook 09's passkey task) or "prose" (real
    docstrings from the standard library, `analysis.corpus`; SmolLM2-135M often misses facts in it even densely).
    """
    from ..analysis import corpus, turns
    rng = np.random.default_rng(seed)
    key, code = int(rng.integers(10000, 99999)), int(rng.integers(10000, 99999))
    if kind == "filler":
        hay = list(tok.encode(turns.PASSKEY_FILLER * (length // 8 + 16), add_special_tokens=False))[:length]
    elif kind == "prose":
        hay = corpus.take(tok, corpus.haystack("prose"), length, offset=int(rng.integers(0, 4096)))
    else:
        raise ValueError(f"kind must be 'filler' or 'prose', got {kind!r}")
    a, b = int(0.3 * len(hay)), int(0.7 * len(hay))
    fact = lambda s: list(tok.encode(f"\n{s}\n", add_special_tokens=False))
    return (hay[:a] + fact(f"The pass key is {key}. Remember it. {key} is the pass key.") + hay[a:b]
            + fact(f"The door code is {code}. Remember it. {code} is the door code.") + hay[b:])


_DOC, _Q = "\x00document\x00", "\x00question\x00"


class ReadsSession:
    """The real model over one shipped document: prefilled once, then asked questions.

    The prompt is the model's chat template around one user message, "Read the text below." then the
    document, then the question; a base model without a chat template (Gemma 3 270M) gets the completion form,
    BOS, "Read the text below.", the document, then "Question: <question>\nAnswer:". The document (and what
    comes before it) is prefilled once. view(question, routers, layer) prefills the question and the tail on a
    fork of it (cached per question) and decodes `answer_tokens` greedy tokens densely and with each router.
    On a hybrid model only the global layers are routed, so only they have selections to shade.
    """

    def __init__(self, engine, tok, document_ids, answer_tokens: int = 8):
        if not engine.config.record_selections:
            raise ValueError("engine must be built with record_selections=True")
        self.engine, self.tok, self.answer_tokens = engine, tok, answer_tokens
        if getattr(tok, "chat_template", None) is None:
            head, rest = "Read the text below.\n\n", f"\n\nQuestion: {_Q}\nAnswer:"
            lead = [tok.bos_token_id]
        else:
            text = tok.apply_chat_template([{"role": "user", "content": f"Read the text below.\n\n{_DOC}\n\n{_Q}"}],
                                           add_generation_prompt=True, tokenize=False)
            head, rest = text.split(_DOC)
            lead = []
        self._between, self._tail = rest.split(_Q)
        self.doc = lead + list(tok.encode(head, add_special_tokens=False)) + [int(t) for t in document_ids]
        bs = engine.store.config.block_size
        self.block_texts = [tok.decode(self.doc[i:i + bs]) for i in range(0, len(self.doc), bs)]
        self.root = engine.new_sequence()
        engine.prefill(self.root, self.doc)
        self._asked: dict[str, object] = {}

    def _question_seq(self, question: str):
        if question not in self._asked:
            for s in self._asked.values():
                self.engine.finish(s)
            self._asked.clear()
            seq = self.engine.fork(self.root)
            ids = self.tok.encode(self._between + question + self._tail, add_special_tokens=False)
            self.engine.prefill(seq, ids)
            self._asked[question] = seq
        return self._asked[question]

    def view(self, question: str, routers: dict[str, Router], layer: int | None = None) -> ReadsView:
        if not question.strip():
            raise ValueError("question must be non-empty text")
        if layer is not None:
            check_int("layer", layer, lo=0, hi=self.engine.store.config.num_layers - 1)
            if self.engine.store.view(self.root, layer).window:
                raise ValueError(f"layer {layer} is a sliding-window layer: it reads its whole window and is never "
                                 "routed; pick a global layer, or None for all of them")
        seq = self._question_seq(question)
        nb = len(self.block_texts)
        answers, weights = {}, {}
        for name, router in {"dense": None, **routers}.items():
            child = self.engine.fork(seq)
            out = self.engine.decode(child, self.answer_tokens, router=router)
            answers[name] = self.tok.decode(out).strip()
            if router is None:
                weights[name] = np.ones(nb)
            else:
                sel = self.engine.stats(child).steps[0].selections            # layer -> [H, K]
                layers = [layer] if layer is not None else sorted(sel)
                w = np.zeros(nb)
                for lyr in layers:
                    for row in sel[lyr].numpy():
                        picked = row[(row >= 0) & (row < nb)]
                        w[picked] += 1
                weights[name] = w / (len(layers) * next(iter(sel.values())).shape[0])
            self.engine.finish(child)
        return ReadsView(answers, weights, self.block_texts, layer)
