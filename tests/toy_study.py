"""A toy study in one file: what adding a study takes (issue 54). It holds the three parts every study holds, built on
the layers below it and nothing else: its run (`analysis`' probes and metrics, a `Router`), its report (a figure
through `suite.viz`, whose canvas checks it must pass, and the notebook's `Checks`) and its findings (a `Finding`
read from its metrics file). In the package it would be `sparsekv/studies/<name>.py` (a folder once it has more
parts), beside its notebook, with one line in `studies.findings.catalog` for its findings to reach the page; the
suite does not change.

Its question: on planted needles with near-duplicate distractor blocks, does `minmax` keep more of the attention
mass than `mean` at one token budget? Each probe seed is a document; the comparison is paired by document.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

import sparsekv as sk
from sparsekv.analysis import metrics as am
from sparsekv.analysis import probes
from sparsekv.studies.findings.finding import Finding
from sparsekv.suite import viz
from sparsekv.suite.report import Checks

STEM = "99_toy_study"            # its notebook's name, which keys its metrics file and its findings


@dataclass(frozen=True)
class ToyConfig:
    scorers: tuple[str, ...] = ("minmax", "mean")
    budget: int = 128            # tokens each router reads per step
    docs: int = 8                # probe seeds, one per document
    length: int = 1024           # tokens per document
    block_size: int = 16
    distractor_sim: float = 0.3  # near-duplicates of the needle: a block mean fools `mean` past 1 / block_size


# -- the run -----------------------------------------------------------------------------------------

def run(cfg: ToyConfig) -> dict[str, np.ndarray]:
    """Each scorer's attention-mass recall per document: {scorer: float64 array of shape (docs,)}, in [0, 1]."""
    out: dict[str, list[float]] = {s: [] for s in cfg.scorers}
    for d in range(cfg.docs):
        p = probes.needle(probes.ProbeConfig(length=cfg.length, head_dim=64, seed=d), depth=(d + 0.5) / cfg.docs,
                          distractor_sim=cfg.distractor_sim, distractor_blocks=8, block_size=cfg.block_size)
        store = sk.BlockStore(sk.StoreConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=cfg.block_size,
                                             num_blocks=cfg.length // cfg.block_size + 1))
        seq = p.write(store)
        for s in cfg.scorers:
            out[s].append(am.evaluate(sk.Router(s, token_budget=cfg.budget), p.q, store, seq, 0).mass_recall)
    return {s: np.asarray(v, dtype=np.float64) for s, v in out.items()}


# -- the report --------------------------------------------------------------------------------------

def metrics(res: dict[str, np.ndarray]) -> dict[str, float]:
    """The metrics file's numbers: each scorer's mean recall, the documents, and the paired difference's t-test p."""
    a, b = res["minmax"], res["mean"]
    return {"docs": len(a), "recall.minmax": float(a.mean()), "recall.mean": float(b.mean()),
            "minmax_minus_mean": float((a - b).mean()), "minmax_vs_mean.p": float(stats.ttest_rel(a, b).pvalue)}


def figure(res: dict[str, np.ndarray], path: str | Path):
    """Each document's recall per scorer, paired by a grey line, with each scorer's mean."""
    import matplotlib.pyplot as plt
    m = metrics(res)
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(res)
    for d in range(len(res[names[0]])):
        ax.plot(range(len(names)), [res[s][d] for s in names], color="0.8", lw=0.8, zorder=1)
    for i, s in enumerate(names):
        ax.scatter([i] * len(res[s]), res[s], color=viz.router_color(s), label=f"{s} (mean {res[s].mean():.2f})",
                   zorder=2)
    ax.set(xticks=range(len(names)), xticklabels=names, ylim=(0, 1.05), xlabel="router",
           ylabel="attention mass selected (share of dense)")
    viz.legend_outside(ax)
    ax.set_title(f"minmax keeps {m['minmax_minus_mean']:+.2f} of the mass over mean, paired over {m['docs']} documents",
                 fontsize=9)
    return viz.save(fig, path)


def checks(res: dict[str, np.ndarray]) -> Checks:
    c = Checks()
    every = np.concatenate(list(res.values()))
    c.invariant("every recall is a share of the mass (min over documents and routers)", every.min(), ">=", 0)
    c.invariant("every recall is a share of the mass (max over documents and routers)", every.max(), "<=", 1 + 1e-6)
    c.hypothesis("minmax keeps more of the mass than mean (paired t-test p)", metrics(res)["minmax_vs_mean.p"], "<",
                 0.05)
    return c


# -- the findings ------------------------------------------------------------------------------------

FINDINGS = (
    Finding("On {docs} planted needles with near-duplicate distractors, `minmax` keeps {a:.2f} of the attention mass "
            "and `mean` {b:.2f} at the same budget.",
            {"docs": (STEM, "docs"), "a": (STEM, "recall.minmax"), "b": (STEM, "recall.mean")}),
)
