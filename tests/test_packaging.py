"""The install layout: kernels/ is sparsekv.kernels, never a top-level `kernels`."""
import importlib.util
import subprocess
import sys


def test_kernels_is_a_subpackage_not_top_level():
    assert importlib.util.find_spec("sparsekv.kernels") is not None
    # Run from an empty folder so the repository root is not on sys.path.
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('kernels') is not None)"
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_import_has_no_heavy_side_effects():
    code = ("import sys, sparsekv; bad = [m for m in ('matplotlib', 'papermill', 'triton', 'transformers') "
            "if m in sys.modules]; sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_the_cpu_kernel_source_ships_with_the_package():
    from sparsekv.kernels import cpu_decode
    assert cpu_decode._SOURCE.is_file() and cpu_decode._SOURCE.suffix == ".cpp"
    import tomllib
    from pathlib import Path
    cfg = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "cpu/*.cpp" in cfg["tool"]["setuptools"]["package-data"]["sparsekv.kernels"]


def test_make_lab_opens_jupyterlab_on_the_notebooks_with_the_project_kernel():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    dry = subprocess.run(["make", "-n", "lab"], cwd=root, capture_output=True, text=True)
    assert dry.returncode == 0 and "-m jupyter lab --notebook-dir=notebooks" in dry.stdout
    version = subprocess.run([sys.executable, "-m", "jupyter", "lab", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip()[0].isdigit()
    kernels = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list"], capture_output=True, text=True)
    assert "sparsekv" in kernels.stdout
