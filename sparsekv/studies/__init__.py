"""Layer 9 (research, the top): the studies. Each is a module (one notebook or benchmark), or a folder for a study
with parts, holding its run, its report (figures and the notebook's checks) and its findings:

    equal_bytes/   the equal-bytes study (notebook 24): design, run, analysis, report, fast memory, the front page
    tail_loss/     tail loss of every family (notebook 22): study, report, findings
    paired/        the paired-question study (the archived notebooks 14-21): study, report
    findings/      the findings page (`page`, `python -m sparsekv findings`), its catalog, and the findings of the
                   notebooks that are modules (one `nNN_<stem>.py` per notebook)

Studies are built from the instruments (layer 7) and the suite's machinery (layer 8: runner, sweep, checks,
figures' style); nothing in the package imports a study.
"""
