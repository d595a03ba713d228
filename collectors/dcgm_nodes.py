"""What a dcgm-exporter payload says about each node besides its GPUs: the exporter's labels
common to all of the node's rows, and the driver version (`DCGM_FI_DRIVER_VERSION`), for the
node's inventory report (`collectors.inventory.NodeFacts`). Pure.

A label is the node's when every row of the node carries it with one value and it is not one
the exporter sets per GPU, per MIG instance or per workload (UUID, index, model, PCI bus, MIG
ids, pod, namespace, container, HPC job, …): what is left are the labels an operator added
(`--kubernetes-gpu-id-type`, relabelling, a DaemonSet's extra labels: cluster, zone, rack).
At most `MAX_NODE_LABELS` are kept (by key), each key and value at most 256 characters.
"""

from __future__ import annotations

from collections.abc import Mapping

from collectors.inventory import NodeFacts

DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
NOT_NODE_LABELS = frozenset(
    {
        "gpu", "UUID", "uuid", "device", "modelName", "Hostname", "hostname", "pci_bus_id",
        DRIVER_LABEL, "GPU_I_PROFILE", "GPU_I_ID", "pod", "namespace", "container", "pod_uid",
        "pod_name", "pod_namespace", "container_name", "hpc_job", "err_code", "err_msg",
        "__name__", "instance", "job",
    }
)  # fmt: skip
MAX_NODE_LABELS = 64
MAX_TEXT = 256


class NodeLabelLog:
    """Collects the rows' labels per node as a payload is read; `facts()` at the end."""

    def __init__(self) -> None:
        self._common: dict[str, dict[str, str]] = {}
        self._driver: dict[str, str] = {}

    def add(self, node: str, labels: Mapping[str, str]) -> None:
        driver = labels.get(DRIVER_LABEL)
        if driver and len(driver) <= MAX_TEXT:
            self._driver.setdefault(node, driver)
        own = {
            k: v
            for k, v in labels.items()
            if k not in NOT_NODE_LABELS and len(k) <= MAX_TEXT and len(v) <= MAX_TEXT
        }
        common = self._common.get(node)
        if common is None:
            self._common[node] = own
        else:
            self._common[node] = {k: v for k, v in common.items() if own.get(k) == v}

    def facts(self) -> dict[str, NodeFacts]:
        return {
            node: NodeFacts(tuple(sorted(labels.items()))[:MAX_NODE_LABELS], self._driver.get(node))
            for node, labels in self._common.items()
        }
