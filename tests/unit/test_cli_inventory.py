"""`tally inventory list` over a real sealed ledger, the `inventory:` configuration section and
`tally collect --label`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import orjson
import pytest
from click.testing import CliRunner

from ledger.ingest import ConsumedMessage, Ingestor
from ledger.inventory import encode_report
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.topology import GpuTopology
from tally.cli import cli
from tally.config import ConfigError, parse_config
from tests.builders import T0_US, a_config_dict
from tests.conftest import write_config
from tests.inventory_builders import a_gpu, a_mig_slice, a_report
from tests.unit.test_dcgm_scrape import Exporter, _serve


@pytest.fixture
def ledger(tmp_path):
    """A sealed ledger whose inventory has a live node (h100) and a long silent one (a100)."""
    data = tmp_path / "ledger"
    now = time.time_ns() // 1000
    reports = [
        a_report(
            "node-01",
            a_gpu("GPU-0", topology=GpuTopology(nvlink_domain="node-01/nvlink0", numa_node=1)),
            a_gpu("GPU-1", 1, mig_mode=True, mig=(a_mig_slice(),)),
        ),
        a_report("node-02", a_gpu("GPU-9", model="A100"), at_us=T0_US, pool="a100", labels=()),
    ]
    reports[0] = replace(reports[0], time_us=now)
    with DuckDBStore(data) as store:
        ingest = Ingestor(store, "cluster-a", PriceBook((Price("*", 1),)), {})
        ingest.apply(
            [
                ConsumedMessage("tally.inventory-reports", 0, i, encode_report(r))
                for i, r in enumerate(reports)
            ]
        )
        store.seal()
    config = write_config(tmp_path / "tally.yaml", a_config_dict(ledger={"data_dir": str(data)}))
    return config


def invoke(*args: str):
    return CliRunner().invoke(cli, ["inventory", "list", *args])


def test_the_inventory_is_listed_with_each_gpus_status(ledger):
    result = invoke("--config", str(ledger), "-o", "json")
    assert result.exit_code == 0, result.output
    rows = orjson.loads(result.output)
    assert [(r["node"], r["uuid"], r["status"]) for r in rows] == [
        ("node-01", "GPU-0", "live"),
        ("node-01", "GPU-1", "live"),
        ("node-02", "GPU-9", "stale"),
    ]
    assert rows[1]["mig"] == ["3g.40gb"] and rows[0]["labels"] == {"rack": "r1"}
    assert rows[0]["memory_mib"] == 80 * 1024 and rows[0]["health"] == "healthy"
    assert rows[0]["topology"] == {"nvlink_domain": "node-01/nvlink0", "numa_node": 1}
    assert rows[1]["topology"] == {}  # nothing known

    csv = invoke("--config", str(ledger), "-o", "csv", "--pool", "a100")
    assert csv.exit_code == 0 and csv.output.splitlines()[0].startswith("node,index,uuid,pool")
    assert [line.split(",")[2] for line in csv.output.splitlines()[1:]] == ["GPU-9"]
    everything = invoke("--config", str(ledger), "-o", "csv").output
    assert '"nvlink_domain=node-01/nvlink0,numa_node=1"' in everything.splitlines()[1]
    table = invoke("--config", str(ledger))
    assert table.exit_code == 0 and "NODE" in table.output and "stale" in table.output
    assert (
        "no GPUs reported in pool nope" in invoke("--config", str(ledger), "--pool", "nope").output
    )


def test_no_ledger_is_exit_4(tmp_path):
    result = invoke("--data-dir", str(tmp_path / "nowhere"))
    assert result.exit_code == 4 and "no ledger" in result.output


@pytest.mark.parametrize(
    ("section", "error"),
    [
        pytest.param(
            {"report_every_rounds": 4, "stale_after_intervals": 6}, "half", id="reports-too-rare"
        ),
        pytest.param({"stale_after_intervals": 1}, "stale_after_intervals", id="window-too-small"),
        pytest.param({"labels": {"": "x"}}, "labels", id="an-empty-label-key"),
        pytest.param({"gpu_labels": {"0": {"": "x"}}}, "gpu_labels", id="an-empty-gpu-label-key"),
        pytest.param({"gpu_labels": {"": {"a": "x"}}}, "gpu_labels", id="a-gpu-without-a-name"),
    ],
)
def test_the_inventory_section_is_checked(section, error):
    with pytest.raises(ConfigError, match=error):
        parse_config(a_config_dict(inventory=section), "tally.yaml")


def test_a_label_that_is_not_key_value_is_refused(tmp_path):
    path = write_config(tmp_path / "tally.yaml", a_config_dict())
    result = CliRunner().invoke(
        cli, ["collect", "--config", str(path), "--source", "sim", "--label", "rack", "--once"]
    )
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


@pytest.fixture
def dcgm() -> Iterator[Exporter]:
    """A real `/metrics` endpoint serving a dcgm-exporter payload."""
    yield from _serve(Exporter())


def test_the_pool_comes_from_the_option_else_the_config(tmp_path, dcgm):
    path = write_config(tmp_path / "tally.yaml", a_config_dict(inventory={"pool": "rack-7"}))
    pools = []
    for extra in ((), ("--pool", "spot")):
        result = CliRunner().invoke(
            cli,
            ["collect", "--config", str(path), "--source", "dcgm", "--url", dcgm.url, "--once"]
            + list(extra),
        )
        assert result.exit_code == 0, result.output
        pools.append({e["data"]["pool"] for e in orjson.loads(result.stdout)})
    assert pools == [{"rack-7"}, {"spot"}]


def cordon(*args: str):
    return CliRunner().invoke(cli, ["inventory", *args])


def test_cordon_and_uncordon_check_their_target_before_sending(ledger):
    dry = cordon("cordon", "node-01", "--config", str(ledger), "--reason", "fan", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "gpu_cordoned" in dry.output and "cordon node-01: fan" in dry.output
    gpu = cordon("uncordon", "GPU-0", "--config", str(ledger), "--reason", "ok", "--dry-run")
    assert gpu.exit_code == 0 and "GPU-0 is not cordoned" in gpu.output
    unknown = cordon("cordon", "node-77", "--config", str(ledger), "--reason", "x")
    assert unknown.exit_code == 2 and "no GPU or node 'node-77'" in unknown.output
    missing = cordon("cordon", "node-01", "--config", str(ledger))
    assert missing.exit_code == 2 and "--reason" in missing.output


def test_cordon_without_a_ledger_is_exit_4(tmp_path):
    result = cordon("cordon", "node-01", "--data-dir", str(tmp_path / "nowhere"), "--reason", "x")
    assert result.exit_code == 4 and "no ledger" in result.output
