"""Kubernetes pods: namespace and labels → team and project, and one job id
(`k8s:<namespace>/<pod>`) for a pod whether dcgm-exporter named it or NVML saw its processes,
through a real HTTP kubelet on loopback serving a real-shaped `PodList`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collectors.dcgm import DcgmCollector
from collectors.dcgm_fields import owner_from_labels
from collectors.dcgm_http import DcgmConfig
from collectors.fake_nvml import FakeGpu, FakeNvml, FakeProcess
from collectors.k8s_identity import Pod, PodRules, parse_pod_list, pod_owner
from collectors.kubelet import KubeletPods
from collectors.nvml import NvmlCollector
from collectors.ownership import OwnerResolver
from ledger.events import Owner
from tests.conftest import REPO

PODS_JSON = (REPO / "tests/fixtures/kubelet/pods.json").read_bytes()
DCGM_PODS = (REPO / "tests/fixtures/dcgm/h100_8gpu_pods.txt").read_text()
RULES = PodRules(
    namespaces={"vision": ("vision", None), "research": ("vision", "detection")},
    team_labels=("team", "kueue.x-k8s.io/queue-name"),
    project_labels=("project",),
)
LLM_UID = "5f1c2a3b-8d4e-4f6a-9b7c-0d1e2f3a4b5c"
VISION_UID = "1234abcd-5678-4def-9abc-0123456789ab"
SHARED_UID = "a7b8c9d0-e1f2-4a3b-8c4d-5e6f7a8b9c0d"
SYSTEM_UID = "0f9e8d7c-6b5a-4938-a271-605f4e3d2c1b"
GPU = "GPU-4a0f5c1e-7d3b-2f9a-8c61-0b9e3d7a1c01"
CTR = "c0ffee00" * 8
PLUGIN = "nvidia-device-plugin-daemonset-x7k2p"
DETECTOR = "k8s:vision/detector-7c9f8b6d54-xk2lp"


# ---------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize(
    ("namespace", "labels", "owner"),
    [
        pytest.param(
            "research",
            {"team": "language", "project": "segmentation"},
            Owner(team="vision", project="detection", job_id="k8s:research/p"),
            id="namespace-map-wins-over-labels",
        ),
        pytest.param(
            "vision",
            {"team": "language", "project": "segmentation"},
            Owner(team="vision", project="segmentation", job_id="k8s:vision/p"),
            id="namespace-team-label-project",
        ),
        pytest.param(
            "shared",
            {"team": "language", "project": "pretraining"},
            Owner(team="language", project="pretraining", job_id="k8s:shared/p"),
            id="labels-in-unmapped-namespace",
        ),
        pytest.param(
            "shared",
            {"kueue.x-k8s.io/queue-name": "vision", "team": "language"},
            Owner(team="language", job_id="k8s:shared/p"),
            id="first-team-label-wins",
        ),
        pytest.param(
            "shared",
            {"kueue.x-k8s.io/queue-name": "vision", "team": ""},
            Owner(team="vision", job_id="k8s:shared/p"),
            id="empty-label-skipped",
        ),
        pytest.param(
            "shared",
            {"team": "x" * 257},
            Owner(team="shared", job_id="k8s:shared/p"),
            id="overlong-label-skipped",
        ),
        pytest.param("shared", {}, Owner(team="shared", job_id="k8s:shared/p"), id="namespace"),
        pytest.param("", {"team": "language"}, Owner(team="language", job_id="k8s:p"), id="no-ns"),
    ],
)
def test_pod_owner(namespace: str, labels: dict[str, str], owner: Owner) -> None:
    assert pod_owner(namespace, "p", labels, RULES) == owner


def test_parse_pod_list() -> None:
    pods = parse_pod_list(PODS_JSON)
    assert [(p.namespace, p.name, p.phase) for p in pods] == [
        ("llm", "pretrain-70b-worker-0", "Running"),
        ("vision", "detector-7c9f8b6d54-xk2lp", "Running"),
        ("shared", "notebook-ada", "Running"),
        ("kube-system", "nvidia-device-plugin-daemonset-x7k2p", "Running"),
        ("llm", "eval-sweep-3-pending", "Pending"),
    ]
    assert pods[2] == Pod(
        SHARED_UID,
        "shared",
        "notebook-ada",
        {
            "app.kubernetes.io/name": "jupyter",
            "kueue.x-k8s.io/queue-name": "vision",
            "project": "detection",
        },
        "Running",
    )


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"kind":"Status","status":"Failure","code":401}', id="status"),
        pytest.param(b"<html>", id="not-json"),
        pytest.param(b'{"kind":"PodList","items":{}}', id="items-not-list"),
    ],
)
def test_parse_pod_list_refuses(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_pod_list(body)


# ---------------------------------------------------------------------------- a real kubelet


class Kubelet:
    """A loopback HTTP server answering `GET /pods` as the kubelet's read-only port does."""

    def __init__(self) -> None:
        self.body = PODS_JSON
        self.status = 200
        self.requests = 0
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                kubelet.requests += 1
                code = kubelet.status if self.path == "/pods" else 404
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(kubelet.body)))
                self.end_headers()
                self.wfile.write(kubelet.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pods"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    server = Kubelet()
    yield server
    server.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pod_proc(root: Path, pid: int, uid: str) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "environ").write_bytes(b"PATH=/usr/bin\0HOME=/root\0")
    (base / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{CTR}.scope\n"
    )
    (base / "status").write_text("Name:\tpython\nUid:\t0\t0\t0\t0\n")


