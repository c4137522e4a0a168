"""Parameter sweeps over a notebook on Ray: `python -m sparsekv sweep NOTEBOOK --grid GRID.yaml [--address ADDR]`.

A grid (YAML) names parameter lists, whose product is taken, and/or explicit cells, each overlaid on `base`:

    base:   {progress: false}                  # every cell's parameters start from these
    params: {block_size: [16, 64], budgets: [[64], [256]]}   # the product: 4 cells
    cells:  [{block_size: 32, budgets: [128]}]               # and any cell written out
    threads: 1                                  # torch/OpenMP threads per cell, and the CPUs Ray gives it
    gpus: 0                                     # GPUs Ray gives each cell (1 for a GPU notebook)
    pin: equal-bytes-1                          # optional: the cells' code version, declared (see below)

Each cell is one papermill execution of the notebook with those parameters, as one Ray task. Every parameter is
checked against the notebook's `parameters` cell before anything runs: an unknown name or a value of another type
than the default's (an int where a list is expected) is a ValueError/TypeError naming it.

Without `--address`, Ray starts embedded on this machine with as many CPUs as the cores (`--workers` caps it);
`--address auto` or `ray://host:port` runs the same command on a cluster, whose nodes need this package installed.

The cache key of a cell is a hash of the notebook's cells (their source, not their outputs), the cell's parameters
and the package version: change any of them and the cell runs again; change nothing and a re-run skips it. A grid
that spans sessions declares `pin` instead: its key is then a hash of the notebook's name, the parameters and the pin
alone, so an edit elsewhere in the package (or to the notebook's analysis cells) keeps the finished cells, and
bumping the pin is the one way to rerun them all. A pin is a promise that the code computing a cell is unchanged;
each cell's `status.json` records the package version it really ran, so the promise can be audited. A
cell's folder `DIR/cells/KEY/` holds `params.json`, the executed notebook, `metrics.json` and `status.json`,
written in a scratch folder and moved into place in one rename, so an interrupted sweep (Ctrl-C, a killed worker)
loses at most the cells in flight. A failing cell records its error and traceback in `status.json` and the others
go on; failed cells run again on the next invocation.

`load(DIR)` returns every finished cell's metrics as one tidy pandas DataFrame (one row per cell and metric, the
cell's parameters as columns); the sweep also writes it to `DIR/results.parquet` (CSV where pyarrow is missing).
`compute(DIR, ...)` lists what each finished cell cost (wall seconds, threads, core-seconds).
`plot(df, metric, x, by=None)` draws one metric against one parameter, a line per value of another, with the
notebook's own interval where it records one (metrics `M.ci_lo`, `M.ci_hi`); `suite.explorers.sweep_explorer(DIR)`
opens a finished sweep in JupyterLab.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .params import check as check_parameters

INJECTED = ("figures_dir", "metrics_path")       # set by the runner for every cell, never by a grid
SOURCE_SUFFIXES = {".py", ".cpp", ".h", ".cu", ".cuh"}


# -- the grid ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Grid:
    """A sweep's cells (parameter dicts, in order, without duplicates) and each cell's resources."""

    cells: tuple[dict, ...]
    threads: int = 1
    gpus: int = 0
    pin: str | None = None

    @classmethod
    def from_dict(cls, spec: dict) -> "Grid":
        if not isinstance(spec, dict):
            raise TypeError(f"grid must be a mapping with base/params/cells, got {type(spec).__name__}")
        unknown = sorted(set(spec) - {"base", "params", "cells", "threads", "gpus", "pin"})
        if unknown:
            raise ValueError(f"grid keys must be base, params, cells, threads, gpus, pin; got unknown {unknown}")
        base = spec.get("base") or {}
        params = spec.get("params") or {}
        explicit = spec.get("cells") or []
        if not isinstance(base, dict) or not isinstance(params, dict) or not isinstance(explicit, list):
            raise TypeError("grid: base and params must be mappings and cells a list of mappings")
        for name, values in params.items():
            if not isinstance(values, list) or not values:
                raise TypeError(f"grid params.{name} must be a non-empty list of values, got {values!r}")
        cells = [dict(base, **dict(zip(params, combo))) for combo in itertools.product(*params.values())] \
            if params else []
        for i, c in enumerate(explicit):
            if not isinstance(c, dict):
                raise TypeError(f"grid cells[{i}] must be a mapping of parameters, got {type(c).__name__}")
            cells.append(dict(base, **c))
        if not cells:
            raise ValueError("grid has no cells: give params (lists, their product is taken) or cells")
        cells = [check_parameters(c, f"grid cell {i}") for i, c in enumerate(cells)]    # JSON values (suite.params)
        seen, unique = set(), []
        for c in cells:
            k = json.dumps(c, sort_keys=True)
            if k not in seen:
                seen.add(k)
                unique.append(c)
        threads, gpus = spec.get("threads", 1), spec.get("gpus", 0)
        for name, v, lo in (("threads", threads, 1), ("gpus", gpus, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"grid {name} must be an int >= {lo}, got {v!r}")
        pin = spec.get("pin")
        if pin is not None and (not isinstance(pin, str) or not pin.strip()):
            raise ValueError(f"grid pin must be a non-empty string (the cells' declared code version), got {pin!r}")
        return cls(tuple(unique), threads, gpus, pin)

    @classmethod
    def load(cls, path: str | Path) -> "Grid":
        import yaml
        return cls.from_dict(yaml.safe_load(Path(path).read_text()))


def notebook_parameters(path: str | Path) -> dict:
    """{name: default} of the notebook's cell tagged `parameters` (literal values only)."""
    nb = json.loads(Path(path).read_text())
    cells = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise ValueError(f"{path} has no cell tagged 'parameters': papermill cannot set its parameters")
    out = {}
    for node in ast.parse("".join(cells[0]["source"])).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                out[node.targets[0].id] = None          # a computed default: any value is accepted
    return out


