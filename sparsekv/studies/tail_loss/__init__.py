"""The tail-loss study (notebook 22; archived 23 ran it on Gemma at 8k): one folder, three parts.

    study      the run: every method's next-token loss on the tail of real documents -> TailStudy, its declared
               contrasts (`plan`) and metrics
    report     its figures, tables and the notebook's checks
    findings   the sentences docs/findings.md renders from its committed metrics (listed in `findings.catalog`)

The run's names are re-exported here (`tail_loss.TailConfig`, `tail_loss.run`), as when it was one module.
"""
from .study import *  # noqa: F403 (the run's public names, its __all__)
from .study import __all__  # noqa: F401
