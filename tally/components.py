"""Builds the project's components from a validated `TallyConfig` (the wiring of the stack)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from collectors.simulated import PoolSpec, SimulatedFleet, TeamSpec, WorkloadKind
from ledger import admin
from ledger.units import Unit
from tally.config import TallyConfig
from tally.language import _

if TYPE_CHECKING:
    # Importing `streams.worker` imports Faust, which parses the process's argv for its own
    # `-L/--loop` option: only the command that runs the worker may import it (see below).
    from collectors.kubelet import KubeletPods
    from collectors.ownership import OwnerResolver
    from ledger.events import Owner
    from streams.worker import WorkerSettings
    from tally.kafka_clients import KafkaClients

BOOTSTRAP_ENV = "TALLY_BOOTSTRAP"


class NoBrokerError(Exception):
    """No broker address is known for a command that needs one."""


def bootstrap_servers(config: TallyConfig, override: str | None = None) -> tuple[str, ...]:
    """Where Kafka is: `--bootstrap`, then $TALLY_BOOTSTRAP (set by `tally up`), then config."""
    chosen = override or os.environ.get(BOOTSTRAP_ENV)
    if chosen:
        return tuple(s.strip() for s in chosen.split(",") if s.strip())
    if config.broker.mode == "external":
        return config.broker.bootstrap_servers
    raise NoBrokerError(
        _(
            "the configured broker is embedded, and it runs only under `tally up`; "
            "pass --bootstrap HOST:PORT to reach a running one"
        )
    )


def simulated_fleet(config: TallyConfig, interval_s: float | None = None) -> SimulatedFleet:
    """The configured simulated fleet, sampling every `interval_s` (default: the sampling
    interval); a simulated cluster (`fleet.workload` set) when the config has one."""
    fleet = config.fleet
    mix = fleet.workloads
    return SimulatedFleet(
        seed=fleet.seed,
        pools=[
            PoolSpec(p.name, p.model, p.nodes, p.gpus_per_node, p.memory_gib) for p in fleet.pools
        ],
        teams=[
            TeamSpec(t.name, tuple(t.projects), tuple(t.users)) for t in config.organisation.teams()
        ],
        mix=[
            (WorkloadKind.TRAINING, mix.training),
            (WorkloadKind.INFERENCE, mix.inference),
            (WorkloadKind.NOTEBOOK, mix.notebook),
            (WorkloadKind.UNALLOCATED, mix.unallocated),
        ],
        interval_us=int((interval_s or config.sampling.interval_s) * 1_000_000),
        external_pct=None if fleet.workload is None else fleet.workload.external_pct,
    )


def worker_settings(
    config: TallyConfig, bootstrap: tuple[str, ...], kafka: KafkaClients
) -> WorkerSettings:
    """The worker's settings. Imports Faust (through `streams.worker`): call it only where the
    worker is about to run, never while a command is being parsed."""
    from streams.worker import WorkerSettings
    from tally.segments_config import publisher, segments_store

    sharded = config.ledger.sharded  # the shards' publishers are the worker's (`streams.shards`)
    return WorkerSettings(
        bootstrap=bootstrap,
        kafka_options=kafka.security,
        group_options=kafka.group,
        faust_credentials=kafka.faust_credentials(),
        group_id=config.worker.group_id,
        samples_topic=config.topics.samples,
        admin_topic=config.topics.admin,
        jobs_topic=config.topics.jobs,
        balances_topic=config.topics.balances,
        inventory_reports_topic=config.topics.inventory_reports,
        inventory_topic=config.topics.inventory,
        deadletter_topic=config.topics.deadletter,
        alerts_topic=config.topics.alerts,
        idle_policy=config.idle.policy(),
        data_dir=config.ledger.data_dir,
        prices=config.price_book(),
        cost_centres=config.organisation.cost_centre_of(),
        batch_max_messages=config.worker.batch_max_messages,
        batch_within_s=config.worker.batch_within_s,
        seal_interval_s=config.ledger.seal_interval_s,
        compact_below_rows=config.ledger.compact_below_rows,
        compact_min_segments=config.ledger.compact_min_segments,
        dedupe_window_us=config.ledger.dedupe_window_days * 86_400_000_000,
        zone=config.ledger.zone(),
        duckdb_memory_limit=config.ledger.memory_limit(),
        publisher=None
        if sharded
        else publisher(
            config.ledger.data_dir, config.ledger.segments_url, config.ledger.object_store
        ),
        sharded=sharded,
        segments_store=segments_store(config.ledger.segments_url, config.ledger.object_store)
        if sharded
        else None,
        grace_s=config.ledger.object_store.grace_s,
    )


def desired_admin_state(config: TallyConfig) -> admin.DesiredState:
    """What `tally admin apply` makes the ledger's admin state: the config's teams, prices,
    quotas, one-off budgets and recurring budget policies."""
    budgets: list[admin.BudgetSpec] = []
    policies: list[admin.PolicySpec] = []
    for b in config.budgets:
        for unit, amount in ((Unit.MONEY, b.money), (Unit.GPU_MS, b.gpu_hours)):
            if amount is None:
                continue
            if b.period is not None:
                budgets.append(admin.BudgetSpec(b.team, b.period, unit, amount))
            else:
                assert b.every is not None
                rule, limit = b.carry(unit)
                policies.append(
                    admin.PolicySpec(
                        b.team, unit, amount, admin.Cadence(b.every), b.start, b.end, rule, limit
                    )
                )
    return admin.DesiredState(
        teams=tuple(
            admin.TeamSpec(team.name, centre.name, team.projects, team.users)
            for centre in config.organisation.cost_centres
            for team in centre.teams
        ),
        prices=tuple(
            admin.PriceSpec(p.model, p.pool, p.per_gpu_hour, p.effective_from * 1_000_000)
            for p in config.prices
        ),
        quotas=tuple(
            admin.QuotaSpec(
                q.team, q.pool, q.flavor_model, q.nominal, q.borrowing_limit, q.lending_limit
            )
            for q in config.quotas
        ),
        budgets=tuple(budgets),
        policies=tuple(policies),
    )


def kubelet_pods(config: TallyConfig, node: str) -> KubeletPods | None:
    """The kubelet client of `identity.kubernetes` for this node, or None when none is set."""
    from collectors.kubelet import KubeletPods

    k8s = config.identity.kubernetes
    url = k8s.kubelet_url_for(node)
    if url is None:
        return None
    return KubeletPods(url, timeout_s=k8s.kubelet_timeout_s, refresh_s=k8s.kubelet_refresh_s)


def owner_resolver(config: TallyConfig, kubelet: KubeletPods | None) -> OwnerResolver:
    """The NVML collector's process → owner resolver with `identity:`'s Slurm accounts and
    pods (through `kubelet`, when there is one)."""
    from collectors.k8s_identity import pod_owner_of
    from collectors.ownership import OwnerResolver
    from collectors.slurm_account import SlurmAccounts

    identity = config.identity
    rules = identity.kubernetes.rules()
    pods = None
    if kubelet is not None:
        client = kubelet

        def pods(uid: str) -> Owner | None:
            return pod_owner_of(client.by_uid(uid), rules)

    return OwnerResolver(
        pods=pods,
        slurm_account=SlurmAccounts(identity.scontrol, timeout_s=identity.scontrol_timeout_s),
        accounts=identity.account_owners(),
    )
