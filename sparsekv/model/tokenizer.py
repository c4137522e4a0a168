"""A SentencePiece tokenizer built from a GGUF file's own vocabulary (Gemma 3's), with the calls the suite makes.

transformers 5.2 builds Gemma 3's GGUF tokenizer as a Unigram model and adds no BOS, so "The capital of France is"
comes out as ten pieces (`The ▁c ap it al ...`) and the model answers " is is is". The file carries everything a
correct one needs: `tokenizer.ggml.model = llama` (SentencePiece), 262,144 pieces with their scores and token
types, `add_space_prefix = false`, byte pieces for byte fallback, and the special ids. `from_gguf` builds a
SentencePiece BPE model from exactly those pieces: byte fallback on, no dummy prefix, whitespace escaped to `▁`,
nothing else normalised. Scores fall with the id (the merge priority), so BPE merges the pair with the higher score
first, as llama.cpp does.

One trap: the file stores its user-defined whitespace runs (2 to 31 spaces) with literal spaces, while SentencePiece
matches user-defined pieces after it has escaped spaces to `▁`; written as they are, they would never match (four
spaces of indentation would become four one-space tokens). They are written with `▁` here.

    tok = GGUFTokenizer.from_gguf("data/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf")
    tok("The capital of France is")["input_ids"]       # [2, 818, 5279, 529, 7001, 563]

A base model has no chat template: `apply_chat_template` raises, and prompts for it are completion-style.
"""
from __future__ import annotations

from pathlib import Path

from . import cache_folder
from .cache_folder import sha256_file

SPACE = "\u2581"          # SentencePiece's escaped space, "▁"


def _gguf_vocab(path: Path) -> dict:
    """The tokenizer fields of a GGUF file: pieces, scores, token types, special ids, flags."""
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    f = r.fields

    def scalar(name, default=None):
        if name not in f:
            return default
        v = f[name].parts[f[name].data[0]]
        return v.tobytes().decode() if v.dtype.kind in "u" and v.dtype.itemsize == 1 else v.tolist()[0]

    tok = f["tokenizer.ggml.tokens"]
    pieces = [bytes(tok.parts[i]).decode("utf-8") for i in tok.data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    return {"model": scalar("tokenizer.ggml.model"), "pieces": pieces, "scores": scores, "types": types,
            "bos": scalar("tokenizer.ggml.bos_token_id"), "eos": scalar("tokenizer.ggml.eos_token_id"),
            "unk": scalar("tokenizer.ggml.unknown_token_id"), "pad": scalar("tokenizer.ggml.padding_token_id"),
            "add_bos": bool(scalar("tokenizer.ggml.add_bos_token", True)),
            "add_space_prefix": bool(scalar("tokenizer.ggml.add_space_prefix", False)),
            "architecture": scalar("general.architecture")}


def build_model_proto(vocab: dict) -> bytes:
    """A serialized SentencePiece BPE ModelProto from a GGUF vocabulary (see the module docstring)."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    if vocab["model"] != "llama":
        raise ValueError(f"the GGUF tokenizer must be SentencePiece (tokenizer.ggml.model = 'llama'), got {vocab['model']!r}")
    m = pb.ModelProto()
    t = m.trainer_spec
    t.model_type = pb.TrainerSpec.BPE
    t.vocab_size = len(vocab["pieces"])
    t.byte_fallback = True
    t.unk_id, t.bos_id, t.eos_id = vocab["unk"], vocab["bos"], vocab["eos"]
    t.pad_id = vocab["pad"] if vocab["pad"] is not None else -1
    n = m.normalizer_spec
    n.name = "identity"
    n.add_dummy_prefix = vocab["add_space_prefix"]
    n.remove_extra_whitespaces = False
    n.escape_whitespaces = True
    for i, (piece, score, kind) in enumerate(zip(vocab["pieces"], vocab["scores"], vocab["types"])):
        p = m.pieces.add()
        if kind == 4 and piece.strip(" ") == "":              # user-defined runs of spaces: matched after escaping
            piece = piece.replace(" ", SPACE)
        p.piece, p.score = piece, score
        p.type = pb.ModelProto.SentencePiece.UNKNOWN if i == vocab["unk"] else kind   # GGUF and SentencePiece agree
    return m.SerializeToString()


class GGUFTokenizer:
    """A SentencePiece tokenizer with the transformers-like calls the suite uses:

        tok(text, add_special_tokens=True) -> {"input_ids": [...]}     (BOS first when the file says add_bos)
        tok.encode(text, add_special_tokens=True) -> [...]
        tok.decode(ids, skip_special_tokens=False) -> str
        tok.convert_ids_to_tokens(ids) -> [piece, ...]
        bos_token_id, eos_token_id, vocab_size
    """

    def __init__(self, model_proto: bytes, bos: int, eos: int, add_bos: bool = True, name: str = ""):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.bos_token_id, self.eos_token_id, self.add_bos, self.name = bos, eos, add_bos, name
        self.vocab_size = self.sp.get_piece_size()
        self.chat_template = None

    @classmethod
    def from_gguf(cls, path: str | Path, cache: bool = False) -> "GGUFTokenizer":
        """From a GGUF file. cache=True keeps the built model proto in `sentencepiece-<sha256>/` beside the file
        (the file's full sha256; `model.cache_folder`: published whole with a manifest, so a reader never sees a
        partial file, and a folder whose manifest does not vouch for it is a ValueError) and reads it back from
        there instead of rebuilding it."""
        if not isinstance(cache, bool):
            raise TypeError(f"cache must be a bool (the cache folder is sentencepiece-<sha256> beside the file), "
                            f"got {type(cache).__name__}")
        path = Path(path)
        if cache:
            digest = sha256_file(path)
            folder = cache_folder.path(path, "sentencepiece", digest)
            if folder.exists() or folder.is_symlink():
                cache_folder.check(folder, digest)
                ids = (folder / "tokenizer.ids").read_text().split()
                if len(ids) != 3 or not all(x.lstrip("-").isdigit() for x in ids):
                    raise ValueError(f"{folder / 'tokenizer.ids'} must hold three integers (bos eos add_bos), got "
                                     f"{' '.join(ids)[:80]!r}")
                bos, eos, add_bos = (int(x) for x in ids)
                return cls((folder / "tokenizer.model").read_bytes(), bos, eos, bool(add_bos), path.name)
        vocab = _gguf_vocab(path)
        proto = build_model_proto(vocab)
        if cache:
            def write(out: Path) -> None:
                (out / "tokenizer.model").write_bytes(proto)
                (out / "tokenizer.ids").write_text(f"{vocab['bos']} {vocab['eos']} {int(vocab['add_bos'])}")

            cache_folder.publish(folder, path, digest, write)
        return cls(proto, vocab["bos"], vocab["eos"], vocab["add_bos"], path.name)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self.sp.encode(text)
        return [self.bos_token_id] + ids if add_special_tokens and self.add_bos else ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if not self.sp.is_control(i)]
        return self.sp.decode(ids)

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def __len__(self) -> int:
        return self.vocab_size

    def apply_chat_template(self, *args, **kwargs):
        raise ValueError(f"{self.name or 'this tokenizer'} has no chat template (a base model): build a completion-style "
                         "prompt instead, e.g. one ending 'Question: ...\\nAnswer: The pass key is'")


def gguf_architecture(path: str | Path) -> str:
    """`general.architecture` of a GGUF file (reads the metadata only: `gguf_file.read_header`)."""
    from .gguf_file import read_header
    return read_header(path, tensors=False).string("general.architecture")
