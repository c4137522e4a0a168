"""The README's results table (suite.frontpage): rendered from the committed study rows, in declared order, never
chosen by its results."""
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sparsekv.studies.equal_bytes import analysis as an
from sparsekv.suite import frontpage

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_results_match_the_committed_rows():
    assert frontpage.section((REPO / "README.md").read_text()) == frontpage.render(REPO)


def _root_with(tmp_path: Path, docs: int) -> Path:
    """A repository root whose study holds the committed front-cell rows, their documents repeated under new ids to
    `docs` documents (the outcomes of a repeated document are its own: the statistics see real answer patterns)."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / frontpage.PILOT, root / frontpage.PILOT)
    study = an.load_rows(REPO / frontpage.STUDY)
    model, length, task = frontpage.FRONT_CELL
    g = study[(study["model"] == model) & (study["length"] == length) & (study["task"] == task)]
    have = sorted(g["doc"].unique())
    copies = [g.assign(doc=g["doc"] + 10_000 * k) for k in range(-(-docs // len(have)))]
    rows = pd.concat(copies, ignore_index=True)
    rows = rows[rows["doc"].isin(sorted(rows["doc"].unique())[:docs])]
    (root / frontpage.STUDY / "cells" / "x").mkdir(parents=True)
    rows.to_csv(root / frontpage.STUDY / "cells" / "x" / "24_equal_bytes.rows.csv", index=False)
    return root


def test_below_the_documents_needed_nothing_is_tested(tmp_path):
    text = frontpage.render(_root_with(tmp_path, an.MIN_DOCS - 1))
    assert f"is {an.MIN_DOCS - 1} of the {an.MIN_DOCS} needed" in text and "|" not in text


def test_at_the_documents_needed_the_table_is_the_design_s_contrasts_in_declared_order(tmp_path):
    root = _root_with(tmp_path, an.MIN_DOCS)
    text = frontpage.render(root)
    body = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| contrast")
            and not line.startswith("| ---")]
    plan = an.plan(an.load_rows(root / frontpage.STUDY), an.dense_cells(an.load_rows(root / frontpage.PILOT)))
    declared = [c.name.split(": ", 1)[1] for c in plan.contrasts]
    assert [line.split(" | ")[0][2:] for line in body] == declared and 1 <= len(body) <= 8
    for line in body:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[5] == str(an.MIN_DOCS)                         # the unit is the document
        assert float(cells[7]) >= float(cells[6])                   # Holm never lowers a p-value
    page = root / "README.md"
    page.write_text(f"x\n{frontpage.START}\nstale\n{frontpage.END}\ny\n")
    assert frontpage.update(page, root) and not frontpage.update(page, root)
    assert frontpage.main(["--root", str(root), "--check"]) == 0


def test_a_page_without_markers_is_named():
    with pytest.raises(ValueError, match="no results markers"):
        frontpage.section("no markers here")
