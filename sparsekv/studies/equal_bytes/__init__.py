"""The equal-bytes study: lossless routing against lossy caches, asked once, the way a sceptical reviewer designs it.

    design     the methods, their knobs, the headline rule, the margin, the pre-listed contrasts (fixed before a run)
    run        one sweep cell: every method on every question of a block of documents -> tidy rows
    analysis   every finished cell as one table: curves with document-level intervals, headline cells from the
               pilot, the contrast table (Holm over the study's family)
    report     its figures: every family as a curve of accuracy against bytes read and held, the title's verdicts
    fast_memory  the third byte axis (fast memory held against stall per step)
    frontpage  the README's results table and figure, rendered from the committed rows (`python -m sparsekv frontpage`)

Notebook 24 is its parameters, narrative and plots; `sweeps/24_equal_bytes_*.yaml` are its grids; the committed
results folder is `results/equal_bytes/` (each cell's metrics and rows, never an executed notebook).
"""
