"""The findings' prose: the sentences of docs/findings.md, one module per notebook, beside the studies they describe.

Layout (issue 54: the suite keeps only machinery that knows no study):

    finding.py       the `Finding` type (a template and the metrics it reads) and words that know no study
    paired_words.py  the words the paired-question findings (notebooks 14, 15, 17-21) share
    nNN_<stem>.py    a notebook's findings, `FINDINGS`, and the private words only they use (NN_<stem> is the
                     notebook's name and its figures/NN_<stem>.metrics.json, the metrics its findings read)
    archive/         the same, for the notebooks in notebooks/archive/ (superseded by 24; their metrics still render)
    catalog.py       the page's findings in the page's order: the modules listed once, explicitly

One module per notebook, rather than per study module, because a finding's values are keyed by notebook (several
notebooks run one study: `studies.paired` serves 14-21) and a notebook's metrics file is what a finding cites. A study
that is a folder (`equal_bytes/`, notebook 24) keeps its findings in its own folder (`equal_bytes/findings.py`) when
it has any, listed in the catalog like the rest. Nothing here registers itself on import: `suite.findings` renders
`catalog.FINDINGS`, and a notebook module's findings reach the page only through the catalog's list.
"""
