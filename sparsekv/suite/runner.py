"""Headless notebook runner on papermill: `python -m sparsekv notebooks run|smoke [names]`.

    run       every notebook at its own (full) parameters; executed copies and metrics go to
              build/notebooks/full/, figures and a copy of each metrics JSON to figures/.
              The summary compares headline metrics with the committed figures/*.metrics.json.
    smoke     every notebook with the shared small parameters of notebooks/smoke.yaml; all
              output (figures included) goes to --out (default build/notebooks/smoke/), so a
              smoke run never overwrites figures/. Metrics are compared with the committed
              baselines in tests/baselines/ (see sparsekv.suite.regression).
    spread    a smoke run, here or under --cpu alt, whose differences from each committed baseline are added to
              its spread (`regression.merge_spread`; the baseline's values stay): how a baseline learns what
              another machine or configuration gives. Commit the change with the machine it was measured on.
    baseline  a smoke run that re-records tests/baselines/NN.smoke.json; commit the change
              with the reason the metrics moved. Each notebook runs twice, under both of
              `suite.cpuconfig`'s configurations, and the baseline keeps how far the two differ
              (`regression.record_spread`: a metric's tolerance on another CPU is derived from it).

    --fresh   run mode: recompute every long grid a notebook would read from results/stored/ (`suite.stored`:
              its `stored_dir` parameter set to ""), and store nothing. Without it, a course run reads the grids
              committed for the notebooks' own parameters (about 65 minutes of computation) and computes any other.

    --sweep   any mode, with the notebooks as the cells of one Ray sweep (`suite.sweep`) under OUT/sweep/:
              parallel where there are more cores than one notebook's threads (`--workers`, `--threads`), on a
              cluster with `--address`, and resumable (a notebook whose cell finished with the same cache key is
              not run again). Notebooks with timing findings run alone on their node. `make notebooks` uses it.

Each notebook receives two injected parameters besides its own: `figures_dir` and
`metrics_path` (absolute). Smoke runs also set `gate_timing: false` (notebooks/smoke.yaml):
timing checks and timing metrics are recorded there but never fail, so `make test` passes on a
busy machine; full runs gate them. The runner prints a progress line per notebook and a summary
table, and exits non-zero if any notebook failed.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..core.tables import format_table
from . import cpuconfig
from .notebook import KERNEL, NotebookRun, kernel_name, run_notebook  # noqa: F401  (also named here, as before)
from .params import check as check_parameters

MODES = ("run", "smoke", "baseline", "spread")


def check_root(root: Path | str) -> Path:
    """The repository root the suite runs in: it must hold notebooks/ and tests/baselines/.

    Passed in (`--root`, default the current folder, which is where `make` runs), never derived
    from where the package is installed.
    """
    root = Path(root).resolve()
    missing = [d for d in ("notebooks", "tests/baselines") if not (root / d).is_dir()]
    if missing:
        raise FileNotFoundError(f"root must be the sparsekv repository (with notebooks/ and tests/baselines/); "
                                f"{root} has no {', '.join(missing)}")
    return root


def discover(names: list[str] | None = None, root: Path | str = ".") -> list[Path]:
    """Notebooks `NN_topic.ipynb` in order; `names` filter by stem or prefix ("01", "01_dense...")."""
    folder = check_root(root) / "notebooks"
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return found
    out = []
    for n in names:
        hits = [p for p in found if p.stem == n or p.stem.startswith(n)]
        if not hits:
            raise ValueError(f"names: no notebook matches {n!r}; have {[p.stem for p in found]}")
        out += [p for p in hits if p not in out]
    return out


def smoke_parameters(stem: str, root: Path | str = ".") -> dict:
    """The smoke parameters of one notebook: the file's `defaults`, overlaid by its own entry."""
    import yaml
    path = check_root(root) / "notebooks" / "smoke.yaml"
    spec = yaml.safe_load(path.read_text()) or {}
    params = dict(spec.get("defaults") or {})
    params.update((spec.get("notebooks") or {}).get(stem) or {})
    return check_parameters(params, stem)          # JSON values only (suite.params): refused before any notebook runs


