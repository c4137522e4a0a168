"""The sliding-window rule, written once: the first key a query can still see.

A layer with window w lets the query at position i see the keys j with 0 <= i - j < w (Gemma 3's and
transformers' rule), so its first visible key is max(0, i - w + 1); a global layer (w = 0) sees every key from 0.
Everything that depends on the rule asks `first_visible`: decode (the new token is the query at N - 1), chunked
prefill (a chunk's first query), the hybrid store's release of the blocks no later query can reach, the hybrid
prefix cache's windows and the byte model of sliding layers.
"""
from __future__ import annotations


def first_visible(position: int, window: int) -> int:
    """The first key position the query at `position` can see: max(0, position - window + 1), or 0 when
    `window` is 0 (a global layer). Plain ints, no checks: windows are validated where they are configured."""
    return max(0, position - window + 1) if window else 0
