"""The book: README, docs/ and the notebooks with their outputs, as one static site (`make book`).

    python -m sparsekv book [--root DIR] [--out build/book] [--stage build/book_src] [--shots build/browser]

A reader sees every output without running anything. The site is built in two steps:

    stage(root, stage_dir)     copy what the site shows into stage_dir/pages/, the repository's own layout kept
                               (README.md at the top, docs/, notebooks/, figures/), so every relative link in the
                               README and docs/ resolves as it does on GitHub; write stage_dir/mkdocs.yml with the nav
    build(stage_dir, site)     mkdocs (the material theme, mkdocs-jupyter for the notebooks) in strict mode: a
                               page linking to a file that was not staged fails the build

Each notebook page comes from the best copy there is, in this order (`pick`): the executed copy of the last full
run (build/notebooks/full/, `make notebooks`), a smoke run's (build/notebooks/smoke/, small parameters), else the
committed notebook, which has no outputs. A banner under the title says which, when it ran, and whether the
notebook changed since (its cells differ from the committed ones). Figures saved by the notebooks are inline in
their outputs; the committed PNGs the docs link to are copied beside them. The live explorers (ipywidgets) need a
kernel: their page shows the screenshots `tests/test_browser.py` leaves in build/browser/, with how to open each
in JupyterLab (`make lab`).

Nothing here is committed: the site (tens of MB of executed notebooks with their images inline) is rebuilt from
the executed copies, which are artifacts too (docs/setup.md). The generator is the `book` extra of pyproject.toml.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# Executed copies, best first: (kind, folder relative to the root). The committed notebook is the fallback.
RUNS = (("full", Path("build/notebooks/full")), ("smoke", Path("build/notebooks/smoke")))
SHOTS = Path("build/browser")                         # tests/test_browser.py's screenshots of the explorers
DOCS_ORDER = ("setup", "models", "map", "findings", "benchmarks", "peers", "serving", "regression", "figures")
GENERATOR = ("mkdocs", "material", "mkdocs_jupyter")  # modules of the `book` extra
INSTALL = "pip install -e '.[book]' (make setup installs it)"

BANNER = {
    "full": "**Executed in the last full run** (`make notebooks`{when}): these outputs are the ones the findings "
            "quote.",
    "smoke": "**A smoke run, not the findings:** executed with the small parameters of `notebooks/smoke.yaml` "
             "(`python -m sparsekv notebooks smoke {stem}`{when}); `make notebooks` runs it at full size.",
    "source": "**Not executed:** the committed notebook, without outputs. Run `make notebooks`, then `make book`.",
}
STALE = " The notebook has changed since this run: its cells differ from the committed ones."
ARCHIVED = ("**Archived:** out of the course (superseded, merged, or awaiting a rerun with documents as the unit: see the "
            "archive's README); its full-run figures stay in the findings page.")
EXPLORER = "**A live explorer:** its controls need a kernel. Open it with `make lab` (`explorers/{name}`)."
LINK = re.compile(r"(\]\(|<img [^>]*src=\")([^)\"#\s]+)")    # markdown links and images, and HTML <img>


@dataclass(frozen=True)
class Source:
    """The copy of a notebook a page shows."""
    kind: str        # "full", "smoke" or "source" (the committed notebook, no outputs)
    path: Path       # the file read
    when: str        # when the run ended (papermill's metadata, else the file's time); "" for the source
    stale: bool      # the run's cells differ from the committed notebook's (it ran an older version)


@dataclass(frozen=True)
class Book:
    """What `stage` laid out: the config, the nav written into it, and each course notebook's source (by path)."""
    config: Path
    nav: list
    course: dict[str, Source]


# ---------------------------------------------------------------------------------------------- public API

def pick(nb: Path, root: Path, runs=RUNS) -> Source:
    """The best copy of notebook `nb` (a path under root/notebooks/): a full run's, a smoke run's, else itself."""
    for kind, folder in runs:
        run = root / folder / nb.name
        if run.is_file():
            executed = json.loads(run.read_text())
            return Source(kind, run, _ended(executed, run), _cells(executed) != _cells(json.loads(nb.read_text())))
    return Source("source", nb, "", False)


