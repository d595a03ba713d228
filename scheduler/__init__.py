"""The scheduler: queues, quotas, admission, preemption, reclaim and executors (local, Slurm).

It reads ledger-derived balances from the `balances` topic; see DESIGN.md and the Scheduler
issue. It imports only `ledger`.
"""
