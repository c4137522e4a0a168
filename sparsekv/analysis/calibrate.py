"""Calibration of the `labels` router (Double Sparsity's label channels), on text no evaluation reads.

    python -m sparsekv calibrate --model smollm2            # writes data/calibration/smollm2.labels-r8-t2048.json
    labels = load_labels("data/calibration/smollm2.labels-r8-t2048.json")
    engine = sk.Engine(model, summaries=DEFAULT_SUMMARIES + ("klabel",), labels=labels)
    router = sk.Router("labels", token_budget=64)

What it trains on: the docstrings of the standard-library modules in `CALIBRATION_MODULES`, none of which any
notebook's haystack reads (`analysis.corpus.PROSE_MODULES` and `CODE_MODULES`; a test checks they are disjoint),
prefilled once through the model (`tokens` tokens), then `queries` decode steps on the following tokens. For each
store layer and kv head, a channel's importance is the mean |q_c| over those decode queries (the kv head's query
heads pooled) times the mean |k_c| over the prefilled keys: Double Sparsity's offline channel ranking, on
post-RoPE q and k (what the store holds). With `pairs` (the default) channels are chosen in RoPE pairs (c, c + D/2),
whose joint magnitude a rotation does not change, by their summed importance. It takes a few seconds on a CPU.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ..storage.summaries import LabelChannels
from . import corpus

CALIBRATION_MODULES = ("inspect", "ipaddress", "optparse", "pprint", "sched", "selectors", "queue", "random",
                       "shlex", "struct", "tokenize", "traceback", "uuid", "gettext", "numbers", "operator",
                       "plistlib", "base64", "codecs", "copy", "dis", "doctest", "filecmp", "fnmatch", "glob",
                       "gzip", "hashlib", "hmac", "mimetypes", "ftplib", "poplib", "imaplib")


def calibration_text() -> str:
    """The calibration text: docstrings of `CALIBRATION_MODULES` (see the module docstring)."""
    return corpus.prose(CALIBRATION_MODULES)


def channel_importance(engine, tok, tokens: int = 2048, queries: int = 32) -> torch.Tensor:
    """[L, H, D] float64: mean |q_c| of `queries` decode queries times mean |k_c| of `tokens` prefilled keys, per
    store layer and kv head, on the calibration text. A hybrid model's sliding layers see only their window's keys."""
    ids = [tok.bos_token_id] + corpus.take(tok, calibration_text(), tokens + queries - 1)
    c = engine.store.config
    L, H, D = c.num_layers, c.num_kv_heads, c.head_dim
    qsum = torch.zeros(L, H, D, dtype=torch.float64)
    seq = engine.new_sequence()
    engine.prefill(seq, ids[:tokens])
    ksum = torch.zeros(L, H, D, dtype=torch.float64)
    for layer in range(L):
        start = engine.store.view(seq, layer).seq.released * c.block_size
        k, _ = engine.store.gather(seq, layer, start)                          # [n, H, D]
        ksum[layer] = k.double().abs().mean(0)

    def observe(layer: int, q: torch.Tensor) -> None:                          # q [Hq, D]
        qsum[layer] += q.double().abs().view(H, -1, D).mean(1)

    engine.feed(seq, ids[tokens:tokens + queries], router=None, observer=observe, logits="last")
    engine.finish(seq)
    return qsum / queries * ksum


def label_channels(importance: torch.Tensor, r: int, pairs: bool = True, source: str = "") -> LabelChannels:
    """The top-`r` channels by importance ([L, H, D]) per layer and kv head; with `pairs`, the top r / 2 RoPE pairs
    (c, c + D/2) by summed importance (r must be even)."""
    L, H, D = importance.shape
    if not 1 <= r <= D:
        raise ValueError(f"r must be in [1, head_dim={D}], got {r}")
    if pairs:
        if r % 2 or D % 2:
            raise ValueError(f"r must be even to choose RoPE pairs, got r={r}")
        pair = importance[..., :D // 2] + importance[..., D // 2:]                 # [L, H, D/2]
        top = pair.topk(r // 2, dim=-1).indices
        chosen = torch.cat([top, top + D // 2], -1)
    else:
        chosen = importance.topk(r, dim=-1).indices
    return LabelChannels(tuple(tuple(tuple(h.tolist()) for h in layer) for layer in chosen), source)


def save_labels(path: str | Path, labels: LabelChannels, meta: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "source": labels.source, "r": labels.r, "channels": labels.channels}) + "\n")
    tmp.replace(path)
    return path


def load_labels(path: str | Path) -> LabelChannels:
    """The `LabelChannels` a calibration wrote (FileNotFoundError naming the command that writes it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no label calibration at {path}: run `python -m sparsekv calibrate --model ...`")
    d = json.loads(path.read_text())
    return LabelChannels(d["channels"], d.get("source", ""))


def default_path(model: str, r: int, root: str | Path = ".", tokens: int = 2048) -> Path:
    """Where `python -m sparsekv calibrate` writes a model's labels: one file per (r, calibration tokens)."""
    return Path(root) / "data" / "calibration" / f"{model}.labels-r{r}-t{tokens}.json"


def store_kwargs(model_name: str, head_dim: int, root: str | Path = ".", block_size: int = 16, tokens: int = 2048,
                 r: int | None = None) -> dict:
    """Engine keywords for a store that keeps the `labels` router's cache: {"summaries": ..., "labels": ...}, from the
    calibration file of `model_name` (calibrated first, by `calibrate`, when the file is missing). r defaults to
    2 * head_dim / block_size: the label cache then holds exactly Quest's min/max bytes per block."""
    from ..storage.summaries import DEFAULT_SUMMARIES
    r = r or 2 * head_dim // block_size
    path = default_path(model_name, r, root, tokens)
    if not path.exists():
        calibrate(model_name, r=r, block_size=block_size, tokens=tokens, root=root)
    return {"summaries": DEFAULT_SUMMARIES + ("klabel",), "labels": load_labels(path)}


def calibrate(model_name: str = "smollm2", r: int | None = None, block_size: int = 16, tokens: int = 2048,
              queries: int = 32, pairs: bool = True, root: str | Path = ".", out: str | Path | None = None) -> Path:
    """Calibrate `model_name`'s label channels on CALIBRATION_MODULES' text and write them (default_path unless
    `out`); returns the file. Runs at torch's current thread count."""
    import sparsekv as sk

    from ..model import fetch
    if model_name not in fetch.MODELS:
        raise ValueError(f"model_name must be one of {sorted(fetch.MODELS)}, got {model_name!r}")
    path = fetch.model_path(fetch.MODELS[model_name], root)
    model, tok = sk.load_model(path), sk.load_tokenizer(path)
    r = r or 2 * model.config.head_dim // block_size
    source = (f"docstrings of {len(CALIBRATION_MODULES)} standard-library modules (analysis.calibrate."
              f"CALIBRATION_MODULES, disjoint from every evaluation haystack): {tokens} prefilled tokens, "
              f"{queries} decode queries")
    print(f"calibrating {r} label channels per kv head of {path.name} on {source}", flush=True)
    t0 = time.perf_counter()
    engine = sk.Engine(model, block_size=block_size, num_blocks=tokens // block_size + 64, progress=False)
    imp = channel_importance(engine, tok, tokens, queries)
    labels = label_channels(imp, r, pairs=pairs, source=source)
    secs = time.perf_counter() - t0
    written = save_labels(out or default_path(model_name, r, root, tokens), labels,
                          {"model": path.name, "seconds": round(secs, 1), "tokens": tokens, "queries": queries,
                           "pairs": pairs, "block_size": block_size})
    print(f"wrote {written} in {secs:.1f}s")
    return Path(written)


def main(argv=None) -> int:
    from ..model import fetch
    ap = argparse.ArgumentParser(prog="python -m sparsekv calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(fetch.MODELS), default="smollm2")
    ap.add_argument("--channels", type=int, default=None, help="r label channels per kv head (default 2 * D / block)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--no-pairs", action="store_true", help="choose single channels, not RoPE pairs")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--root", default=".")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    calibrate(args.model, args.channels, args.block_size, args.tokens, args.queries, not args.no_pairs, args.root,
              args.out)
    return 0


__all__ = ["CALIBRATION_MODULES", "calibration_text", "channel_importance", "label_channels", "save_labels",
           "load_labels", "default_path", "store_kwargs", "calibrate"]
