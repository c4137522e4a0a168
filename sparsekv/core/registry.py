"""Adding a strategy class to a registry by its name: the one rule every registry here shares.

Scorers, selectors and eviction policies are each a dict {name: class}; `add` checks that the
class is a subclass of the registry's base, that its name is a non-empty str, and that the name
is not taken by another class (re-registering the same class is allowed).
"""
from __future__ import annotations


def add(registry: dict, cls: type, base: type, what: str, name_attr: str = "name") -> type:
    """Register `cls` in `registry` under `cls.<name_attr>`; returns `cls` (usable in a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"a {what} must be a {base.__name__} subclass, got {cls!r}")
    name = getattr(cls, name_attr, None)
    if not name or not isinstance(name, str):
        raise ValueError(f"a {what} needs a non-empty str {name_attr}, got {name!r}")
    if name in registry and registry[name] is not cls:
        raise ValueError(f"{what} {name!r} is already registered")
    registry[name] = cls
    return cls
