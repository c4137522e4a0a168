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
    linked = set()
    for page in PAGES:
        linked |= set(re.findall(r"figures/[\w.-]+\.png", page.read_text()))
    committed = {f"figures/{p.name}" for p in (REPO / "figures").glob("*.png")}
    assert committed - linked == set()
