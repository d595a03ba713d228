#!/usr/bin/env bash
# Device check for the NVML collector, on a machine with an NVIDIA GPU and driver.
#   1. the NVML contract suite against the real pynvml (the fake runs beside it);
#   2. two rounds of NvmlCollector one second apart; the second printed as JSON.
# Needs: python with pytest, nvidia-ml-py and orjson (the repo's .venv when present).
# --noconftest keeps the broker fixtures (and their dependencies) out of it.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
status=0

echo "== nvidia-smi"
nvidia-smi -L || echo "(nvidia-smi not available)"

echo "== contract suite (real pynvml must not be skipped)"
report="$("$PY" -m pytest tests/contract/test_nvml_contract.py --noconftest -p no:cacheprovider \
  -q -rs 2>&1)" || status=1
echo "$report"
if grep -q "no NVIDIA driver" <<<"$report"; then
  echo "FAIL: the real backend was skipped (nvmlInit failed)"; status=1
fi

echo "== one NvmlCollector round"
"$PY" - <<'PY' || status=1
import json
import socket
import time

import pynvml

from collectors.nvml import NvmlCollector
from collectors.ownership import OwnerResolver
from ledger.events import sample_to_dict

collector = NvmlCollector(
    pynvml, socket.gethostname(), "device-check", interval_s=1, owner_resolver=OwnerResolver()
)
with collector:
    first = collector.collect_round()
    time.sleep(1)
    started = time.process_time()
    second = collector.collect_round()
    cpu_ms = (time.process_time() - started) * 1000
print(
    json.dumps(
        {
            "source": collector.source,
            "gpus": collector.gpu_count,
            "round_cpu_ms": round(cpu_ms, 3),
            "problems": list(first.problems + second.problems),
            "health": [
                {"gpu": h.gpu_uuid, "kind": h.kind.value, "detail": h.detail, "xid": h.xid}
                for h in first.health + second.health
            ],
            "samples": [sample_to_dict(s) for s in second.samples],
        },
        indent=2,
    )
)
PY
exit $status
