"""Policy what-if from the ledger's own history (`tally whatif`).

A window of the archived `jobs` topic (`ledger.read.job_history.read_job_event_log`) is read
into a `History` (`history`), replayed through the real scheduling cycle on a simulated clock,
tick by tick as the live service decides, under a baseline and an alternative `Scenario`
(`replay`, driving `scheduler.simulation`),
measured (`metrics`) and compared (`compare`, `report`): cost and GPU-hours per team, queueing
delay p50/p95 per team and queue, utilisation, preemptions and GPU-hours lost, Jain fairness,
budget overruns; the recorded admissions against the baseline replay (every divergence with
its cause); and, when GPUs are added, whether any team's p95 wait rose and the capacity
sentence; `texts` writes all of it in a reader's language (`WhatIfReport.said`).

Everything here is pure but `replay`'s wall-clock timing; `tally.whatif` turns configuration
files into scenarios and reads the archive.
"""

from scheduler.whatif.compare import COLUMNS, Divergence, divergences, same_decisions
from scheduler.whatif.history import Admission, History, Limit, read_history
from scheduler.whatif.metrics import Delay, Metrics, Overrun, jain_permille, metrics
from scheduler.whatif.replay import Outcome, Run, Scenario, Wait, replay
from scheduler.whatif.report import Said, WhatIfReport, what_if
from scheduler.whatif.texts import Cause

__all__ = [
    "COLUMNS",
    "Admission",
    "Cause",
    "Delay",
    "Divergence",
    "History",
    "Limit",
    "Metrics",
    "Outcome",
    "Overrun",
    "Run",
    "Said",
    "Scenario",
    "Wait",
    "WhatIfReport",
    "divergences",
    "jain_permille",
    "metrics",
    "read_history",
    "replay",
    "same_decisions",
    "what_if",
]
