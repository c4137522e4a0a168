"""The suite's own scheduling (tests/conftest.py): under pytest-xdist each test module runs whole on one worker, so
its module-scoped fixtures are built once, and each notebook run of test_notebooks.py is a unit of its own."""
import re
import subprocess
import sys

from conftest import REPO, _unit


def test_a_module_is_one_unit_and_a_notebook_run_is_its_own():
    assert _unit("tests/test_sweep.py::test_a_failing_cell[1]") == "test_sweep"
    assert _unit("tests/test_notebooks.py::test_notebook_smoke[13_routers]") == \
        "tests/test_notebooks.py::test_notebook_smoke[13_routers]"


def test_under_xdist_every_module_runs_whole_on_one_worker_and_the_longest_starts_first(tmp_path):
    """Three small modules over two workers (13 s of a `make test` on 2 cores, 2026-12-05): with one unit per test,
    as `--dist loadgroup` gave under pytest 9.2, each module's tests were spread over both workers. The recorded
    seconds (here a file that calls the module with the fewest tests the longest) decide which unit starts first:
    xdist's own order, most tests first, would start it last, after another module on its worker."""
    import json
    import os
    mods = ["tests/test_report.py", "tests/test_threads.py", "tests/test_router_bytes.py"]    # 8, 5 and 3 tests
    (tmp_path / "durations.json").write_text(json.dumps({"test_router_bytes": 9.0, "test_threads": 1.0}))
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider", *mods],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SPARSEKV_TEST_DURATIONS": str(tmp_path / "durations.json")})
    assert run.returncode == 0, run.stdout[-2000:]
    ran = re.findall(r"^\[(gw\d)\] .*?PASSED (tests/test_\w+\.py)::", run.stdout, re.M)
    workers = {m: {w for w, mm in ran if mm == m} for m in mods}
    assert len(ran) >= 16 and {m for _, m in ran} == set(mods), run.stdout[-2000:]
    assert all(len(w) == 1 for w in workers.values()), workers
    (longest,) = workers["tests/test_router_bytes.py"]
    assert [m for w, m in ran if w == longest][0] == "tests/test_router_bytes.py", ran


def test_a_unit_skipped_here_keeps_the_seconds_recorded_where_it_ran():
    """Recording durations on a machine without Chromium must not write test_browser's 0 s over CI's 84 s (it would
    then start last in CI, on one worker, after the others finish); units that ran whole are re-measured, new ones
    added, and a unit skipped in part keeps the larger of its two records."""
    from conftest import recorded_durations
    measured = {"test_browser": 0.02, "test_book": 6.4, "test_sweep": 101.04, "test_new": 3.0}
    before = {"test_browser": 84.3, "test_book": 41.4, "test_sweep": 118.1}
    assert recorded_durations(measured, {"test_browser", "test_book"}, before) == \
        {"test_book": 41.4, "test_browser": 84.3, "test_new": 3.0, "test_sweep": 101.0}
    assert recorded_durations(measured, set(), before)["test_browser"] == 0.0
