"""The cold tier: block tiles in one file on disk, each record authenticated, read back exactly.

One file per store, in `StoreConfig.cold_dir`, created with a unique name and deleted when the
store is closed or collected. The file is addressed by (layer, block id):

    record(layer, block) at offset (layer * num_blocks + block) * stride
    record = K tile [H, bs, D] | V tile [H, bs, D] | (int8 stores) K scales [H, bs] | V scales [H, bs]
    stride = the record's bytes rounded up to 4096 (so O_DIRECT can read and write it)

The file is sparse: only records that were written take disk space.

Authentication. Anyone who can write the file (a shared `cold_dir`) must not choose the K/V a model
reads, so a checksum is not enough: CRC-32 is affine, and 4 adjusted bytes give any tile (all +inf
keys, say) the CRC of the record it replaces. Each record instead gets a 16-byte keyed BLAKE2b tag

    tag(layer, block) = blake2b(key, digest 16 bytes) over  layer | block | generation | record bytes

with a random 32-byte key per store (os.urandom, never written anywhere) and `generation` the slot's
count of writes. Tags and generations stay in memory (`tag`, `generation`), beside the block's
summaries, which never leave memory. A read recomputes the tag over what it read: a record that is
short, corrupted, forged, an older generation of the same slot, or another slot's raises
`ColdBlockError` naming the layer and block; its bytes are never returned.

The file is opened once: `tempfile.mkstemp` creates it (O_EXCL, O_NOFOLLOW, mode 0600) and its own
descriptor is the one used, O_DIRECT switched on with fcntl; the path is never opened again, so a
symlink or a file swapped in at that path in a shared `cold_dir` is never written. `close()` unlinks
the path only while it still names this file.

The page cache. With `direct=True` (the default) the descriptor gets O_DIRECT where the
file system allows it, so every read reaches the device and the OS page cache never hides the
disk (`io_mode` says "O_DIRECT"). Where O_DIRECT is refused, reads go through the page cache and
`drop_cache()` asks the kernel to drop the file's clean pages (posix_fadvise DONTNEED after
fdatasync); `io_mode` then says "page cache (dropped by fadvise)".

Prefetch. `submit(layer, block)` reads and authenticates a record on one background thread (os.preadv
and hashlib's BLAKE2b release the GIL) and returns a Future; the store installs the result on the main
thread, so only this module's file descriptor is shared between threads.
"""
from __future__ import annotations

import hashlib
import hmac
import mmap
import os
import struct
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ALIGN = 4096     # O_DIRECT's alignment of offsets, sizes and buffers (one page)
TAG_BYTES = 16   # a record's keyed BLAKE2b digest (128 bits: forging one is a 2^128 guess without the key)
KEY_BYTES = 32   # the per-store BLAKE2b key, from os.urandom


class ColdBlockError(RuntimeError):
    """A cold block that cannot be served: its record is torn, corrupted, forged, replayed, or unreadable.

    Attributes: layer and block (the physical block id) of the record, and `reason`.
    """

    def __init__(self, layer: int, block: int, reason: str):
        self.layer, self.block, self.reason = int(layer), int(block), reason
        super().__init__(f"cold block {self.block} (layer {self.layer}) cannot be served: {reason}")


@dataclass
class ColdStats:
    """What the cold tier moved, and the time it took (seconds are wall time on the caller's thread,
    except `prefetch_read_s`, spent on the background thread)."""

    reads: int = 0                  # records read on the caller's thread (a miss: the step waited for the disk)
    prefetched: int = 0             # records read on the background thread
    writes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_s: float = 0.0
    write_s: float = 0.0
    prefetch_read_s: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _aligned(nbytes: int) -> mmap.mmap:
    """A page-aligned, zeroed buffer of `nbytes` (anonymous mmap): what O_DIRECT reads into."""
    return mmap.mmap(-1, nbytes)


