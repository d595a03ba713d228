"""The `identity:` section: Slurm accounts and Kubernetes pods to teams; a bad one is refused with
the field and the problem."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from collectors.k8s_identity import PodRules
from collectors.ownership import user_name_from_passwd
from ledger.events import Owner
from tally.components import kubelet_pods, owner_resolver
from tally.config import ConfigError, parse_config
from tests.builders import a_config_dict

IDENTITY: dict[str, Any] = {
    "slurm_accounts": {
        "ml-research": {"team": "vision", "project": "detection"},
        "nlp": {"team": "language"},
    },
    "scontrol": "/opt/slurm/bin/scontrol",
    "kubernetes": {
        "namespaces": {"cv": "vision", "cv-seg": {"team": "vision", "project": "segmentation"}},
        "team_labels": ["team", "kueue.x-k8s.io/queue-name"],
        "project_labels": ["example.com/project"],
        "kubelet_url": "http://{node}:10255/pods",
    },
}


def test_identity_section() -> None:
    identity = parse_config(a_config_dict(identity=IDENTITY)).identity
    assert identity.account_owners() == {
        "ml-research": ("vision", "detection"),
        "nlp": ("language", None),
    }
    assert identity.scontrol == ("/opt/slurm/bin/scontrol",)
    assert identity.kubernetes.rules() == PodRules(
        {"cv": ("vision", None), "cv-seg": ("vision", "segmentation")},
        ("team", "kueue.x-k8s.io/queue-name"),
        ("example.com/project",),
    )
    assert identity.kubernetes.kubelet_url_for("gpu-07") == "http://gpu-07:10255/pods"


def test_identity_defaults() -> None:
    identity = parse_config(a_config_dict()).identity
    assert identity.account_owners() == {}
    assert identity.scontrol == ("scontrol",)
    assert identity.kubernetes.rules() == PodRules()
    assert identity.kubernetes.kubelet_url_for("gpu-07") is None


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        pytest.param(
            {"slurm_accounts": {"ml": {"team": "physics"}}},
            "identity.slurm_accounts.ml: unknown team 'physics'",
            id="unknown-team",
        ),
        pytest.param(
            {"slurm_accounts": {"ml": {"team": "language", "project": "detection"}}},
            "identity.slurm_accounts.ml: team 'language' has no project 'detection' "
            "(its projects: pretraining)",
            id="project-of-another-team",
        ),
        pytest.param(
            {"kubernetes": {"namespaces": {"cv": "physics"}}},
            "identity.kubernetes.namespaces.cv: unknown team 'physics'",
            id="namespace-unknown-team",
        ),
        pytest.param(
            {"kubernetes": {"namespaces": {"CV_Team": "vision"}}},
            "identity.kubernetes.namespaces: 'CV_Team' is not a namespace name",
            id="bad-namespace",
        ),
        pytest.param(
            {"kubernetes": {"team_labels": ["team name"]}},
            "identity.kubernetes.team_labels[0]: 'team name' is not a Kubernetes label key",
            id="bad-label-key",
        ),
        pytest.param(
            {"kubernetes": {"kubelet_url": "ftp://node:10255/pods"}},
            "identity.kubernetes.kubelet_url: kubelet_url must start with http:// or https://",
            id="bad-kubelet-url",
        ),
        pytest.param(
            {"kubernetes": {"kubelet_timeout_s": 0}},
            "identity.kubernetes.kubelet_timeout_s: Input should be greater than 0",
            id="zero-timeout",
        ),
        pytest.param(
            {"slurm_accounts": {"ml": "vision"}},
            "identity.slurm_accounts.ml: Input should be a valid dictionary",
            id="account-not-a-mapping",
        ),
        pytest.param(
            {"scontrol": []},
            "identity.scontrol: Tuple should have at least 1 item",
            id="no-scontrol",
        ),
        pytest.param({"sacct": "x"}, "identity.sacct: Extra inputs are not permitted", id="extra"),
    ],
)
def test_invalid_identity(identity: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(a_config_dict(identity=identity), "tally.yaml")
    assert message in str(raised.value)


def _wait_exec(pid: int, argv0: bytes) -> None:
    deadline = time.monotonic() + 10
    cmdline = Path(f"/proc/{pid}/cmdline")
    while not cmdline.read_bytes().startswith(argv0):
        assert time.monotonic() < deadline, f"{pid} never ran {argv0!r}"
        time.sleep(0.005)


def test_the_collector_wiring_reads_a_real_process() -> None:
    """`tally collect`'s resolver on this host's /proc: a Slurm job's account from its env."""
    config = parse_config(a_config_dict(identity=IDENTITY))
    assert kubelet_pods(parse_config(a_config_dict()), "gpu-07") is None
    pods = kubelet_pods(config, "gpu-07")
    assert pods is not None
    assert pods.url == "http://gpu-07:10255/pods"
    pods.close()
    resolver = owner_resolver(config, None)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", "SLURM_JOB_ACCOUNT": "nlp"}
    with subprocess.Popen(["sleep", "30"], env=env) as job:
        try:
            _wait_exec(job.pid, b"sleep")  # before exec, the child's environ is still ours
            owner = resolver(job.pid, "GPU-0")
        finally:
            job.kill()
    assert owner == Owner(
        team="language", user=user_name_from_passwd(os.getuid()), job_id="slurm:77"
    )