def stage(root: Path | str = ".", dest: Path | str = "build/book_src", runs=RUNS, shots: Path | None = None) -> Book:
    """Lay out dest/pages/ and dest/mkdocs.yml from the repository at `root` (see the module docstring)."""
    root, dest = Path(root).resolve(), Path(dest).resolve()
    shots = root / SHOTS if shots is None else Path(shots)
    pages = dest / "pages"
    if pages.exists():
        shutil.rmtree(pages)
    pages.mkdir(parents=True)

    def copy(path: Path) -> str:                  # a file of the repository, at its own path; the nav names it so
        rel = path.relative_to(root).as_posix()
        _copy(path, pages / rel)
        return rel

    def notebook(nb: Path, note: str) -> str:
        rel = nb.relative_to(root).as_posix()
        _write_notebook(json.loads(nb.read_text()), pages / rel, note)
        return rel

    course: dict[str, Source] = {}
    for nb in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        src = course[nb.relative_to(root).as_posix()] = pick(nb, root, runs)
        _write_notebook(json.loads(src.path.read_text()), pages / nb.relative_to(root), _banner(src, nb.stem))
    docs = sorted((root / "docs").glob("*.md"), key=lambda p: (p.stem not in DOCS_ORDER,
                                                                DOCS_ORDER.index(p.stem) if p.stem in DOCS_ORDER else 0,
                                                                p.stem))
    nav: list = [{"Home": copy(root / "README.md")},
                 {"Docs": [{_title(d.read_text()): copy(d)} for d in docs]},
                 {"Notebooks": [{f"{Path(rel).stem[:2]} · {_nb_title(root / rel)}": rel} for rel in course]}]
    explorers = sorted((root / "notebooks" / "explorers").glob("*.ipynb"))
    (pages / "explorers.md").write_text(_explorers_page(explorers, shots, pages / "images" / "explorers"))
    nav.append({"Explorers": ["explorers.md"] + [{_nb_title(nb): notebook(nb, EXPLORER.format(name=nb.name))}
                                                 for nb in explorers]})
    archive = root / "notebooks" / "archive"
    old = [{_nb_title(nb): notebook(nb, ARCHIVED)} for nb in sorted(archive.glob("*.ipynb"))]
    if old:
        nav.append({"Archive": [copy(p) for p in [archive / "README.md"] if p.exists()] + old})
    if (root / "CHANGELOG.md").exists():
        nav.append({"Changelog": copy(root / "CHANGELOG.md")})
    _copy_linked(root, pages)
    config = dest / "mkdocs.yml"
    config.write_text(_config(nav))
    return Book(config, nav, course)


def build(book: Book | Path, site: Path | str = "build/book", strict: bool = True) -> Path:
    """Run mkdocs on a staged book; returns the site folder (open index.html)."""
    missing = [m for m in GENERATOR if _find(m) is None]
    if missing:
        raise ModuleNotFoundError(f"the book's generator is missing ({', '.join(missing)}): {INSTALL}")
    config = book.config if isinstance(book, Book) else Path(book)
    site = Path(site).resolve()
    cmd = [sys.executable, "-m", "mkdocs", "build", "--quiet", "--clean", "-f", str(config), "-d", str(site)]
    proc = subprocess.run(cmd + (["--strict"] if strict else []), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"mkdocs build failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return site


# ---------------------------------------------------------------------------------------------- helpers

def _find(module: str):
    import importlib.util
    return importlib.util.find_spec(module)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _title(markdown: str) -> str:
    return next((line[2:].strip() for line in markdown.splitlines() if line.startswith("# ")), "untitled")


def _nb_title(nb: Path) -> str:
    cells = json.loads(nb.read_text())["cells"]
    return next((_title("".join(c["source"])) for c in cells if c["cell_type"] == "markdown"), nb.stem)


def _cells(nb: dict) -> list[str]:
    """A notebook's cell sources, without the cell papermill injects: what decides whether a run is current."""
    return ["".join(c["source"]) for c in nb["cells"]
            if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]


def _ended(nb: dict, path: Path) -> str:
    end = (nb.get("metadata", {}).get("papermill") or {}).get("end_time")
    stamp = datetime.fromisoformat(end) if end else datetime.fromtimestamp(path.stat().st_mtime)
    return stamp.strftime("%Y-%m-%d %H:%M")


def _banner(src: Source, stem: str) -> str:
    when = f", {src.when}" if src.when else ""
    return BANNER[src.kind].format(stem=stem, when=when) + (STALE if src.stale else "")


def _write_notebook(nb: dict, dst: Path, note: str) -> None:
    """Write `nb` with `note` quoted under its title, and its relative links made site links."""
    quote = f"> {note}"
    first = next((c for c in nb["cells"] if c["cell_type"] == "markdown"), None)
    title, _, rest = "".join(first["source"]).partition("\n") if first else ("", "", "")
    if title.startswith("# "):                # right under the title line, above the question
        first["source"] = f"{title}\n\n{quote}\n\n{rest}"
    else:
        nb["cells"].insert(0, {"cell_type": "markdown", "id": "book-provenance", "metadata": {}, "source": quote})
    for c in nb["cells"]:              # mkdocs-jupyter renders cells as they are: .md and .ipynb links point at pages
        if c["cell_type"] == "markdown":
            c["source"] = LINK.sub(lambda m: m.group(1) + _site_link(m.group(2)), "".join(c["source"]))
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(nb))


