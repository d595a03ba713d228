"""The `inventory:` section of the configuration: how often collectors report each node's GPUs,
when a silent GPU counts as stale, and the labels this host's collector attaches to its nodes
(see `ledger.inventory`, `collectors.inventory`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from ledger.invalid import Invalid
from tally.config_fields import Name, Strict


class InventoryConfig(Strict):
    """`stale_after_intervals`: a GPU no report has named for more than this many sampling
    intervals is stale and gets no new placements; `report_every_rounds`: a collector reports
    each node at least this often (besides at start and on every change), at most half the
    stale window so one late report never makes a GPU stale; `labels`: this collector's node
    labels (`tally collect --label key=value` adds to them); `pool`: the pool of this host's
    GPUs for NVML and dcgm-exporter (`tally collect --pool` wins; the simulated fleet's GPUs
    are in their configured pools); `gpu_labels`: labels of single GPUs, by GPU index or UUID,
    over the node's — for topology (`topology.nvlink_domain`, `topology.numa_node`,
    `topology.rail`, `topology.rack`; `ledger.topology`)."""

    stale_after_intervals: int = Field(6, ge=2, le=100_000)
    report_every_rounds: int = Field(2, ge=1, le=50_000)
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_labels: dict[str, dict[str, str]] = Field(default_factory=dict)
    pool: Name = "default"

    @model_validator(mode="after")
    def _reports_within_the_window(self) -> InventoryConfig:
        if 2 * self.report_every_rounds > self.stale_after_intervals:
            raise Invalid(
                "report_every_rounds must be at most half of stale_after_intervals, or a GPU "
                "goes stale between two reports"
            )
        for key, value in self.labels.items():
            if not key or len(key) > 256 or len(value) > 256:
                raise Invalid("labels: {key!r}: keys and values of 1–256 characters", key=key[:64])
        if len(self.labels) > 64:
            raise Invalid("labels: at most 64")
        for gpu, labels in self.gpu_labels.items():
            if not gpu or len(gpu) > 256 or len(labels) > 64:
                raise Invalid("gpu_labels: {gpu!r}: a GPU index or UUID, 64 labels", gpu=gpu[:64])
            if any(not k or len(k) > 256 or len(v) > 256 for k, v in labels.items()):
                raise Invalid(
                    "gpu_labels: {gpu!r}: keys and values of 1–256 characters", gpu=gpu[:64]
                )
        return self
