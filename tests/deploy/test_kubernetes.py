"""deploy/kubernetes: the Kustomize overlays rendered with `kubectl kustomize` (Debian's
kubernetes-client), every object validated by kubernetes-validate against a current
Kubernetes, and what the manifests promise checked against Tally itself: each container runs
a command the real CLI accepts with the rendered ConfigMap's configuration (which passes
`tally config check`; the Job `tally-admin-apply-<hash>` runs `tally admin apply` of that
file, retried until the worker has published the ledger, and is a new Job when the file
changes), probes and the PodMonitor hit the ports that configuration serves, every secret the
configuration names reaches the pod (and none it does not name), no pod but the worker mounts
the worker's volume, and readers read the sealed ledger from the object store (the dev
overlay's MinIO, whose bucket a Job makes; production's external S3) into caches of their own
(the dashboard's on a claim)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tally.dashboard_login import secrets_path
from tests.deploy.commands import (
    DASHBOARD_HEALTH_PATH,
    DEPLOY,
    HEALTH_PATHS,
    STORE_USERS,
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


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every object that makes pods: the long-running workloads and the one-shot Jobs."""
    return (o for o in objects if o["kind"] in (*WORKLOAD_KINDS, "Job"))


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
    for workload in pod_templates(objects):
        for container in pod_spec(workload)["containers"]:
            if container["image"].split(":")[0] != "tally":
                continue
            command, config = container_command(objects, workload, container, tmp_path)
            seen.add(command.path)
            if workload["kind"] == "Job":
                assert command.path in ONE_SHOT, f"{workload['metadata']['name']}: {command}"
                continue  # runs to completion: serves nothing
            port = metrics_port(config, command)
            if command.path == ("dashboard",):
                assert port_number(container, "http") == config.dashboard.port
                assert config.dashboard.host == "0.0.0.0"
                continue
            assert port is not None, f"{workload['metadata']['name']}: serves no health port"
            assert port_number(container, "metrics") == port
            assert serves_outside(config, command), "probes come from the kubelet"
    expected = {("collect",), ("worker",), ("scheduler", "run"), ("alerts", "run"), ("dashboard",)}
    assert expected | ONE_SHOT <= seen


# the Tally commands that run as Jobs: to completion, serving no port
ONE_SHOT = frozenset({("admin", "apply")})