def _type_ok(default, value) -> bool:
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def validate(grid: Grid, notebook: str | Path) -> None:
    """Raise before anything runs if a cell holds a value that is not JSON (`suite.params`), names a parameter the
    notebook lacks, sets an injected one, or gives a value of another type than the notebook's default."""
    defaults = notebook_parameters(notebook)
    for i, cell in enumerate(grid.cells):
        check_parameters(cell, f"cell {i} ({Path(notebook).stem})")        # JSON values, at every depth (suite.params)
        for name, value in cell.items():
            if name in INJECTED:
                raise ValueError(f"cell {i}: {name} is set by the sweep itself (each cell's own folder)")
            if name not in defaults:
                raise ValueError(f"cell {i}: {Path(notebook).name} has no parameter {name!r}; "
                                 f"it has {sorted(k for k in defaults if k not in INJECTED)}")
            if not _type_ok(defaults[name], value):
                raise TypeError(f"cell {i}: parameter {name} must be a {type(defaults[name]).__name__} like its "
                                f"default {defaults[name]!r}, got {type(value).__name__} {value!r}")


def package_version() -> str:
    """The installed version, plus a digest of the package's own source files (`+src.` 12 hex digits).

    The digest makes the cache key follow the code in an editable install, where the version number stays put
    while the code under it changes: a cell re-runs after any edit to sparsekv's Python, C++ or CUDA sources."""
    from importlib import metadata
    try:
        version = metadata.version("sparsekv")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    return f"{version}+src.{source_digest()}"


