"""Job history: the readers' projection of the scheduler's `jobs` topic, out of the raw-event
archive, and the dashboard's plain-language reading of it.

This package owns what the Team page and the queue-wait trends say about jobs:
- `read_job_event_log` reads the messages of the jobs topic from the sealed raw-event archive
  (`archive/`, see `ledger.store.segments`) and decodes them with `ledger.job_events`
  (`job_event_log`); hold events, which share the topic, are passed over;
- `fold_jobs` folds job events into one `JobRow` per job: state, queue, GPUs, times, the
  current wait and its reason, preemptions (by whom, why), attempts;
- `select_jobs`, `daily_queue_waits` and `observed_waits` select and summarise rows;
- `explain_job` answers "why is my job waiting / why was it stopped" for a researcher.

Modules: `archive` (reading the topic), `fold` (`fold_jobs`, `select_jobs`), `queue_waits`
and `explain`; this package re-exports their public names.

`scheduler.explain` answers the same question for the CLI from the scheduler's own copy of the
events; `explain_job` is the dashboard's reading of the same events, in fuller sentences and
with advice. Both follow the scheduler's state machine (`scheduler.state`): a preempted job is
back in its queue with the reason `preempted` until a cycle gives it another reason, and a
failed job with `retry` is back with `retrying`.

Invariants:
- everything here but `read_job_event_log` is pure: plain values in, frozen values out;
- events are applied in publication order: the archive's order (batch sequence, then position
  in the batch). A job's events share its key and so one partition, whose order the archive
  keeps; events repeated by a resend (the same content-derived id) count once;
- times are integer µs; durations and quantiles are integer µs (nearest rank, no floats).
"""

from ledger.read.job_history.archive import (
    DEFAULT_JOBS_TOPIC,
    JobEventLog,
    job_envelopes,
    job_event_log,
    read_job_event_log,
)
from ledger.read.job_history.explain import (
    FAIL_PLAIN,
    NOT_YET_CONSIDERED,
    PREEMPT_PLAIN,
    WAIT_ADVICE,
    WAIT_PLAIN,
    WAIT_SHORT,
    Explanation,
    TimelineEntry,
    duration_text,
    explain_job,
    job_name,
    outcome_text,
    state_text,
    wait_text,
    when_text,
)
from ledger.read.job_history.fold import (
    JobRow,
    JobState,
    Preemption,
    fold_jobs,
    job_teams,
    select_jobs,
)
from ledger.read.job_history.queue_waits import (
    DAY_US,
    US_PER_HOUR,
    US_PER_MINUTE,
    ObservedWaits,
    QueueWaitDay,
    daily_queue_waits,
    observed_waits,
    quantile_us,
)

__all__ = [
    "DAY_US",
    "DEFAULT_JOBS_TOPIC",
    "FAIL_PLAIN",
    "NOT_YET_CONSIDERED",
    "PREEMPT_PLAIN",
    "US_PER_HOUR",
    "US_PER_MINUTE",
    "WAIT_ADVICE",
    "WAIT_PLAIN",
    "WAIT_SHORT",
    "Explanation",
    "JobEventLog",
    "JobRow",
    "JobState",
    "ObservedWaits",
    "Preemption",
    "QueueWaitDay",
    "TimelineEntry",
    "daily_queue_waits",
    "duration_text",
    "explain_job",
    "fold_jobs",
    "job_envelopes",
    "job_event_log",
    "job_name",
    "job_teams",
    "observed_waits",
    "outcome_text",
    "quantile_us",
    "read_job_event_log",
    "select_jobs",
    "state_text",
    "wait_text",
    "when_text",
]
