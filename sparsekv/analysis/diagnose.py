"""Why Quest's bound is loose on real keys: its slack per RoPE frequency band, measured on a model's own q and k.

Quest scores block b by U_b = sum_c max(q_c min_c, q_c max_c) (min and max over the block's keys, post-RoPE), an
upper bound on the block's best q.k. Its slack, U_b - max_t q.k_t, splits exactly into per-channel terms
u_c - q_c k_{t*,c} >= 0 (t* the block's best key), so each channel's share of the slack is measured, not assumed.
Channels are grouped by how far their RoPE pair turns within one block, block_size * omega_i (omega_i =
theta^(-2i/D), channel c in pair c mod D/2):
    "fast"   at least pi: within one block the pair sweeps half a turn or more, so min/max span about +-|k|;
    "mid"    pi/4 to pi;
    "slow"   under pi/4: the pair barely turns inside a block, and the bound is as tight as the content allows.
A counterfactual tests the RoPE hypothesis directly: the bound with the fast band's terms replaced by q . mean
("slow bound": min/max where the bound is informative, MoBA's mean where it is not), ranked against the oracle.

    rows = slack_profile(engine, seq, tokens, budget_blocks=8)     # one row per (step, layer, kv head)
"""
from __future__ import annotations

import math

import torch

from ..routing.mass import block_attention_mass

BANDS = ("fast", "mid", "slow")


def rope_bands(inv_freq: torch.Tensor, block_size: int) -> torch.Tensor:
    """[D] band index (0 fast, 1 mid, 2 slow) of every channel, from the rotary inverse frequencies [D / 2]."""
    turn = block_size * inv_freq.double()                                     # radians a pair turns in one block
    band = torch.where(turn >= math.pi, 0, torch.where(turn >= math.pi / 4, 1, 2))
    return torch.cat([band, band])


def block_slack(q: torch.Tensor, k: torch.Tensor, block_size: int, bands: torch.Tensor) -> dict:
    """Quest's slack on one kv head: q [G, D] (its query heads), k [N, D] its keys (post-RoPE), float64 inside.

    Returns {"slack": [G, nb] U_b - max_t q.k_t (>= 0, in q.k units), "by_band": [3, G, nb] the slack's exact split
    over BANDS, "bound": [G, nb] U_b, "slow_bound": [G, nb] the counterfactual (fast band scored by q . mean)}."""
    q, k = q.double(), k.double()
    N, D = k.shape
    nb = -(-N // block_size)
    pad = nb * block_size - N
    kp = torch.cat([k, k[-1:].expand(pad, D)]) if pad else k                 # repeat the last key: same min/max
    blocks = kp.view(nb, block_size, D)
    lo, hi = blocks.amin(1), blocks.amax(1)                                  # [nb, D]
    u = torch.maximum(q[:, None] * lo[None], q[:, None] * hi[None])          # [G, nb, D]
    s = q @ kp.T                                                             # [G, nb * bs]
    valid = torch.arange(nb * block_size) < N
    best = torch.where(valid, s, -torch.inf).view(-1, nb, block_size).argmax(-1)   # [G, nb]
    t_star = best + torch.arange(nb)[None] * block_size
    m = q[:, None] * kp[t_star]                                              # [G, nb, D]
    per_channel = u - m                                                      # >= 0 each
    by_band = torch.stack([per_channel[..., bands == b].sum(-1) for b in range(3)])
    mean = torch.stack([kp[i * block_size:min(N, (i + 1) * block_size)].mean(0) for i in range(nb)])
    fast = bands == 0
    slow_bound = u[..., ~fast].sum(-1) + (q[:, None, fast] * mean[None, :, fast]).sum(-1)
    return {"slack": per_channel.sum(-1), "by_band": by_band, "bound": u.sum(-1), "slow_bound": slow_bound}


def _recall(mass: torch.Tensor, scores: torch.Tensor, k: int) -> float:
    """Attention mass kept by each query head's top-k blocks under `scores` ([G, nb]); the mean over heads."""
    top = scores.topk(min(k, scores.shape[1]), dim=-1).indices
    return float(torch.gather(mass, 1, top).sum(-1).mean())


def slack_profile(engine, seq, tokens: list[int], budget_blocks: int) -> list[dict]:
    """Dense decode of `tokens` on a fork of `seq`; at every global layer and kv head, Quest's slack by band and the
    mass that the top `budget_blocks` blocks keep under the oracle, Quest's bound and the slow-band bound.

    Rows {step, layer, head, slack, fast, mid, slow (shares of the slack), recall_oracle, recall_minmax,
    recall_slow_bound}. Needs the model's rotary frequencies (`Model.inv_freq`)."""
    from .observe import observe_decode
    store, rows = engine.store, []
    bs = store.config.block_size
    bands = rope_bands(engine.model.inv_freq, bs)          # global layers' base (sliding layers are skipped)

    def observe(child, step: int, layer: int, q: torch.Tensor) -> None:
        v = store.view(child, layer)
        if v.window:
            return
        k, _ = v.store.gather(v.seq, v.layer)                                 # [N, H, D]
        H, D = k.shape[1], k.shape[2]
        G = q.shape[0] // H
        mass = block_attention_mass(q, v.store, v.seq, v.layer).double()     # [Hq, nb]
        for h in range(H):
            r = block_slack(q[h * G:(h + 1) * G], k[:, h], bs, bands)
            total = r["slack"].sum()
            share = (r["by_band"].sum((1, 2)) / total).tolist() if total > 0 else [0.0, 0.0, 0.0]
            mh = mass[h * G:(h + 1) * G]
            rows.append({"step": step, "layer": layer, "head": h, "slack": float(r["slack"].mean() / math.sqrt(D)),
                         **dict(zip(BANDS, share)), "recall_oracle": _recall(mh, mh, budget_blocks),
                         "recall_minmax": _recall(mh, r["bound"], budget_blocks),
                         "recall_slow_bound": _recall(mh, r["slow_bound"], budget_blocks)})

    observe_decode(engine, seq, tokens, observe)
    return rows


__all__ = ["BANDS", "rope_bands", "block_slack", "slack_profile"]
