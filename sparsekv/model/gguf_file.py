"""A GGUF file's header, read without building a view of every metadata value, and read as hostile input.

The `gguf` package's `GGUFReader` makes a numpy view for every part of every field: about 790,000 of them for
Gemma 3 270M's 262,144-piece vocabulary, 15 to 30 s of each model load and of each `gguf_architecture` call. Here
the header is walked with `struct` instead: scalar and string values are decoded, arrays are skipped (recorded by
element type and length) and each tensor's bytes are a read-only memory map, so a header reads in about 0.1 s.
`GGUFReader` stays where the vocabulary itself is needed (`tokenizer._gguf_vocab`, on a cache miss).

Layout (GGUF v2 and v3, little-endian; gguf's docs/gguf.md):
    magic "GGUF", version uint32, tensor count uint64, metadata count uint64
    metadata: key (uint64 length + UTF-8), value type uint32, value
        value: a scalar of that type; a string (uint64 length + bytes); or an array: element type uint32,
        count uint64, the elements
    tensor infos: name (string), n_dims uint32, ne[n_dims] uint64 (ne[0] the fastest axis), ggml type uint32,
        offset uint64 (from the start of the data section)
    the data section: at the next multiple of `general.alignment` (32 when absent)

A file is untrusted input. Every count, length and dimension it declares is checked against a cap (`MAX_*` below,
each far above what real files use) and against the bytes left in the file before anything of that size is read or
allocated, and sizes are computed with Python integers (no int64 wrap-around).

Invariants:
    1. `Tensor.rows()` is the same bytes, in the same shape, as `GGUFReader`'s `ReaderTensor.data` for a block
       (quantised) format: uint8 [prod(ne[1:]), ne[0] / block size * block bytes].
    2. Every tensor lies inside the file (a truncated file is a ValueError, not a short read).
    3. A malformed header of any kind (truncated, a count over its cap or past the end of the file, an unknown value
       or ggml type, arrays nested too deep, a duplicate key or tensor name, a bad alignment) raises ValueError
       naming the file and the field; no other exception escapes `read_header` or `parse_header` for any bytes.
"""
from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Caps on what a header may declare, each far above the two real files' own values (in brackets). A count is also
# checked against the bytes left in the file, at the smallest size of one of its items, before it is walked.
MAX_TENSORS = 1 << 20       # tensor infos (236 in Gemma 3 270M, 272 in SmolLM2-135M; a 405B model has ~1,100)
MAX_FIELDS = 1 << 16        # metadata key-value pairs (33 in each)
MAX_ARRAY = 1 << 24         # elements of one array (262,144: Gemma's vocabulary, scores and token types)
MAX_STRING = 1 << 24        # bytes of one string: a key, a value, an array element, a tensor name (368)
MAX_DIMS = 4                # a tensor's n_dims: ggml's GGML_MAX_DIMS, which llama.cpp enforces too (2)
MAX_DEPTH = 8               # arrays nested in arrays (0: no real file nests them; llama.cpp reads none)
MAX_DIM = (1 << 63) - 1     # one dimension: ggml keeps ne as int64

