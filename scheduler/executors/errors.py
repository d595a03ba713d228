"""The executors' exception tree: everything an executor raises is an `ExecutorError`.

    SchedulerError (scheduler.errors)
    └── ExecutorError           an executor could not do what it was told
        ├── InvalidWork         a `Work` no executor can run (both or neither of command and
        │                       script, a script without #!, an env name a job may not set)
        ├── JobAlreadyStarted   `start` for a job that runs there already
        ├── ExecutorUnavailable the backend cannot be reached: a binary is missing, the Slurm
        │                       controller does not answer, a command timed out
        ├── StopTimeout         a job's processes outlived `stop`'s deadline: its GPUs are
        │                       not safe to hand to another job
        └── SlurmError          a Slurm command failed: its argv, exit status and stderr
            ├── SlurmJobUnknown Slurm does not know the job id (never existed, or purged)
            ├── SlurmRejected   sbatch refused the job (no such gres, partition or node)
            └── SlurmOutputError output that does not parse (a Slurm version this code does
                                not know)

What is wrong with a job is a value, not an exception: a command that does not exist or a job
sbatch refuses is reported `FAILED` by `poll`. Subprocess and Slurm failures are translated
into this tree in one place each: `scheduler.executors.local` (exec errors) and
`scheduler.executors.slurm_text.classify` (Slurm's exit status and stderr).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.errors import SchedulerError


class ExecutorError(SchedulerError):
    """Base class of every error an executor raises."""


class InvalidWork(ExecutorError):
    """A `Work` that no executor can run."""


class JobAlreadyStarted(ExecutorError):
    """`start` for a job that is already running on this executor."""


class ExecutorUnavailable(ExecutorError):
    """The backend cannot be reached (missing binary, controller down, timeout)."""


class StopTimeout(ExecutorError):
    """A job's processes were still alive when `stop` gave up on them."""

    def __init__(self, message: str, job_ids: Sequence[str]) -> None:
        super().__init__(message)
        self.job_ids = tuple(job_ids)


class SlurmError(ExecutorError):
    """A Slurm command exited non-zero."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"{' '.join(self.argv[:2])} exited {returncode}: {self.stderr}")


class SlurmJobUnknown(SlurmError):
    """Slurm does not know the job id."""


class SlurmRejected(SlurmError):
    """sbatch refused the job."""


class SlurmOutputError(SlurmError):
    """A Slurm command's output does not parse."""

    def __init__(self, argv: Sequence[str], output: str, why: str) -> None:
        super().__init__(argv, 0, f"{why}: {output[:200]!r}")
