"""Sweeps on Ray (suite.sweep): a grid over a tiny notebook gives what serial runs give, resumes after a kill
without running a finished cell twice, records a failing cell and goes on, and refuses a bad grid up front."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO

from sparsekv.suite import sweep as sw
from sparsekv.suite.runner import run_notebook

pytest.importorskip("ray")
TINY = REPO / "tests" / "data" / "sweep_tiny.ipynb"


def executions(log):
    return log.read_text().splitlines() if log.exists() else []


def test_a_two_by_two_grid_on_two_workers_gives_the_serial_runs_metrics(tmp_path):
    log = tmp_path / "log.txt"
    grid = sw.Grid.from_dict({"base": {"log_path": str(log)}, "params": {"a": [1, 2], "b": [0.5, 3.0]}})
    res = sw.sweep(TINY, grid, tmp_path / "sweep", workers=2, progress=False)
    assert len(res.ran) == 4 and not res.failed and not res.skipped
    df = sw.load(tmp_path / "sweep")
    assert (tmp_path / "sweep" / "results.parquet").exists() or (tmp_path / "sweep" / "results.csv").exists()
    for cell in grid.cells:
        serial = run_notebook(TINY, tmp_path / "serial", tmp_path / "serial" / "fig", cell,
                              env={"OMP_NUM_THREADS": "1"}).metrics["metrics"]
        rows = df[(df["a"] == cell["a"]) & (df["b"] == cell["b"])]
        assert dict(zip(rows["metric"], rows["value"])) == serial
    assert set(df["metric"]) == {"sum", "product", "threads"}
    assert (df[df["metric"] == "threads"]["value"] == 1).all()        # each task ran at the threads Ray gave it


def test_a_killed_sweep_reruns_only_the_missing_cells(tmp_path):
    log, out = tmp_path / "log.txt", tmp_path / "sweep"
    spec = {"base": {"log_path": str(log), "sleep": 1.0}, "params": {"a": [1, 2, 3]}}
    (tmp_path / "grid.yaml").write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, "-m", "sparsekv", "sweep", str(TINY), "--grid", str(tmp_path / "grid.yaml"),
                             "--out", str(out), "--workers", "1"], cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not any((out / "cells").glob("*/status.json")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)                 # the driver and what shares its process group
    proc.wait()
    # Ray's raylet and workers run in sessions of their own: stop them too, as a killed machine would, and let
    # their kernels (whose parent poller exits with the worker) go, before reading what finished.
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True, timeout=60)
    time.sleep(3)
    done = {p.parent.name for p in (out / "cells").glob("*/status.json")}
    assert 1 <= len(done) < 3
    t0 = time.time()
    res = sw.sweep(TINY, sw.Grid.from_dict(spec), out, workers=2, progress=False)
    assert sorted(res.skipped) == sorted(done) and len(res.ran) == 3 - len(done) and not res.failed
    assert sum(float(line.split()[3]) >= t0 for line in executions(log)) == 3 - len(done)   # executions of the re-run
    assert not [p for p in (out / "cells").iterdir() if p.name.startswith(".") and (p / "status.json").exists()]
    again = sw.sweep(TINY, sw.Grid.from_dict(spec), out, workers=2, progress=False)
    assert not again.ran and len(again.skipped) == 3                # nothing runs twice


def test_a_failing_cell_is_recorded_with_its_traceback_and_the_others_finish(tmp_path):
    grid = sw.Grid.from_dict({"cells": [{"a": 1}, {"a": 2, "fail": True}, {"a": 3}]})
    res = sw.sweep(TINY, grid, tmp_path / "sweep", workers=2, progress=False)
    assert len(res.failed) == 1 and len(res.ran) == 3
    st = sw.cell_status(tmp_path / "sweep" / "cells" / res.failed[0])
    assert st["status"] == "failed" and "asked to fail at a=2" in st["traceback"] and "RuntimeError" in st["traceback"]
    df = sw.load(tmp_path / "sweep")
    assert sorted(df[df["metric"] == "sum"]["a"]) == [1, 3]


@pytest.mark.parametrize("spec,exc,words", [
    ({"params": {"c": [1, 2]}}, ValueError, "has no parameter 'c'"),
    ({"params": {"a": [1, "two"]}}, TypeError, "parameter a must be a int"),
    ({"params": {"names": ["x"]}}, TypeError, "parameter names must be a list"),
    ({"cells": [{"metrics_path": "x.json"}]}, ValueError, "set by the sweep itself"),
    ({"params": {"a": 1}}, TypeError, "must be a non-empty list"),
    ({"params": {}}, ValueError, "no cells"),
    ({"grid": {}}, ValueError, "unknown"),
])
def test_a_bad_grid_is_refused_before_any_cell_runs(tmp_path, spec, exc, words):
    with pytest.raises(exc, match=words):
        sw.sweep(TINY, sw.Grid.from_dict(spec), tmp_path / "sweep", workers=1, progress=False)
    assert not (tmp_path / "sweep").exists()


def test_the_cache_key_follows_the_source_the_parameters_and_the_version(tmp_path):
    k = sw.cell_key(TINY, {"a": 1}, "1.0")
    assert k == sw.cell_key(TINY, {"a": 1}, "1.0")
    assert len({k, sw.cell_key(TINY, {"a": 2}, "1.0"), sw.cell_key(TINY, {"a": 1}, "1.1")}) == 3
    nb = json.loads(TINY.read_text())
    nb["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["noise"]}]
    (tmp_path / "same.ipynb").write_text(json.dumps(nb))
    assert sw.cell_key(tmp_path / "same.ipynb", {"a": 1}, "1.0") == k     # outputs are not the source
    nb["cells"][2]["source"].append("x = 1\n")
    (tmp_path / "edited.ipynb").write_text(json.dumps(nb))
    assert sw.cell_key(tmp_path / "edited.ipynb", {"a": 1}, "1.0") != k


def test_plot_draws_a_metric_against_a_parameter(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd
    df = pd.DataFrame([{"cell": f"c{a}{b}", "status": "ok", "a": a, "b": b, "metric": "sum", "value": a + b}
                       for a in (1, 2) for b in (0.5, 3.0)])
    ax = sw.plot(df, "sum", "a", by="b")
    assert len(ax.lines) >= 2 and ax.get_xlabel() == "a"
    with pytest.raises(ValueError, match="no finished cell"):
        sw.plot(df, "nope", "a")


def test_the_progress_bar_counts_cells_running_from_their_scratch_folders(tmp_path):
    """`running` counts a pending cell while its scratch folder (made when `run_cell` starts) exists, once per cell,
    and ignores a finished cell's folder, a cell no longer pending and scratch left by an interrupted earlier run."""
    cells = tmp_path / "cells"
    since = time.time_ns()
    for name in (f".aaaa.11.{since + 5}", f".aaaa.12.{since + 9}",   # one cell, two scratch folders: counted once
                 f".bbbb.13.{since + 1}", f".cccc.14.{since - 10}",   # cccc: left over from before this run
                 "dddd", f".eeee.15.{since + 2}"):                    # dddd finished; eeee no longer pending
        (cells / name).mkdir(parents=True)
    assert sw.running(cells, {"aaaa", "bbbb", "cccc", "dddd"}, since) == 2
    assert sw.running(tmp_path / "absent", {"aaaa"}, since) == 0