# GGUF value types: id -> struct format of a scalar (8 STRING and 9 ARRAY are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# the fewest bytes one item can take: a scalar its size, a string its length, an array its type and count
_MIN_BYTES = {**{t: struct.calcsize(f) for t, f in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}
_MIN_FIELD = 8 + 4 + 1      # key length, value type, the smallest value
_MIN_TENSOR = 8 + 4 + 4 + 8  # name length, n_dims, ggml type, offset
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class ArrayValue:
    """An array in the metadata, not decoded: its element type (a GGUF value type id) and length."""

    element_type: int
    count: int


@dataclass(frozen=True)
class Tensor:
    """One tensor's info. ne: ggml's dimensions, fastest first; kind: the ggml type's name ("Q4_K", "F32", ...);
    offset: absolute, in bytes from the start of the file; n_bytes: its size in the file."""

    name: str
    ne: tuple[int, ...]
    kind: str
    offset: int
    n_bytes: int
    _buffer: mmap.mmap | bytes = field(repr=False, compare=False)

    def rows(self):
        """The tensor's bytes as uint8 [prod(ne[1:]), bytes per ne[0]-row], read-only, without a copy."""
        outer = math.prod(self.ne[1:])
        a = np.frombuffer(self._buffer, dtype=np.uint8, count=self.n_bytes, offset=self.offset)
        return a.reshape(outer, self.n_bytes // outer)


@dataclass(frozen=True)
class Header:
    """version; fields: key -> int, float, bool, str or ArrayValue, in file order; tensors in file order."""

    path: Path
    version: int
    fields: dict[str, object]
    tensors: list[Tensor]

    def string(self, key: str) -> str:
        """A string field's value (KeyError naming the key when absent, TypeError when not a string)."""
        if key not in self.fields:
            raise KeyError(f"{self.path.name} has no metadata key {key!r}")
        v = self.fields[key]
        if not isinstance(v, str):
            raise TypeError(f"{self.path.name}: {key!r} must be a string, got {type(v).__name__}")
        return v


def _shown(name: str) -> str:
    """A key or tensor name as an error message quotes it: repr'd, and cut short past 80 characters."""
    return repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name):,} characters)"


class _Cursor:
    """Sequential little-endian reads over a buffer, each bounds-checked: a ValueError naming `where` (the field
    being read) past the end of the buffer or over a cap."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.end, self.path = buf, 0, len(buf), path
        self.where = "the header"

    def error(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {self.where}: {what}")

    def truncated(self, what: str) -> ValueError:
        return ValueError(f"{self.path} is truncated: {self.where}: {what} runs past the end of the file "
                          f"(byte {self.end:,})")

    def take(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        if n > self.end - self.pos:
            raise self.truncated(f"{what} at byte {self.pos:,}")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def count(self, what: str, cap: int, item_bytes: int) -> int:
        """A uint64 count of items, at most `cap` and small enough that that many items of `item_bytes` each fit
        in the bytes left (checked before any item is read)."""
        n = self.take("<Q", what)
        if n > cap:
            raise self.error(f"{what} is {n:,}, more than the cap {cap:,}")
        if n * item_bytes > self.end - self.pos:
            raise self.truncated(f"{what} {n:,} (at least {n * item_bytes:,} bytes from byte {self.pos:,})")
        return n

    def string(self, what: str) -> str:
        n = self.count(f"{what}'s length", MAX_STRING, 1)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_strings(self, count: int) -> None:
        buf, pos, end = self.buf, self.pos, self.end
        for i in range(count):
            if pos + 8 > end:
                raise self.truncated(f"string {i:,} of {count:,}")
            (n,) = _U64.unpack_from(buf, pos)
            if n > MAX_STRING:
                raise self.error(f"string {i:,} of {count:,} has length {n:,}, more than the cap {MAX_STRING:,}")
            pos += 8 + n
        if pos > end:
            raise self.truncated(f"the last of {count:,} strings")
        self.pos = pos

    def value(self, vtype: int, depth: int = 0):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype], "the value")
        if vtype == _STRING:
            return self.string("the string value")
        if vtype != _ARRAY:
            raise self.error(f"value type must be a GGUF value type (0-12), got {vtype}")
        if depth >= MAX_DEPTH:
            raise self.error(f"arrays are nested more than {MAX_DEPTH} deep")
        etype = self.take("<I", "the array's element type")
        if etype not in _MIN_BYTES:
            raise self.error(f"the array's element type must be a GGUF value type (0-12), got {etype}")
        count = self.count("the array's length", MAX_ARRAY, _MIN_BYTES[etype])
        if etype == _STRING:
            self.skip_strings(count)
        elif etype in _SCALARS:
            self.pos += count * _MIN_BYTES[etype]           # inside the buffer: `count` checked it
        else:                                               # an array of arrays: walk it (no model file has one)
            for _ in range(count):
                self.value(_ARRAY, depth + 1)
        return ArrayValue(etype, count)


def read_header(path: str | Path, *, tensors: bool = True) -> Header:
    """The header of the GGUF file at `path` (module docstring). tensors=False stops after the metadata (no tensor
    infos: `Header.tensors` is empty). The file stays memory-mapped while a returned Tensor refers to it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    size = path.stat().st_size
    if size < 24:
        raise ValueError(f"{path} is not a GGUF file: {size} bytes, shorter than its header")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return parse_header(buf, path, tensors=tensors)


