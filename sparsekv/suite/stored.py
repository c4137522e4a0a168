"""Stored results: a notebook's long computations, computed once for its parameters and read back by the course.

A course notebook that runs a long grid (08's passkeys, 12's answers, 13's routers) wraps that call:

    rows = stored.compute_or_read(stored_dir, "passkey_grid", key, lambda: realmodel.passkey_grid(...))

    stored_dir ""        compute, write nothing (what every smoke run does: `notebooks/smoke.yaml`)
    stored_dir a folder  read `<folder>/<name>-<digest>.json` when it was computed for exactly `key`;
                         otherwise compute, then write it there (atomically), for the next run to read

`key` names everything the result depends on: the notebook parameters the call reads, by their notebook names and
values (`tests/test_stored.py` checks every committed file's key against its notebook's current parameters, so a
changed default can never be answered from a stale file). The file also records its provenance (when, the commit,
the CPU, the seconds the computation took), and `compute_or_read` prints it on every read, so a reader always sees
that a number came from a stored run and how to recompute it (`stored_dir = ""`, or
`python -m sparsekv notebooks run --fresh`).

Only data is stored: JSON, with tuples, dicts whose keys are not all plain strings, non-finite floats and numeric
numpy arrays written as tagged objects (`encode`/`decode`, exact inverses on the values they accept). Reading
constructs values and never runs code; a file that is not this format is a ValueError naming it, never a silent
recomputation.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .params import check as check_parameters

FORMAT = 1
TAGS = ("__tuple__", "__items__", "__float__", "__array__")
NUMERIC_KINDS = "biuf"        # numpy dtype kinds an array may have (bool, signed, unsigned, float)


# -- the codec --------------------------------------------------------------------------------------

def encode(value, path: str = "value", depth: int = 0):
    """`value` as plain JSON data. Accepts None, bool, int, float (NaN and infinities tagged), str, numpy scalars
    (stored as the Python scalar), numeric numpy arrays, lists, tuples and dicts of these (a dict whose keys are
    not all plain strings, or uses a tag as a key, is stored as its item pairs). Anything else is a TypeError naming
    its `path` (`value[3]['method']`)."""
    if depth > 64:
        raise TypeError(f"stored: {path} is nested deeper than 64 levels")
    if isinstance(value, np.generic) and not isinstance(value, np.ndarray):
        value = value.item()
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if t is list:
        return [encode(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if t is tuple:
        return {"__tuple__": [encode(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]}
    if t is dict:
        if all(type(k) is str and k not in TAGS for k in value):
            return {k: encode(v, f"{path}[{k!r}]", depth + 1) for k, v in value.items()}
        return {"__items__": [[encode(k, f"{path} key {k!r}", depth + 1), encode(v, f"{path}[{k!r}]", depth + 1)]
                              for k, v in value.items()]}
    if t is np.ndarray:
        if value.dtype.kind not in NUMERIC_KINDS:
            raise TypeError(f"stored: {path} must be a numeric array (dtype kind in {NUMERIC_KINDS!r}), got dtype "
                            f"{value.dtype}")
        flat = [encode(v, path, depth + 1) for v in value.ravel().tolist()]
        return {"__array__": flat, "dtype": value.dtype.str, "shape": list(value.shape)}
    raise TypeError(f"stored: {path} must be data (None, bool, int, float, str, a numpy scalar or numeric array, "
                    f"or a list, tuple or dict of these), got {t.__module__}.{t.__qualname__}")


def decode(data, path: str = "value"):
    """The inverse of `encode`: builds the values (tuples, dicts, floats, arrays) a tagged object stands for.
    Raises ValueError naming `path` for anything `encode` does not write."""
    t = type(data)
    if data is None or t in (bool, int, float, str):
        return data
    if t is list:
        return [decode(v, f"{path}[{i}]") for i, v in enumerate(data)]
    if t is not dict:
        raise ValueError(f"stored: {path} holds a {t.__name__}, which encode never writes")
    tags = [k for k in data if k in TAGS]
    if not tags:
        return {k: decode(v, f"{path}[{k!r}]") for k, v in data.items()}
    tag = tags[0]
    if tag == "__tuple__" and len(data) == 1 and type(data[tag]) is list:
        return tuple(decode(v, f"{path}[{i}]") for i, v in enumerate(data[tag]))
    if tag == "__items__" and len(data) == 1 and type(data[tag]) is list and all(
            type(p) is list and len(p) == 2 for p in data[tag]):
        return {_hashable(decode(k, f"{path} key"), path): decode(v, f"{path}[{i}]")
                for i, (k, v) in enumerate(data[tag])}
    if tag == "__float__" and len(data) == 1 and data[tag] in ("nan", "inf", "-inf"):
        return float(data[tag])
    if tag == "__array__" and set(data) == {"__array__", "dtype", "shape"}:
        dtype = np.dtype(data["dtype"]) if type(data["dtype"]) is str else None
        shape = data["shape"]
        if dtype is None or dtype.kind not in NUMERIC_KINDS or type(shape) is not list or not all(
                type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"stored: {path} is an array with dtype {data['dtype']!r} and shape {shape!r}; expected "
                             f"a numeric dtype (kind in {NUMERIC_KINDS!r}) and a list of sizes")
        flat = [decode(v, path) for v in data["__array__"]]
        if len(flat) != math.prod(shape):
            raise ValueError(f"stored: {path} holds {len(flat)} values for an array of shape {tuple(shape)}")
        return np.array(flat, dtype=dtype).reshape(shape)
    raise ValueError(f"stored: {path} is a malformed {tag} object (keys {sorted(data)})")


def _hashable(key, path: str):
    try:
        hash(key)
    except TypeError:
        raise ValueError(f"stored: {path} has a dict key that cannot be hashed ({type(key).__name__})") from None
    return key


# -- the files ------------------------------------------------------------------------------------------

def digest(key: dict) -> str:
    """The first 12 hex digits of SHA-256 over the key's canonical JSON (sorted keys): the file name's suffix."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def path_of(folder: str | Path, name: str, key: dict) -> Path:
    """`<folder>/<name>-<digest(key)>.json`. `name` must be a plain word (letters, digits, `_`, `-`)."""
    if type(name) is not str or not name or not all(ch.isalnum() or ch in "_-" for ch in name):
        raise ValueError(f"name must be a non-empty word of letters, digits, '_' and '-', got {name!r}")
    return Path(folder) / f"{name}-{digest(key)}.json"


