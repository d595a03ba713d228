"""Collector health beyond XIDs: NVML (`collectors.nvml_health`, through the collector over the
fake NVML: ECC double-bit errors, pages pending retirement, thermal and power slowdowns) and
dcgm-exporter's ECC and retired-page families (`collectors.dcgm_health`) — one event on each
rising edge, none while a condition lasts, none where the GPU cannot answer."""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from collectors.dcgm_parse import parse_metrics
from collectors.fake_nvml import FakeGpu, FakeNvml, gpu_uuid
from ledger.events import HealthKind
from tests.unit.test_dcgm_parser import INTERVAL_US, T_US
from tests.unit.test_nvml_collector import collector

Change = Callable[[FakeGpu], None]


def dbe(n: int) -> Change:
    def set_(g: FakeGpu) -> None:
        g.ecc_dbe = n

    return set_


def pending(on: bool) -> Change:
    def set_(g: FakeGpu) -> None:
        g.retired_pending = on

    return set_


def reasons(bits: int) -> Change:
    def set_(g: FakeGpu) -> None:
        g.clock_reasons = bits

    return set_


THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
POWER = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
CAP = pynvml.nvmlClocksEventReasonSwPowerCap

CASES: dict[str, tuple[list[Change], list[list[HealthKind]]]] = {
    "a-rising-dbe-count-once-per-rise": (
        [dbe(0), dbe(2), dbe(2), dbe(3)],
        [[], [HealthKind.ECC_DBE], [], [HealthKind.ECC_DBE]],
    ),
    "dbe-errors-already-there-at-the-first-read": ([dbe(1), dbe(1)], [[HealthKind.ECC_DBE], []]),
    "pages-pending-retirement-on-the-edge": (
        [pending(False), pending(True), pending(True), pending(False), pending(True)],
        [[], [HealthKind.RETIRED_PAGES], [], [], [HealthKind.RETIRED_PAGES]],
    ),
    "thermal-and-power-slowdowns-on-their-edges": (
        [reasons(0), reasons(THERMAL), reasons(THERMAL | POWER), reasons(0)],
        [[], [HealthKind.THERMAL_THROTTLE], [HealthKind.POWER_THROTTLE], []],
    ),
    "the-sw-power-cap-is-no-fault": ([reasons(CAP), reasons(CAP)], [[], []]),
}


@pytest.mark.parametrize(("changes", "expected"), CASES.values(), ids=CASES.keys())
def test_health_events_on_rising_edges(
    changes: list[Change], expected: list[list[HealthKind]]
) -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0))])
    c = collector(fake)
    seen = []
    for change in changes:
        change(fake.gpus[0])
        result = c.collect_round()
        seen.append([h.kind for h in result.health])
        assert all(h.gpu_uuid == gpu_uuid(0) and h.node == "node-1" for h in result.health)
        fake.tick(10)
    assert seen == expected


def test_a_gpu_without_ecc_or_retirement_is_asked_once_and_reports_nothing() -> None:
    unsupported = {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRetiredPagesPendingStatus"}
    fake = FakeNvml(
        [FakeGpu(gpu_uuid(0), ecc_dbe=5, retired_pending=True, unsupported=unsupported)]
    )
    c = collector(fake)
    first = c.collect_round()
    fake.tick(10)
    second = c.collect_round()
    assert first.health == second.health == ()
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 1
    assert any("ECC errors" in p for p in first.problems)


ECC_ROWS = """\
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-e",modelName="NVIDIA H100",Hostname="n1"}} 10
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{gpu="0",UUID="GPU-e",modelName="NVIDIA H100",Hostname="n1"}} {dbe}
DCGM_FI_DEV_RETIRED_PENDING{{gpu="0",UUID="GPU-e",modelName="NVIDIA H100",Hostname="n1"}} {pend}
"""


@pytest.mark.parametrize(
    ("payloads", "kinds"),
    [
        pytest.param([(0, 0), (2, 0), (2, 0)], [[], ["ecc_dbe"], []], id="dbe-rise-once"),
        pytest.param([(1, 0)], [["ecc_dbe"]], id="dbe-at-the-first-payload"),
        pytest.param(
            [(0, 0), (0, 1), (0, 1), (0, 0), (0, 1)],
            [[], ["retired_pages"], [], [], ["retired_pages"]],
            id="pending-on-each-rising-edge",
        ),
    ],
)
def test_ecc_and_retired_page_families_raise_health_on_rising_edges(
    payloads: list[tuple[int, int]], kinds: list[list[str]]
) -> None:
    state: dict[str, tuple[int, int]] = {}
    seen = []
    for dbe, pending in payloads:
        result = parse_metrics(
            ECC_ROWS.format(dbe=dbe, pend=pending),
            host_default="h",
            pool="p",
            time_us=T_US,
            interval_us=INTERVAL_US,
            previous_health=state,
        )
        state = dict(result.health_state)
        seen.append([h.kind.value for h in result.health])
        assert all(h.gpu_uuid == "GPU-e" and h.node == "n1" for h in result.health)
    assert seen == kinds
