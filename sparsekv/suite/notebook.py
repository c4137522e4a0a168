"""Execute one notebook with papermill: the step the serial runner (`suite.runner`) and each cell of a sweep
(`suite.sweep.run_cell`) share, so neither of those imports the other for it.

    run = run_notebook(Path("notebooks/01_x.ipynb"), out_dir, figures_dir, {"n": 3})   # never raises for a failure
    run.status, run.metrics                                                            # "ok" | "failed", the JSON
"""
from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .params import check as check_parameters

KERNEL = "sparsekv"


@dataclass
class NotebookRun:
    name: str
    status: str                      # "ok" | "failed"
    seconds: float
    metrics_path: Path
    executed_path: Path
    error: str = ""
    metrics: dict = field(default_factory=dict)
    detail: str = ""                                # a failure's full error text (papermill's includes the traceback)
    reference: dict = field(default_factory=dict)   # the committed metrics compared against
    regression: str = ""                            # the comparison's failure table, if any


def kernel_name() -> str:
    """The registered `sparsekv` kernel if present (make setup registers it), else python3."""
    from jupyter_client.kernelspec import KernelSpecManager
    return KERNEL if KERNEL in KernelSpecManager().find_kernel_specs() else "python3"


def _ipc_kernel_manager():
    """A kernel manager whose kernel talks over IPC sockets in a folder of its own. Over TCP, the manager picks free
    ports, releases them, and the kernel binds them later: kernels started at once by parallel test workers can pick
    the same port (a CI run's kernel died on "Address already in use" before replying to kernel_info). A socket path
    under a unique folder cannot collide; the folder is removed with the manager."""
    import shutil
    import tempfile
    import weakref

    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kw):
            folder = tempfile.mkdtemp(prefix="sparsekv-kernel-")
            kw.setdefault("transport", "ipc")
            kw.setdefault("ip", os.path.join(folder, "k"))
            super().__init__(**kw)
            weakref.finalize(self, shutil.rmtree, folder, True)

    return IPCKernelManager


def run_notebook(path: Path, out_dir: Path, figures_dir: Path, params: dict | None = None,
                 timeout: int = 1800, env: dict[str, str] | None = None) -> NotebookRun:
    """Execute one notebook with papermill; never raises for a notebook failure.

    params: JSON values only (`suite.params.check`); anything else is a TypeError before anything is written or run.

    env: variables the notebook's kernel process runs with (for example `cpuconfig.environment("alt")`);
    set in this process only while papermill starts the kernel and runs it, then restored. OMP_NUM_THREADS,
    unless given or already set, is the cores idle when the notebook starts (`suite.threads.choose`: a busy
    neighbour then costs its core, not a stall at every parallel op).
    """
    import papermill as pm

    from . import threads
    parameters = check_parameters(dict(params or {}), path.stem)     # before anything is written or run
    env = dict(env or {})
    env.setdefault("OMP_NUM_THREADS", str(threads.choose()))
    out_dir.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / path.name
    metrics_path = out_dir / f"{path.stem}.metrics.json"
    metrics_path.unlink(missing_ok=True)
    parameters.update(figures_dir=str(figures_dir.resolve()), metrics_path=str(metrics_path.resolve()))
    t0 = time.perf_counter()
    saved = {k: os.environ.get(k) for k in (env or {})}
    try:
        os.environ.update(env or {})
        pm.execute_notebook(str(path), str(executed), parameters=parameters, kernel_name=kernel_name(),
                            cwd=str(path.parent), execution_timeout=timeout, progress_bar=False,
                            **({"kernel_manager_class": _ipc_kernel_manager()} if os.name == "posix" else {}))
        status, error, detail = "ok", "", ""
    except Exception as exc:  # papermill raises PapermillExecutionError with the cell's traceback
        status, error = "failed", _short_error(exc)
        detail = str(exc) if str(exc).strip() else traceback.format_exc()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - t0
    run = NotebookRun(path.stem, status, seconds, metrics_path, executed, error, detail=detail)
    if status == "ok" and not metrics_path.exists():
        run.status, run.error = "failed", f"ran but wrote no metrics JSON at {metrics_path}"
    if metrics_path.exists():
        run.metrics = json.loads(metrics_path.read_text())
    return run


def _short_error(exc: Exception) -> str:
    text = str(exc).strip() or traceback.format_exception_only(type(exc), exc)[-1]
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:])[:600]
