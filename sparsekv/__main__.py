"""sparsekv's command line: `python -m sparsekv COMMAND [args]`.

    notebooks run|smoke|baseline [names]   the papermill runner (suite.runner)
    train ...                              train a recall model (recall.train)
    fetch [--root DIR]                     fetch and verify the real model (model.fetch)
    findings [--check]                     re-render docs/findings.md from the metrics (studies.findings.page)
    frontpage [--check]                    re-render the README's results table (studies.equal_bytes.frontpage)
    calibrate [--model M]                  calibrate the `labels` router's channels (analysis.calibrate)
    sweep NOTEBOOK --grid G.yaml           a parameter grid over a notebook, on Ray (suite.sweep)
    book [--out DIR]                       the static site of the docs and executed notebooks (suite.book)
    as-avx2 [--emulate MODEL] -- CMD       run CMD as an AVX2-only machine sees itself (suite.avx2_view; root)
    kernels [native|alt|avx2 ...]          build the C++ extension for each CPU configuration (suite.cpuconfig)
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {"notebooks": "sparsekv.suite.runner", "train": "sparsekv.recall.train",
            "fetch": "sparsekv.model.fetch", "findings": "sparsekv.studies.findings.page",
            "calibrate": "sparsekv.analysis.calibrate", "sweep": "sparsekv.suite.sweep",
            "book": "sparsekv.suite.book", "as-avx2": "sparsekv.suite.avx2_view",
            "kernels": "sparsekv.suite.cpuconfig",
            "frontpage": "sparsekv.studies.equal_bytes.frontpage"}


def pages() -> tuple:
    """What a full notebook run re-renders when every notebook passed: the findings page, then the README's results
    table. The suite's runner knows no study (it is the layer below them), so the command line hands them to it."""
    from .studies.equal_bytes import frontpage
    from .studies.findings import page
    return page.rerender, frontpage.rerender


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]])
    if argv[0] == "notebooks":
        return module.main(argv[1:], pages=pages()) or 0
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
