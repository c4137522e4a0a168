"""The paired-question study (the archived notebooks 14, 15 and 17-21; superseded by `equal_bytes`, kept so their
committed metrics can be compared and rerun): one folder, two parts.

    study    the run: every method's answers to every question, exact McNemar against dense -> Study
    report   its figures, tables and the notebook's checks

Its findings stay with the archived notebooks' (`findings/archive/`, words in `findings/paired_words.py`). The run's
names are re-exported here (`paired.StudyConfig`, `paired.run`), as when it was one module.
"""
from .study import *  # noqa: F403 (the run's public names, its __all__)
from .study import __all__  # noqa: F401
