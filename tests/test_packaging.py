"""The install layout: kernels/ is sparsekv.kernels, never a top-level `kernels`."""
import importlib.util
import os
import subprocess
import sys

import pytest


def test_kernels_is_a_subpackage_not_top_level():
    assert importlib.util.find_spec("sparsekv.kernels") is not None
    # Run from an empty folder so the repository root is not on sys.path.
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('kernels') is not None)"
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_import_has_no_heavy_side_effects():
    code = ("import sys, sparsekv; bad = [m for m in ('matplotlib', 'papermill', 'triton', 'transformers') "
            "if m in sys.modules]; sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_the_package_imports_lazily():
    """`import sparsekv` and the suite's report (what every notebook's last cell and the sweep's tiny cells import)
    load no torch; a public name imports its module on first use; every registry is complete however it is reached."""
    code = ("import sys, sparsekv, sparsekv.suite.report; assert 'torch' not in sys.modules, 'torch'; "
            "from sparsekv.routing.scorers import SCORERS; assert 'hminmax' in SCORERS, sorted(SCORERS); "
            "assert sparsekv.Engine.__module__ == 'sparsekv.model.engine' and sparsekv.metrics.__name__ == "
            "'sparsekv.analysis.metrics' and set(sparsekv.__all__) <= set(dir(sparsekv))")
    r = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        import sparsekv
        sparsekv.Nope


WHEEL_CHECK = r"""
import importlib, pathlib, pkgutil, subprocess, sys
import torch
import sparsekv, sparsekv.kernels
venv = pathlib.Path(sys.argv[1]).resolve()
assert pathlib.Path(sparsekv.__file__).resolve().is_relative_to(venv), sparsekv.__file__     # not the checkout
names = [m.name for m in pkgutil.walk_packages(sparsekv.__path__, "sparsekv.")]
for name in names:
    importlib.import_module(name)                                      # every module of every subpackage imports
subs = {n for n in names if pathlib.Path(importlib.import_module(n).__file__).name == "__init__.py"}
from sparsekv.kernels import cpu_decode
assert cpu_decode.available(), cpu_decode.reason()                    # compiled from the installed sources
so = cpu_decode.build_dir() / f"{cpu_decode._name()}.so"
assert so.is_file() and so.resolve().is_relative_to(pathlib.Path(sys.argv[2]).resolve()), so
calls = []
real = (cpu_decode.route_topk, cpu_decode.paged_decode)
cpu_decode.route_topk = lambda *a: calls.append("route") or real[0](*a)
cpu_decode.paged_decode = lambda *a, **k: calls.append("attend") or real[1](*a, **k)
model = sparsekv.Model(sparsekv.ModelConfig.from_name("tiny"))
engine = sparsekv.Engine(model, router=sparsekv.Router("minmax", token_budget=16), block_size=8, num_blocks=32,
                         progress=False)
seq = engine.new_sequence()
engine.prefill(seq, list(range(40)))
engine.decode(seq, 2)
assert calls.count("route") == 2 * len(model.config.attn_layers) and "attend" in calls, calls
help = subprocess.run([sys.executable, "-m", "sparsekv", "--help"], capture_output=True, text=True)
assert help.returncode == 0 and "notebooks" in help.stderr + help.stdout
print("ok", len(names), "modules;", ", ".join(sorted(subs)))
"""


def test_the_wheel_installs_outside_the_checkout_and_compiles_its_kernel(tmp_path):
    """Build the wheel, install it into a fresh virtual environment outside the checkout (torch and the other
    dependencies come from this environment's site-packages through a .pth file, so nothing is downloaded),
    then import every module, compile the C++ extension from the installed sources and headers into a fresh
    cache, run one routed decode on the fused kernels, and run `python -m sparsekv --help`."""
    import sysconfig
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(dist), str(root)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("sparsekv-*.whl")
    import zipfile
    shipped = set(zipfile.ZipFile(wheel).namelist())
    for src in (root / "kernels" / "cpu").iterdir():                    # every kernel source and header
        assert f"sparsekv/kernels/cpu/{src.name}" in shipped, src.name
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")   # torch, numpy, yaml: after ours
    inst = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                          capture_output=True, text=True)
    assert inst.returncode == 0, inst.stderr[-3000:]
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARSEKV_", "PYTHONPATH"))}
    env["XDG_CACHE_HOME"] = str(cache)                                   # an empty cache: the kernel must build
    run = subprocess.run([str(py), "-c", WHEEL_CHECK, str(venv), str(cache)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    for sub in ("sparsekv.serving", "sparsekv.kernels", "sparsekv.storage", "sparsekv.suite"):
        assert sub in run.stdout, run.stdout


def test_make_lab_opens_jupyterlab_on_the_notebooks_with_the_project_kernel():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    dry = subprocess.run(["make", "-n", "lab"], cwd=root, capture_output=True, text=True)
    assert dry.returncode == 0 and "-m jupyter lab --notebook-dir=notebooks" in dry.stdout
    version = subprocess.run([sys.executable, "-m", "jupyter", "lab", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip()[0].isdigit()
    kernels = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list"], capture_output=True, text=True)
    assert "sparsekv" in kernels.stdout


@pytest.mark.parametrize("module", ["transformers", "pandas", "scipy", "ray", "ipykernel"])
def test_the_installed_dependencies_carry_their_compiled_bytecode(module):
    """`make setup` installs with `uv pip install --compile-bytecode`: uv writes no .pyc files unless asked, and where
    PYTHONDONTWRITEBYTECODE is set no process writes them, so every test worker, notebook kernel and Ray worker
    compiled these packages from source on each import (about 15% of a real-model smoke run; CHANGELOG, 2026-12-07)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    cached = importlib.util.cache_from_source(spec.origin)
    assert os.path.exists(cached), (f"{module} has no compiled bytecode ({cached}): this environment was installed "
                                    "before `make setup` compiled it; rm .venv/.sparsekv-installed && make setup")
