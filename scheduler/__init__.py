"""The scheduler: queues, quotas, admission, preemption, reclaim and executors (local, Slurm).

It reads ledger-derived balances from the `balances` topic. It imports only `ledger`.

The decision core is pure: every decision is a function of an immutable `ClusterSnapshot` that
returns `jobs`-topic events (`ledger.job_events`) with their reasons. One mutable projection,
`SchedulerState`, applies those events and hands out the next snapshot; executors, the HTTP
API, the CLI and the Kafka wiring plug in through the Protocols in `scheduler.ports`.

    model        queues, teams and quotas, nodes, balances and holds, jobs, the cycle policy
    quota        cohorts, borrowing and lending limits (the lending invariant)
    budget       the hold an admission places and whether the balance covers it
    fairshare    decayed metered usage (half-life) and standing per team
    snapshot     ClusterSnapshot and the fleet index; phase 1, heads
    ordering     phase 4, order: priority, then fair share, then age
    admission    phases 3 and 5, nominate and admit; the cycle's workspace
    preemption   phase 6, preempt: who may be a victim, the fewest, lowest, newest
    cycle        the seven phases in one pure function, run_cycle
    placement    which free GPUs a job gets (best fit; gangs on the fewest nodes)
    topology     gangs by NUMA node, NVLink domain, rail, rack; a required topology
    reclaim      allocated-but-idle GPUs handled by queue policy
    lifecycle    finishing, failing and retrying, cancelling, maximum runtime
    decisions    decisions as events (admission, preemption, GPU release)
    explain      "why is my job waiting / why was it preempted", from the events
    state        SchedulerState, the projection of the `jobs` topic
    simulation   discrete-event replay in simulated time (benchmark, invariant tests, what-if)
    ports        Clock, EventSink, BalanceFeed, UsageFeed, Executor, SchedulerObserver,
                 Publisher and its in-memory fake MemoryPublisher
    executors    the Executor adapters: local (process groups), slurm, fake; one contract suite
    service      the running scheduler: replays `jobs`, reads `balances` and `alerts`, runs the
                 cycle, publishes decisions before the executor carries them out
    dispatcher   the service's synchronous heart: decisions applied and queued for `jobs`
    records      job records as the API shows them, and submissions
    hold_acks    the scheduler's holds until the ledger acknowledges them (counted once)
    jobs_topic   the scheduler's `jobs` messages: encoding, `tally-seq`, replay order
    work_store   jobs' commands and local runs' process groups under `work_dir`
    undeliverable  `jobs` messages the broker refused for their content, one line each in
                 `work_dir`
    kafka        the service's Kafka adapters: replay reader, publisher, balances/alerts feeds
    api          the HTTP API with per-team bearer tokens
    errors       SchedulerError ← ConfigError, StateError, ExecutorError, ServiceError, …

Policy rules, each documented in full where it is implemented:
- admission is all-or-nothing; a job gets GPUs of one flavor (pool, model) that matches its
  constraint, on one node unless it may span nodes;
- a team holds at most nominal + borrowing limit per flavor; it borrows only from unused
  quota of its cohort, and no member lends beyond its lending limit; jobs of non-preemptible
  queues never borrow, so borrowed quota can always be reclaimed;
- admission places a hold of GPUs × estimated runtime (× price for money budgets); a team
  whose balance − open holds cannot cover it beyond its overdraft waits with
  `budget_exhausted`, or runs unheld and preemptible where its queue says `run_preemptible`;
- order: priority, then jobs within nominal before borrowers, then decayed metered usage per
  unit of quota, then age; preemption reclaims lent quota and makes room for higher priority,
  choosing the fewest, then lowest-priority, then most recently started victims, never a
  non-preemptible queue's job; victims requeue with their original submit time;
- jobs that can never run (no matching GPUs, more than the team may ever hold, unknown queue
  or team) are parked out of the backlogs until `SchedulerState.unpark`.
"""
