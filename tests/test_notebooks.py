"""Every notebook, executed headless with the shared smoke parameters into a temporary folder.

The notebooks assert their own checks and fail on NaN metrics; here we also check that each
run wrote its metrics JSON and never touched figures/.
"""
import pytest

from sparsekv import notebooks as nbrun

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