def _resolver(root: Path, pods: KubeletPods) -> OwnerResolver:
    def by_uid(uid: str) -> Owner | None:
        pod = pods.by_uid(uid)
        return pod_owner(pod.namespace, pod.name, pod.labels, RULES) if pod else None

    return OwnerResolver(root, user_name=lambda _uid: "root", pods=by_uid)


@pytest.mark.parametrize(
    ("uid", "owner"),
    [
        pytest.param(
            LLM_UID,
            Owner("language", "pretraining", "root", "k8s:llm/pretrain-70b-worker-0"),
            id="labels",
        ),
        pytest.param(
            VISION_UID,
            Owner("vision", "segmentation", "root", DETECTOR),
            id="namespace-map",
        ),
        pytest.param(
            SHARED_UID, Owner("vision", "detection", "root", "k8s:shared/notebook-ada"), id="kueue"
        ),
        pytest.param(
            SYSTEM_UID,
            Owner(
                "kube-system", None, "root", "k8s:kube-system/nvidia-device-plugin-daemonset-x7k2p"
            ),
            id="namespace-name",
        ),
        pytest.param(
            "deadbeef-0000-4000-8000-000000000000",
            Owner(None, None, "root", "k8s-pod:deadbeef-0000-4000-8000-000000000000"),
            id="unknown-pod-stays-uid",
        ),
    ],
)
def test_nvml_pod_uid_through_the_kubelet(
    tmp_path: Path, kubelet: Kubelet, uid: str, owner: Owner
) -> None:
    _pod_proc(tmp_path, 42, uid)
    with KubeletPods(kubelet.url, timeout_s=2.0) as pods:
        assert _resolver(tmp_path, pods)(42, GPU) == owner


def test_one_pod_identity_across_dcgm_and_nvml(tmp_path: Path, kubelet: Kubelet) -> None:
    """The same pod through both collectors: dcgm-exporter's rows name it, NVML's process
    (pid 42 on the fake NVML, its /proc under tmp_path) names its uid."""
    _pod_proc(tmp_path, 42, LLM_UID)
    fake = FakeNvml([FakeGpu(GPU, util_gpu=80, processes=[FakeProcess(42)])])
    with (
        KubeletPods(kubelet.url) as pods,
        DcgmCollector(DcgmConfig(url="http://dcgm.invalid/metrics", pod_rules=RULES)) as dcgm,
    ):
        result = dcgm.ingest(DCGM_PODS, 1_700_000_000_000_000, pods.index().by_name)
        resolver = _resolver(tmp_path, pods)
        nvml = NvmlCollector(fake, "dgx-h100-03", "h100", owner_resolver=resolver)  # type: ignore[arg-type]
        (sample,) = nvml.collect_round().samples
    by_gpu = {e.data.gpu_index: e.data.owner for e in result.envelopes}  # type: ignore[union-attr]
    assert by_gpu[0] == Owner("language", "pretraining", None, "k8s:llm/pretrain-70b-worker-0")
    assert [p.owner for p in sample.processes] == [
        Owner("language", "pretraining", "root", "k8s:llm/pretrain-70b-worker-0")
    ]
    assert by_gpu[4] == Owner("vision", "segmentation", None, DETECTOR)
    assert by_gpu[7] is None


