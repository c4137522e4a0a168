"""Real text for long-context probes, taken from what every Python install carries.

Two haystacks, both from the Python standard library of the running interpreter, so nothing is
downloaded or shipped:
    prose   the docstrings of standard-library modules, classes and functions: real technical
            English written by people (`inspect.getdoc`, imported modules only);
    code    the source files of standard-library modules: real Python.
License: the Python Software Foundation License (PSF-2.0), the license of CPython's standard
library; both are read from the installed copy and only used in memory.

Invariants:
    1. The same interpreter gives the same text for the same arguments (fixed module order, no
       randomness), so a notebook's prompts are reproducible on one machine.
    2. `take(tok, text, n)` returns exactly n token ids (or raises when the text is too short).
"""
from __future__ import annotations

import importlib
import inspect
import sysconfig
from pathlib import Path

# Modules in a fixed order: large, stable, pure-Python, documented, importable without side effects.
PROSE_MODULES = ("argparse", "collections", "functools", "itertools", "json", "logging", "pathlib", "re",
                 "statistics", "string", "textwrap", "typing", "unittest", "urllib.parse", "zipfile", "tarfile",
                 "email.message", "http.client", "subprocess", "threading", "decimal", "fractions", "datetime",
                 "calendar", "difflib", "heapq", "bisect", "shutil", "tempfile", "csv", "configparser", "pickle")
CODE_MODULES = ("argparse", "textwrap", "difflib", "csv", "configparser", "shutil", "tempfile", "calendar",
                "fractions", "statistics", "heapq", "bisect", "string", "functools", "dataclasses", "enum")
SOURCE = "the Python standard library of this interpreter (PSF License 2.0)"


def prose(modules: tuple[str, ...] = PROSE_MODULES, min_words: int = 12) -> str:
    """Docstrings of the modules and their public classes and functions, as paragraphs of English."""
    seen, parts = set(), []
    for name in modules:
        mod = importlib.import_module(name)
        objs = [mod] + [obj for attr, obj in sorted(vars(mod).items())
                        if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
                        and getattr(obj, "__module__", None) == mod.__name__]
        for obj in objs:
            doc = inspect.getdoc(obj) or ""
            if len(doc.split()) >= min_words and doc not in seen:
                seen.add(doc)
                parts.append(doc.strip())
    return "\n\n".join(parts)


def code(modules: tuple[str, ...] = CODE_MODULES) -> str:
    """The source files of the modules, concatenated in order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in modules:
        path = stdlib / (name.replace(".", "/") + ".py")
        if path.exists():
            parts.append(f"# ---- {name}.py ----\n" + path.read_text(encoding="utf-8"))
    if not parts:
        raise FileNotFoundError(f"no standard-library sources under {stdlib} (a Python build without .py files?)")
    return "\n\n".join(parts)


def haystack(kind: str) -> str:
    """'prose' or 'code'."""
    if kind not in HAYSTACKS:
        raise ValueError(f"kind must be one of {sorted(HAYSTACKS)}, got {kind!r}")
    return HAYSTACKS[kind]()


HAYSTACKS = {"prose": prose, "code": code}


def take(tok, text: str, n: int, offset: int = 0) -> list[int]:
    """Exactly n token ids of `text` (no special tokens), starting at token `offset`."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) < offset + n:
        raise ValueError(f"n: the text has {len(ids)} tokens, fewer than offset + n = {offset + n}")
    return ids[offset:offset + n]