def read(path: str | Path, key: dict) -> tuple[object, dict]:
    """(value, provenance) of a stored file computed for `key`. ValueError naming the file when it is not this
    format, or was computed for another key."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"stored: {path} is not JSON ({e}); delete it to recompute") from None
    if type(doc) is not dict or doc.get("format") != FORMAT or "value" not in doc or "key" not in doc:
        raise ValueError(f"stored: {path} is not a stored result of format {FORMAT} (keys format, key, value, ...)")
    if doc["key"] != key:
        diff = sorted(k for k in set(doc["key"]) | set(key) if doc["key"].get(k, None) != key.get(k, None))
        raise ValueError(f"stored: {path} was computed for another key (differs in {diff}); delete it to recompute")
    provenance = {k: doc.get(k) for k in ("name", "written", "commit", "cpu", "seconds")}
    return decode(doc["value"], str(path.name)), provenance


def write(path: str | Path, key: dict, value, seconds: float) -> Path:
    """Write `value` computed for `key` (in `seconds`) to `path` atomically: a reader sees the old file or the new
    one, never half of one. Encodes first, so a value that is not data raises TypeError and writes nothing."""
    path = Path(path)
    doc = {"format": FORMAT, "name": path.stem.rsplit("-", 1)[0], "key": key, "written": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(path.parent), "cpu": _cpu(),
           "seconds": round(float(seconds), 1), "value": encode(value)}
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    return path


def compute_or_read(folder: str | Path, name: str, key: dict, compute: Callable[[], object], stream=None):
    """The value `compute()` gives for `key`: read from `<folder>/<name>-<digest>.json` when that file exists, else
    computed (and written there unless `folder` is ""). Prints one line saying which, with the stored run's
    provenance. `key`: a str-keyed dict of JSON values (`suite.params.check`: no tuple, no NaN), the notebook
    parameters `compute` reads."""
    stream = sys.stdout if stream is None else stream
    if not isinstance(folder, (str, Path)):
        raise TypeError(f"folder must be a str or Path ('' stores nothing), got {type(folder).__name__}")
    key = check_parameters(key, f"stored key of {name!r}")
    path = path_of(folder, name, key) if str(folder) else None
    if path is not None and path.exists():
        value, p = read(path, key)
        stream.write(f"{name}: read {path} (computed {p['written']} at commit {p['commit']} on {p['cpu']} in "
                     f"{p['seconds']:.0f} s; stored_dir = '' recomputes)\n")
        return value
    t0 = time.perf_counter()
    value = compute()
    seconds = time.perf_counter() - t0
    if path is not None:
        write(path, key, value, seconds)
        stream.write(f"{name}: computed in {seconds:.0f} s and stored as {path}\n")
    return value


def _commit(folder: Path) -> str:
    """The repository's short commit, with "+changes" when the tree differs from it; "unknown" outside git."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=folder if folder.exists() else ".", capture_output=True,
                                        text=True, timeout=20)
        head = run("rev-parse", "--short", "HEAD")
        if head.returncode:
            return "unknown"
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu() -> str:
    """The CPU's model name and core count, as /proc/cpuinfo gives it (the platform's processor elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


__all__ = ["FORMAT", "compute_or_read", "decode", "digest", "encode", "path_of", "read", "write"]