def admin_apply_job(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The admin-apply Job: named after the ConfigMap it mounts, the hash of tally.yaml in both
    (`tally-admin-apply-<hash>`)."""
    component = "app.kubernetes.io/component"
    (job,) = [
        o
        for o in objects
        if o["kind"] == "Job" and o["metadata"].get("labels", {}).get(component) == "admin-apply"
    ]
    (volume,) = [v for v in pod_spec(job)["volumes"] if "configMap" in v]
    assert job["metadata"]["name"] == volume["configMap"]["name"]
    assert re.fullmatch(r"tally-admin-apply-[a-z0-9]{10}", job["metadata"]["name"]), job["metadata"]
    return job


@pytest.mark.parametrize(
    ("edit", "same"),
    [
        pytest.param(lambda text: text, True, id="unchanged-file-same-job"),
        pytest.param(lambda text: text + "\n# edited\n", False, id="edited-file-new-job"),
    ],
)
def test_admin_apply_runs_again_when_its_file_changes(
    base: list[dict[str, Any]], tmp_path: Path, edit: Any, same: bool
) -> None:
    """A Job's pod template cannot change: the Job is named after its file's hash, so `kubectl
    apply -k` after an edit creates a new Job (which applies the new file), and an unchanged
    file names the Job that already ran."""
    copy_of = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE, copy_of)
    config = copy_of / "base" / "tally.yaml"
    config.write_text(edit(config.read_text()))
    again = admin_apply_job(render(copy_of / "base"))
    assert (again["metadata"]["name"] == admin_apply_job(base)["metadata"]["name"]) is same


def test_admin_apply_is_a_job_retried_until_the_worker_has_published_the_ledger(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, objects = overlay
    job = admin_apply_job(objects)
    spec = pod_spec(job)
    assert spec["restartPolicy"] == "OnFailure", "exit 4 (no ledger yet) is retried"
    assert 0 < job["spec"]["backoffLimit"] <= 10
    (container,) = spec["containers"]
    command, config = container_command(objects, job, container, tmp_path)
    assert command.path == ("admin", "apply")
    assert not command.params["initial"], "never planned against an empty ledger"
    assert not command.params["dry_run"]
    # the file it applies is the configuration every other pod mounts
    worker = named(objects, "StatefulSet", "tally-worker")
    (worker_container,) = pod_spec(worker)["containers"]
    _, worker_config = container_command(objects, worker, worker_container, tmp_path)
    assert config == worker_config
    assert {e["name"]: e.get("value") for e in container["env"]}["TALLY_ACTOR"]
    # its data directory (scratch: it reads the admin state from the store) is its own: no
    # claim, gone with the pod
    volume = volume_under(job, container, config.ledger.data_dir)
    assert "emptyDir" in volume, volume


# the probes of the images that are not Tally's (dev overlay): image → (liveness, readiness)
# HTTP paths on the container's port named "api"; None: a TCP probe (Kafka serves no HTTP)
THIRD_PARTY_PROBES: dict[str, tuple[str, str] | None] = {
    "apache/kafka": None,
    "quay.io/minio/minio": ("/minio/health/live", "/minio/health/ready"),
}


def test_every_container_has_resources_and_probes_on_served_paths(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = overlay
    for template in pod_templates(objects):
        for container in pod_spec(template)["containers"]:
            where = f"{template['metadata']['name']}/{container['name']}"
            resources = container.get("resources", {})
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(bound, {})), f"{where}: {bound}"
            if template["kind"] == "Job":
                continue  # runs to completion: nothing to probe
            image = container["image"].split(":")[0]
            probes = [container.get(p) for p in ("livenessProbe", "readinessProbe")]
            assert all(probes), f"{where}: a probe is missing"
            gets = [p.get("httpGet") for p in probes]
            if image == "tally":
                port = port_number(container, gets[0]["port"])
                assert port_number(container, gets[1]["port"]) == port, where
                paths = tuple(g["path"] for g in gets)
                if paths == (DASHBOARD_HEALTH_PATH,) * 2:
                    assert port == port_number(container, "http"), where
                else:
                    assert paths == ("/healthz", "/readyz"), where
                    assert set(paths) <= HEALTH_PATHS
                    assert port == port_number(container, "metrics"), where
                continue
            assert image in THIRD_PARTY_PROBES, f"{where}: an image with no known probes"
            expected = THIRD_PARTY_PROBES[image]
            if expected is None:
                assert all("tcpSocket" in p for p in probes), where
                continue
            assert tuple(g["path"] for g in gets) == expected, where
            assert {port_number(container, g["port"]) for g in gets} == {
                port_number(container, "api")
            }, where


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
    # the deployments run one worker (ledger.sharded is not set)
    assert worker["spec"]["replicas"] == 1
    (claim,) = worker["spec"]["volumeClaimTemplates"]
    (container,) = pod_spec(worker)["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    _, config = container_command(objects, worker, container, tmp_path)
    assert config.ledger.data_dir.is_relative_to(mount["mountPath"])
    assert named(objects, "Service", worker["spec"]["serviceName"])["spec"]["clusterIP"] == "None"


def is_ledger_claim(objects: list[dict[str, Any]], claim: str) -> bool:
    """Whether `claim` is one the worker StatefulSet's volume template makes for a replica
    (`<template>-<set>-<ordinal>`): the volume of the worker's hot DuckDB."""
    worker = named(objects, "StatefulSet", "tally-worker")
    (template,) = worker["spec"]["volumeClaimTemplates"]
    prefix = f"{template['metadata']['name']}-{worker['metadata']['name']}-"
    return claim.startswith(prefix) and claim.removeprefix(prefix).isdigit()


def claims_of(pod: dict[str, Any]) -> set[str]:
    return {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod.get("volumes", [])
        if "persistentVolumeClaim" in v
    }


def test_no_pod_but_the_worker_mounts_the_ledgers_volume(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = overlay
    worker_pods = named(objects, "StatefulSet", "tally-worker")["spec"]["template"]["metadata"]
    claimed_by: dict[str, str] = {}
    for workload in pod_templates(objects):
        name = f"{workload['kind']}/{workload['metadata']['name']}"
        spec = pod_spec(workload)
        if name == "StatefulSet/tally-worker":
            continue
        claims = claims_of(spec)
        assert not any(is_ledger_claim(objects, c) for c in claims), f"{name}: {claims}"
        for claim in claims:  # and no other volume is shared between two workloads either
            assert claimed_by.setdefault(claim, name) == name, f"{claim}: {name}, {claimed_by}"
        # nothing is pinned to the worker's node to share its volume
        for term in (
            spec.get("affinity", {})
            .get("podAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", [])
        ):
            selector = term["labelSelector"].get("matchLabels", {})
            assert not selector.items() <= worker_pods["labels"].items(), name
            assert "statefulset.kubernetes.io/pod-name" not in selector, name
        assert all("hostPath" not in v for v in spec.get("volumes", [])) or (
            name == "DaemonSet/tally-collector"
        ), f"{name}: a node's directory"


def test_the_sealed_ledger_is_read_from_the_object_store(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, objects = overlay
    configs = {}
    for workload in pod_templates(objects):
        for container in pod_spec(workload)["containers"]:
            if container["image"].split(":")[0] == "tally":
                command, config = container_command(objects, workload, container, tmp_path)
                configs[command.path] = (workload, container, config)
    assert set(configs) >= STORE_USERS
    _, _, worker = configs[("worker",)]
    assert urlsplit(worker.ledger.segments_url).scheme == "s3"
    for path in STORE_USERS & set(configs):
        workload, container, config = configs[path]
        ledger = config.ledger
        assert (ledger.segments_url, ledger.object_store) == (
            worker.ledger.segments_url,
            worker.ledger.object_store,
        ), path
        if path == ("worker",):
            continue
        # a reader's cache (<data_dir>/replica) is written: on a writable volume of its own
        volume = volume_under(workload, container, ledger.data_dir)
        assert "emptyDir" in volume or "persistentVolumeClaim" in volume, path
    # alert delivery reads Kafka only: its delivery log is on a volume it alone mounts
    workload, container, config = configs[("alerts", "run")]
    claim = volume_under(workload, container, config.ledger.data_dir)["persistentVolumeClaim"]
    assert not is_ledger_claim(objects, claim["claimName"])
    assert named(objects, "PersistentVolumeClaim", claim["claimName"])["spec"]["accessModes"]
    # what the dashboard keeps (people's saved job templates) survives a restart
    workload, container, config = configs[("dashboard",)]
    kept = volume_under(workload, container, secrets_path(config).parent / "templates")
    assert "persistentVolumeClaim" in kept, kept
    assert not is_ledger_claim(objects, kept["persistentVolumeClaim"]["claimName"])
    assert workload["spec"].get("strategy", {}).get("type") == "Recreate"  # one pod per claim
    # and its cache of the sealed ledger, as large as the ledger, is on a claim of its own: a
    # restart pulls what is new, not the whole ledger into the node's ephemeral storage
    cache = volume_under(workload, container, config.ledger.data_dir / "replica")
    claim = cache["persistentVolumeClaim"]["claimName"]
    assert claim != kept["persistentVolumeClaim"]["claimName"]
    assert not is_ledger_claim(objects, claim)
    assert named(objects, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == [
        "ReadWriteOnce"
    ]


def volume_under(workload: dict[str, Any], container: dict[str, Any], path: Path) -> dict[str, Any]:
    """The pod volume `path` lies on in `container`, mounted writable."""
    where = f"{workload['metadata']['name']}: {path}"
    mounts = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert mounts, f"{where} is on no volume"
    mount = max(mounts, key=lambda m: len(Path(m["mountPath"]).parts))  # the innermost wins
    assert not mount.get("readOnly", False), f"{where} is read-only"
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    return dict(volume)


def test_dev_runs_minio_and_makes_its_bucket_production_an_external_store(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    name, objects = overlay
    worker = named(objects, "StatefulSet", "tally-worker")
    container = pod_spec(worker)["containers"][0]
    _, config = container_command(objects, worker, container, tmp_path)
    store = config.ledger.object_store
    endpoint = urlsplit(store.endpoint_url)
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    if name == "production":
        assert endpoint.scheme == "https", "credentials cross the network"
        assert endpoint.hostname not in services
        assert not any("minio" in o["metadata"]["name"] for o in objects)
        return
    # the endpoint is the overlay's MinIO Service, on the port MinIO serves (9000 by default)
    host = str(endpoint.hostname)
    minio = named(objects, "Deployment", host)
    (server,) = pod_spec(minio)["containers"]
    (port,) = [p for p in services[host]["spec"]["ports"] if p["port"] == endpoint.port]
    assert port_number(server, port["targetPort"]) == 9000 == port_number(server, "api")
    assert services[host]["spec"]["selector"].items() <= (
        minio["spec"]["template"]["metadata"]["labels"].items()
    )
    # MinIO's root user and password are the keys Tally's pods read as the store's credentials
    refs = secret_refs(container)
    credentials = {
        "MINIO_ROOT_USER": refs[store.access_key_id_env],
        "MINIO_ROOT_PASSWORD": refs[store.secret_access_key_env],
    }
    assert {k: v for k, v in secret_refs(server).items() if k in credentials} == credentials
    # the Job makes the bucket segments_url names on that endpoint, with the same credentials
    job = named(objects, "Job", "minio-bucket")
    (mc,) = pod_spec(job)["containers"]
    script = " ".join(mc["args"])
    assert f"mc alias set objects {store.endpoint_url} " in script
    bucket = urlsplit(config.ledger.segments_url).netloc
    assert script.endswith(f"mc mb --ignore-existing objects/{bucket}")
    assert secret_refs(mc) == credentials
    assert pod_spec(job)["restartPolicy"] == "OnFailure", "retried until MinIO answers"


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


def documented_secrets(kustomization: str) -> dict[str, set[str]]:
    """The Secrets an overlay's kustomization tells the operator to create, with their keys:
    `kubectl … create secret generic NAME --from-literal=KEY=… …` in its comments."""
    commands = re.split(r"create secret generic ", kustomization)[1:]
    return {
        command.split()[0]: set(re.findall(r"--from-literal=([a-z0-9-]+)=", command))
        for command in commands
    }


def test_documented_secrets_are_read_per_secret() -> None:
    text = """#   kubectl create secret generic one \\
    #     --from-literal=a=… --from-literal=b=…
    #   kubectl create secret generic two --from-literal=c=…"""
    assert documented_secrets(text) == {"one": {"a", "b"}, "two": {"c"}}


def test_every_secret_the_config_names_reaches_the_pod(
    overlay: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    name, objects = overlay
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    documented = documented_secrets(
        (KUSTOMIZE / "overlays" / name / "kustomization.yaml").read_text()
    )
    stores = 0
    for template in pod_templates(objects):
        for container in pod_spec(template)["containers"]:
            where = f"{template['metadata']['name']}/{container['name']}"
            refs = secret_refs(container)
            for ref in refs.values():
                if ref["name"] in secrets:  # rendered: the key is in it, unless optional
                    assert ref["key"] in secrets[ref["name"]]["data"] or ref.get("optional"), ref
                else:  # created beside the overlay: its kustomization says how, with each key
                    assert ref["key"] in documented.get(ref["name"], set()), (name, ref)
            if container["image"].split(":")[0] != "tally":
                continue
            command, config = container_command(objects, template, container, tmp_path)
            wanted = secret_variables(config, command)
            for variable in wanted:
                assert variable in refs, f"{where}: {variable}"
                # only the Kafka password may be left out (the base's Kafka needs none)
                optional = refs[variable].get("optional", False)
                assert not optional or variable == "TALLY_KAFKA_PASSWORD", variable
            # and no pod gets a secret its configuration does not name (alert delivery, which
            # reads no ledger, no S3 key), but the optional Kafka password an overlay may use
            extra = {v for v, ref in refs.items() if v not in wanted and not ref.get("optional")}
            assert not extra, f"{where}: {extra}"
            store = config.ledger.object_store
            stores += store.secret_access_key_env in wanted
    assert stores == len(STORE_USERS), "the worker, the dashboard and the admin-apply Job"