def _site_link(target: str) -> str:
    """A notebook's relative link to a page, as the page's address (use_directory_urls is off)."""
    if re.match(r"[a-z]+:", target) or not target.endswith((".md", ".ipynb")):
        return target
    folder, _, name = target.rpartition("/")
    page = "index.html" if name in ("README.md", "index.md") else name.rsplit(".", 1)[0] + ".html"
    return f"{folder}/{page}" if folder else page


def _copy_linked(root: Path, pages: Path) -> None:
    """Copy every file that a staged markdown page links to (figures, CHANGELOG, another page) and is not staged
    yet, at its own path, then the files those link to: relative links then resolve in the site as in the repo."""
    todo = sorted(pages.rglob("*.md"))
    while todo:
        page = todo.pop()
        origin = root / page.relative_to(pages)       # where the page lives in the repository
        if not origin.is_file():                      # generated (the explorers' page): its links are staged
            continue
        for _, target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("/"):
                continue
            src = (origin.parent / target).resolve()
            if not src.is_file() or root not in src.parents:
                continue                              # a broken link: mkdocs --strict names it
            dst = pages / src.relative_to(root)
            if not dst.exists():
                _copy(src, dst)
                if dst.suffix == ".md":
                    todo.append(dst)


def _explorers_page(explorers: list[Path], shots: Path, images: Path) -> str:
    lines = ["# The live explorers", "",
             "Each explorer is a notebook of controls (ipywidgets) that recompute and redraw on every change, so it "
             "needs a running kernel: this page can only show it. To use one, start JupyterLab on the notebooks with "
             "the project's kernel,", "", "```bash", "make lab", "```", "",
             "open `explorers/NAME.ipynb` in its file browser and run all cells (Run, then Run All Cells). "
             "The screenshots come from `tests/test_browser.py`, which does the same in headless Chromium, changes "
             "one control and checks that the output follows (`pytest tests/test_browser.py` leaves them in "
             "`build/browser/`).", ""]
    for nb in explorers:
        cells = json.loads(nb.read_text())["cells"]
        intro = next(("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"), f"# {nb.stem}")
        blurb = " ".join(line for line in intro.splitlines()[1:] if line.strip())
        lines += [f"## {_title(intro)}", "", blurb, "",
                  f"Open it with `make lab`, then `explorers/{nb.name}`; [its cells](notebooks/explorers/{nb.name}).", ""]
        found = sorted(p for p in shots.glob(f"{nb.stem}-[12]-*.png")) if shots.is_dir() else []
        for shot in found:
            _copy(shot, images / shot.name)
            what = "as it opens" if "-1-" in shot.name else "after changing " + shot.stem.split("-after-")[-1]
            lines += [f"![{nb.stem}, {what}](images/explorers/{shot.name})", "", f"*{nb.stem}, {what}.*", ""]
        if not found:
            lines += ["*No screenshot yet: `pytest tests/test_browser.py` takes them (into `build/browser/`), then "
                      "`make book`.*", ""]
    return "\n".join(lines)


def _config(nav: list) -> str:
    import yaml
    config = {
        "site_name": "sparsekv",
        "docs_dir": "pages",
        "use_directory_urls": False,          # page.html, not page/: relative links work from a file:// copy too
        "theme": {"name": "material", "font": False,             # no web fonts: the site loads nothing from outside
                  "features": ["navigation.sections", "navigation.top"]},
        "markdown_extensions": ["tables", "admonition", "attr_list", {"toc": {"permalink": False}}],
        "plugins": ["search", {"mkdocs-jupyter": {"include": ["*.ipynb"], "execute": False, "include_source": False,
                                                  "include_requirejs": False}}],
        "nav": nav,
    }
    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsekv book", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("."), help="repository root (default: the current folder)")
    ap.add_argument("--out", type=Path, default=Path("build/book"), help="the site (default build/book)")
    ap.add_argument("--stage", type=Path, default=Path("build/book_src"), help="staging folder (default build/book_src)")
    ap.add_argument("--shots", type=Path, default=None, help="explorer screenshots (default ROOT/build/browser)")
    args = ap.parse_args(argv)
    book = stage(args.root, args.stage, shots=args.shots)
    kinds = [s.kind for s in book.course.values()]
    site = build(book, args.out)
    print(f"book: {site / 'index.html'} ({len(kinds)} notebooks: {kinds.count('full')} from the full run, "
          f"{kinds.count('smoke')} from smoke runs, {kinds.count('source')} not executed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
