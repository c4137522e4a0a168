"""Pictures of the store that the notebooks share: block tables and the physical pool.

matplotlib is imported inside each function, so importing sparsekv does not need it.
"""
from __future__ import annotations

from .store import BlockStore, Sequence


def plot_block_tables(store: BlockStore, seqs: dict[str, Sequence], ax_tables=None, ax_pool=None):
    """Left: each sequence's block table (logical -> physical id). Right: the physical pool
    coloured by ref count, so shared blocks (ref count > 1) stand out. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    if ax_tables is None or ax_pool is None:
        fig, (ax_tables, ax_pool) = plt.subplots(1, 2, figsize=(12, 0.6 * len(seqs) + 2.5),
                                                 gridspec_kw={"width_ratios": [3, 2]})
    fig = ax_tables.figure
    refs = store.pool.ref_counts
    cmap = ListedColormap(["#eeeeee", "#9ecae1", "#fd8d3c", "#e6550d", "#a63603"])
    width = max(s.num_blocks for s in seqs.values())
    grid = np.full((len(seqs), width), np.nan)
    for r, (name, s) in enumerate(seqs.items()):
        for j, b in enumerate(s.block_ids):
            grid[r, j] = min(refs[b], 4)
            ax_tables.text(j, r, str(b), ha="center", va="center", fontsize=8)
    ax_tables.imshow(grid, cmap=cmap, vmin=0, vmax=4, aspect="auto")
    ax_tables.set_yticks(range(len(seqs)), list(seqs))
    ax_tables.set_xlabel("logical block (text: physical block id)")
    ax_tables.set_title("block tables (colour: ref count)")
    side = int(np.ceil(np.sqrt(store.config.num_blocks)))
    pool = np.zeros(side * side)
    pool[: store.config.num_blocks] = [min(r, 4) for r in refs]
    ax_pool.imshow(pool.reshape(side, side), cmap=cmap, vmin=0, vmax=4)
    ax_pool.set_title(f"physical pool: {store.num_free_blocks}/{store.config.num_blocks} free")
    ax_pool.set_xticks([]), ax_pool.set_yticks([])
    fig.tight_layout()
    return fig
