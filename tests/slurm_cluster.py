"""A private single-node SLURM cluster for the `slurm` tests: munged, slurmctld and slurmd as plain processes
of this user, everything (config, munge key and socket, state, spool, logs) under one folder, free ports.

Tested with Debian 12's slurm-wlm 22.05.8 and munge 0.5.15, without systemd, as root and as an ordinary
user (the daemons and the jobs then run as that user). The node offers `cpus` CPUs whatever the machine has. Starting takes well under a second; stopping kills
whatever jobs are left first, since `scontrol shutdown` leaves running jobs (their slurmstepd) alive.
No accounting (`accounting_storage/none`): `sacct` answers "accounting storage is disabled", as on many
small clusters, which is what harness.launch.submitit_jobs copes with.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun")
# Variables of an outer SLURM job (a CI runner inside one) would leak into sbatch and srun.
OUTER_JOB_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SUBMITIT_")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_memory_mib() -> int:
    """The memory slurmd sees here (`slurmd -C`'s RealMemory): the node's must not claim more."""
    first = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return int(dict(kv.split("=", 1) for kv in first.split())["RealMemory"])


def cgroup_plugin() -> str:
    """slurmd 22.05-23.11 always loads a cgroup plugin, and `autodetect` fails without systemd's cgroup
    layout; cgroup/v1's set-up touches no file. 24.05 has `disabled`."""
    version = subprocess.run(["slurmd", "-V"], capture_output=True, text=True).stdout.split()[-1]
    major, minor = (int(x) for x in version.split(".")[:2])
    return "disabled" if (major, minor) >= (24, 5) else "cgroup/v1"


class SlurmCluster:
    """`start()`, `env()` for every client command (sbatch, squeue, submitit, Hydra), `stop()`.

    `root` must be short: the munge socket's path must fit in 108 bytes (use tmp_path_factory.mktemp)."""

    PARTITION = "debug"

    def __init__(self, root: Path, cpus: int = 8) -> None:
        self.root = root.resolve()
        self.cpus = cpus  # what the node offers, whatever this machine has (SlurmdParameters=config_overrides)
        self.node = socket.gethostname().split(".")[0]  # what `hostname -s` prints; slurmd -N names it
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(OUTER_JOB_PREFIXES)}
        env["SLURM_CONF"] = str(self.conf)  # there is no /etc/slurm/slurm.conf: every client needs it
        return env

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, env=self.env(), capture_output=True, text=True, check=check, timeout=timeout)

    def write_config(self) -> None:
        r = self.root
        for folder in ("munge", "munge-key", "state", "spool", "log", "run"):
            (r / folder).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)  # munged wants the socket's folder open to all (and --force for its parents)
        os.chmod(r / "munge-key", 0o700)
        key = r / "munge-key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        ctld_port = free_port()
        slurmd_port = free_port()
        while slurmd_port == ctld_port:
            slurmd_port = free_port()
        (r / "plugstack.conf").write_text("")  # not /etc/slurm/plugstack.conf
        (r / "cgroup.conf").write_text(f"CgroupPlugin={cgroup_plugin()}\n")  # read from beside slurm.conf
        user = pwd.getpwuid(os.getuid()).pw_name
        self.conf.write_text(f"""\
ClusterName=pytest
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
# this cluster's munged; cred_expire also bounds how long a requeued job waits (default 120 s)
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={r}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
# the first batch job would otherwise wait batch_sched_delay's default 3 s
SchedulerParameters=batch_sched_delay=0,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without it every job asks for the whole node's memory and jobs run one at a time
DefMemPerCPU=500
MpiDefault=none
ReturnToService=2
# impossible requests fail at submission instead of pending forever
EnforcePartLimits=ALL
# SIGTERM to SIGKILL when a job is cancelled or runs out of time: SLURM's default
KillWait=30
OverTimeLimit=0
MessageTimeout=10
InactiveLimit=0
# finished jobs stay visible to squeue for an hour
MinJobAge=3600
# jobs that wait for signals more than they compute can run side by side on a small machine
SlurmdParameters=config_overrides
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={real_memory_mib()} State=UNKNOWN
PartitionName={self.PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self, timeout: float = 30) -> SlurmCluster:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self.write_config()
        r = self.root
        # --force: pytest's temporary folders are 0700, which munged would refuse for the socket's parents
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={r}/munge-key/munge.key", f"--pid-file={r}/run/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge-key/munged.seed"])
        self._wait_for("munged's socket", self.munge_socket.exists, timeout)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait_for("slurmctld", lambda: self.run("scontrol", "ping", check=False).returncode == 0, timeout)
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait_for("the node to be idle", lambda: self.run("sinfo", "-h", "-n", self.node, "-o", "%T",
                                                                check=False).stdout.strip() == "idle", timeout)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.root / "log" / f"{name}.out", "wb") as out:
            self.procs[name] = subprocess.Popen(cmd, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.root)

    def _wait_for(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}; "
                                       f"see {self.root / 'log'}")
            if ready():
                return
            time.sleep(0.05)
        raise TimeoutError(f"waited {timeout} s for {what}; see {self.root / 'log'}")

    # ---- jobs ----

    def job_state(self, job_id: str) -> str:
        out = self.run("squeue", "-h", "--states=all", "-j", job_id, "-o", "%T", check=False).stdout.split()
        return out[0] if out else ""

    def job_processes(self, job_id: str) -> list[int]:
        """PIDs of the job's processes on this machine (they inherit SLURM_JOB_ID from slurmstepd)."""
        needle = f"SLURM_JOB_ID={job_id}".encode()
        found = []
        for pid in _pids():
            try:
                if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.append(pid)
            except OSError:
                continue
        return found

    # ---- stopping ----

    def _own_pids(self) -> list[int]:
        """This cluster's daemons (our root in their command line) and slurmstepds (our SLURM_CONF)."""
        me, found = os.getpid(), []
        env_needle, cmd_needle = f"SLURM_CONF={self.conf}".encode(), str(self.root).encode()
        for pid in _pids():
            if pid == me:
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            daemon = any(name in cmdline for name in (b"slurmstepd", b"slurmctld", b"slurmd", b"munged"))
            if daemon and (cmd_needle in cmdline or env_needle in environ):
                found.append(pid)
        return found

    def _kill_jobs(self) -> None:
        """SIGKILL everything below our slurmstepds: a cancel would cost KillWait for jobs that trap SIGTERM."""
        children: dict[int, list[int]] = {}
        for pid in _pids():
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(pid)
        stepds = [p for p in self._own_pids() if b"slurmstepd" in _cmdline(p)]
        todo = [c for p in stepds for c in children.get(p, [])]
        while todo:
            pid = todo.pop()
            todo.extend(children.get(pid, []))
            _kill(pid)

    def stop(self, timeout: float = 20) -> None:
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            self._kill_jobs()
            self.run("scancel", f"--user={os.getuid()}", check=False)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                left = self.run("squeue", "-h", "-t", "PD,R,CG,S,CF,RQ,RS,RH,SE,SO,ST", check=False)
                if left.returncode != 0 or not left.stdout.strip():
                    break
                time.sleep(0.1)
            self.run("scontrol", "shutdown", check=False)  # slurmctld tells slurmd to go too
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            if name == "munged":
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self._own_pids():  # anything of ours left (a slurmstepd between two states)
            _kill(pid)
        self.procs.clear()


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
