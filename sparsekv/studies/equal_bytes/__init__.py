"""The equal-bytes study: lossless routing against lossy caches, asked once, the way a sceptical reviewer designs it.

    design     the methods, their knobs, the headline rule, the margin, the pre-listed contrasts (fixed before a run)
    run        one sweep cell: every method on every question of a block of documents -> tidy rows
    analysis   every finished cell as one table: curves with document-level intervals, headline cells from the
               pilot, the contrast table (Holm over the study's family), figures

Notebook 24 is its parameters, narrative and plots; `sweeps/24_equal_bytes_*.yaml` are its grids; the committed
results folder is `results/equal_bytes/` (each cell's metrics and rows, never an executed notebook).
"""
