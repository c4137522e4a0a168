"""The README's results table (studies.equal_bytes.frontpage): rendered from the committed study rows, in declared order, never
chosen by its results."""
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sparsekv.studies.equal_bytes import analysis as an
from sparsekv.studies.equal_bytes import frontpage

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


def test_the_other_headline_cells_are_each_named_with_their_verdicts_or_what_they_owe(tmp_path):
    """Every headline cell of the pilot but the front one gets one clause, in the pilot's order: its contrasts'
    verdicts from the same Holm family as the table when it has them, else its documents of those owed."""
    root = _root_with(tmp_path, an.MIN_DOCS)
    pilot = an.dense_cells(an.load_rows(root / frontpage.PILOT))
    others = [an.cell_name(m, int(n), t) for m, n, t, h in pilot[["model", "length", "task", "headline"]].values
              if h and (m, int(n), t) != frontpage.FRONT_CELL]
    last = frontpage.render(root).splitlines()[-1]
    assert others and all(f"**{c}**: owed (0 of {an.MIN_DOCS} documents run)" in last for c in others)
    assert [last.index(f"**{c}**") for c in others] == sorted(last.index(f"**{c}**") for c in others)
    # the committed rows: a cell with enough documents lists exactly its contrasts shown at Holm p < alpha
    study = an.load_rows(REPO / frontpage.STUDY)
    table = an.contrast_table(study, an.dense_cells(an.load_rows(REPO / frontpage.PILOT)))
    line = frontpage.render(REPO).splitlines()[-1]
    for cell in {r.name.split(": ", 1)[0] for r in table.rows} - {an.cell_name(*frontpage.FRONT_CELL)}:
        rows = [r for r in table.rows if r.name.startswith(f"{cell}: ")]
        clause = line.split(f"**{cell}**", 1)[1].split("; **", 1)[0]
        assert f"({rows[0].n_docs} documents, {len(rows)} contrasts)" in clause
        for r in rows:
            what = r.name.split(": ", 1)[1]
            assert (what + " (" in clause) == (r.p_adj < table.plan.alpha)
            alike = r.p_adj >= table.plan.alpha and r.a_only == 0 and r.b_only == 0   # no discordant pair at all
            assert (f"{what}: the same answer on all {r.n_questions} questions" in clause) == alike
        assert f"{sum(r.p_adj >= table.plan.alpha for r in rows)} not shown" in clause


def test_a_contrast_whose_methods_answer_alike_is_named_as_making_no_claim():
    """A not-shown contrast with no discordant pair is named (the same answers everywhere: a zero-variance test makes
    no claim); a not-shown one with discordant pairs is only counted; a shown one is listed with its verdict."""
    from sparsekv.analysis.clustered import ContrastRow

    def row(name, p_adj, a_only, b_only):
        return ContrastRow(f"cell: {name}", "non-inferiority", "x", "dense", 0.05, 0.0, 0.0, 0.0, 0.9, 1.0, p_adj,
                           a_only, b_only, "non-inferior within 5 points (p = 0.01)", 128, 32)

    text = frontpage._verdicts([row("alike", 1.0, 0, 0), row("close", 0.4, 3, 4), row("good", 0.01, 0, 2)], 0.05)
    assert text == ("shown: good (non-inferior within 5 points); 2 not shown (alike: the same answer on all 128 "
                    "questions, so its test has no variance and makes no claim)")