def parse_header(buf: bytes | mmap.mmap, path: str | Path = "<bytes>", *, tensors: bool = True) -> Header:
    """The header of a GGUF file already in memory (`read_header` maps the file and calls this): `buf` the file's
    bytes, `path` the name errors give it. Tensors refer to `buf` without a copy."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if not isinstance(buf, (bytes, mmap.mmap)):
        raise TypeError(f"buf must be bytes or an mmap.mmap, got {type(buf).__name__}")
    path = Path(path)
    if len(buf) < 24:
        raise ValueError(f"{path} is not a GGUF file: {len(buf)} bytes, shorter than its header")
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file: magic {bytes(buf[:4])!r}, expected b'GGUF'")
    c = _Cursor(buf, path)
    c.pos = 4
    version = c.take("<I", "the version")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version must be 2 or 3 (little-endian), got {version} "
                         "(a big-endian file reads as a huge version)")
    n_tensors = c.count("the tensor count", MAX_TENSORS, _MIN_TENSOR)
    n_fields = c.count("the metadata count", MAX_FIELDS, _MIN_FIELD)
    fields: dict[str, object] = {}
    for i in range(n_fields):
        c.where = f"metadata key {i:,}"
        key = c.string("its name")
        if key in fields:
            raise c.error(f"the key {_shown(key)} appears twice")
        c.where = f"metadata key {_shown(key)}"
        fields[key] = c.value(c.take("<I", "the value type"))
    align = fields.get("general.alignment", 32)
    if type(align) is not int or align <= 0 or align & (align - 1):
        raise ValueError(f"{path}: general.alignment must be a positive power of two, got {align!r}")
    infos, names = [], set()
    for i in range(n_tensors if tensors else 0):
        c.where = f"tensor info {i:,}"
        name = c.string("its name")
        if name in names:
            raise c.error(f"the tensor name {_shown(name)} appears twice")
        names.add(name)
        c.where = f"tensor {_shown(name)}"
        n_dims = c.take("<I", "n_dims")
        if n_dims > MAX_DIMS:
            raise c.error(f"n_dims is {n_dims:,}, more than ggml's {MAX_DIMS}")
        ne = tuple(c.take("<Q", f"ne[{j}]") for j in range(n_dims))
        for j, d in enumerate(ne):
            if not 1 <= d <= MAX_DIM:
                raise c.error(f"ne[{j}] must be between 1 and 2^63 - 1, got {d:,}")
        ttype = c.take("<I", "the ggml type")
        try:
            kind = GGMLQuantizationType(ttype)
            block, size = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise c.error(f"the ggml type must be one the gguf package knows, got {ttype}") from None
        if (ne[0] if ne else 1) % block:
            raise c.error(f"ne[0] = {ne[0] if ne else 1:,} is not a multiple of {kind.name}'s block {block}")
        infos.append((name, ne, kind.name, c.take("<Q", "the offset"), math.prod(ne) // block * size))
    data = -(-c.pos // align) * align
    out = []
    for name, ne, kind, offset, n_bytes in infos:
        if data + offset + n_bytes > len(buf):
            raise ValueError(f"{path} is truncated: tensor {_shown(name)} ({kind} {ne}) ends at byte "
                             f"{data + offset + n_bytes:,}, the file at {len(buf):,}")
        out.append(Tensor(name, ne, kind, data + offset, n_bytes, buf))
    return Header(path, version, fields, out)
