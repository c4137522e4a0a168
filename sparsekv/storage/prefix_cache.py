"""A prefix cache over the store's physical blocks: full blocks named by a chained SHA-256.

Block identity: block i of a prompt is named

    h_0 = sha256(b"root|" | namespace_bytes(namespace))   (the namespace: model id, adapter, tenant salt)
    h_i = sha256(h_{i-1} | token ids of block i as int64)

so a hit on block i implies the whole prefix up to it matches, inside the same namespace,
and a collision would need a SHA-256 collision. A namespace is None (the default, shared by every
caller that passes none), a str, bytes or an int, hashed as its type, its length and its bytes: "a",
b"a" and 97 are three namespaces. Anything else is a TypeError: an object would be named by something
other than its value (its repr leaves out fields declared repr=False), and two tenants would share blocks. Only full blocks are cached; they are
append-only in the store, so sharing them never needs a copy.

Lifecycle of a cached block: in use (ref count > 0) -> released (ref count 0, kept and
*evictable*) -> either hit again (back in use) or evicted when an allocation finds no
free block. The eviction order is the policy (`eviction.py`: lru, lfu, position, or any
registered one), bound once when the cache is built. Within equal keys, deeper blocks go first
(a leaf before its parent), because evicting a parent strands its cached descendants.
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
import weakref
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from ..core.checks import check_choice
from .block_table import BlockTable, Sequence
from .eviction import POLICIES, EvictionPolicy
from .store import BlockStore


@dataclass(frozen=True)
class PrefixMatch:
    """The cached prefix of a prompt: whole blocks, leaving at least one token to compute."""

    num_tokens: int
    block_ids: list[int]


@dataclass(frozen=True)
class Explanation:
    """Where a prompt's prefix stops matching the cache."""

    matched_blocks: int
    matched_tokens: int
    first_miss_block: int | None     # None: every cacheable block matched
    diff_token: int | None           # prompt index of the first token that differs from the closest cached block
    candidates: int                  # cached blocks that continue the matched prefix
    block_size: int

    def __str__(self) -> str:
        if self.first_miss_block is None:
            return f"all {self.matched_blocks} cacheable blocks hit ({self.matched_tokens} tokens)"
        s = (f"{self.matched_blocks} blocks hit ({self.matched_tokens} tokens); block {self.first_miss_block} "
             f"(tokens {self.first_miss_block * self.block_size}-{(self.first_miss_block + 1) * self.block_size - 1}) misses")
        if self.diff_token is None:
            return s + ": nothing cached continues this prefix"
        return s + f": it first differs from the closest cached block at token {self.diff_token}"


@dataclass
class CacheStats:
    queries: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=64))   # (hit, prompt) per query

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recent_hit_rate(self) -> float:
        p = sum(q for _, q in self.recent)
        return sum(h for h, _ in self.recent) / p if p else 0.0


