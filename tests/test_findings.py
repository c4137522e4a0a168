"""The findings page (docs/findings.md) is rendered from the full-run metrics, so it cannot drift from them, and so
is the benchmarks page (docs/benchmarks.md) from benchmarks/results."""
import json
import re
import shutil

import pytest
from conftest import REPO

from sparsekv.studies.findings import page as findings

CITED = sorted({src for f in findings.FINDINGS for src in f.values.values() if not callable(src)})


def test_findings_page_matches_the_committed_full_run_metrics():
    page = (REPO / findings.PAGE).read_text()
    assert findings.section(page) == findings.render(REPO / "figures"), \
        f"{findings.PAGE} differs from figures/*.metrics.json: run `python -m sparsekv findings`"


def test_every_finding_cites_metrics_that_exist():
    m = findings.load(REPO / "figures")
    missing = [f"{s}:{k}" for s, k in CITED if k not in m.get(s, {})]
    assert CITED and not missing, missing


@pytest.mark.parametrize("cited", CITED, ids=[f"{s}:{k}" for s, k in CITED])
def test_perturbing_a_cited_metric_breaks_the_page_check(cited, tmp_path):
    for f in (REPO / "figures").glob("*.metrics.json"):
        shutil.copy(f, tmp_path / f.name)
    stem, metric = cited
    path = tmp_path / f"{stem}.metrics.json"
    rec = json.loads(path.read_text())
    rec["metrics"][metric] = rec["metrics"][metric] * 1.37 + 0.211      # a visible move at any printed precision
    path.write_text(json.dumps(rec))
    page = (REPO / findings.PAGE).read_text()
    assert findings.section(page) != findings.render(tmp_path)


def test_a_missing_metric_is_named():
    f = findings.Finding("x {a}", {"a": ("00_tour", "no_such_metric")})
    with pytest.raises(KeyError, match="00_tour:no_such_metric"):
        f.render({"00_tour": {}})


def test_the_catalog_lists_every_notebook_module_once():
    """The page's findings are the notebook modules' (studies/findings/nNN_*.py, archive/ included) and the study
    folders' (studies/<study>/findings.py), each listed once in the catalog and concatenated in its order: a module
    the catalog forgets would never reach the page."""
    import importlib
    import pathlib

    from sparsekv.studies.findings import catalog
    folder = pathlib.Path(catalog.__file__).parent
    names = sorted(p.relative_to(folder).with_suffix("").as_posix().replace("/", ".") for p in folder.rglob("n[0-9]*.py"))
    modules = [importlib.import_module(f"sparsekv.studies.findings.{n}") for n in names]
    studies = folder.parent
    modules += [importlib.import_module(f"sparsekv.studies.{p.parent.name}.findings") for p in studies.glob("*/findings.py")]
    assert any(m.__name__ == "sparsekv.studies.tail_loss.findings" for m in modules)
    # every notebook module, once
    assert sorted(m.__name__ for m in catalog.NOTEBOOKS) == sorted(m.__name__ for m in modules)
    # and the page's findings are theirs, in the catalog's order
    assert list(findings.FINDINGS) == [f for m in catalog.NOTEBOOKS for f in m.FINDINGS]


def test_benchmark_page_tables_match_the_committed_results():
    """docs/benchmarks.md's tables are rendered from benchmarks/results (loaded by path: the repository
    root never goes on sys.path, where its kernels/ folder would shadow the PyPI `kernels` package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    page = report.PAGE.read_text()
    assert report.page_section(page) == report.tables(), "run `python -m benchmarks.report --write`"
    # a literal missing its f prefix once put "{d['budget_tokens']}" into the page itself
    unformatted = re.findall(r"\{\w+\[['\"][^]]*\]\}", report.tables())
    assert not unformatted, f"fields the renderer never filled in: {sorted(set(unformatted))}"


def test_a_full_run_hands_both_pages_to_the_runner_and_each_re_renders(tmp_path):
    """`python -m sparsekv notebooks` gives the runner the findings page and the README's results table to re-render
    (the suite below the studies cannot import them; it once tried, in a branch only a full run reaches). On a copy of
    the repository's pages: each says it is current, and a stale copy is rewritten to the committed text."""
    from sparsekv import __main__ as cli
    from sparsekv.studies.equal_bytes import frontpage
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / findings.PAGE, tmp_path / findings.PAGE)
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    (tmp_path / "figures").symlink_to(REPO / "figures")
    (tmp_path / "results").symlink_to(REPO / "results")
    assert cli.pages() == (findings.rerender, frontpage.rerender)
    assert [render(tmp_path) for render in cli.pages()] == [f"{findings.PAGE} already matches the metrics",
                                                            "README.md's results already current"]
    readme = (tmp_path / "README.md").read_text()
    stale = readme.replace(frontpage.section(readme), "\nstale\n")
    (tmp_path / "README.md").write_text(stale)
    assert frontpage.rerender(tmp_path) == "README.md's results re-rendered from the study's rows"
    assert (tmp_path / "README.md").read_text() == readme
