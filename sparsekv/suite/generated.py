"""A generated block of a hand-written page: the text between two marker comments, re-rendered in place.

    section(text, start, end)          the block (ValueError naming the markers when either is missing)
    replace(page, start, end, new)     write `new` between the markers of the file `page`; True when it changed

Used by the findings page (`suite.findings`) and the README's results table (`suite.frontpage`); the rest of each
page stays the author's.
"""
from __future__ import annotations

from pathlib import Path


def section(text: str, start: str, end: str, what: str = "generated") -> str:
    """The text between `start` and `end`, without its surrounding newlines."""
    if start not in text or end not in text:
        raise ValueError(f"the page has no {what} markers ({start!r} ... {end!r})")
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def replace(page: str | Path, start: str, end: str, new: str, what: str = "generated") -> bool:
    """Put `new` between the markers of `page` (a file); True when the block changed, False when it was current."""
    page = Path(page)
    text = page.read_text()
    if section(text, start, end, what) == new:
        return False
    head, rest = text.split(start, 1)
    page.write_text(head + start + "\n" + new + "\n" + end + rest.split(end, 1)[1])
    return True


__all__ = ["section", "replace"]
