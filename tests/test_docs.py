"""The front page and the docs/ pages link only to files that exist, and the front page stays a front page."""
import re

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")         # [text](target) and ![alt](target); anchors dropped


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_resolves(page):
    targets = [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", t)]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, missing


def test_readme_is_a_front_page_with_the_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert all(f"make {c}" in text for c in ("notebooks", "test", "lab"))
    assert "findings:start" not in text and "bench:start" not in text     # rendered sections live in docs/


def test_every_committed_figure_is_linked_from_a_docs_page():
    """figures/ and the benchmarks' own figures under benchmarks/results/ (gemma_speed and vs_llamacpp were linked
    from no page)."""
    linked = set()
    for page in PAGES:
        linked |= set(re.findall(r"(?:figures|benchmarks/results)/[\w.-]+\.png", page.read_text()))
    committed = {f"figures/{p.name}" for p in (REPO / "figures").glob("*.png")}
    committed |= {f"benchmarks/results/{p.name}" for p in (REPO / "benchmarks" / "results").glob("*.png")}
    assert committed - linked == set()


def test_every_committed_figure_is_drawn_by_a_notebook_or_a_benchmark():
    """A committed figure that nothing redraws would go stale: each is named by a notebook (its own cells or the
    study a cell calls name the file; an archived notebook's figures stay with its committed metrics) or drawn by a
    benchmark's `plot` that `benchmarks.report.figures` redraws."""
    import json
    named = " ".join("".join(c["source"]) for nb in (REPO / "notebooks").rglob("*.ipynb")
                     for c in json.loads(nb.read_text())["cells"])
    redrawn = {"summary_precision.png", "gemma_speed.png"}
    # `benchmarks.report.figures` redraws the figure of every committed run against llama.cpp (vs_llamacpp*.json)
    # and of every CPU decode run (cpu_decode*.json, into figures/)
    redrawn |= {p.with_suffix(".png").name for p in (REPO / "benchmarks" / "results").glob("vs_llamacpp*.json")}
    redrawn |= {p.with_suffix(".png").name for p in (REPO / "benchmarks" / "results").glob("cpu_decode*.json")}
    import re
    prefixes = tuple(re.findall(r'f"(\d\d_[A-Za-z0-9_]+)\{', named))     # a figure per cell: f"24_curves_{...}.png"
    orphans = [p.name for p in [*(REPO / "figures").glob("*.png"), *(REPO / "benchmarks" / "results").glob("*.png")]
               if p.name not in named and p.name not in redrawn and not p.name.startswith(prefixes or ("\0",))]
    assert orphans == []


def test_the_readme_course_lists_every_course_notebook_once_and_at_most_fourteen():
    """Issue 56: a course of at most 14 numbered notebooks, each a row of the README's course table (or its
    appendix line); archived notebooks are linked only under notebooks/archive/."""
    text = (REPO / "README.md").read_text()
    text = text[text.index("### The course"):]
    text = text[:text.index("Archived,")]
    course = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    linked = re.findall(r"\]\(notebooks/([0-9][0-9]_[\w-]+\.ipynb)\)", text)
    assert len(course) <= 14, course
    assert sorted(linked) == course, {"not linked": sorted(set(course) - set(linked)),
                                      "linked twice or not in the course": sorted(set(linked) - set(course)
                                                                                  | {n for n in linked
                                                                                     if linked.count(n) > 1})}


def test_the_study_page_types_no_verdict_or_accuracy():
    """The equal-bytes study's verdicts move as cells join its Holm family; the README and notebook 24 render them from
    the rows. A typed one went stale once (docs/equal_bytes.md called a contrast non-inferior after the family's
    growth had made it "not shown"), so the page states none: no adjusted p, no accuracy to a tenth of a point."""
    text = (REPO / "docs" / "equal_bytes.md").read_text()
    typed = re.findall(r"Holm p \d[^\s,;)]*|\b\d+\.\d+%", text)
    assert not typed, f"docs/equal_bytes.md types results the rows should render: {typed}"