def source_digest() -> str:
    """12 hex digits of sha256 over the relative path and bytes of every source file of the sparsekv package."""
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(p for p in pkg.rglob("*") if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def cell_key(notebook: str | Path, params: dict, version: str | None = None, env: dict | None = None,
             pin: str | None = None) -> str:
    """16 hex digits of sha256 over the notebook's cell sources, the parameters, the package version (with its
    source digest) and, where given, the environment the cell's kernel is forced into (`cpuconfig`). With `pin` (a
    grid's declared code version): over the notebook's name, the parameters and the pin only."""
    if pin is not None:
        spec = {"notebook": Path(notebook).name, "params": params, "pin": pin}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    nb = json.loads(Path(notebook).read_text())
    source = [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]
    spec = {"source": source, "params": params, "version": version or package_version()}
    if env:
        spec["env"] = env
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


# -- one cell ----------------------------------------------------------------------------------

def run_cell(notebook: str, params: dict, cell_dir: str, threads: int, timeout: int,
             figures_dir: str | None = None, env: dict | None = None) -> dict:
    """Execute one cell into `cell_dir` atomically; returns its status record. Runs in a Ray worker (or inline).

    threads: the kernel's OMP/MKL threads (the CPUs Ray reserved). figures_dir: where the notebook draws (default
    the cell's own `figures/`). env: more variables for the kernel (a `cpuconfig` configuration)."""
    from .notebook import run_notebook
    final = Path(cell_dir)
    scratch = final.parent / f".{final.name}.{os.getpid()}.{time.time_ns()}"
    scratch.mkdir(parents=True)
    t0 = time.time()
    env = {**(env or {}), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    try:
        run = run_notebook(Path(notebook), scratch, Path(figures_dir) if figures_dir else scratch / "figures", params,
                           timeout=timeout, env=env)
        status = {"status": run.status, "error": run.error, "traceback": run.detail, "seconds": run.seconds}
        if run.metrics_path.exists():
            os.replace(run.metrics_path, scratch / "metrics.json")
    except Exception as exc:                # the runner itself failed (a missing kernel, a full disk)
        status = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                  "seconds": time.time() - t0}
    status.update(params=params, notebook=Path(notebook).name, finished=time.time(), pid=os.getpid(), threads=threads,
                  version=package_version())
    (scratch / "params.json").write_text(json.dumps(params, indent=1, sort_keys=True))
    (scratch / "status.json").write_text(json.dumps(status, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(scratch, final)
    return status


def running(cells: Path, keys: set[str], since: int) -> int:
    """How many of the cells `keys` are executing now: those with a scratch folder (`.KEY.PID.NS`, made when
    `run_cell` starts and renamed into place when it ends) started at or after `since` (time.time_ns(); older
    ones are left by an interrupted run)."""
    live = set()
    for d in cells.iterdir() if cells.is_dir() else ():
        parts = d.name.split(".")
        if d.name.startswith(".") and len(parts) == 4 and parts[1] in keys and parts[3].isdigit() \
                and int(parts[3]) >= since:
            live.add(parts[1])
    return len(live)


def cell_status(cell_dir: Path) -> dict | None:
    """The status record of a finished cell, or None."""
    path = cell_dir / "status.json"
    return json.loads(path.read_text()) if path.exists() else None


# -- the sweep ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """One cell to run: a notebook with parameters, into `out/cells/key/`.

    cpus: the CPUs Ray reserves and the threads the kernel runs, or None for all of one node's CPUs, so that the
    cell runs alone on its node (a notebook whose findings are timings). figures_dir: where it draws (None: its
    cell folder). env: variables its kernel is forced into (part of the key)."""

    key: str
    notebook: Path
    params: dict
    cpus: int | None = 1
    gpus: int = 0
    figures_dir: Path | None = None
    env: dict = field(default_factory=dict)


@dataclass
class SweepResult:
    out: Path
    keys: list[str]
    ran: list[str] = field(default_factory=list)          # cells executed by this call
    skipped: list[str] = field(default_factory=list)      # finished before this call
    failed: list[str] = field(default_factory=list)

    def table(self):
        return load(self.out)


def sweep(notebook: str | Path, grid: Grid, out: str | Path, address: str | None = None, workers: int | None = None,
          timeout: int = 1800, progress: bool = True) -> SweepResult:
    """Run every cell of `grid` not already finished in `out`, as Ray tasks; returns what ran, was skipped, failed.

    Validation comes first (nothing starts on a bad grid). Embedded Ray (`address=None`) gets `workers` CPUs
    (default: this machine's cores); each task asks for `grid.threads` CPUs and `grid.gpus` GPUs.
    """
    notebook = Path(notebook).resolve()
    if not notebook.exists():
        raise FileNotFoundError(f"notebook {notebook} does not exist")
    validate(grid, notebook)
    out = Path(out).resolve()
    version = package_version()
    jobs = [Job(cell_key(notebook, c, version, pin=grid.pin), notebook, c, grid.threads, grid.gpus)
            for c in grid.cells]
    (out / "cells").mkdir(parents=True, exist_ok=True)
    shown = notebook.relative_to(Path.cwd()) if notebook.is_relative_to(Path.cwd()) else notebook   # no machine path
    (out / "grid.json").write_text(json.dumps({"notebook": str(shown), "cells": {j.key: j.params for j in jobs},
                                               "threads": grid.threads, "gpus": grid.gpus, "pin": grid.pin},
                                              indent=1))
    return run_jobs(jobs, out, address, workers, timeout, progress, desc=f"sweep {notebook.stem}")


def run_jobs(jobs: list[Job], out: str | Path, address: str | None = None, workers: int | None = None,
             timeout: int = 1800, progress: bool = True, desc: str = "sweep") -> SweepResult:
    """Run the jobs not already finished in `out/cells/`, as Ray tasks, then write the results table.

    A job whose cell folder holds an ok status is skipped; a failed or missing one runs. The jobs may come from
    different notebooks (the suite runner's `--sweep` makes one job per notebook)."""
    out = Path(out).resolve()
    (out / "cells").mkdir(parents=True, exist_ok=True)
    result = SweepResult(out, [j.key for j in jobs])
    todo = []
    for job in jobs:
        st = cell_status(out / "cells" / job.key)
        if st is not None and st["status"] == "ok":
            result.skipped.append(job.key)
        else:
            todo.append(job)
    if todo:
        _run_on_ray(todo, out, address, workers, timeout, progress, desc, result)
    write_table(out)
    return result


def _node_cpus(ray) -> int:
    """The CPUs of the largest live node of the cluster Ray is connected to."""
    return max(int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive"))


def _run_on_ray(todo: list[Job], out: Path, address, workers, timeout, progress, desc, result) -> None:
    import ray
    from tqdm.auto import tqdm
    started = not ray.is_initialized()          # shut down at the end only a Ray this call started
    if started:
        kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if address is None:
            ray.init(num_cpus=workers or os.cpu_count(), num_gpus=None if any(j.gpus for j in todo) else 0, **kw)
        else:
            ray.init(address=address, **kw)
    node = _node_cpus(ray)
    since = time.time_ns()
    pending = {}
    for j in todo:
        cpus = node if j.cpus is None else min(j.cpus, node)       # more than a node has would never be scheduled
        task = ray.remote(num_cpus=cpus, num_gpus=j.gpus, max_retries=0)(run_cell)
        ref = task.remote(str(j.notebook), j.params, str(out / "cells" / j.key), cpus, timeout,
                          str(j.figures_dir) if j.figures_dir else None, j.env)
        pending[ref] = j.key
    bar = tqdm(total=len(todo), desc=desc, unit="cell", disable=not progress)
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                key = pending.pop(ref)
                try:
                    st = ray.get(ref)
                except Exception as exc:       # the worker died: nothing was moved into place for this cell
                    st = {"status": "failed", "error": f"worker lost: {exc}"}
                result.ran.append(key)
                if st["status"] != "ok":
                    result.failed.append(key)
                bar.update()
            now = running(out / "cells", set(pending.values()), since)
            bar.set_postfix(running=now, queued=len(pending) - now, failed=len(result.failed), refresh=not done)
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        bar.close()
        if started:
            ray.shutdown()


# -- the results table --------------------------------------------------------------------------

def load(out: str | Path):
    """Every finished cell of the sweep in `out` as a tidy DataFrame: columns cell, status, seconds, the cell's
    parameters (lists as their JSON text), metric, value; one row per (cell, metric) of the ok cells, and one row
    with metric None for each failed cell."""
    import pandas as pd
    rows = []
    for d in sorted((Path(out) / "cells").iterdir()):
        st = cell_status(d) if d.is_dir() and not d.name.startswith(".") else None
        if st is None:
            continue
        params = {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in st["params"].items()}
        head = {"cell": d.name, "status": st["status"], "seconds": st.get("seconds"), **params}
        mpath = d / "metrics.json"
        metrics = json.loads(mpath.read_text())["metrics"] if st["status"] == "ok" and mpath.exists() else {}
        if not metrics:
            rows.append({**head, "metric": None, "value": None})
        rows += [{**head, "metric": k, "value": v} for k, v in metrics.items()]
    return pd.DataFrame(rows)


def compute(*outs: str | Path):
    """What the finished cells under the sweep folders cost: one row per ok cell found at any depth
    (`OUT/**/cells/KEY/status.json`; scratch folders of cells in flight are skipped), with its folder, the
    notebook, wall seconds, the threads it ran, core-seconds (wall x threads: the cores the sweep reserved for it,
    an upper bound on what it used) and the package version it ran. Failed cells are left out: they ran again."""
    import pandas as pd
    rows = []
    for out in outs:
        for path in sorted(Path(out).rglob("cells/*/status.json")) if out and Path(out).is_dir() else []:
            st = cell_status(path.parent)
            if path.parent.name.startswith(".") or st.get("status") != "ok":
                continue
            threads = int(st.get("threads") or 1)
            rows.append({"cell": path.parent.name, "folder": str(path.parent), "notebook": st.get("notebook"),
                         "seconds": float(st["seconds"]), "threads": threads,
                         "core_seconds": float(st["seconds"]) * threads, "version": st.get("version")})
    return pd.DataFrame(rows, columns=["cell", "folder", "notebook", "seconds", "threads", "core_seconds",
                                       "version"])


def write_table(out: str | Path) -> Path:
    """Write load(out) to out/results.parquet, or results.csv where pyarrow is missing; returns the path."""
    df = load(out)
    try:
        import pyarrow  # noqa: F401
        path = Path(out) / "results.parquet"
        df.to_parquet(path, index=False)
    except ImportError:
        path = Path(out) / "results.csv"
        df.to_csv(path, index=False)
    return path


INTERVAL = (".ci_lo", ".ci_hi")      # a notebook's own interval for metric M: metrics M.ci_lo and M.ci_hi


def parameters(df) -> list[str]:
    """The parameter columns of a `load` table (everything but cell, status, seconds, metric, value)."""
    return [c for c in df.columns if c not in ("cell", "status", "seconds", "metric", "value")]


def summarize(df, metric: str, x: str, by: str | None = None):
    """One row per (by, x): the metric's mean over the ok cells sharing them, n (cells), and the interval drawn:
    the notebook's own (M.ci_lo, M.ci_hi; over several cells, the lowest lo and the highest hi), else the
    cells' min and max (seeds, say), else none (lo = hi = mean)."""
    import pandas as pd
    ok = df[df["status"] == "ok"]
    d = ok[ok["metric"] == metric]
    if d.empty:
        raise ValueError(f"metric {metric!r} is in no finished cell; have {sorted(df['metric'].dropna().unique())[:20]}")
    have = parameters(df)
    for col in [x] + ([by] if by else []):
        if col not in have:
            raise ValueError(f"{col!r} is not a parameter of this sweep; have {have}")
    keys = [by, x] if by else [x]
    s = d.groupby(keys, sort=True)["value"].agg(mean="mean", lo="min", hi="max", n="count").reset_index()
    s["interval"] = "cells"
    lo, hi = (ok[ok["metric"] == metric + suffix] for suffix in INTERVAL)
    if not lo.empty and not hi.empty:
        own = pd.merge(lo.groupby(keys)["value"].min().rename("lo"), hi.groupby(keys)["value"].max().rename("hi"),
                       left_index=True, right_index=True).reset_index()
        s = s.drop(columns=["lo", "hi"]).merge(own, on=keys, how="left")
        s["interval"] = "notebook"
    return s


def plot(df, metric: str, x: str, by: str | None = None, ax=None):
    """One metric against parameter `x`, a line per value of `by`: the mean over the cells that share (x, by), with
    the interval of `summarize` (the notebook's own where it records one). Returns the axes."""
    from . import viz
    s = summarize(df, metric, x, by)
    if ax is None:
        import matplotlib.pyplot as plt
        ax = plt.subplots(figsize=(6.5, 4))[1]
    groups = [(None, s)] if by is None else list(s.groupby(by, sort=True))
    for k, (label, g) in enumerate(groups):
        ax.errorbar(list(g[x]), g["mean"].to_numpy(), yerr=[(g["mean"] - g["lo"]).clip(lower=0).to_numpy(),
                                                          (g["hi"] - g["mean"]).clip(lower=0).to_numpy()],
                    fmt="o-", capsize=3, color=viz.COLORS[k % len(viz.COLORS)],
                    label=None if by is None else f"{by} = {label}")
    what = "the notebook's interval" if (s["interval"] == "notebook").all() else "min to max over cells"
    ax.set(xlabel=x, ylabel=metric, title=f"{metric} by {x}" + (f" and {by}" if by else "") + f"\n(bars: {what})")
    if by is not None:
        ax.legend(fontsize=8, loc="best")
    return ax


# -- command line ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsekv sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebook", type=Path, help="the notebook (a path, or a stem under notebooks/)")
    ap.add_argument("--grid", type=Path, required=True, help="the grid YAML")
    ap.add_argument("--address", default=None, help="a Ray cluster ('auto' or ray://host:port); default embedded")
    ap.add_argument("--out", type=Path, default=None, help="the sweep folder (default build/sweeps/NOTEBOOK)")
    ap.add_argument("--workers", type=int, default=None, help="CPUs of the embedded Ray (default: the cores)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per notebook cell")
    args = ap.parse_args(argv)
    nb = args.notebook
    if not nb.exists() and (Path("notebooks") / f"{nb}.ipynb").exists():
        nb = Path("notebooks") / f"{nb}.ipynb"
    out = args.out or Path("build") / "sweeps" / nb.stem
    try:
        res = sweep(nb, Grid.load(args.grid), out, args.address, args.workers, args.timeout)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(res.keys)} cells: {len(res.ran)} ran ({len(res.failed)} failed), {len(res.skipped)} already done; "
          f"results in {out}")
    for key in res.failed:
        st = cell_status(res.out / "cells" / key) or {}
        print(f"  failed {key} {st.get('params')}: {st.get('error', '')[:300]}", file=sys.stderr)
    return 1 if res.failed else 0


__all__ = ["Grid", "notebook_parameters", "validate", "package_version", "cell_key", "run_cell", "Job", "sweep",
           "run_jobs", "SweepResult", "load", "write_table", "parameters", "summarize", "plot"]
