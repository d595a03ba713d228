"""The directory-driven fake NVML (`collectors.fake_nvml_files`): processes other processes write
under `procs/<index or UUID>/<pid>`, listed only while alive, with their SM utilisation; XIDs
under `xids/`, each delivered once through the real collector's event path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pynvml
import pytest

from collectors.fake_nvml_files import GPUS_FILE, PROCS_DIR, XIDS_DIR, DirectoryNvml
from collectors.nvml import NvmlCollector

UUIDS = ("GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-aaaaaaaa-0001-4000-8000-000000000001")
DEAD = 4_000_000  # above any pid_max: never alive


class Clock:
    def __init__(self) -> None:
        self.now_us = 1_800_000_000_000_000

    def __call__(self) -> int:
        return self.now_us


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Clock, NvmlCollector]:
    (tmp_path / GPUS_FILE).write_text(json.dumps([{"uuid": u, "name": "A100"} for u in UUIDS]))
    clock = Clock()
    fake = DirectoryNvml(tmp_path, clock=clock, alive=lambda pid: pid != DEAD)
    return tmp_path, clock, NvmlCollector(fake, "n1", "a100", clock=clock, interval_s=1)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("device", ["1", UUIDS[1]], ids=["by-index", "by-uuid"])
def test_live_processes_are_listed_with_their_utilisation(node, device: str) -> None:
    root, clock, collector = node
    me = os.getpid()
    _write(root / PROCS_DIR / device / str(me), "60")
    _write(root / PROCS_DIR / device / str(DEAD), "90")  # gone: the driver lists it no more
    clock.now_us += 1_000_000
    first = {s.gpu_uuid: s for s in collector.collect_round().samples}
    assert [(p.pid, p.sm_util_pct) for p in first[UUIDS[1]].processes] == [(me, 60)]
    assert (first[UUIDS[0]].processes, first[UUIDS[0]].util_gpu_pct) == ((), 0)
    assert first[UUIDS[1]].util_gpu_pct == 60
    _write(root / PROCS_DIR / device / str(me), "0")  # idle now
    clock.now_us += 1_000_000
    second = {s.gpu_uuid: s for s in collector.collect_round().samples}
    assert [(p.pid, p.sm_util_pct) for p in second[UUIDS[1]].processes] == [(me, 0)]
    assert second[UUIDS[1]].util_gpu_pct == 0


def test_an_xid_file_is_one_event_delivered_once(node) -> None:
    root, clock, collector = node
    clock.now_us += 1_000_000
    assert collector.collect_round().health == ()  # the first round registers for events
    _write(root / XIDS_DIR / "a", "1 79")
    clock.now_us += 1_000_000
    health = collector.collect_round().health
    assert [(h.gpu_uuid, h.xid) for h in health] == [(UUIDS[1], 79)]
    assert not (root / XIDS_DIR / "a").exists()
    clock.now_us += 1_000_000
    assert collector.collect_round().health == ()


def test_errors_are_the_binding_s_own(node) -> None:
    _, _, collector = node
    fake = collector._nvml
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
