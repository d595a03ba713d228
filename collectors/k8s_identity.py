"""Kubernetes pod identity: one job id and one owner for a pod, whichever collector saw it.

This module owns the pure rules (no I/O) both collectors use:

- `pod_job_id(namespace, name)`: the canonical job id of a pod, `k8s:<namespace>/<name>`
  (`k8s:<name>` without a namespace). dcgm-exporter rows name the pod directly; NVML processes
  name its uid (cgroup path) and reach the same id through the kubelet (`collectors.kubelet`).
  A pod the kubelet does not know stays `k8s-pod:<uid>`.
- `pod_owner(namespace, name, labels, rules)`: team and project, field by field:
    * team: the namespace map (`identity.kubernetes.namespaces`) first, then the first of
      `team_labels` the pod carries, then the namespace's own name;
    * project: the namespace map's project, then the first of `project_labels` the pod carries.
  The operator's map wins over labels because labels are written by whoever creates the pod;
  labels decide the team in shared namespaces the map does not name. Label values that are
  empty or longer than `MAX_VALUE_CHARS` are ignored.
- `parse_pod_list(data)`: the pods of a kubelet `/pods` answer (a v1 `PodList`), refusing
  anything that is not one with ValueError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ledger.events import Owner

MAX_VALUE_CHARS = 256  # the event decoder rejects longer strings
K8S_PREFIX = "k8s:"


@dataclass(frozen=True, slots=True)
class PodRules:
    """How a pod's namespace and labels name its team and project.

    `namespaces`: namespace → (team, project or None); `team_labels` and `project_labels`:
    label keys, in order of precedence (e.g. `team`, `kueue.x-k8s.io/queue-name`).
    """

    namespaces: Mapping[str, tuple[str, str | None]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    team_labels: tuple[str, ...] = ("team",)
    project_labels: tuple[str, ...] = ("project",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "namespaces", MappingProxyType(dict(self.namespaces)))


@dataclass(frozen=True, slots=True)
class Pod:
    """One pod as the kubelet describes it."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    phase: str | None = None


def pod_job_id(namespace: str, name: str) -> str:
    return f"{K8S_PREFIX}{namespace}/{name}" if namespace else f"{K8S_PREFIX}{name}"


def _first_label(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = labels.get(key)
        if value and len(value) <= MAX_VALUE_CHARS:
            return value
    return None


def pod_owner(
    namespace: str, name: str, labels: Mapping[str, str], rules: PodRules | None = None
) -> Owner:
    """The owner of pod `namespace/name` with `labels` (see the module's rules)."""
    rules = rules or PodRules()
    mapped_team, mapped_project = rules.namespaces.get(namespace, (None, None))
    team = mapped_team or _first_label(labels, rules.team_labels) or namespace or None
    project = mapped_project or _first_label(labels, rules.project_labels)
    return Owner(team=team, project=project, job_id=pod_job_id(namespace, name))


def pod_owner_of(pod: Pod | None, rules: PodRules | None = None) -> Owner | None:
    """`pod_owner` of a pod the kubelet described; None for an unknown pod."""
    if pod is None:
        return None
    return pod_owner(pod.namespace, pod.name, pod.labels, rules)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_VALUE_CHARS else None


def parse_pod_list(data: bytes) -> tuple[Pod, ...]:
    """The pods of a v1 `PodList` (JSON). Items without uid, namespace or name are skipped;
    labels that are not strings are dropped. Raises ValueError for anything else."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("kind") != "PodList":
        raise ValueError("not a v1 PodList")
    items = document.get("items")
    if items is None:  # an empty list may be encoded as null
        items = []
    if not isinstance(items, list):
        raise ValueError("PodList.items is not a list")
    pods: list[Pod] = []
    for item in items:
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict):
            continue
        uid, namespace, name = (_text(metadata.get(k)) for k in ("uid", "namespace", "name"))
        if uid is None or namespace is None or name is None:
            continue
        raw_labels = metadata.get("labels")
        labels = {
            key: value
            for key, value in (raw_labels.items() if isinstance(raw_labels, dict) else ())
            if isinstance(key, str) and isinstance(value, str)
        }
        status = item.get("status")
        phase = _text(status.get("phase")) if isinstance(status, dict) else None
        pods.append(Pod(uid, namespace, name, MappingProxyType(labels), phase))
    return tuple(pods)
