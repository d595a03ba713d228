"""deploy/kubernetes: the Kustomize overlays rendered with `kubectl kustomize` (Debian's
kubernetes-client), every object validated by kubernetes-validate against a current
Kubernetes, and what the manifests promise checked against Tally itself: each container runs
a command the real CLI accepts with the rendered ConfigMap's configuration (which passes
`tally config check`), probes and the PodMonitor hit the ports that configuration serves, and
every secret the configuration names reaches the pod."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.commands import (
    DASHBOARD_HEALTH_PATH,
    DEPLOY,
    HEALTH_PATHS,
    TallyCommand,
    config_check,
    metrics_port,
    parse_tally,
    secret_variables,
    serves_outside,
)

pytestmark = pytest.mark.deploy

KUSTOMIZE = DEPLOY / "kubernetes"
OVERLAYS = ("dev", "production")
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
CRD_GROUP = "monitoring.coreos.com/"


def kubernetes_version() -> str:
    """The newest Kubernetes the pinned kubernetes-validate knows (1.37 with 1.37.0)."""
    from kubernetes_validate.utils import latest_version

    return latest_version()


def render(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl not found: install Debian's kubernetes-client (.ci/run does)")
    done = subprocess.run(
        [kubectl, "kustomize", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(KUSTOMIZE / "overlays" / request.param)


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(KUSTOMIZE / "base")


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def workloads(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (o for o in objects if o["kind"] in WORKLOAD_KINDS)


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def tally_containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for workload in workloads(objects):
        for container in pod_spec(workload)["containers"]:
            if container["image"].split(":")[0] == "tally":
                yield workload["metadata"]["name"], container


def test_base_renders(base: list[dict[str, Any]]) -> None:
    kinds = {o["kind"] for o in base}
    assert {"DaemonSet", "StatefulSet", "Deployment", "Service", "ConfigMap"} <= kinds


def test_every_rendered_object_is_valid_kubernetes(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    import kubernetes_validate

    _, objects = overlay
    version = kubernetes_version()
    validated = 0
    for obj in objects:
        if obj["apiVersion"].startswith(CRD_GROUP):
            continue  # the Prometheus Operator's CRDs: test_pod_monitor_scrapes_every_metrics_port
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.caught.absolute_path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {exc.caught.message}")
        validated += 1
    assert validated >= 10


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda o: o["spec"].update(replica=1), id="misspelt-field"),
        pytest.param(
            lambda o: pod_spec(o)["containers"][0].update(ports=[{"containerPort": "http"}]),
            id="port-not-a-number",
        ),
    ],
)
def test_validation_refuses_a_broken_object(base: list[dict[str, Any]], breakage: Any) -> None:
    import kubernetes_validate

    broken = copy.deepcopy(named(base, "StatefulSet", "tally-worker"))
    breakage(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_version(), strict=True)


def rendered_config(objects: list[dict[str, Any]], workload: dict[str, Any], tmp: Path) -> Path:
    """The ConfigMap a workload mounts at /etc/tally, written where `tally config check` reads."""
    (volume,) = [v for v in pod_spec(workload)["volumes"] if "configMap" in v]
    configmap = named(objects, "ConfigMap", volume["configMap"]["name"])
    path = tmp / workload["metadata"]["name"] / "tally.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(configmap["data"]["tally.yaml"])
    return path


def container_command(
    objects: list[dict[str, Any]], workload: dict[str, Any], container: dict[str, Any], tmp: Path
) -> tuple[TallyCommand, Any]:
    command = parse_tally(container["args"])
    (mount,) = [
        m
        for m in container["volumeMounts"]
        if any(v["name"] == m["name"] and "configMap" in v for v in pod_spec(workload)["volumes"])
    ]
    config_path = rendered_config(objects, workload, tmp)
    file = command.config_file({f"{mount['mountPath']}/tally.yaml": config_path})
    return command, config_check(file)


def port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container.get("ports", []) if p["name"] == port]
    return int(number)


def test_every_tally_container_runs_a_real_command_with_a_valid_config(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, objects = overlay
    seen = set()
    for workload in workloads(objects):
        for container in pod_spec(workload)["containers"]:
            if container["image"].split(":")[0] != "tally":
                continue
            command, config = container_command(objects, workload, container, tmp_path)
            seen.add(command.path)
            port = metrics_port(config, command)
            if command.path == ("dashboard",):
                assert port_number(container, "http") == config.dashboard.port
                assert config.dashboard.host == "0.0.0.0"
                continue
            assert port is not None, f"{workload['metadata']['name']}: serves no health port"
            assert port_number(container, "metrics") == port
            assert serves_outside(config, command), "probes come from the kubelet"
    expected = {("collect",), ("worker",), ("scheduler", "run"), ("alerts", "run"), ("dashboard",)}
    assert expected <= seen


def test_every_container_has_resources_and_probes_on_served_paths(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = overlay
    for workload in workloads(objects):
        for container in pod_spec(workload)["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), f"{where}: {bound}"
            for probe in ("livenessProbe", "readinessProbe"):
                assert probe in container, f"{where}: {probe}"
                get = container[probe].get("httpGet")
                if get is None:
                    assert container["image"].startswith("apache/kafka:"), where
                    continue
                port = port_number(container, get["port"])
                if get["path"] == DASHBOARD_HEALTH_PATH:
                    assert port == port_number(container, "http")
                else:
                    assert get["path"] in HEALTH_PATHS, where
                    assert port == port_number(container, "metrics"), where
            if container["image"].split(":")[0] == "tally":
                assert container["livenessProbe"]["httpGet"]["path"] in {
                    "/healthz",
                    DASHBOARD_HEALTH_PATH,
                }
                assert container["readinessProbe"]["httpGet"]["path"] in {
                    "/readyz",
                    DASHBOARD_HEALTH_PATH,
                }


def test_collector_is_a_daemonset_on_gpu_nodes_that_can_see_every_process(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, objects = overlay
    collector = named(objects, "DaemonSet", "tally-collector")
    spec = pod_spec(collector)
    assert spec["hostPID"] is True, "NVML reports host PIDs; ownership reads their /proc"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    (container,) = spec["containers"]
    command, _ = container_command(objects, collector, container, tmp_path)
    assert command.params["source"] == "nvml"
    assert "SYS_PTRACE" in container["securityContext"]["capabilities"]["add"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"], "takes no GPU from jobs"


def test_worker_is_one_statefulset_replica_with_its_own_volume(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, objects = overlay
    worker = named(objects, "StatefulSet", "tally-worker")
    # several workers sharing one ledger are not built yet
    assert worker["spec"]["replicas"] == 1
    (claim,) = worker["spec"]["volumeClaimTemplates"]
    (container,) = pod_spec(worker)["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    _, config = container_command(objects, worker, container, tmp_path)
    assert config.ledger.data_dir.is_relative_to(mount["mountPath"])
    assert named(objects, "Service", worker["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize(
    ("name", "read_only"), [("tally-dashboard", True), ("tally-alerts", False)]
)
def test_readers_mount_worker_0s_volume_on_its_node(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path, name: str, read_only: bool
) -> None:
    _, objects = overlay
    worker = named(objects, "StatefulSet", "tally-worker")
    (claim,) = worker["spec"]["volumeClaimTemplates"]
    pvc = f"{claim['metadata']['name']}-{worker['metadata']['name']}-0"
    reader = named(objects, "Deployment", name)
    spec = pod_spec(reader)
    (volume,) = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc
    (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    selector = dict(term["labelSelector"]["matchLabels"])
    assert selector.pop("statefulset.kubernetes.io/pod-name") == f"{worker['metadata']['name']}-0"
    assert selector.items() <= worker["spec"]["template"]["metadata"]["labels"].items()
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount.get("readOnly", False) is read_only
    _, config = container_command(objects, reader, container, tmp_path)
    _, worker_config = container_command(
        objects, worker, pod_spec(worker)["containers"][0], tmp_path
    )
    assert config.ledger.data_dir == worker_config.ledger.data_dir
    assert config.ledger.data_dir.is_relative_to(mount["mountPath"])


def test_scheduler_alerts_and_dashboard_are_deployments_behind_services(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = overlay
    for name in ("tally-scheduler", "tally-alerts", "tally-dashboard"):
        assert named(objects, "Deployment", name)["spec"]["replicas"] == 1
    for name, port in (("tally-dashboard", "http"), ("tally-scheduler", "api")):
        service = named(objects, "Service", name)
        pods = named(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pods.items()
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port]


def test_pod_monitor_scrapes_every_metrics_port(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = overlay
    (monitor,) = [o for o in objects if o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert monitor["kind"] in {"PodMonitor", "ServiceMonitor"}
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    scraped = set()
    for workload in workloads(objects):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"] for c in pod_spec(workload)["containers"] for p in c.get("ports", [])}
        if "metrics" in ports:
            assert selector.items() <= labels.items(), workload["metadata"]["name"]
            scraped.add(workload["metadata"]["name"])
    assert {"tally-worker", "tally-scheduler", "tally-collector", "tally-alerts"} <= scraped


def secret_refs(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Environment variable → its secretKeyRef."""
    return {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def test_every_secret_the_config_names_reaches_the_pod(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    name, objects = overlay
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    keys_documented = set(
        re.findall(
            r"--from-literal=([a-z-]+)=",
            (KUSTOMIZE / "overlays" / name / "kustomization.yaml").read_text(),
        )
    )
    for workload in workloads(objects):
        for container in pod_spec(workload)["containers"]:
            if container["image"].split(":")[0] != "tally":
                continue
            command, config = container_command(objects, workload, container, tmp_path)
            refs = secret_refs(container)
            for variable in secret_variables(config, command):
                assert variable in refs, f"{workload['metadata']['name']}: {variable}"
                # only the Kafka password may be left out (the base's Kafka needs none)
                optional = refs[variable].get("optional", False)
                assert not optional or variable == "TALLY_KAFKA_PASSWORD", variable
            for ref in refs.values():
                if ref["name"] in secrets:  # rendered: the key is in it, unless optional
                    assert ref["key"] in secrets[ref["name"]]["data"] or ref.get("optional"), ref
                else:  # created beside the overlay: its kustomization says how, with each key
                    assert ref["key"] in keys_documented, (name, ref)
    assert not any("s3" in s or "minio" in s for s in secrets), "no object storage yet"