def test_dcgm_row_without_a_kubelet_uses_namespace_rules() -> None:
    labels = {"namespace": "research", "pod": "trainer-0", "container": "main"}
    assert owner_from_labels(labels, RULES) == Owner(
        "vision", "detection", None, "k8s:research/trainer-0"
    )
    assert owner_from_labels({**labels, "namespace": "llm"}, RULES) == Owner(
        "llm", None, None, "k8s:llm/trainer-0"
    )


def test_kubelet_cache_refresh_and_new_pods(kubelet: Kubelet) -> None:
    clock = Clock()
    pods = KubeletPods(kubelet.url, refresh_s=30.0, miss_refresh_s=5.0, clock=clock)
    assert pods.by_uid(LLM_UID) is not None
    assert pods.by_uid(LLM_UID) is not None
    assert kubelet.requests == 1  # cached
    kubelet.body = PODS_JSON.replace(b"notebook-ada", b"notebook-bob").replace(
        SHARED_UID.encode(), b"b0b0b0b0-e1f2-4a3b-8c4d-5e6f7a8b9c0d"
    )
    assert pods.by_uid("b0b0b0b0-e1f2-4a3b-8c4d-5e6f7a8b9c0d") is None  # read 0 s ago
    assert kubelet.requests == 1
    clock.now += 5.0
    new = pods.by_uid("b0b0b0b0-e1f2-4a3b-8c4d-5e6f7a8b9c0d")
    assert new is not None
    assert (new.namespace, new.name) == ("shared", "notebook-bob")
    assert kubelet.requests == 2
    clock.now += 30.0
    assert pods.index().by_uid.get(SHARED_UID) is None
    assert kubelet.requests == 3
    pods.close()


@pytest.mark.parametrize(
    ("status", "body", "logged"),
    [
        pytest.param(500, b"boom", "HTTP 500", id="server-error"),
        pytest.param(200, b'{"kind":"Status","code":401}', "not a v1 PodList", id="not-podlist"),
    ],
)
def test_a_failing_kubelet_keeps_the_pods_read_before(
    kubelet: Kubelet, caplog: pytest.LogCaptureFixture, status: int, body: bytes, logged: str
) -> None:
    clock = Clock()
    pods = KubeletPods(kubelet.url, refresh_s=30.0, miss_refresh_s=5.0, clock=clock)
    assert pods.by_uid(LLM_UID) is not None
    kubelet.status, kubelet.body = status, body
    clock.now += 30.0
    with caplog.at_level(logging.WARNING, "tally.collector.kubelet"):
        assert pods.by_uid(LLM_UID) is not None  # re-read failed: the last pods stay
        clock.now += 6.0
        assert pods.by_uid("deadbeef-0000-4000-8000-000000000000") is None
    assert kubelet.requests == 2  # no re-read on a miss right after a failure
    assert [r.getMessage() for r in caplog.records] == [
        f"kubelet {kubelet.url}: {logged}; pods stay as last read"
    ]
    pods.close()


def test_an_unreachable_kubelet_leaves_the_pod_uid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = Kubelet()
    url = server.url
    server.close()  # nothing listens there any more
    _pod_proc(tmp_path, 42, LLM_UID)
    with (
        caplog.at_level(logging.WARNING, "tally.collector.kubelet"),
        KubeletPods(url, timeout_s=1.0) as pods,
    ):
        owner = _resolver(tmp_path, pods)(42, GPU)
    assert owner == Owner(None, None, "root", f"k8s-pod:{LLM_UID}")
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith(f"kubelet {url}: ")
