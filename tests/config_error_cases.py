"""Configurations that make each of Tally's own validators refuse (#15 item 9): `CASES`, one
row per `ledger.invalid.Invalid` sentence the configuration's models (and the tokens file's
callers) can raise, with the English
an operator read before the sentences were translated, byte for byte (after `t.yaml: `).
`tests/unit/test_config_language.py` checks each row in English and Chinese, and that every
sentence raised in the source has a row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ledger.roles import Caller, Role
from ledger.units import parse_micros
from tally.alerts_config import AlertsConfig, AlertSinkConfig
from tally.auth_config import ClaimRuleConfig, OidcConfig
from tally.broker_config import BrokerConfig, ConsumerConfig, TlsConfig, TopicsConfig
from tally.budgets_config import BudgetConfig, CarryCap
from tally.config import (
    EnergyPriceConfig,
    FleetConfig,
    IdleConfig,
    LedgerConfig,
    OrganisationConfig,
    PriceConfig,
    TallyConfig,
    TeamConfig,
    WorkloadMix,
)
from tally.identity_config import IdentityConfig, KubernetesIdentity
from tally.inventory_config import InventoryConfig
from tally.metrics_config import MetricsConfig
from tally.os_users_config import OsUsersConfig
from tally.scheduler_config import (
    IdleReclaimAfter,
    PriorityBoundsConfig,
    QueueConfig,
    QuotaConfig,
    SchedulerConfig,
    SchedulerTeamConfig,
    TokensConfig,
)
from tests.builders import a_config_dict


@dataclass(frozen=True, slots=True)
class Case:
    model: type[BaseModel] | Callable[[], object]
    data: Any
    said: str  # `field.path: sentence` in English, as it always was (after `t.yaml: `)


POOL = {"name": "h100", "model": "H100", "nodes": 1}
QUEUE = {"name": "q", "class": "dev"}
VISION = {"team": "vision"}
NOPE = {"team": "nope"}
QUOTA = {"team": "vision", "pool": "h100", "model": "NVIDIA H100 80GB HBM3", "nominal": 1}
BUDGET = {"team": "vision", "money": "10", "every": "month"}
SINK = {"name": "s", "kind": "slack", "url": "https://hooks.example"}
OIDC = {"issuer": "https://id.example", "audience": "tally"}
ROLE = {"value": "g", "role": "admin"}


CASES: dict[str, Case] = {
    # tally/config_fields.py and the ledger's amounts
    "money-magnitude": Case(
        PriceConfig,
        {"model": "m", "per_gpu_hour": "1e30"},
        "per_gpu_hour: at most 4,611,686,018,427 in magnitude",
    ),
    "money-type": Case(
        PriceConfig,
        {"model": "m", "per_gpu_hour": [1]},
        'per_gpu_hour: expected a decimal amount such as "2.50"',
    ),
    "money-text": Case(
        PriceConfig,
        {"model": "m", "per_gpu_hour": "abc"},
        "per_gpu_hour: 'abc' is not a decimal amount",
    ),
    "money-infinite": Case(
        PriceConfig,
        {"model": "m", "per_gpu_hour": "Infinity"},
        "per_gpu_hour: 'Infinity' is not a finite amount",
    ),
    "money-places": Case(
        PriceConfig,
        {"model": "m", "per_gpu_hour": "1.0000001"},
        "per_gpu_hour: '1.0000001' has more than six decimal places",
    ),
    "money-overflow": Case(
        PriceConfig, {"model": "m", "per_gpu_hour": "1e999999"}, "per_gpu_hour: too large an amount"
    ),
    "caller-team": Case(
        lambda: Caller(Role.ADMIN, "vision"), None, "role admin is organisation-wide: no team"
    ),
    "caller-no-team": Case(lambda: Caller(Role.TEAM_LEAD), None, "role team-lead needs a team"),
    "caller-no-user": Case(lambda: Caller(Role.MEMBER, "vision"), None, "role member needs a user"),
    "amount-boolean": Case(lambda: parse_micros(True), None, "a boolean is not an amount"),
    "amount-float": Case(
        lambda: parse_micros(2.5),
        None,
        "floats are not accepted as amounts; write the amount as text",
    ),
    "name": Case(
        TeamConfig,
        {"name": "-x", "projects": ["a"]},
        "name: names use letters, digits, '.', '_' and '-', start with a letter or digit, and "
        "are at most 64 characters",
    ),
    "env-name": Case(
        TokensConfig,
        {"admin_env": "1X"},
        "admin_env: an environment variable name: letters, digits and '_'",
    ),
    "gpu-hours-type": Case(
        SchedulerTeamConfig,
        {"name": "t", "overdraft_gpu_hours": [1]},
        'overdraft_gpu_hours: expected GPU-hours such as 500 or "12.5"',
    ),
    "gpu-hours-text": Case(
        SchedulerTeamConfig,
        {"name": "t", "overdraft_gpu_hours": "abc"},
        "overdraft_gpu_hours: 'abc' is not a number of GPU-hours",
    ),
    "gpu-hours-negative": Case(
        SchedulerTeamConfig,
        {"name": "t", "overdraft_gpu_hours": "-1"},
        "overdraft_gpu_hours: GPU-hours must be a finite, non-negative number",
    ),
    "gpu-hours-overflow": Case(
        SchedulerTeamConfig,
        {"name": "t", "overdraft_gpu_hours": "1e999999"},
        "overdraft_gpu_hours: at most 1,281,023,894,007 GPU-hours",
    ),
    "gpu-hours-fraction": Case(
        SchedulerTeamConfig,
        {"name": "t", "overdraft_gpu_hours": "0.0000000001"},
        "overdraft_gpu_hours: 0.0000000001 GPU-hours is not a whole number of GPU-milliseconds",
    ),
    "gpu-hours-too-many": Case(
        SchedulerTeamConfig,
        {"name": "t", "overdraft_gpu_hours": "1e13"},
        "overdraft_gpu_hours: at most 1,281,023,894,007 GPU-hours",
    ),
    # tally/config.py
    "team-twice": Case(
        OrganisationConfig,
        {"cost_centres": [{"name": "r", "teams": [{"name": "a", "projects": ["p"]}] * 2}]},
        "(top level): team 'a' appears twice",
    ),
    "no-weight": Case(
        WorkloadMix,
        {"training": 0, "inference": 0, "notebook": 0, "unallocated": 0},
        "(top level): at least one workload weight must be positive",
    ),
    "pools-unique": Case(FleetConfig, {"pools": [POOL, POOL]}, "pools: pool names must be unique"),
    "price-negative": Case(
        PriceConfig,
        {"model": "m", "per_gpu_hour": "-1"},
        "per_gpu_hour: a price cannot be negative",
    ),
    "energy-price-negative": Case(
        EnergyPriceConfig, {"per_kwh": "-1"}, "per_kwh: a price cannot be negative"
    ),
    "mig-profile": Case(
        QuotaConfig,
        {**QUOTA, "mig_profile": "big"},
        "(top level): mig_profile 'big': expected e.g. 1g.10gb or 3g.40gb",
    ),
    "mig-in-model": Case(
        QuotaConfig,
        {**QUOTA, "model": "A100/1g.10gb"},
        "(top level): model 'A100/1g.10gb': name a MIG profile in mig_profile",
    ),
    "reclaim-one": Case(
        IdleReclaimAfter,
        {},
        "(top level): give exactly one of reclaim_after_min or alert_after_min",
    ),
    "priority-bounds": Case(
        PriorityBoundsConfig, {"min": 5, "max": 1}, "(top level): min (5) is above max (1)"
    ),
    "over-budget-preemptible": Case(
        QueueConfig,
        {**QUEUE, "preemptible": False, "run_preemptible_when_over_budget": True},
        "(top level): run_preemptible_when_over_budget needs a preemptible queue (over-budget "
        "jobs run preemptible)",
    ),
    "overdraft-negative": Case(
        SchedulerTeamConfig,
        {"name": "t", "overdraft_money": "-1"},
        "overdraft_money: an overdraft cannot be negative",
    ),
    "scheduler-team-twice": Case(
        SchedulerConfig, {"teams": [{"name": "a"}] * 2}, "teams: a team appears twice"
    ),
    "hysteresis": Case(
        IdleConfig,
        {"threshold_pct": 50, "resolve_pct": 10},
        "(top level): resolve_pct must be at least threshold_pct (hysteresis)",
    ),
    "zone": Case(
        LedgerConfig,
        {"timezone": "Mars/Olympus"},
        "timezone: 'Mars/Olympus' is not an IANA time zone name such as UTC or Asia/Shanghai",
    ),
    "sharded-without-store": Case(
        LedgerConfig,
        {"sharded": True},
        "(top level): sharded: true needs segments_url: the shards are shared by the workers "
        "through the segments store",
    ),
    "budget-unknown-team": Case(
        TallyConfig,
        a_config_dict(budgets=[{**BUDGET, "team": "nope"}]),
        "(top level): budget for unknown team 'nope'",
    ),
    "budgets-twice-in-period": Case(
        TallyConfig,
        a_config_dict(budgets=[{"team": "vision", "money": "1", "period": "2026-11"}] * 2),
        "(top level): two budgets for team 'vision' in 2026-11",
    ),
    "budgets-twice-recurring": Case(
        TallyConfig,
        a_config_dict(budgets=[BUDGET] * 2),
        "(top level): two budgets for team 'vision' that recur",
    ),
    "quota-unknown-team": Case(
        TallyConfig,
        a_config_dict(quotas=[{**QUOTA, "team": "nope"}]),
        "(top level): quota for unknown team 'nope'",
    ),
    "quotas-twice": Case(
        TallyConfig,
        a_config_dict(quotas=[QUOTA] * 2),
        "(top level): two quotas for team 'vision' on h100/NVIDIA H100 80GB HBM3",
    ),
    "queues-unique": Case(
        TallyConfig, a_config_dict(queues=[QUEUE] * 2), "(top level): queue names must be unique"
    ),
    "scheduler-unknown-team": Case(
        TallyConfig,
        a_config_dict(scheduler={"teams": [{"name": "nope"}]}),
        "(top level): scheduler.teams: unknown team 'nope'",
    ),
    "token-unknown-team": Case(
        TallyConfig,
        a_config_dict(scheduler={"tokens": {"team_env": {"nope": "NOPE_TOKEN"}}}),
        "(top level): scheduler.tokens.team_env: unknown team 'nope'",
    ),
    "queue-unknown-model": Case(
        TallyConfig,
        a_config_dict(queues=[{**QUEUE, "allowed_models": ["B200", "A100"]}]),
        "(top level): queue 'q': unknown GPU model(s) A100, B200 (configured: NVIDIA H100 "
        "80GB HBM3)",
    ),
    "queue-no-model": Case(
        TallyConfig,
        a_config_dict(
            queues=[
                {**QUEUE, "allowed_models": ["NVIDIA H100 80GB HBM3"]}
                | {"forbidden_models": ["NVIDIA H100 80GB HBM3"]}
            ]
        ),
        "(top level): queue 'q': its model policy allows no model",
    ),
    "pool-without-price": Case(
        TallyConfig,
        a_config_dict(prices=[{"model": "B200", "per_gpu_hour": "1"}]),
        "(top level): fleet pool 'h100' uses model 'NVIDIA H100 80GB HBM3', which has no price",
    ),
    # tally/budgets_config.py
    "cap-empty": Case(
        CarryCap, {}, "(top level): a carry-over cap needs money, gpu_hours, or both"
    ),
    "cap-negative": Case(
        CarryCap, {"money": "-1"}, "(top level): a carry-over cap cannot be negative"
    ),
    "carry-over-text": Case(
        BudgetConfig,
        {**BUDGET, "carry_over": "most"},
        'carry_over: carry_over: none, all, a percentage such as "25%" (at most 100), or a '
        "cap such as {money: \"500.00\"}, not 'most'",
    ),
    "budget-empty": Case(
        BudgetConfig,
        {"team": "t", "every": "month"},
        "(top level): a budget needs money, gpu_hours, or both",
    ),
    "budget-negative": Case(
        BudgetConfig, {**BUDGET, "money": "-1"}, "(top level): a budget cannot be negative"
    ),
    "budget-period-or-every": Case(
        BudgetConfig,
        {"team": "t", "money": "1"},
        "(top level): a budget has either a period (one month) or every (month|quarter)",
    ),
    "budget-start-once": Case(
        BudgetConfig,
        {"team": "t", "money": "1", "period": "2026-11", "start": "2026-11"},
        "(top level): start, end and carry_over belong to a recurring budget (every:)",
    ),
    "budget-end-before-start": Case(
        BudgetConfig,
        {**BUDGET, "start": "2026-11", "end": "2026-10"},
        "(top level): end 2026-10 is before start 2026-11",
    ),
    "budget-cap-units": Case(
        BudgetConfig,
        {**BUDGET, "carry_over": {"gpu_hours": 5}},
        "(top level): carry_over: a cap names exactly the budgeted units (money)",
    ),
    "budget-month": Case(
        BudgetConfig,
        {**BUDGET, "start": "2026-13"},
        "start: '2026-13' is not a month such as 2026-11",
    ),
    # tally/broker_config.py
    "tls-key-without-cert": Case(
        TlsConfig,
        {"key_file": "k.pem"},
        "(top level): key_file needs cert_file (the client certificate)",
    ),
    "tls-password-without-cert": Case(
        TlsConfig,
        {"key_password_env": "KEY_PASSWORD"},
        "(top level): key_password_env needs cert_file (the client certificate)",
    ),
    "heartbeat": Case(
        ConsumerConfig,
        {"session_timeout_s": 3, "heartbeat_interval_s": 3},
        "(top level): heartbeat_interval_s (3.0) must be below session_timeout_s (3.0); a "
        "third of it is usual",
    ),
    "external-without-servers": Case(
        BrokerConfig,
        {"mode": "external"},
        "(top level): an external broker needs bootstrap_servers (host:port, …)",
    ),
    "server-not-host-port": Case(
        BrokerConfig,
        {"mode": "external", "bootstrap_servers": ["kafka"]},
        "(top level): bootstrap server 'kafka' is not host:port",
    ),
    "embedded-ssl": Case(
        BrokerConfig,
        {"security_protocol": "SSL"},
        "(top level): security_protocol: the embedded broker speaks PLAINTEXT only, not SSL "
        "(use mode: external for a secured cluster)",
    ),
    "sasl-missing": Case(
        BrokerConfig,
        {"mode": "external", "bootstrap_servers": ["k:9092"], "security_protocol": "SASL_SSL"},
        "(top level): sasl: security_protocol SASL_SSL needs a sasl: section",
    ),
    "sasl-unused": Case(
        BrokerConfig,
        {
            "mode": "external",
            "bootstrap_servers": ["k:9092"],
            "sasl": {"username": "u", "password_env": "P"},
        },
        "(top level): sasl: given, but security_protocol is PLAINTEXT (SASL_PLAINTEXT or "
        "SASL_SSL use it)",
    ),
    "tls-unused": Case(
        BrokerConfig,
        {"mode": "external", "bootstrap_servers": ["k:9092"], "tls": {}},
        "(top level): tls: given, but security_protocol is PLAINTEXT (SSL or SASL_SSL use it)",
    ),
    "insync-over-replicas": Case(
        TopicsConfig,
        {"settings": {"jobs": {"min_insync_replicas": 2}}},
        "(top level): settings.jobs: min_insync_replicas (2) exceeds replication_factor (1) "
        "for the jobs topic: no write could ever succeed",
    ),
    # tally/identity_config.py, tally/os_users_config.py
    "label-key": Case(
        KubernetesIdentity,
        {"team_labels": ["a b"]},
        "team_labels[0]: 'a b' is not a Kubernetes label key (prefix/name, e.g. "
        "kueue.x-k8s.io/queue-name)",
    ),
    "namespace": Case(
        KubernetesIdentity,
        {"namespaces": {"Big_NS": "vision"}},
        "namespaces: 'Big_NS' is not a namespace name (lower-case letters, digits and '-', at "
        "most 63)",
    ),
    "kubelet-url": Case(
        KubernetesIdentity,
        {"kubelet_url": "ftp://node:10250"},
        "kubelet_url: kubelet_url must start with http:// or https://",
    ),
    "scontrol": Case(
        IdentityConfig,
        {"scontrol": ["scontrol", ""]},
        "scontrol: scontrol: each part of the command must be non-empty",
    ),
    "identity-unknown-team": Case(
        TallyConfig,
        a_config_dict(identity={"slurm_accounts": {"acct": {"team": "nope"}}}),
        "(top level): identity.slurm_accounts.acct: unknown team 'nope'",
    ),
    "identity-unknown-project": Case(
        TallyConfig,
        a_config_dict(
            identity={"kubernetes": {"namespaces": {"ml": {"team": "vision", "project": "x"}}}}
        ),
        "(top level): identity.kubernetes.namespaces.ml: team 'vision' has no project 'x' "
        "(its projects: detection, segmentation)",
    ),
    "os-user": Case(
        OsUsersConfig,
        {"users": {"ada": "ada:x"}},
        "users.ada: 'ada:x' is not an OS user name (letters, digits, '_', '.', '-', at most 32)",
    ),
    # tally/inventory_config.py
    "report-window": Case(
        InventoryConfig,
        {"stale_after_intervals": 6, "report_every_rounds": 4},
        "(top level): report_every_rounds must be at most half of stale_after_intervals, or a "
        "GPU goes stale between two reports",
    ),
    "label-length": Case(
        InventoryConfig,
        {"labels": {"": "x"}},
        "(top level): labels: '': keys and values of 1–256 characters",
    ),
    "labels-count": Case(
        InventoryConfig,
        {"labels": {f"k{i}": "v" for i in range(65)}},
        "(top level): labels: at most 64",
    ),
    "gpu-labels-key": Case(
        InventoryConfig,
        {"gpu_labels": {"": {}}},
        "(top level): gpu_labels: '': a GPU index or UUID, 64 labels",
    ),
    "gpu-label-length": Case(
        InventoryConfig,
        {"gpu_labels": {"0": {"k": "v" * 257}}},
        "(top level): gpu_labels: '0': keys and values of 1–256 characters",
    ),
    # tally/alerts_config.py, tally/auth_config.py, tally/metrics_config.py
    "sink-url": Case(
        AlertSinkConfig,
        {**SINK, "url": "ftp://x"},
        "url: expected an http:// or https:// URL",
    ),
    "sink-one-url": Case(
        AlertSinkConfig,
        {**SINK, "url_env": "HOOK"},
        "(top level): give exactly one of url or url_env",
    ),
    "sink-secret": Case(
        AlertSinkConfig,
        {**SINK, "secret_env": "SECRET"},
        "(top level): secret_env: a slack sink does not sign its requests",
    ),
    "sinks-unique": Case(
        AlertsConfig, {"sinks": [SINK] * 2}, "(top level): alert sink names must be unique"
    ),
    "algorithm-twice": Case(
        OidcConfig,
        {**OIDC, "roles": [ROLE], "algorithms": ["RS256", "RS256"]},
        "algorithms: an algorithm appears twice",
    ),
    "role-needs-team": Case(
        ClaimRuleConfig,
        {**ROLE, "role": "member"},
        "(top level): claim rule groups=g: role member needs a team",
    ),
    "role-without-team": Case(
        ClaimRuleConfig,
        {**ROLE, "team": "vision"},
        "(top level): claim rule groups=g: role admin is organisation-wide: no team",
    ),
    "auth-unknown-team": Case(
        TallyConfig,
        a_config_dict(
            auth={"oidc": {**OIDC, "roles": [{**ROLE, "role": "member", "team": "nope"}]}}
        ),
        "(top level): auth.oidc.roles: unknown team(s) nope",
    ),
    "metrics-ports": Case(
        MetricsConfig,
        {"worker_port": 9000, "scheduler_port": 9000},
        "(top level): worker_port and scheduler_port must differ (or be 0)",
    ),
}
