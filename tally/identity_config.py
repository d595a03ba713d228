"""The `identity:` section of the configuration: who a job or a process is. Collectors name the
team and project of work Tally did not schedule — Slurm jobs by their account, Kubernetes pods
by their namespace and labels (see `collectors.slurm_account`, `collectors.k8s_identity`,
`collectors.kubelet`); the executors run a Tally user's jobs as an OS user (`os_users`,
`tally.os_users_config`), and the Slurm executor submits a team's jobs with `--account=` the
first account mapped to that team (`slurm_account_of_team`).

    identity:
      os_users: {users: {ada: ada}, default: null}
      slurm_accounts:
        ml-research: {team: research, project: llm}
      scontrol: [scontrol]            # the command asked for a job's account
      kubernetes:
        namespaces:
          vision: computer-vision     # a team, or {team: …, project: …}
        team_labels: [team, kueue.x-k8s.io/queue-name]
        project_labels: [project]
        kubelet_url: http://{node}:10255/pods   # left out: pods stay `k8s-pod:<uid>`

Teams and projects named here must be in `organisation` (checked by `check_identity_names`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator

from collectors.k8s_identity import PodRules
from ledger.invalid import Invalid
from tally.config_fields import Name, Strict
from tally.os_users_config import OsUsersConfig

# A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
_LABEL_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
_LABEL_PREFIX = r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?"
LABEL_KEY = re.compile(rf"^(?:{_LABEL_PREFIX}/)?{_LABEL_NAME}$")
NAMESPACE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")  # an RFC 1123 label


def _label_key(value: Any) -> str:
    if not isinstance(value, str) or not LABEL_KEY.match(value):
        raise Invalid(
            "{key!r} is not a Kubernetes label key (prefix/name, e.g. kueue.x-k8s.io/queue-name)",
            key=str(value)[:80],
        )
    return value


LabelKey = Annotated[str, BeforeValidator(_label_key)]


class OwnerRef(Strict):
    """A team and, optionally, one of its projects."""

    team: Name
    project: Name | None = None


def _owner_ref(value: Any) -> Any:
    return {"team": value} if isinstance(value, str) else value


NamespaceOwner = Annotated[OwnerRef, BeforeValidator(_owner_ref)]


class KubernetesIdentity(Strict):
    """Pods: `namespaces` (namespace → team or {team, project}) wins over labels;
    `team_labels` and `project_labels` are label keys in order of precedence; `kubelet_url`
    (`{node}` becomes the collector's node name) resolves NVML's pod uids and dcgm rows' labels,
    re-read every `kubelet_refresh_s`, each read bounded by `kubelet_timeout_s`."""

    namespaces: dict[str, NamespaceOwner] = Field(default_factory=dict)
    team_labels: tuple[LabelKey, ...] = ("team",)
    project_labels: tuple[LabelKey, ...] = ("project",)
    kubelet_url: str | None = Field(None, min_length=8, max_length=512)
    kubelet_timeout_s: float = Field(2.0, gt=0, le=60)
    kubelet_refresh_s: float = Field(30.0, ge=1, le=3600)

    @field_validator("namespaces")
    @classmethod
    def _namespace_names(cls, value: dict[str, OwnerRef]) -> dict[str, OwnerRef]:
        for namespace in value:
            if not NAMESPACE.match(namespace):
                raise Invalid(
                    "{namespace!r} is not a namespace name (lower-case letters, digits and "
                    "'-', at most 63)",
                    namespace=namespace[:80],
                )
        return value

    @field_validator("kubelet_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise Invalid("kubelet_url must start with http:// or https://")
        return value

    def rules(self) -> PodRules:
        return PodRules(
            {ns: (ref.team, ref.project) for ns, ref in self.namespaces.items()},
            self.team_labels,
            self.project_labels,
        )

    def kubelet_url_for(self, node: str) -> str | None:
        return self.kubelet_url.replace("{node}", node) if self.kubelet_url else None


def _command(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


class IdentityConfig(Strict):
    """`slurm_accounts`: Slurm account → {team, project} (an account not named here is booked
    to the team `unmapped:<account>`); `scontrol`: the command asked for the account of a job
    whose environment does not carry `SLURM_JOB_ACCOUNT`; `kubernetes`: pods; `os_users`: the
    OS user each Tally user's jobs run as."""

    os_users: OsUsersConfig = OsUsersConfig()
    slurm_accounts: dict[Name, OwnerRef] = Field(default_factory=dict)
    scontrol: Annotated[tuple[str, ...], BeforeValidator(_command)] = Field(
        ("scontrol",), min_length=1, max_length=16
    )
    scontrol_timeout_s: float = Field(5.0, gt=0, le=60)
    kubernetes: KubernetesIdentity = KubernetesIdentity()

    @field_validator("scontrol")
    @classmethod
    def _non_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not all(0 < len(part) <= 4096 for part in value):
            raise Invalid("scontrol: each part of the command must be non-empty")
        return value

    def account_owners(self) -> dict[str, tuple[str, str | None]]:
        return {account: (ref.team, ref.project) for account, ref in self.slurm_accounts.items()}


def check_identity_names(identity: IdentityConfig, projects: Mapping[str, tuple[str, ...]]) -> None:
    """Raise ValueError unless every team (and project) `identity` names is in the
    organisation (`projects`: team → its projects)."""
    named = [
        *(
            (f"identity.slurm_accounts.{account}", ref)
            for account, ref in identity.slurm_accounts.items()
        ),
        *(
            (f"identity.kubernetes.namespaces.{namespace}", ref)
            for namespace, ref in identity.kubernetes.namespaces.items()
        ),
    ]
    for where, ref in named:
        if ref.team not in projects:
            raise Invalid("{where}: unknown team {team!r}", where=where, team=ref.team)
        if ref.project is not None and ref.project not in projects[ref.team]:
            raise Invalid(
                "{where}: team {team!r} has no project {project!r} (its projects: {projects})",
                where=where,
                team=ref.team,
                project=ref.project,
                projects=", ".join(projects[ref.team]),
            )


def slurm_account_of_team(accounts: Mapping[str, OwnerRef]) -> dict[str, str]:
    """Team → the first Slurm account (in the file's order) mapped to it."""
    out: dict[str, str] = {}
    for account, owner in accounts.items():
        out.setdefault(owner.team, account)
    return out