def parameters_for(paths: list[Path], mode: str, root: Path | str = ".", fresh: bool = False) -> dict[str, dict]:
    """Each notebook's injected parameters: none in "run" mode (its own), else its smoke parameters; with `fresh`,
    `stored_dir` set to "" in every notebook that has that parameter, so it computes its grids (`suite.stored`)."""
    from .sweep import notebook_parameters
    params = {p.stem: {} if mode == "run" else smoke_parameters(p.stem, root) for p in paths}
    if fresh:
        for p in paths:
            if "stored_dir" in notebook_parameters(p):
                params[p.stem]["stored_dir"] = ""
    return params


def run_all(mode: str, names: list[str] | None = None, out: Path | None = None,
            timeout: int | None = None, stream=sys.stdout, root: Path | str = ".", cpu: str = "native",
            sweep: bool = False, address: str | None = None, workers: int | None = None,
            threads: int | None = None, fresh: bool = False,
            pages: Sequence[Callable[[Path], str]] = ()) -> list[NotebookRun]:
    """Run the selected notebooks in `mode` ("run", "smoke" or "baseline"), printing progress.

    cpu: a configuration of `suite.cpuconfig` the notebooks' kernels are forced into ("native": none).
    sweep (or an `address`): run the notebooks as the cells of one Ray sweep (`suite.sweep.run_jobs`) in
    `out/sweep/`, instead of one after another; see `sweep_jobs` for the CPUs each gets. A notebook whose cell
    finished before with the same key is not run again.
    fresh: set `stored_dir` to "" in every notebook that has that parameter (`suite.stored`): compute every grid.
    pages: after a full run whose notebooks all passed, each is called with `root` and returns a line to print: the
    pages rendered from the committed metrics (`python -m sparsekv notebooks` passes the findings page and the
    README's results table; the suite knows no study, so it is handed them).
    """
    env = cpuconfig.environment(cpu)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    root = check_root(root)
    paths = discover(names, root)
    if mode == "run":
        out = out or root / "build" / "notebooks" / "full"
        figures = root / "figures"
    else:
        out = out or root / "build" / "notebooks" / ("spread" if mode == "spread" else "smoke")
        figures = out / "figures"
    timeout = timeout or (3600 if mode == "run" else 300)
    params = parameters_for(paths, mode, root, fresh)
    if mode in ("baseline", "spread") and (sweep or address is not None):
        raise ValueError(f"{mode} runs notebooks one after another on this machine: drop --sweep")
    if mode == "spread":
        description = cpuconfig.describe(cpu)
        configuration = f"{cpu} on {description['cpu']}"
        stream.write(f"spread of every baseline to {configuration}\n")
    if mode == "baseline":
        runs = _record_baselines(paths, params, out, figures, timeout, cpu, root, stream)
    elif sweep or address is not None:
        runs = _run_as_sweep(paths, params, mode, out, figures, timeout, env, root, address, workers, threads, stream)
    else:
        runs = []
        for i, path in enumerate(paths, 1):
            print(f"[{i}/{len(paths)}] {path.stem} ({mode}) ...", file=stream, flush=True)
            run = run_notebook(path, out, figures, params[path.stem], timeout, env=env)
            if mode == "spread":
                runs.append(_add_spread(run, configuration, description, root, f"[{i}/{len(paths)}] ", stream))
            else:
                runs.append(_settle(run, mode, out, root, f"[{i}/{len(paths)}] ", stream))
    print(summary_table(runs), file=stream, flush=True)
    if mode == "run" and all(r.status == "ok" for r in runs):
        for render in pages:
            print(render(root), file=stream, flush=True)
    return runs


def _record_baselines(paths, params, out, figures, timeout, cpu, root, stream) -> list[NotebookRun]:
    """Each notebook under configuration `cpu`, then under the other one; the first run's metrics, with the spread
    between the two (`regression.record_spread`) and what each configuration ran (`cpuconfig.describe`), become
    its baseline. A notebook that fails under either configuration records nothing."""
    from . import regression as baselines
    other = "alt" if cpu == "native" else "native"
    configurations = {c: cpuconfig.describe(c) for c in (cpu, other)}
    runs = []
    for i, path in enumerate(paths, 1):
        tag = f"[{i}/{len(paths)}] "
        print(f"{tag}{path.stem} (baseline, {cpu} then {other}) ...", file=stream, flush=True)
        run = run_notebook(path, out, figures, params[path.stem], timeout, env=cpuconfig.environment(cpu))
        if run.status == "ok":
            again = run_notebook(path, out / other, out / other / "figures", params[path.stem], timeout,
                                 env=cpuconfig.environment(other))
            if again.status != "ok":
                run.status, run.error = "failed", f"under the {other!r} configuration: {again.error}"
            else:
                run.metrics["spread"] = baselines.record_spread(run.metrics, again.metrics, configurations)
                n = len(run.metrics["spread"]["metrics"])
                print(f"{tag}{path.stem}: {n} metrics differ between {cpu} and {other}", file=stream, flush=True)
        runs.append(_settle(run, "baseline", out, root, tag, stream))
    return runs


