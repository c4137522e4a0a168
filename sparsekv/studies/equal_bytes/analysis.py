"""Every finished cell of the equal-bytes study read as one table, and what may be said from it.

    load_rows(*folders)        every cell's rows (`run.COLUMNS`) under the folders, one DataFrame
    dense_cells(pilot)         per (model, length, task): sparsekv dense's pilot accuracy, documents, and whether it
                               is a headline cell (`design.HEADLINE_MIN`)
    curves(rows)               per (model, length, task, method): documents, questions, accuracy with a cluster
                               bootstrap interval over documents, bytes read and held, mean answer KL
    contrast_table(rows, ...)  the pre-listed contrasts of every headline cell with enough documents, one Holm family
    coverage(rows)             documents finished per (model, length, task) and method: what the grid still owes
    compute(*folders, ...)     what the finished cells cost per (model, length, task, split): cells, documents,
                               core-hours, core-minutes per document; the fast-memory runs beside them

A headline cell needs MIN_DOCS documents (the unit of replication) in every method it compares; below that its
contrasts are listed as owed, never tested.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...analysis import clustered
from . import design as dz

if TYPE_CHECKING:                      # pandas is imported where it is used (the `sweep` extra)
    import pandas as pd

MIN_DOCS = 30
KEYS = ["model", "length", "task"]


def load_rows(*folders) -> "pd.DataFrame":
    """Every `*.rows.csv` under the folders (a sweep's `cells/KEY/` folders, or any folder), concatenated; a
    question answered twice by one method (a cell run twice) is kept once."""
    import pandas as pd
    files = sorted(f for d in folders if d for f in Path(d).rglob("*.rows.csv"))
    if not files:
        return pd.DataFrame(columns=["model", "length", "task", "split", "doc", "question", "method", "correct"])
    df = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    return df.drop_duplicates(["model", "length", "task", "split", "doc", "question", "method"], keep="last")


def load_fast_memory(folder) -> "pd.DataFrame":
    """Every fast-memory row (`fast_memory.run_document`, `fast_memory_*.csv` under `folder`), one DataFrame, with
    the CPU its run recorded (`cpu`, from the .json beside it: stall is a timing of that machine); empty when there
    are none (or `folder` is "" or missing)."""
    import json

    import pandas as pd
    files = sorted(Path(folder).rglob("fast_memory_*.csv")) if folder and Path(folder).is_dir() else []
    parts = []
    for f in files:
        meta = f.with_suffix(".json")
        cpu = json.loads(meta.read_text()).get("machine", {}).get("cpu", "") if meta.exists() else ""
        parts.append(pd.read_csv(f).assign(cpu=cpu or "unrecorded"))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def dense_cells(pilot, threshold: float = dz.HEADLINE_MIN) -> "pd.DataFrame":
    """Per (model, length, task) of the pilot rows: sparsekv dense's accuracy (pooled over questions), its cluster
    bootstrap 95% interval, documents, questions, and "headline" (accuracy >= threshold)."""
    import pandas as pd
    out = []
    d = pilot[(pilot["method"] == "dense")]
    for key, g in d.groupby(KEYS):
        a = clustered.accuracy(g["correct"].astype(float).to_numpy(), g["doc"].to_numpy())
        out.append({**dict(zip(KEYS, key)), "docs": g["doc"].nunique(), "questions": len(g), "dense": a.estimate,
                    "lo": a.lo, "hi": a.hi, "headline": bool(a.estimate >= threshold)})
    return pd.DataFrame(out, columns=KEYS + ["docs", "questions", "dense", "lo", "hi", "headline"])


def curves(rows) -> "pd.DataFrame":
    """One row per (model, length, task, method) with its line, family, knob, rule, docs, questions, accuracy and a
    95% cluster-bootstrap interval (documents resampled), bytes read and held (shares of bf16 dense) and the mean
    answer-token KL to its engine's dense (nats)."""
    import pandas as pd
    out = []
    for key, g in rows.groupby(KEYS + ["method"]):
        if len(g) == 0:
            continue
        docs = g["doc"].to_numpy()
        c = g["correct"].astype(float).to_numpy()
        if g["doc"].nunique() >= 2:
            a = clustered.accuracy(c, docs)
            est, lo, hi = a.estimate, a.lo, a.hi
        else:                                          # one document: no interval over documents exists
            est, lo, hi = float(c.mean()), float("nan"), float("nan")
        first = g.iloc[0]
        out.append({**dict(zip(KEYS + ["method"], key)), "line": first["line"], "family": first["family"],
                    "engine": first["engine"], "knob": first["knob"], "rule": first["rule"],
                    "kv_bits": first["kv_bits"], "docs": g["doc"].nunique(), "questions": len(g), "accuracy": est,
                    "lo": lo, "hi": hi, "read": first["read"], "held": first["held"],
                    "kl": float(np.nanmean(g["kl"].astype(float))) if g["kl"].notna().any() else float("nan")})
    return pd.DataFrame(out)


def coverage(rows) -> "pd.DataFrame":
    """Documents finished per (model, length, task, split) and the fewest over its methods: what the grid owes."""
    g = rows.groupby(KEYS + ["split", "method"])["doc"].nunique().reset_index()
    return g.groupby(KEYS + ["split"])["doc"].agg(["min", "max"]).rename(
        columns={"min": "docs (fewest method)", "max": "docs (most)"}).reset_index()


def compute(*folders, fast_memory=None) -> "pd.DataFrame":
    """The compute the study's finished cells took, per (model, length, task, split): cells, documents (those in
    the cells' rows), core-hours (each cell's wall time x the threads its sweep gave it, `suite.sweep.compute`) and
    core-minutes per document. Fast-memory runs (`fast_memory_*.json` under `fast_memory`: wall time x threads)
    are rows of split "fast memory"; the pilot's cells are one row per (model, length). A last row, "all", sums
    every row. Documents are those in each cell's or run's rows, summed: a document run twice (a fast-memory cell
    timed on two machines) counts twice. Keys come from the rows, so the names match
    `curves` and `coverage`."""
    import json

    import pandas as pd

    from ...suite import sweep
    out = []
    for _, c in sweep.compute(*folders).iterrows():
        files = sorted(Path(c["folder"]).glob("*.rows.csv"))
        if not files:
            continue
        r = pd.read_csv(files[0], usecols=KEYS + ["split", "doc"])
        out.append({**{k: r[k].iloc[0] for k in KEYS + ["split"]}, "docs": r["doc"].nunique(),
                    "core_seconds": c["core_seconds"]})
    for f in sorted(Path(fast_memory).rglob("fast_memory_*.json")) if fast_memory and Path(fast_memory).is_dir() \
            else []:
        run = json.loads(f.read_text())
        r = pd.read_csv(f.with_suffix(".csv"), usecols=KEYS + ["doc"])
        out.append({**{k: r[k].iloc[0] for k in KEYS}, "split": "fast memory", "docs": r["doc"].nunique(),
                    "core_seconds": float(run["seconds"]) * int(run["machine"]["threads"])})
    cols = KEYS + ["split", "cells", "docs", "core_hours", "core_min_per_doc"]
    if not out:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(out)
    pilot = df["split"] == "pilot"                 # one row per (model, length): the pilot's cells are small
    df.loc[pilot, "task"] = df[pilot].groupby(["model", "length"])["task"].transform(
        lambda t: f"every pilot task ({t.nunique()})")
    g = df.groupby(KEYS + ["split"], sort=False).agg(cells=("docs", "size"), docs=("docs", "sum"),
                                                     core_seconds=("core_seconds", "sum")).reset_index()
    total = {**{k: "all" for k in KEYS + ["split"]}, "cells": int(g["cells"].sum()), "docs": int(g["docs"].sum()),
             "core_seconds": float(g["core_seconds"].sum())}
    g = pd.concat([g, pd.DataFrame([total])], ignore_index=True)
    g["core_hours"] = g["core_seconds"] / 3600
    g["core_min_per_doc"] = (g["core_seconds"] / 60 / g["docs"]).where(g["split"] != "all")
    return g[cols]


def cell_name(model: str, length: int, task: str) -> str:
    return f"{model} {length // 1024}k {task}" if length % 1024 == 0 else f"{model} {length} {task}"


def plan(rows, headline, design: dz.Design = dz.Design()) -> clustered.ContrastPlan | None:
    """The study's one family: every headline cell's pre-listed contrasts (`design.contrasts`) whose methods have
    MIN_DOCS documents. Headline cells come from the pilot (`dense_cells`), never from these rows. None when no
    contrast is ready."""
    out = []
    for _, h in headline[headline["headline"]].iterrows():
        g = rows[(rows["model"] == h["model"]) & (rows["length"] == h["length"]) & (rows["task"] == h["task"])
                 & (rows["split"] == "study")]
        if g.empty:
            continue
        docs = g.groupby("method")["doc"].nunique()
        nbytes = {m: {"read": x["read"], "held": x["held"]} for m, x in g.groupby("method").first().iterrows()
                  if docs[m] >= MIN_DOCS}
        out += dz.contrasts(cell_name(h["model"], h["length"], h["task"]), nbytes, design)
    return clustered.ContrastPlan(out) if out else None


def owed(rows, headline, design: dz.Design = dz.Design()) -> "pd.DataFrame":
    """The headline cells' contrasts not yet testable: each with the documents its methods have so far."""
    import pandas as pd
    out = []
    for _, h in headline[headline["headline"]].iterrows():
        g = rows[(rows["model"] == h["model"]) & (rows["length"] == h["length"]) & (rows["task"] == h["task"])
                 & (rows["split"] == "study")]
        nbytes = {m: {"read": x["read"], "held": x["held"]} for m, x in g.groupby("method").first().iterrows()}
        docs = g.groupby("method")["doc"].nunique()
        for c in dz.contrasts(cell_name(h["model"], h["length"], h["task"]), nbytes, design):
            n = int(min(docs.get(c.method_a, 0), docs.get(c.method_b, 0)))
            if n < MIN_DOCS:
                out.append({"contrast": c.name, "documents": n, "needed": MIN_DOCS})
    return pd.DataFrame(out, columns=["contrast", "documents", "needed"])


def contrast_table(rows, headline, design: dz.Design = dz.Design()) -> clustered.ContrastTable | None:
    """Evaluate `plan(rows, headline)`: each contrast on the questions both its methods answered (matched by
    document and question), Holm over the whole family; None when no contrast is ready."""
    p = plan(rows, headline, design)
    if p is None:
        return None
    study = rows[rows["split"] == "study"]
    by_cell = {cell_name(m, n, t): g for (m, n, t), g in study.groupby(KEYS)}     # each row named once, not per contrast
    pairs = {}
    for c in p.contrasts:
        g = by_cell[c.name.split(":")[0]]
        a = g[g["method"] == c.method_a].set_index(["doc", "question"])["correct"]
        b = g[g["method"] == c.method_b].set_index(["doc", "question"])["correct"]
        common = a.index.intersection(b.index).sort_values()
        pairs[c.name] = (a[common].astype(float).to_numpy(), b[common].astype(float).to_numpy(),
                         np.array([d for d, _ in common]))
    return p.evaluate_pairs(pairs)


__all__ = ["MIN_DOCS", "load_rows", "dense_cells", "curves", "coverage", "compute", "cell_name", "plan", "owed",
           "contrast_table"]
