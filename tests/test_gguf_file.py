"""sparsekv.model.gguf_file against the gguf package's own reader: the same tensors, bytes and metadata, on a written
file with every value type and an odd alignment, and on both real models' files where they are present."""
from __future__ import annotations

import numpy as np
import pytest

from sparsekv.model import fetch
from sparsekv.model.gguf_file import ArrayValue, read_header

gguf = pytest.importorskip("gguf")
REPO = fetch.__file__.rsplit("/sparsekv/", 1)[0]


def assert_same_as_gguf_reader(path):
    """Every tensor's name, ggml type, dimensions, offset and bytes, and every scalar or string field, as GGUFReader
    reads them (arrays: their element type and length)."""
    ours, theirs = read_header(path), gguf.GGUFReader(str(path))
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.kind, a.ne, a.offset, a.n_bytes) == \
            (b.tensor_type.name, tuple(int(x) for x in b.shape), int(b.data_offset), int(b.n_bytes)), a.name
        if b.tensor_type.name not in ("F32", "F16", "BF16"):        # GGUFReader types the float ones' data
            assert a.rows().shape == b.data.shape and np.array_equal(a.rows(), b.data), a.name
        else:
            assert a.rows().tobytes() == np.ascontiguousarray(b.data).tobytes(), a.name
    assert list(ours.fields) == [k for k in theirs.fields if not k.startswith("GGUF.")]
    for key, f in theirs.fields.items():
        if key.startswith("GGUF."):                                 # GGUFReader's own header entries
            continue
        v, kind = ours.fields[key], f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            assert v == ArrayValue(int(f.types[1]), len(f.data)), key
        elif kind == gguf.GGUFValueType.STRING:
            assert v == bytes(f.parts[f.data[0]]).decode(), key
        else:
            assert v == f.parts[f.data[0]].tolist()[0], key
    return ours


def write(path, alignment=None):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    types = gguf.GGUFValueType
    for i, (vt, val) in enumerate([(types.UINT8, 7), (types.INT8, -3), (types.UINT16, 65000), (types.INT16, -2),
                                   (types.UINT32, 4_000_000_000), (types.INT32, -5), (types.FLOAT32, 0.25),
                                   (types.BOOL, True), (types.UINT64, 2**40 + 1), (types.INT64, -(2**40)),
                                   (types.FLOAT64, 1e-300), (types.STRING, "sp\u00e4rse")]):
        w.add_key_value(f"test.scalar{i}", val, vt)
    w.add_array("test.strings", ["a", "", "\u2581piece", "x" * 300])
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.empty", [])
    rng = np.random.default_rng(0)
    w.add_tensor("float", rng.standard_normal((3, 5)).astype(np.float32))
    q8 = rng.integers(0, 256, (7, 2 * 34), dtype=np.uint8)               # 7 rows of 64 Q8_0 weights
    w.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q4k = rng.integers(0, 256, (2, 144), dtype=np.uint8)                # 2 rows of 256 Q4_K weights
    w.add_tensor("q4k", q4k, raw_shape=q4k.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return q8, q4k


@pytest.mark.parametrize("alignment", [None, 64, 128])
def test_a_written_file_reads_as_gguf_reads_it(tmp_path, alignment):
    p = tmp_path / "t.gguf"
    q8, q4k = write(p, alignment)
    h = assert_same_as_gguf_reader(p)
    assert h.string("general.architecture") == "llama"
    rows = {t.name: t.rows() for t in h.tensors}
    assert np.array_equal(rows["q8"], q8) and np.array_equal(rows["q4k"], q4k)       # the bytes written, unchanged
    assert h.fields["test.scalar11"] == "sp\u00e4rse" and h.fields["test.strings"] == ArrayValue(8, 4)
    assert read_header(p, tensors=False).tensors == [] and read_header(p, tensors=False).fields == h.fields


@pytest.mark.parametrize("model", [fetch.SMOLLM2, fetch.GEMMA3_270M], ids=lambda m: m.name)
def test_the_real_model_files_read_as_gguf_reads_them(model):
    path = fetch.model_path(model, REPO)
    if not path.is_file():
        pytest.skip(f"{model.name} is not fetched (make model)")
    h = assert_same_as_gguf_reader(path)
    assert h.string("general.architecture") == {"smollm2": "llama", "gemma3-270m": "gemma3"}[model.name]


def test_bad_files_are_clear_errors(tmp_path):
    p = tmp_path / "t.gguf"
    write(p)
    data = p.read_bytes()
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        read_header(tmp_path / "absent.gguf")
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="magic"):
        read_header(tmp_path / "magic.gguf")
    for cut in (10, 40, len(data) - 1):                 # inside the header, a string, the last tensor's bytes
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated|shorter than its header"):
            read_header(tmp_path / "cut.gguf")
    (tmp_path / "version.gguf").write_bytes(data[:4] + (7).to_bytes(4, "little") + data[8:])
    with pytest.raises(ValueError, match="version must be 2 or 3"):
        read_header(tmp_path / "version.gguf")
    h = read_header(p)
    with pytest.raises(KeyError, match="no metadata key"):
        h.string("general.name")
    with pytest.raises(TypeError, match="must be a string"):
        h.string("test.scalar0")


def test_a_conversion_reads_each_file_s_metadata_once_and_leaves_gguf_as_it_was(tmp_path):
    """`checkpoint._one_reader_per_file`: transformers builds a new `gguf.GGUFReader` for a file's config, weights and
    tokenizer; inside the block every reader of one file is the same object (one parse of the metadata), with the
    fields a fresh reader reads; another file gets its own; a nested block shares the outer one's readers; on exit,
    an exception's included, `gguf.GGUFReader` is the class again."""
    from sparsekv.model import checkpoint
    real = gguf.GGUFReader
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write(a)
    write(b, alignment=64)
    with checkpoint._one_reader_per_file():
        first = gguf.GGUFReader(str(a))
        assert gguf.GGUFReader(a) is first and gguf.GGUFReader(str(tmp_path / "." / "a.gguf")) is first
        assert gguf.GGUFReader(b) is not first
        with checkpoint._one_reader_per_file():
            assert gguf.GGUFReader(a) is first
        assert gguf.GGUFReader is not real and gguf.GGUFReader(a) is first      # the inner block restored nothing
        fresh = real(str(a))
        assert list(first.fields) == list(fresh.fields)
        assert all(bytes(p) == bytes(q) for k in fresh.fields
                   for p, q in zip(first.fields[k].parts, fresh.fields[k].parts, strict=True))
    assert gguf.GGUFReader is real and real(str(a)) is not first
    with pytest.raises(RuntimeError, match="inside"):
        with checkpoint._one_reader_per_file():
            raise RuntimeError("inside")
    assert gguf.GGUFReader is real