def _add_spread(run: NotebookRun, configuration: str, description: dict, root: Path, tag: str,
                stream) -> NotebookRun:
    """Add a smoke run's differences from the committed baseline to the baseline's spread (mode "spread")."""
    from . import regression as baselines
    ref_path = baselines.baseline_path(run.name, "smoke", root)
    run.reference = json.loads(ref_path.read_text()) if ref_path.exists() else {}
    if run.status == "ok" and not run.reference:
        run.status, run.error = "failed", f"no baseline at {ref_path}; record one with 'baseline'"
    if run.status == "ok":
        merged = baselines.merge_spread(run.reference, run.metrics, configuration, description)
        ref_path.write_text(json.dumps(merged, indent=1, sort_keys=True))
        run.detail = f"{len(baselines.record_spread(run.reference, run.metrics)['metrics'])} metrics differ"
    print(f"{tag}{run.name}: {run.status} in {run.seconds:.1f}s" + (f"; {run.detail}" if run.status == "ok" else "")
          + (f"\n    {run.error}" if run.error else ""), file=stream, flush=True)
    return run


def _settle(run: NotebookRun, mode: str, out: Path, root: Path, tag: str, stream) -> NotebookRun:
    """Compare a finished run with its reference, or record it as the reference (run, baseline); print it."""
    from . import regression as baselines
    ref_path = baselines.baseline_path(run.name, "full" if mode == "run" else "smoke", root)
    run.reference = json.loads(ref_path.read_text()) if ref_path.exists() else {}
    if run.status == "ok":
        if mode in ("run", "baseline"):
            ref_path.parent.mkdir(parents=True, exist_ok=True)
            ref_path.write_text(json.dumps(run.metrics, indent=1, sort_keys=True))
        if mode == "smoke":
            if not run.reference:
                run.status, run.error = "failed", f"no baseline at {ref_path}; record one with 'baseline'"
            else:
                cmp = baselines.compare(run.reference, run.metrics, gate_timing=False, root=root)
                if not cmp.ok:
                    run.status, run.regression = "regressed", cmp.table()
                    (out / f"{run.name}.diff.json").write_text(cmp.to_json())
    print(f"{tag}{run.name}: {run.status} in {run.seconds:.1f}s"
          + (f"\n    {run.error}" if run.error else "") + (f"\n{run.regression}" if run.regression else ""),
          file=stream, flush=True)
    return run


def sweep_jobs(paths: list[Path], params: dict[str, dict], mode: str, figures: Path, env: dict, root: Path,
               threads: int) -> list:
    """One `sweep.Job` per notebook. A notebook whose baseline records timing metrics asks for all of a node's
    CPUs (cpus=None), so it runs alone there as in a serial run and its timings share the machine with nothing;
    every other notebook asks for `threads` CPUs."""
    from . import regression as baselines
    from . import sweep as sw
    version = sw.package_version()
    mode_key = {"mode": "run" if mode == "run" else "smoke"}
    return [sw.Job(sw.cell_key(p, {**params[p.stem], **mode_key}, version, env or None), p, params[p.stem],
                   None if baselines.has_timing(p.stem, root) else threads, 0, figures, env) for p in paths]


