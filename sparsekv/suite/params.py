"""Notebook parameters as JSON values: the one check every parameter passes before papermill sees it.

papermill writes each parameter into the notebook's source as a Python literal. It translates None, bool, int,
float, str, list and dict (escaping strings); any other value, bytes (YAML's `!!binary`), a set (`!!set`), a tuple
or an object, it writes as `"{value}"` without escaping, so a crafted value becomes code that runs in the kernel
(`"b'"+str(print(...))+"'"`). A parameter name is written as is (`name = value`), so a name is code too.

`check(params, notebook)` accepts exactly JSON's values, recursively:

    None, bool, int, finite float, str          (exact types: a subclass could format itself as anything)
    list of values                              (a tuple is refused: pass a list)
    dict of values with str keys                (an int key becomes its decimal string, as JSON and papermill
                                                 write it; any other key is refused)

NaN and infinities are refused: JSON has no literal for them, and a cell's parameters go to `params.json` and
the cache key as JSON. Anything else is a TypeError naming the notebook (or grid cell) and the parameter's path
(`lengths[1]`, `layout["docs"]`); a name that is not a Python identifier is a ValueError. It returns a new dict of
plain values (int keys as strings), which is what the caller passes on; the input is never changed.

Called by `runner.smoke_parameters` and `notebook.run_notebook` (every notebook run, smoke or full, serial or a
sweep's cell) and by `sweep.Grid.from_dict` and `sweep.validate` (a grid is refused before any cell starts).
"""
from __future__ import annotations

import keyword
import math

MAX_DEPTH = 32          # nesting deeper than this is refused (a list that holds itself would recurse forever)
EXPECTED = "None, bool, int, finite float, str, or a list or str-keyed dict of these"


def check(params: dict, notebook: str) -> dict:
    """A plain copy of `params` whose every value is JSON-typed; raises TypeError/ValueError naming
    `notebook` and the first bad parameter's path. `notebook`: the notebook's stem, or a grid cell's label."""
    if type(params) is not dict:
        raise TypeError(f"{notebook}: parameters must be a dict of name: value, got {type(params).__name__}")
    out = {}
    for name, value in params.items():
        if type(name) is not str:
            raise TypeError(f"{notebook}: parameter names must be str, got {type(name).__name__} {_show(name)}")
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"{notebook}: parameter name {name!r} is not a Python identifier")
        out[name] = _plain(value, notebook, name, 0)
    return out


def _plain(value, notebook: str, path: str, depth: int):
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        if not math.isfinite(value):
            raise TypeError(f"{notebook}: parameter {path} must be a finite float (JSON has no {value}), got {value}")
        return value
    if depth >= MAX_DEPTH:
        raise TypeError(f"{notebook}: parameter {path} is nested deeper than {MAX_DEPTH} levels")
    if t is list:
        return [_plain(v, notebook, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if t is dict:
        out = {}
        for k, v in value.items():
            key = str(k) if type(k) is int else k
            if type(key) is not str:
                raise TypeError(f"{notebook}: parameter {path} must have str keys, got the {type(k).__name__} key "
                                f"{_show(k)}")
            if key in out:
                raise TypeError(f"{notebook}: parameter {path} has the key {key!r} twice (an int and its string)")
            out[key] = _plain(v, notebook, f"{path}[{key!r}]", depth + 1)
        return out
    hint = " (pass a list)" if t is tuple else ""
    raise TypeError(f"{notebook}: parameter {path} must be JSON-typed ({EXPECTED}), got {t.__name__} "
                    f"{_show(value)}{hint}")


def _show(value) -> str:
    """A short description of a refused value: the repr of a scalar builtin, the length of a container, the type
    of anything else (an object's own repr is its author's code, and may raise)."""
    t = type(value)
    if t in (bytes, bytearray, complex, float, int, str):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    if t in (tuple, set, frozenset):
        return f"of {len(value)} items"
    return f"<{t.__module__}.{t.__qualname__} object>"


__all__ = ["check", "MAX_DEPTH"]