def namespace_bytes(namespace) -> bytes:
    """The bytes a namespace is hashed as: a type tag, the value's length (8 bytes) and its bytes.

    None, str (UTF-8), bytes and int (two's complement), exact types only: a subclass or any other object is a
    TypeError, because its identity could be more than what it hashes as (a repr that leaves fields out)."""
    t = type(namespace)
    if namespace is None:
        return b"none"
    if t is str:
        tag, raw = b"str", namespace.encode("utf-8", "surrogatepass")
    elif t is bytes:
        tag, raw = b"bytes", namespace
    elif t is int:
        tag, raw = b"int", namespace.to_bytes(namespace.bit_length() // 8 + 1, "big", signed=True)
    else:
        raise TypeError(f"namespace must be None, str, bytes or int (a tenant's salt as bytes, a model id as str), "
                        f"got {t.__module__}.{t.__qualname__}; convert it to str or bytes where it is made")
    return tag + b"|" + len(raw).to_bytes(8, "big") + raw


@dataclass
class _Meta:
    digest: bytes
    parent: bytes
    namespace: object
    position: int            # block index in its prefix chain
    tokens: np.ndarray       # the block's token ids (for explain)
    hits: int = 0
    last_access: int = 0


class PrefixCache:
    """Maps chained block hashes to physical blocks of one `BlockStore`, or of a bare `BlockTable` (what the
    serving simulator and the workload replays use: the same hits and evictions, no tensors).

    Invariants:
    1. A digest maps to at most one block and a cached block to exactly one digest; the
       block holds exactly the K/V of the tokens its chain names (blocks are full and never
       rewritten).
    2. A cached block is in use (ref count > 0) or evictable (ref count 0); evictable blocks
       are exactly those the pool counts as evictable, so free + evictable + used == total.
    3. Allocation takes uncached free blocks first; only then are evictable blocks evicted,
       in policy order. A block in use, pinned blocks included, is never evicted.
    4. `match` never returns a block count that covers the prompt's last token.
    5. An evicted block's digest is forgotten before the block is handed out again.
    6. Prompts in different namespaces never share a block: a chain's root digest hashes the namespace's type,
       length and bytes (`namespace_bytes`), so None, "a", b"a" and 97 are four roots; any other namespace is a
       TypeError before anything changes.
    """

    def __init__(self, store: BlockStore, policy: str = "lru", high_watermark: float | None = None,
                 low_watermark: float | None = None, protect: float = 4.0, window: int = 64):
        if isinstance(store, BlockStore):
            # Weak proxies: the store's pool holds this cache as its evictor, so strong references back would make
            # every store with a prefix cache a reference cycle, its K/V freed only when the cycle collector runs
            # (notebook 11's smoke held six engines of 1.7 GB at once). The store keeps its cache alive.
            self.table = weakref.proxy(store.table)
            store = weakref.proxy(store)
        elif isinstance(store, BlockTable):
            self.table, store = store, None
        else:
            raise TypeError(f"store must be a BlockStore or a BlockTable, got {type(store).__name__}")
        check_choice("policy", policy, POLICIES)
        if (high_watermark is None) != (low_watermark is None):
            raise ValueError("set both high_watermark and low_watermark, or neither")
        if high_watermark is not None and not 0 < low_watermark <= high_watermark <= 1:
            raise ValueError(f"watermarks must satisfy 0 < low <= high <= 1, got low={low_watermark}, high={high_watermark}")
        if self.table.pool.evictor is not None:
            raise ValueError("store already has a prefix cache")
        self.store, self.policy, self.protect = store, policy, protect        # store: None over a bare table
        self._policy: EvictionPolicy = POLICIES[policy](protect=protect)          # bound once
        self.block_size = self.table.block_size
        self.high, self.low = high_watermark, low_watermark
        self._by_digest: dict[bytes, int] = {}
        self._meta: dict[int, _Meta] = {}
        self._children: dict[bytes, set[int]] = {}
        self._heap: list[tuple] = []           # (key, -position, tiebreak, block) with lazy deletion
        self._evictable: dict[int, int] = {}   # block -> stamp of its live heap entry
        self._pins: dict[str, list[int]] = {}
        self._chains: dict[int, tuple] = {}     # seq id -> (full blocks hashed, last digest, root digest, seq): see insert
        self._clock = itertools.count(1)
        self._tie = itertools.count()
        self.stats = CacheStats(recent=deque(maxlen=window))
        self.table.pool.evictor = self

    # -- hashing ----------------------------------------------------------------------------
    @staticmethod
    def root(namespace=None) -> bytes:
        return hashlib.sha256(b"root|" + namespace_bytes(namespace)).digest()

    def block_digests(self, token_ids, namespace=None, max_blocks: int | None = None) -> list[bytes]:
        """Chained digests of the full blocks of `token_ids` (at most `max_blocks`)."""
        ids = _as_int64(token_ids)
        n = len(ids) // self.block_size if max_blocks is None else min(max_blocks, len(ids) // self.block_size)
        raw = ids[: n * self.block_size].tobytes()
        step = self.block_size * 8
        h, out = self.root(namespace), []
        for i in range(n):
            h = hashlib.sha256(h + raw[i * step:(i + 1) * step]).digest()
            out.append(h)
        return out

    # -- public -----------------------------------------------------------------------------
    def match(self, token_ids, namespace=None) -> PrefixMatch:
        """The longest cached prefix of `token_ids`, in whole blocks, leaving >= 1 token to compute."""
        ids = _as_int64(token_ids)
        cacheable = (len(ids) - 1) // self.block_size
        blocks = []
        h = self.root(namespace)
        raw, step = ids[: cacheable * self.block_size].tobytes(), self.block_size * 8
        for i in range(cacheable):                # stops at the first miss: no work past it
            h = hashlib.sha256(h + raw[i * step:(i + 1) * step]).digest()
            b = self._by_digest.get(h)
            if b is None:
                break
            blocks.append(b)
        hit = len(blocks) * self.block_size
        self.stats.queries += 1
        self.stats.prompt_tokens += len(ids)
        self.stats.hit_tokens += hit
        self.stats.recent.append((hit, len(ids)))
        return PrefixMatch(hit, blocks)

    def peek(self, token_ids, namespace=None) -> int:
        """The tokens `match` would reuse for `token_ids`, without counting a query or touching any block
        (what a scheduler asks before it admits a request)."""
        ids = _as_int64(token_ids)
        cacheable = (len(ids) - 1) // self.block_size
        h, n = self.root(namespace), 0
        raw, step = ids[: cacheable * self.block_size].tobytes(), self.block_size * 8
        for i in range(cacheable):
            h = hashlib.sha256(h + raw[i * step:(i + 1) * step]).digest()
            if h not in self._by_digest:
                break
            n += 1
        return n * self.block_size

    def attach(self, seq: Sequence, token_ids, namespace=None) -> int:
        """Start empty `seq` on the cached prefix of `token_ids`; returns the cached token count."""
        m = self.match(token_ids, namespace)
        self.table.attach(seq, m.block_ids)
        now = next(self._clock)
        for b in m.block_ids:
            meta = self._meta[b]
            meta.hits += 1
            meta.last_access = now
        return m.num_tokens

    def insert(self, seq: Sequence, token_ids, namespace=None) -> int:
        """Register the full blocks of `seq` (whose tokens are `token_ids`); returns blocks newly cached.

        Called again on a longer `seq` (a server publishes a prompt chunk by chunk), it hashes only the blocks
        that became full since: a live sequence's full blocks never change (they are append-only).
        """
        self.table.check_seq(seq)
        ids = _as_int64(token_ids)
        if len(ids) != seq.num_tokens:
            raise ValueError(f"token_ids must be the sequence's {seq.num_tokens} tokens, got {len(ids)}")
        n_full = len(ids) // self.block_size
        root = self.root(namespace)                     # a TypeError for a bad namespace, before anything changes
        start, parent = 0, root
        memo = self._chains.get(seq.seq_id)
        if memo is not None and memo[3] is seq and memo[2] == root and memo[0] <= n_full:
            start, parent = memo[0], memo[1]
        bs, step = self.block_size, self.block_size * 8
        raw = ids[start * bs: n_full * bs].tobytes()
        table = seq.block_ids
        now, added = next(self._clock), 0
        for i in range(start, n_full):
            d = hashlib.sha256(parent + raw[(i - start) * step:(i - start + 1) * step]).digest()
            b = table[i]
            if b < 0:                           # released by a sliding window: the chain goes on, nothing to cache
                parent = d
                continue
            known = self._by_digest.get(d)
            if known is None and b not in self._meta:
                self._by_digest[d] = b
                self._meta[b] = _Meta(d, parent, namespace, i, ids[i * bs:(i + 1) * bs].copy(), last_access=now)
                self._children.setdefault(parent, set()).add(b)
                added += 1
            elif known is not None:
                self._meta[known].last_access = now
            parent = d
        self._chains[seq.seq_id] = (n_full, parent, root, seq)
        if len(self._chains) > 4 * len(self.table.sequences) + 64:          # forget sequences that were freed
            self._chains = {k: v for k, v in self._chains.items() if v[3].alive}
        return added

    def retain(self, seq: Sequence, token_ids, namespace=None) -> int:
        """Register the blocks a sliding window is about to release (`HybridPrefixCache.retain`): here none, as one
        store of global layers releases nothing before `seq` is freed. The Engine calls it after every step of any
        store, so that it never asks which prefix cache it holds. Returns 0, the blocks newly cached."""
        return 0

    def pin(self, name: str, token_ids, namespace=None) -> int:
        """Hold the cached prefix of `token_ids` in use (never evicted) under `name`; returns its blocks."""
        if name in self._pins:
            raise ValueError(f"name {name!r} is already pinned; unpin it first")
        ids = _as_int64(token_ids)
        blocks = []
        for d in self.block_digests(ids, namespace):
            b = self._by_digest.get(d)
            if b is None:
                break
            blocks.append(b)
        self.table.pool.incref(blocks)
        self._pins[name] = blocks
        return len(blocks)

    def unpin(self, name: str) -> None:
        if name not in self._pins:
            raise ValueError(f"name {name!r} is not pinned; pinned: {sorted(self._pins)}")
        self.table.pool.decref(self._pins.pop(name))

    def spill(self) -> int:
        """Move the hot tiles of every evictable (released, still cached) block to the store's cold tier,
        as LMCache's local-disk backend does: the blocks keep their digests and still hit, and a hit reads
        them back exactly. Returns the tiles moved (0 without a cold tier, or over a bare table)."""
        return 0 if self.store is None else self.store.spill(list(self._evictable))

    def maintain(self) -> int:
        """Background eviction: above the high watermark (occupied share of blocks), evict
        evictable blocks down to the low watermark. Returns blocks evicted.

        With a cold tier, evictable blocks are spilled to it first (`spill`): hot memory goes back to
        the hot tier while the blocks stay cached; the watermarks then bound the blocks the cache holds
        in both tiers, and only eviction forgets."""
        if self.store is not None and self.store.tiers is not None:
            self.spill()
        if self.high is None:
            return 0
        pool = self.table.pool
        occupied = pool.num_blocks - len(pool.free_queue())
        if occupied <= self.high * pool.num_blocks:
            return 0
        n = min(self.num_evictable, occupied - int(self.low * pool.num_blocks))
        freed = self.evict(n)
        pool.make_free(freed)
        return len(freed)

    def explain(self, token_ids, namespace=None) -> Explanation:
        """Where `token_ids` stops matching: the first missing block and the first differing token."""
        ids = _as_int64(token_ids)
        cacheable = (len(ids) - 1) // self.block_size
        digests = self.block_digests(ids, namespace, max_blocks=cacheable)
        parent, matched = self.root(namespace), 0
        for d in digests:
            if d not in self._by_digest:
                break
            parent, matched = d, matched + 1
        if matched == cacheable:
            return Explanation(matched, matched * self.block_size, None, None, 0, self.block_size)
        mine = ids[matched * self.block_size:(matched + 1) * self.block_size]
        cands = list(self._children.get(parent, ()))
        diff = None
        if cands:
            best = max(len(_common_prefix(self._meta[b].tokens, mine)) for b in cands)
            diff = matched * self.block_size + best
        return Explanation(matched, matched * self.block_size, matched, diff, len(cands), self.block_size)

    # -- observability ----------------------------------------------------------------------
    @property
    def num_cached(self) -> int:
        return len(self._meta)

    def occupancy(self) -> dict:
        """Cached blocks per namespace, blocks per pinned prefix, and pool shares."""
        per_ns: dict = {}
        for m in self._meta.values():
            per_ns[repr(m.namespace)] = per_ns.get(repr(m.namespace), 0) + 1
        pool = self.table.pool
        return {"namespaces": per_ns, "pinned": {k: len(v) for k, v in self._pins.items()},
                "cached": len(self._meta), "evictable": self.num_evictable,
                "free": len(pool.free_queue()), "used": pool.num_used, "total": pool.num_blocks}

    # -- the pool's evictor protocol ----------------------------------------------------------
    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._meta

    def on_release(self, block_id: int) -> None:
        m = self._meta[block_id]
        key = self._policy.key(m)
        stamp = next(self._tie)
        self._evictable[block_id] = stamp           # only the entry with this stamp is live
        heapq.heappush(self._heap, (key, -m.position, stamp, block_id))

    def on_acquire(self, block_id: int) -> None:
        del self._evictable[block_id]           # its heap entry goes stale and is skipped lazily

    def evict(self, n: int) -> list[int]:
        out = []
        while len(out) < n:
            _, _, stamp, b = heapq.heappop(self._heap)
            if self._evictable.get(b) != stamp:
                continue                         # stale: hit (and maybe released) since this entry
            del self._evictable[b]
            self._forget(b)
            out.append(b)
        self.stats.evictions += len(out)
        return out

    def _forget(self, block_id: int) -> None:
        m = self._meta.pop(block_id)
        del self._by_digest[m.digest]
        kids = self._children.get(m.parent)
        if kids is not None:
            kids.discard(block_id)
            if not kids:
                del self._children[m.parent]


def _as_int64(token_ids) -> np.ndarray:
    if isinstance(token_ids, torch.Tensor):
        return token_ids.detach().cpu().to(torch.int64).numpy().ravel()
    return np.asarray(token_ids, dtype=np.int64).ravel()


def _common_prefix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return a[: (diff[0] if len(diff) else n)]
