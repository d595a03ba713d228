"""A real single-node Slurm (Debian's 22.05 packages) for tests, started without systemd.

`SlurmCluster` writes slurm.conf and gres.conf into a directory of its own, makes fake GPUs,
and runs `slurmctld -D` and `slurmd -D` as child processes on free ports; `stop` cancels every
job, ends both daemons and any slurmstepd they left, and removes the state directories.

What this takes, learned on Debian 12 (slurm-wlm 22.05.8):
- `AuthType=auth/none` + `CredType=cred/none`: no munge daemon;
- fake GPUs in gres.conf must be character devices (`mknod nvidiaN c 1 3`, so root): with
  plain files Slurm gives the job an empty `CUDA_VISIBLE_DEVICES`;
- `SchedulerParameters=batch_sched_delay=0`, and more CPUs declared than the machine has
  (`SlurmdParameters=config_overrides`), so many small jobs start at once;
- no `AccountingStorageTRES=gres/gpu` without slurmdbd (it kills slurmctld), and no slurmdbd:
  `sacct` answers "Slurm accounting storage is disabled", the executor's fallback path;
- Slurm's sharding gres for GPU shares: `GresTypes=gpu,shard`, the node's `Gres=` with
  `shard:<GPUs × shards_per_gpu>`, and in gres.conf one `Name=shard Count=<shards_per_gpu>
  File=<device>` line per GPU, so each GPU holds its own shards;
- `KillWait=2`: scancel and requeue escalate SIGTERM to SIGKILL after 2 s, not 30;
- `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`: no cgroups needed.

The session fixture `slurm_cluster` is shared by every module that imports it (reference
counted: started once, stopped when the last user is done). It skips, with the reason, only
where Slurm's binaries are not installed or the tests do not run as root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
INSTALL_HINT = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client"
MARKER = "slurm: needs the real single-node Slurm started by the slurm_cluster fixture"


def register_marker(config: pytest.Config) -> None:
    if not any(line.startswith("slurm:") for line in config.getini("markers")):
        config.addinivalue_line("markers", MARKER)


def unavailable_reason() -> str | None:
    """Why the Slurm fixture cannot run here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)}): {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "the Slurm fixture runs slurmd and mknod as root; these tests are not root"
    return None


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class SlurmCluster:
    root: Path
    node: str = "tally-node"
    gpus: int = 16
    shards_per_gpu: int = 4  # Slurm's sharding gres: GPU shares ask for --gres=shard:n
    cpus: int = 64
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ports: tuple[int, int] = (0, 0)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / "log" / name
        if not path.exists():
            return f"({name}: no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------------ lifecycle

    def write_config(self) -> None:
        root = self.root
        for sub in ("state", "spool", "log", "dev"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus):
            device = root / "dev" / f"nvidia{i}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR, like /dev/null
        ctld_port, d_port = self.ports = tuple(free_ports(2))  # type: ignore[assignment]
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(
            f"""\
ClusterName=tally-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu,shard
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=2
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 Gres=gpu:{self.gpus},shard:{self.gpus * self.shards_per_gpu} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""  # noqa: E501
        )
        last = self.gpus - 1
        per_gpu = f"NodeName={self.node} Name=shard Count={self.shards_per_gpu}"
        shards = "".join(f"{per_gpu} File={root}/dev/nvidia{i}\n" for i in range(self.gpus))
        (root / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={root}/dev/nvidia[0-{last}]\n{shards}"
        )

    def start(self, timeout_s: float = 30.0) -> SlurmCluster:
        self.write_config()
        env = {**os.environ, **self.env}
        for argv in (
            ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)],
        ):
            out = (self.root / "log" / f"{argv[0]}.out").open("wb")
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env))
            out.close()
        try:
            self.wait_idle(timeout_s)
        except RuntimeError:
            self.stop()
            raise
        return self

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Until sinfo shows the node idle; RuntimeError (with the logs) if a daemon died."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(self._died(f"{proc.args[0]} exited {proc.returncode}"))
            state = self.run("sinfo", "--noheader", "--format=%T", check=False)
            last = state.stdout.strip()
            if last == "idle":
                return
            time.sleep(0.2)
        raise RuntimeError(self._died(f"node {self.node} {last}, not idle after {timeout_s:g} s"))

    def _died(self, what: str) -> str:
        tails = "\n".join(
            f"--- {name}\n{self.log_tail(name)}"
            for name in ("slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log")
        )
        jobs = self.run("squeue", "--states=all", check=False).stdout
        node = self.run("scontrol", "show", "node", self.node, check=False).stdout
        return f"Slurm test cluster: {what}\n--- squeue\n{jobs}\n--- node\n{node}\n{tails}"

    def job_ids(self) -> list[str]:
        out = self.run("squeue", "--noheader", "--format=%i", check=False).stdout
        return out.split()

    def cancel_all(self, timeout_s: float = 10.0) -> None:
        ids = self.job_ids()
        if ids:
            self.run("scancel", *ids, check=False)
        deadline = time.monotonic() + timeout_s
        while self.job_ids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        if any(p.poll() is None for p in self.procs):
            self.cancel_all()
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        for pid in stepds(self.conf):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for sub in ("state", "spool"):
            shutil.rmtree(self.root / sub, ignore_errors=True)


def stepds(conf: Path) -> list[int]:
    """slurmstepd processes of the cluster configured by `conf` (they outlive slurmd)."""
    found = []
    marker = f"SLURM_CONF={conf}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "cmdline").read_bytes().startswith(b"slurmstepd"):
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def processes_with_env(name: str, value: str) -> list[int]:
    """Live processes whose environment has NAME=value (how a job's processes are found)."""
    marker = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat[stat.rfind(")") + 2] in "ZX":
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


class _Shared:
    cluster: SlurmCluster | None = None
    users = 0


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The shared single-node Slurm; skips where Slurm is not installed (see the module)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if _Shared.cluster is None:
        _Shared.cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    _Shared.users += 1
    try:
        yield _Shared.cluster
    finally:
        _Shared.users -= 1
        if _Shared.users == 0:
            _Shared.cluster.stop()
            _Shared.cluster = None
