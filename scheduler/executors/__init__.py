"""Executors: adapters of the `Executor` port (`scheduler.ports`) that run what the pure core
decided and report what happened as `JobStatus` values.

    local       processes on this machine: one process group per job, pinned with
                `CUDA_VISIBLE_DEVICES`, stdout and stderr to a per-job log, killed as a group
                (SIGTERM, grace, SIGKILL); the embedded default
    slurm       a Slurm cluster: sbatch --gres=gpu:N, scontrol hold/release/requeue, scancel,
                state from squeue and sacct (scontrol show job without slurmdbd)
    slurm_text  the pure half of the Slurm adapter: argv building, output parsing, the state
                map and the translation of Slurm's failures into exceptions
    run_as      which OS user a job runs as (`identity.os_users`): the pure decision, and
                the host's accounts it reads
    slurm_ids   which Slurm job each Tally job is, folded from the `jobs` topic: what a
                restarted Slurm executor rebuilds its map from
    fake        in memory, deterministic, scripted outcomes (scheduler tests, simulation)
    launch      what every adapter launches a job with: environment, devices, log file name
    processes   process groups on Linux: who is still alive, signalling, waiting
    bridge      decisions → start/stop calls, statuses → `jobs` events (pure but for `enact`
                and `observe`, which call the executor)
    errors      ExecutorError and its subclasses

The package imports nothing eagerly: `from scheduler.executors.local import LocalExecutor`.
"""
