"""A folder of files derived from a model file and cached beside it: published whole, trusted only through its manifest.

Two caches use it: the safetensors conversion of a GGUF file (`checkpoint`, `converted-<sha256>/`) and Gemma 3's
SentencePiece tokenizer built from the file's vocabulary (`tokenizer`, `sentencepiece-<sha256>/`). The name carries
the source file's full sha256 (64 hex digits), and so does the folder's `manifest.json`, with every other file's
name and size:

    folder = cache_folder.path(gguf, "converted", digest)
    if folder.exists():
        cache_folder.check(folder, digest)                # ValueError unless the manifest vouches for it
    else:
        cache_folder.publish(folder, gguf, digest, write)   # write(staging) fills a staging folder

What the manifest guards against: a folder left by another file (a stale or colliding name), and one edited, cut or
added to since it was written (a missing, resized, linked or extra file: an extra `*.safetensors` shard would
otherwise be loaded). File contents are not hashed on each load (about 2 s for SmolLM2's 538 MB of float32 weights
on this machine), and a folder is only as trustworthy as the folder it sits in: whoever can write beside the model
file can also write a matching manifest.

Invariants:
    1. A folder under its final name is complete: `publish` has `write` fill a staging folder beside it (the same
       file system), adds the manifest last, and renames the whole folder into place (os.replace). A failure midway
       leaves nothing under the final name and removes the staging folder.
    2. `check(folder, digest)` passes only when `manifest.json` parses, names `digest` as its source's sha256, and
       lists exactly the folder's files (relative paths, regular files, no links) with their sizes; anything else is
       a ValueError naming the folder and the first difference.
    3. Nothing is deleted or rebuilt over: an untrusted folder is refused, and the user removes it to build it again.
    4. Two processes publishing the same folder at once: the first rename wins; the second checks the winner's
       folder (invariant 2) and discards its own.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

MANIFEST = "manifest.json"
FORMAT = 1          # the manifest's layout; a different one is not trusted



def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """The sha256 of a file's bytes, as hex: what names a cache folder and what the fetch verifies."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

def path(source: str | Path, kind: str, digest: str) -> Path:
    """Where the `kind` cache of `source` (whose sha256 is `digest`) lives: `<kind>-<digest>/` beside it."""
    if not (isinstance(digest, str) and len(digest) == 64 and all(ch in "0123456789abcdef" for ch in digest)):
        raise ValueError(f"digest must be a sha256 as 64 lowercase hex digits, got {digest!r}")
    return Path(source).parent / f"{kind}-{digest}"


def check(folder: Path, digest: str) -> None:
    """Raise ValueError unless `folder` is a complete cache of the file whose sha256 is `digest` (invariant 2)."""
    folder = Path(folder)

    def untrusted(why: str) -> ValueError:
        return ValueError(f"{folder} is not a cache sparsekv can trust: {why}. Nothing was loaded from it; remove the "
                          "folder to build it again")

    if not folder.is_dir():
        raise untrusted("it is not a folder")
    manifest = folder / MANIFEST
    if manifest.is_symlink() or not manifest.is_file():
        raise untrusted(f"it has no {MANIFEST} (a regular file)")
    try:
        m = json.loads(manifest.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise untrusted(f"its {MANIFEST} does not parse as JSON ({exc})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("files"), dict):
        raise untrusted(f"its {MANIFEST} is not a format-{FORMAT} manifest with a 'files' table")
    if m.get("sha256") != digest:
        raise untrusted(f"its {MANIFEST} names source sha256 {m.get('sha256')!r}, expected {digest}")
    found = _listing(folder, untrusted)
    for name in sorted(set(found) | set(m["files"])):
        if name not in found:
            raise untrusted(f"{name} is listed in its {MANIFEST} but missing")
        if name not in m["files"]:
            raise untrusted(f"{name} is not listed in its {MANIFEST}")
        if found[name] != m["files"][name]:
            raise untrusted(f"{name} has {found[name]:,} bytes, its {MANIFEST} says {m['files'][name]!r}")


def publish(folder: Path, source: str | Path, digest: str, write: Callable[[Path], None]) -> Path:
    """Build the cache `folder` of `source` (sha256 `digest`): `write(staging)` writes its files into an empty
    staging folder, the manifest is added, and the folder is renamed into place (invariants 1 and 4)."""
    folder = Path(folder)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name[:24]}-") as tmp:
        staged = Path(tmp) / "out"
        staged.mkdir()
        write(staged)
        files = _listing(staged, lambda why: ValueError(f"the cache written for {folder} is unusable: {why}"))
        manifest = {"format": FORMAT, "source": Path(source).name, "sha256": digest, "files": files}
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        try:
            os.replace(staged, folder)      # atomic within one file system; fails onto a folder that is not empty
        except OSError:
            if not folder.exists():
                raise
            check(folder, digest)           # another process published it first
    return folder


def _listing(folder: Path, untrusted: Callable[[str], ValueError]) -> dict[str, int]:
    """Every file under `folder` but the manifest: relative POSIX path -> size in bytes."""
    out = {}
    for p in sorted(folder.rglob("*")):
        name = p.relative_to(folder).as_posix()
        if p.is_symlink():
            raise untrusted(f"{name} is a link")
        if p.is_dir():
            continue
        if not p.is_file():
            raise untrusted(f"{name} is not a regular file")
        if name != MANIFEST:
            out[name] = p.stat().st_size
    return out