def _run_as_sweep(paths, params, mode, out, figures, timeout, env, root, address, workers, threads,
                  stream) -> list[NotebookRun]:
    """The notebooks as cells of one sweep in out/sweep/; each result is copied to out/ as a serial run leaves it.

    Embedded Ray gets `workers` CPUs (default: the cores idle now, `threads.choose`) and each timing-free notebook
    `threads` of them (default: min(2, workers)). On 2 idle cores that is one notebook at a time with both cores:
    the serial run's schedule."""
    import shutil

    from . import sweep as sw
    from . import threads as thr
    workers = workers or thr.choose()
    threads = threads or min(2, workers)
    jobs = sweep_jobs(paths, params, mode, figures, env, root, threads)
    print(f"sweep of {len(jobs)} notebooks ({mode}) in {out / 'sweep'}: "
          + (f"embedded Ray, {workers} CPUs, {threads} per notebook" if address is None else f"Ray at {address}")
          + "; notebooks with timing findings run alone", file=stream, flush=True)
    res = sw.run_jobs(jobs, out / "sweep", address, workers, timeout, progress=True, desc=f"notebooks {mode}")
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i, (path, job) in enumerate(zip(paths, jobs), 1):
        cell = out / "sweep" / "cells" / job.key
        st = sw.cell_status(cell) or {"status": "failed", "error": "the cell left no status (its worker was lost)"}
        metrics_path, executed = out / f"{path.stem}.metrics.json", out / path.name
        for src, dst in ((cell / "metrics.json", metrics_path), (cell / path.name, executed)):
            dst.unlink(missing_ok=True)            # never an earlier run's file beside this run's result
            if src.exists():
                shutil.copyfile(src, dst)
        run = NotebookRun(path.stem, st["status"], st.get("seconds") or 0.0, metrics_path, executed,
                          st.get("error", ""), detail=st.get("traceback", ""))
        if metrics_path.exists():
            run.metrics = json.loads(metrics_path.read_text())
        tag = f"[{i}/{len(paths)}] " + ("(finished before) " if job.key in res.skipped else "")
        runs.append(_settle(run, mode, out, root, tag, stream))
    return runs


def summary_table(runs: list[NotebookRun]) -> str:
    """One line per notebook: status, runtime, headline metrics as now (committed)."""
    cols = ["notebook", "status", "seconds", "headline metrics: now (committed)"]
    rows = []
    for r in runs:
        m = r.metrics.get("metrics", {})
        ref = r.reference.get("metrics", {})
        head = ", ".join(f"{k}={_fmt(m[k])} ({_fmt(ref[k]) if k in ref else '-'})"
                         for k in r.metrics.get("headline", []) if k in m)
        rows.append(dict(zip(cols, (r.name, r.status, f"{r.seconds:.1f}", head))))
    return format_table(rows, cols, align="left")


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def main(argv: list[str] | None = None, pages: Sequence[Callable[[Path], str]] = ()) -> int:
    """The command line; `pages` as in `run_all`."""
    ap = argparse.ArgumentParser(prog="python -m sparsekv notebooks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=list(MODES))
    ap.add_argument("names", nargs="*", help="notebook stems or prefixes (default: all)")
    ap.add_argument("--out", type=Path, default=None, help="folder for executed copies and metrics")
    ap.add_argument("--timeout", type=int, default=None, help="seconds per cell (default 3600 full, 300 smoke)")
    ap.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: the current folder)")
    ap.add_argument("--cpu", choices=list(cpuconfig.CONFIGS), default="native",
                    help="force the notebooks' kernels into a CPU configuration (suite.cpuconfig; default: none)")
    ap.add_argument("--fresh", action="store_true",
                    help="compute every long grid instead of reading results/stored/ (suite.stored)")
    ap.add_argument("--sweep", action="store_true",
                    help="run the notebooks as cells of one Ray sweep (resumable; parallel where there are cores)")
    ap.add_argument("--address", default=None, help="with --sweep: a Ray cluster ('auto' or ray://host:port)")
    ap.add_argument("--workers", type=int, default=None, help="with --sweep: CPUs of the embedded Ray (default: idle cores)")
    ap.add_argument("--threads", type=int, default=None, help="with --sweep: threads per timing-free notebook (default 2)")
    args = ap.parse_args(argv)
    try:
        runs = run_all(args.mode, args.names or None, args.out, args.timeout, root=args.root, cpu=args.cpu,
                       sweep=args.sweep, address=args.address, workers=args.workers, threads=args.threads,
                       fresh=args.fresh, pages=pages)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if all(r.status == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
