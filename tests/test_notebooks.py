"""Every notebook, executed headless with the shared smoke parameters into a temporary folder.

The notebooks assert their own checks and fail on NaN metrics; here we also check that each
run wrote its metrics JSON and never touched figures/.
"""
import json

import pytest

from sparsekv import baselines, notebooks as nbrun

NOTEBOOKS = nbrun.discover()


def test_there_are_notebooks_and_each_has_a_parameters_cell():
    import nbformat
    assert NOTEBOOKS, "no notebooks found"
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} has outputs"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_smoke(path, tmp_path):
    figures_before = {p: p.stat().st_mtime for p in (nbrun.ROOT / "figures").glob("*")}
    run = nbrun.run_notebook(path, tmp_path, tmp_path / "figures", nbrun.smoke_parameters(path.stem), timeout=300)
    assert run.status == "ok", run.error
    assert run.metrics["notebook"] == path.stem
    assert run.metrics["metrics"], "no metrics recorded"
    assert all(run.metrics["checks"].values())
    assert any((tmp_path / "figures").iterdir()), "the notebook drew no figure"
    assert {p: p.stat().st_mtime for p in (nbrun.ROOT / "figures").glob("*")} == figures_before
    # Regression against the committed smoke baseline (tests/baselines/NN.smoke.json).
    base = json.loads(baselines.baseline_path(path.stem, "smoke").read_text())
    cmp = baselines.compare(base, run.metrics)
    if not cmp.ok:
        (tmp_path / f"{path.stem}.diff.json").write_text(cmp.to_json())
        pytest.fail(cmp.table() + f"\n(JSON diff: {tmp_path / f'{path.stem}.diff.json'}; if the change is intended, "
                    f"re-record with: python -m sparsekv.notebooks baseline {path.stem})", pytrace=False)


@pytest.mark.notebook
@pytest.mark.parametrize("stem", ["00_tour", "03_lost_detail_probes"])
def test_smoke_runs_are_deterministic(stem, tmp_path):
    """Two smoke runs give identical exact and numeric metrics (timings excluded)."""
    path = nbrun.discover([stem])[0]
    params = nbrun.smoke_parameters(stem)
    a = nbrun.run_notebook(path, tmp_path / "a", tmp_path / "fa", params, timeout=300)
    b = nbrun.run_notebook(path, tmp_path / "b", tmp_path / "fb", params, timeout=300)
    assert a.status == b.status == "ok", a.error or b.error
    kinds = a.metrics["kinds"]
    keep = lambda m: {k: v for k, v in m["metrics"].items() if kinds[k] != "timing"}
    assert keep(a.metrics) == keep(b.metrics)
