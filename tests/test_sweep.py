"""Sweeps on Ray (suite.sweep): a grid over a tiny notebook gives what serial runs give, resumes after a kill
without running a finished cell twice, records a failing cell and goes on, and refuses a bad grid up front; the
suite runner's --sweep gives the serial runner's results, with a timing notebook alone on its node.

One embedded Ray (2 CPUs) serves the module's sweeps (`sweep` leaves a Ray it did not start running): starting
one takes about 10 s here, more than a tiny cell."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from sparsekv.suite import sweep as sw
from sparsekv.suite.runner import run_notebook

pytest.importorskip("ray")
TINY = REPO / "tests" / "data" / "sweep_tiny.ipynb"


def executions(log):
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture(scope="module")
def ray2():
    import ray
    if not ray.is_initialized():
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _kill_tree(marker: str, timeout: float = 20.0) -> int:
    """SIGKILL every process whose command line holds `marker` (a Ray session's temp folder: its raylet, GCS and
    monitors), with all their descendants (workers, whose titles no longer name it, and their kernels); wait until
    they are gone. Returns how many there were. Ray processes of other sessions are left alone."""
    import psutil
    roots = []
    for p in psutil.process_iter(["cmdline"]):
        if any(marker in a for a in (p.info["cmdline"] or [])):
            roots.append(p)
    procs = {p.pid: p for r in roots for p in [r, *_children(r)]}
    for p in procs.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(procs.values()), timeout=timeout)
    return len(procs)


def _children(p):
    import psutil
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_a_killed_sweep_reruns_only_the_missing_cells(tmp_path, ray2):
    import tempfile
    log, out = tmp_path / "log.txt", tmp_path / "sweep"
    spec = {"base": {"log_path": str(log), "sleep": 1.0}, "params": {"a": [1, 2, 3]}}
    (tmp_path / "grid.yaml").write_text(json.dumps(spec))
    ray_tmp = tempfile.mkdtemp(prefix="rk", dir="/tmp")     # the killed sweep's own Ray session (short: socket paths)
    proc = subprocess.Popen([sys.executable, "-m", "sparsekv", "sweep", str(TINY), "--grid", str(tmp_path / "grid.yaml"),
                             "--out", str(out), "--workers", "1"], cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RAY_TMPDIR": ray_tmp})
    deadline = time.time() + 120
    while time.time() < deadline and not any((out / "cells").glob("*/status.json")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)                 # the driver and what shares its process group
    proc.wait()
    # Ray's raylet and workers run in sessions of their own: kill them too, as a killed machine would (the
    # module's own Ray, in another temp folder, keeps running), before reading what finished.
    assert any((Path(ray_tmp) / "ray").glob("session_*")), "the killed sweep did not start a Ray of its own"
    _kill_tree(ray_tmp)                                  # what has not already exited with its driver
    time.sleep(3)        # an orphaned kernel's parent poller ends it within a second: let any in-flight line land
    status = {p.parent.name: json.loads(p.read_text()) for p in (out / "cells").glob("*/status.json")}
    # a cell killed in flight may still record itself as failed (its kernel died): that one must run again
    done = {k for k, st in status.items() if st["status"] == "ok"}
    assert 1 <= len(done) < 3, {k: (st["status"], st["error"]) for k, st in status.items()}
    t0 = time.time()
    res = sw.sweep(TINY, sw.Grid.from_dict(spec), out, workers=2, progress=False)
    assert sorted(res.skipped) == sorted(done) and len(res.ran) == 3 - len(done) and not res.failed
    assert sum(float(line.split()[3]) >= t0 for line in executions(log)) == 3 - len(done)   # executions of the re-run
    assert not [p for p in (out / "cells").iterdir() if p.name.startswith(".") and (p / "status.json").exists()]
    again = sw.sweep(TINY, sw.Grid.from_dict(spec), out, workers=2, progress=False)
    assert not again.ran and len(again.skipped) == 3                # nothing runs twice
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_two_by_two_grid_on_two_workers_gives_the_serial_runs_metrics(tmp_path, ray2):
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
    assert set(df["metric"]) == {"sum", "sum.ci_lo", "sum.ci_hi", "product", "threads"}
    assert (df[df["metric"] == "threads"]["value"] == 1).all()        # each task ran at the threads Ray gave it


def test_a_failing_cell_is_recorded_with_its_traceback_and_the_others_finish(tmp_path, ray2):
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
    ({"params": {"a": [1]}, "pin": ""}, ValueError, "pin must be a non-empty string"),
    ({"params": {"a": [1]}, "pin": 3}, ValueError, "pin must be a non-empty string"),
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


def test_a_pinned_grid_keys_its_cells_on_the_notebook_s_name_the_parameters_and_the_pin_alone(tmp_path):
    """A grid that spans sessions: editing the notebook or the package keeps its finished cells; a new pin reruns."""
    k = sw.cell_key(TINY, {"a": 1}, "1.0", pin="study-1")
    assert k == sw.cell_key(TINY, {"a": 1}, "9.9", pin="study-1")            # another package version
    nb = json.loads(TINY.read_text())
    nb["cells"][2]["source"].append("x = 1\n")
    (tmp_path / TINY.name).write_text(json.dumps(nb))
    assert sw.cell_key(tmp_path / TINY.name, {"a": 1}, "1.0", pin="study-1") == k     # an edited notebook
    assert len({k, sw.cell_key(TINY, {"a": 2}, "1.0", pin="study-1"), sw.cell_key(TINY, {"a": 1}, "1.0", pin="study-2"),
                sw.cell_key(TINY, {"a": 1}, "1.0")}) == 4
    assert sw.Grid.from_dict({"params": {"a": [1]}, "pin": "study-1"}).pin == "study-1"


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


def _suite_root(tmp_path):
    """A repository root the suite runner accepts, with two copies of the tiny notebook: 02 records a timing
    metric (a notebook with timing findings), 01 does not."""
    import shutil
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    (root / "tests" / "baselines").mkdir(parents=True)
    for stem in ("01_tiny", "02_tiny_timing"):
        shutil.copyfile(TINY, root / "notebooks" / f"{stem}.ipynb")
    (root / "tests" / "baselines" / "tolerances.yaml").write_text(   # the runners choose different thread counts
        "overrides:\n  threads: {abs: 64, rel: 0.0}\n")
    log = tmp_path / "log.txt"
    (root / "notebooks" / "smoke.yaml").write_text(json.dumps({
        "defaults": {"log_path": str(log)},
        "notebooks": {"01_tiny": {"a": 2, "b": 3.0}, "02_tiny_timing": {"a": 5, "timing": True}}}))
    return root, log


def test_the_suite_runner_s_sweep_gives_the_serial_runs_and_a_timing_notebook_runs_alone(tmp_path, ray2):
    import io

    from sparsekv.suite import runner
    root, log = _suite_root(tmp_path)
    serial = runner.run_all("baseline", out=tmp_path / "serial", root=root, stream=io.StringIO())
    # a baseline runs each notebook under both CPU configurations (native, then alt): 4 executions
    assert [r.status for r in serial] == ["ok", "ok"] and len(executions(log)) == 4
    assert all(set(r.metrics["spread"]["configurations"]) == {"native", "alt"} for r in serial)
    assert {p.name for p in (root / "tests" / "baselines").glob("*.json")} == {"01_tiny.smoke.json",
                                                                               "02_tiny_timing.smoke.json"}
    jobs = runner.sweep_jobs(runner.discover(root=root), {p.stem: runner.smoke_parameters(p.stem, root)
                                                          for p in runner.discover(root=root)},
                             "smoke", tmp_path / "figures", {}, root, 1)
    assert [j.cpus for j in jobs] == [1, None]           # 02's baseline records a timing metric: all of a node

    out = tmp_path / "smoke"
    swept = runner.run_all("smoke", out=out, root=root, stream=io.StringIO(), sweep=True, workers=2, threads=1)
    assert [r.status for r in swept] == ["ok", "ok"] and len(executions(log)) == 6     # compared with the baselines
    assert {r.name: r.metrics["metrics"]["threads"] for r in swept} == {"01_tiny": 1, "02_tiny_timing": 2}
    for s, r in zip(serial, swept):
        assert (out / f"{r.name}.metrics.json").exists() and (out / f"{r.name}.ipynb").exists()   # as serial runs
        m, n = dict(s.metrics["metrics"]), dict(r.metrics["metrics"])
        m.pop("threads"), n.pop("threads")       # the serial runner picks the idle cores, the sweep its CPUs
        assert m == n and s.metrics["kinds"] == r.metrics["kinds"]

    text = io.StringIO()
    again = runner.run_all("smoke", out=out, root=root, stream=text, sweep=True, workers=2, threads=1)
    assert [r.status for r in again] == ["ok", "ok"] and len(executions(log)) == 6     # nothing ran twice
    assert text.getvalue().count("(finished before)") == 2


def test_the_cache_key_follows_the_forced_cpu_configuration_and_the_package_source():
    from sparsekv.suite import cpuconfig
    assert sw.cell_key(TINY, {"a": 1}, "1.0") != sw.cell_key(TINY, {"a": 1}, "1.0", cpuconfig.environment("alt"))
    assert sw.cell_key(TINY, {"a": 1}, "1.0", {}) == sw.cell_key(TINY, {"a": 1}, "1.0")
    version = sw.package_version()
    assert version.endswith("+src." + sw.source_digest()) and len(sw.source_digest()) == 12


def test_summarize_uses_the_notebook_s_own_interval_where_it_records_one():
    import pandas as pd
    rows = []
    for a in (1, 2):
        for seed in (0, 1):
            head = {"cell": f"c{a}{seed}", "status": "ok", "a": a, "seed": seed}
            rows += [{**head, "metric": "acc", "value": 0.5 + 0.1 * a + 0.01 * seed},
                     {**head, "metric": "acc.ci_lo", "value": 0.3 + seed}, {**head, "metric": "acc.ci_hi", "value": 0.9}]
    df = pd.DataFrame(rows)
    s = sw.summarize(df, "acc", "a")
    assert list(s["n"]) == [2, 2] and list(s["interval"]) == ["notebook"] * 2
    assert s["lo"].tolist() == [0.3, 0.3] and s["hi"].tolist() == [0.9, 0.9]      # lowest lo, highest hi
    assert s["mean"].round(4).tolist() == [0.605, 0.705]
    plain = sw.summarize(df[~df["metric"].str.contains("ci_")], "acc", "a")
    assert list(plain["interval"]) == ["cells"] * 2 and plain["lo"].round(4).tolist() == [0.6, 0.7]
    with pytest.raises(ValueError, match="not a parameter"):
        sw.summarize(df, "acc", "b")
