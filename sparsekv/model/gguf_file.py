"""A GGUF file's header, read without building a view of every metadata value.

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

Invariants:
    1. `Tensor.rows()` is the same bytes, in the same shape, as `GGUFReader`'s `ReaderTensor.data` for a block
       (quantised) format: uint8 [prod(ne[1:]), ne[0] / block size * block bytes].
    2. Every tensor lies inside the file (a truncated file is a ValueError, not a short read).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# GGUF value types: id -> struct format of a scalar (8 STRING and 9 ARRAY are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


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
    _buffer: mmap.mmap = field(repr=False, compare=False)

    def rows(self) -> np.ndarray:
        """The tensor's bytes as uint8 [prod(ne[1:]), bytes per ne[0]-row], read-only, without a copy."""
        outer = int(np.prod(self.ne[1:], dtype=np.int64)) if len(self.ne) > 1 else 1
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


class _Cursor:
    """Sequential little-endian reads over a buffer, each bounds-checked (a ValueError past the end)."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path} is truncated: the header ends at byte {len(self.buf)}, inside a value")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path} is truncated: a string of {n} bytes runs past the end of the file")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", self.buf, self.pos)
            self.pos += 8 + n
        if self.pos > len(self.buf):
            raise ValueError(f"{self.path} is truncated: an array of strings runs past the end of the file")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos - 4}")
        etype, count = self.take("<I"), self.take("<Q")
        if etype == _STRING:
            self.skip_strings(count)
        elif etype in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[etype])
        else:                                   # an array of arrays: walk it (no model file here has one)
            for _ in range(count):
                self.value(etype)
        if self.pos > len(self.buf):
            raise ValueError(f"{self.path} is truncated: an array runs past the end of the file")
        return ArrayValue(etype, count)


def read_header(path: str | Path, *, tensors: bool = True) -> Header:
    """The header of the GGUF file at `path` (module docstring). tensors=False stops after the metadata (no tensor
    infos: `Header.tensors` is empty). The file stays memory-mapped while a returned Tensor refers to it."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    with open(path, "rb") as f:
        if path.stat().st_size < 24:
            raise ValueError(f"{path} is not a GGUF file: {path.stat().st_size} bytes, shorter than its header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    c = _Cursor(buf, path)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file: magic {bytes(buf[:4])!r}, expected b'GGUF'")
    c.pos = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version must be 2 or 3 (little-endian), got {version} "
                         "(a big-endian file reads as a huge version)")
    n_tensors, n_fields = c.take("<Q"), c.take("<Q")
    fields: dict[str, object] = {}
    for _ in range(n_fields):
        key = c.string()
        fields[key] = c.value(c.take("<I"))
    infos = []
    if tensors:
        for _ in range(n_tensors):
            name, n_dims = c.string(), c.take("<I")
            ne = tuple(c.take("<Q") for _ in range(n_dims))
            infos.append((name, ne, c.take("<I"), c.take("<Q")))
    align = fields.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0:
        raise ValueError(f"{path}: general.alignment must be a positive integer, got {align!r}")
    data = -(-c.pos // align) * align
    out = []
    for name, ne, ttype, offset in infos:
        kind = GGMLQuantizationType(ttype)
        block, size = GGML_QUANT_SIZES[kind]
        n = int(np.prod(ne, dtype=np.int64)) if ne else 1
        if n % block:
            raise ValueError(f"{path}: tensor {name!r} has {n} elements, not a multiple of {kind.name}'s block {block}")
        t = Tensor(name, ne, kind.name, data + offset, n // block * size, buf)
        if t.offset + t.n_bytes > len(buf):
            raise ValueError(f"{path} is truncated: tensor {name!r} ends at byte {t.offset + t.n_bytes}, "
                             f"the file at {len(buf)}")
        out.append(t)
    return Header(path, version, fields, out)
