"""Why SnapKV answers so few passkey questions on SmolLM2-135M: what each press keeps of the asked fact, and what
the answer would be if the fact's tokens were kept.

    python -m benchmarks.snapkv_needle                      # study documents 500000..500001, ratios 0.5 and 0.875
    python -m benchmarks.snapkv_needle --seeds 500000 --ratios 0.5 --aware-only

Per (document, question, press, ratio, question-aware or not), through the study's own path (`analysis.peers`):
    correct     teacher-forced: every answer token is the argmax
    fact_kept   the share of the asked fact's token positions the cache kept, over layers and kv heads
    late_kept   the same over the upper half of the layers
    ref_agrees  SnapKV only: every kept position scores at least the float64 reference's k-th score and every dropped
                one at most it (`analysis.press_reference.snapkv_scores`)
    forced      SnapKV only: correct when the asked fact's positions are forced into SnapKV's kept set (the lowest-scored
                others make room), an oracle that separates "dropped the fact" from "broke the harness"
A diagnosis, not a timing: nothing is timed. The study runs its questions with `studies.equal_bytes.run`.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sparsekv as sk  # noqa: E402
from sparsekv.analysis import peers, press_reference, tasks  # noqa: E402
from sparsekv.model import fetch  # noqa: E402
from sparsekv.model.checkpoint import converted_folder  # noqa: E402


def _prefill(hf, ids, method, scores=None):
    """(dense cache, the method's cache) of `ids`; with `scores` (a dict), SnapKV's float64 reference scores per layer."""
    seen, handles = {}, []
    if scores is not None:
        for layer in hf.model.layers:
            handles.append(layer.self_attn.register_forward_hook(
                lambda mod, a, kw, out: seen.__setitem__(mod.layer_idx, kw["hidden_states"]), with_kwargs=True))
    try:
        caches = peers.prefill_caches(hf, ids, [peers.PeerMethod("dense", "dense"), method])
    finally:
        for h in handles:
            h.remove()
    if scores is not None:
        for i, h in seen.items():
            scores[i] = press_reference.snapkv_scores(hf.model.layers[i].self_attn, h, hf.config)
    return caches["dense"], caches[method.name]


def _keep(dense, idx):
    """A copy of `dense` holding, per layer, the positions idx[layer] (kv heads, n_kept)."""
    c = copy.deepcopy(dense)
    for layer, i in zip(c.layers, idx):
        g = i[None, :, :, None].expand(1, -1, -1, layer.keys.shape[-1])
        layer.keys, layer.values = layer.keys.gather(2, g).contiguous(), layer.values.gather(2, g).contiguous()
    return c


def _answer(hf, cache, q, aware: bool, T: int) -> bool:
    fed = ([q.ids[-1]] if aware else q.ids) + q.answer[:-1]
    logits = peers.feed(hf, copy.deepcopy(cache), fed, T)[len(fed) - len(q.answer):]
    return logits.argmax(-1).tolist() == list(q.answer)


def rows(hf, doc, press: str, ratio: float, aware: bool) -> list[dict]:
    out = []
    for q in doc.questions:
        ids = doc.ids + (q.ids[:-1] if aware else [])
        T, (a, b) = len(ids), doc.facts[q.facts[0]].span
        scores = {} if press == "SnapKVPress" else None
        dense, cache = _prefill(hf, ids, peers.PeerMethod("m", "evict", press, ratio), scores)
        mask = press_reference.kept_mask(dense, cache)                       # (layers, kv heads, T)
        r = {"doc": doc.seed, "fact": q.facts[0], "press": press, "ratio": ratio, "aware": aware,
             "correct": _answer(hf, cache, q, aware, T), "fact_kept": mask[..., a:b].float().mean().item(),
             "late_kept": mask[mask.shape[0] // 2:, :, a:b].float().mean().item()}
        if scores is not None:
            n_kept = int(mask[0, 0].sum())
            agree, forced = True, []
            for i, s in sorted(scores.items()):
                kth, slack = s.topk(n_kept, -1).values[:, -1:], 1e-6 * s[:, :-64].max()
                agree &= bool((s.masked_fill(~mask[i], 9.0) >= kth - slack).all()
                              and (s.masked_fill(mask[i], -1.0) <= kth + slack).all())
                s = s.clone()
                s[:, a:b] = s.max() + 2                                          # the oracle: the fact stays
                forced.append(s.topk(n_kept, -1).indices)
            r["ref_agrees"], r["forced"] = agree, _answer(hf, _keep(dense, forced), q, aware, T)
        out.append(r)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[500_000, 500_001])
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.875])
    p.add_argument("--presses", nargs="+", default=list(peers.PRESSES))
    p.add_argument("--aware-only", action="store_true", help="SnapKV question-aware only")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    path = fetch.model_path(fetch.SMOLLM2, ROOT)
    tok, hf = sk.load_tokenizer(path), peers.hf_model(converted_folder(path))
    configs = [("SnapKVPress", r, True) for r in args.ratios]
    if not args.aware_only:
        configs += [(press, r, False) for press in args.presses for r in args.ratios]
    print(f"{'press':24s} {'ratio':>5s} {'aware':>5s} {'correct':>8s} {'fact_kept':>9s} {'late_kept':>9s} "
          f"{'ref_agrees':>10s} {'forced':>7s}")
    for press, ratio, aware in configs:
        rs = [r for s in args.seeds for r in rows(hf, tasks.make("passkey", tok, args.length, 4, seed=s), press,
                                                  ratio, aware)]
        n = len(rs)
        mean = lambda k: sum(r[k] for r in rs) / n                               # noqa: E731
        extra = (f"{sum(r['ref_agrees'] for r in rs):>6d}/{n:<3d} {sum(r['forced'] for r in rs):>3d}/{n:<3d}"
                 if "forced" in rs[0] else "")
        print(f"{press:24s} {ratio:5.3f} {str(aware):>5s} {sum(r['correct'] for r in rs):>4d}/{n:<3d} "
              f"{mean('fact_kept'):9.2f} {mean('late_kept'):9.2f} {extra}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