class ColdFile:
    """Fixed-size records of `record_bytes` for `num_layers * num_blocks` (layer, block) slots.

    Invariants:
    1. `read(layer, block)` and `submit(layer, block)` return exactly the bytes of the last
       `write(layer, block, ...)`, or raise `ColdBlockError`; they never return bytes whose keyed tag over
       (layer, block, the slot's generation, bytes) differs from the one written: not a forged record, not an
       earlier generation of the slot, not another slot's record.
    2. `generation[layer, block]` counts the slot's completed writes; a write changes only its own slot.
    3. Records never overlap: each starts on a 4096-byte boundary and `stride >= record_bytes`.
    4. The file is mkstemp's: its descriptor is the only one opened, the path is never opened again.
    5. The file exists from construction until `close()` (or garbage collection), then is deleted.
    """

    def __init__(self, directory, num_layers: int, num_blocks: int, record_bytes: int, direct: bool = True):
        path = Path(directory) if directory is not None else None
        if path is None or not path.is_dir():
            raise ValueError(f"cold_dir must be an existing directory, got {str(directory)!r}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"cold_dir must be writable, and {str(path)!r} is not")
        self.num_layers, self.num_blocks, self.record_bytes = num_layers, num_blocks, record_bytes
        self.stride = -(-record_bytes // ALIGN) * ALIGN
        fd, name = tempfile.mkstemp(prefix="sparsekv-cold-", suffix=".kv", dir=path)    # O_EXCL | O_NOFOLLOW
        self.path, self.fd = Path(name), fd                                 # mkstemp's descriptor: never reopened
        try:
            self.io_mode = self._direct(fd, direct)
            os.ftruncate(fd, self.stride * num_layers * num_blocks)          # sparse: no space until written
        except BaseException:
            ColdFile._cleanup(fd, name, [None])
            raise
        self._key = os.urandom(KEY_BYTES)                                   # this store's; never leaves memory
        self.generation = np.zeros((num_layers, num_blocks), dtype=np.uint64)       # completed writes per slot
        self.tag = np.zeros((num_layers, num_blocks, TAG_BYTES), dtype=np.uint8)    # each slot's last record's tag
        self.stats = ColdStats()
        self._lock = threading.Lock()                                       # guards stats from the reader thread
        self._pool: ThreadPoolExecutor | None = None
        self._finalizer = weakref.finalize(self, ColdFile._cleanup, self.fd, str(self.path), [None])

    @staticmethod
    def _direct(fd: int, direct: bool) -> str:
        """Switch O_DIRECT on for mkstemp's descriptor (Linux's fcntl F_SETFL allows it) and probe one aligned
        write and read; where the file system refuses either, switch it off again and use the page cache."""
        if direct and hasattr(os, "O_DIRECT"):
            import fcntl
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            try:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
                probe = _aligned(ALIGN)
                os.pwritev(fd, [probe], 0)                                   # some file systems refuse at I/O time
                os.preadv(fd, [probe], 0)
                return "O_DIRECT"
            except OSError:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        return "page cache (dropped by fadvise)"

    def _mac(self, layer: int, block: int, generation: int, data) -> bytes:
        """The record's tag: keyed BLAKE2b over its slot, its generation and its bytes."""
        h = hashlib.blake2b(struct.pack("<QQQ", layer, block, generation), digest_size=TAG_BYTES, key=self._key)
        h.update(data)
        return h.digest()

    def expected(self, layer: int, block: int) -> tuple[int, bytes]:
        """(generation, tag) a read of (layer, block) must match: the slot's last completed write."""
        return int(self.generation[layer, block]), self.tag[layer, block].tobytes()

    # -- records ----------------------------------------------------------------------
    def offset(self, layer: int, block: int) -> int:
        return (layer * self.num_blocks + block) * self.stride

    def write(self, layer: int, block: int, payload: torch.Tensor) -> None:
        """Write one record: `payload` a contiguous uint8 CPU tensor of `record_bytes`."""
        if payload.dtype != torch.uint8 or payload.numel() != self.record_bytes:
            raise ValueError(f"payload must be {self.record_bytes} uint8 bytes, got {payload.numel()} {payload.dtype}")
        t0 = time.perf_counter()
        buf = _aligned(self.stride)
        data = payload.numpy()
        np.frombuffer(buf, dtype=np.uint8, count=self.record_bytes)[:] = data
        gen = int(self.generation[layer, block]) + 1
        tag = self._mac(layer, block, gen, data)
        n = os.pwritev(self.fd, [buf], self.offset(layer, block))
        if n != self.stride:
            raise OSError(f"short write of cold block {block} (layer {layer}): {n} of {self.stride} bytes")
        self.generation[layer, block] = gen
        self.tag[layer, block] = np.frombuffer(tag, dtype=np.uint8)
        with self._lock:
            self.stats.writes += 1
            self.stats.bytes_written += self.stride
            self.stats.write_s += time.perf_counter() - t0

    def read(self, layer: int, block: int) -> torch.Tensor:
        """The record of (layer, block) as a uint8 tensor of `record_bytes`, after its tag is checked."""
        t0 = time.perf_counter()
        out = self._read(layer, block, *self.expected(layer, block))
        with self._lock:
            self.stats.reads += 1
            self.stats.bytes_read += self.stride
            self.stats.read_s += time.perf_counter() - t0
        return out

    def submit(self, layer: int, block: int) -> Future:
        """Read (layer, block) on the background thread; the Future holds the record or a ColdBlockError.
        The record must match the slot's tag as it is now (a write after this call makes the read fail)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparsekv-prefetch")
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, ColdFile._cleanup, self.fd, str(self.path), [self._pool])
        return self._pool.submit(self._read_counted, layer, block, *self.expected(layer, block))

    def _read_counted(self, layer: int, block: int, generation: int, tag: bytes) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self._read(layer, block, generation, tag)
        with self._lock:
            self.stats.prefetched += 1
            self.stats.bytes_read += self.stride
            self.stats.prefetch_read_s += time.perf_counter() - t0
        return out

    def _read(self, layer: int, block: int, generation: int, tag: bytes) -> torch.Tensor:
        buf = _aligned(self.stride)
        try:
            n = os.preadv(self.fd, [buf], self.offset(layer, block))
        except OSError as exc:
            raise ColdBlockError(layer, block, f"read failed ({exc})") from exc
        if n != self.stride:
            raise ColdBlockError(layer, block, f"torn record: read {n} of {self.stride} bytes")
        data = np.frombuffer(buf, dtype=np.uint8, count=self.record_bytes)
        if generation == 0:
            raise ColdBlockError(layer, block, "checksum mismatch: the slot was never written")
        if not hmac.compare_digest(self._mac(layer, block, generation, data), tag):
            raise ColdBlockError(layer, block, f"checksum mismatch: the keyed BLAKE2b tag over (layer, block, "
                                 f"generation {generation}, bytes) is not the one written (corrupted, forged, "
                                 f"an older generation or another slot's record)")
        return torch.from_numpy(data.copy())

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = ColdStats()

    # -- the page cache -----------------------------------------------------------------
    def drop_cache(self) -> None:
        """Flush the file and drop its pages from the OS page cache (a no-op under O_DIRECT)."""
        if self.io_mode == "O_DIRECT":
            return
        os.fdatasync(self.fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def file_bytes(self) -> int:
        """Bytes the file occupies on disk (its allocated blocks; the file is sparse)."""
        return os.fstat(self.fd).st_blocks * 512

    def close(self) -> None:
        """Stop the reader thread, close and delete the file. Idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @staticmethod
    def _cleanup(fd: int, path: str, pool: list) -> None:
        if pool[0] is not None:
            pool[0].shutdown(wait=True, cancel_futures=True)
        try:
            mine, there = os.fstat(fd), os.lstat(path)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):     # never unlink what replaced the file
                os.unlink(path)
        except OSError:
            pass
        try:
            os.close(fd)
        except OSError:
            pass
