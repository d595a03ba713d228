"""MIG device names as events carry them: what the driver calls a MIG instance, its own UUID
(`nvmlDeviceGetUUID` on the MIG device's handle: `MIG-<UUID>` since driver R470, what
`nvidia-smi -L` lists; `MIG-GPU-<GPU UUID>/<gi>/<ci>` before), which `CUDA_VISIBLE_DEVICES`
names it by (`ledger.fractional.cuda_mig_device`). `mig_uuid` reads one off an event
(`MigInstance.uuid` in samples and inventory reports). Pure.
"""

from __future__ import annotations

from typing import Any

from ledger.errors import EventError

MIG_UUID_PREFIX = "MIG-"
MAX_MIG_UUID = 256


def mig_uuid(value: Any) -> str | None:
    """A MIG device's UUID as an event carries it (absent: None); raises EventError unless it
    is a `MIG-…` string of at most 256 characters."""
    if value is None:
        return None
    if type(value) is not str or not value.startswith(MIG_UUID_PREFIX) or len(value) > MAX_MIG_UUID:
        raise EventError("mig.uuid: expected a MIG device UUID (MIG-…)")
    return value
