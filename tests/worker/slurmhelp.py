"""A single-host Slurm for tests: munged, slurmctld and slurmd of Debian's slurm-wlm, each with
its own socket, ports, state and logs under a temporary folder (nothing of the machine's own
configuration is used), stopped afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue")


def missing() -> str | None:
    """Why Slurm cannot run here, or None."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} not found; Debian: apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "a test Slurm runs its daemons as root here (SlurmUser=root)"
    return None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@contextmanager
def single_host_slurm(root: Path) -> Iterator[dict[str, str]]:
    """The environment (SLURM_CONF) for sbatch/squeue against a fresh one-node cluster."""
    root.mkdir(parents=True, exist_ok=True)
    for d in ("state", "spool", "munge"):
        (root / d).mkdir(exist_ok=True)
    os.chmod(root / "munge", 0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = root / "munge" / "munge.sock"
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=paretoplantest", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={_port()}",
        f"SlurmdPort={_port()}", "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
        "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "SchedulerType=sched/builtin", "ReturnToService=2", "MpiDefault=none",
        "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
        "MailProg=/bin/true", "JobAcctGatherType=jobacct_gather/none",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
        "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([_binary("munged"), "--foreground", "--force", f"--socket={sock}",
                                       f"--key-file={key}", f"--pid-file={root}/munge/munged.pid",
                                       f"--log-file={root}/munge/munged.log", f"--seed-file={root}/munge/seed"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: sock.exists(), "munged", root)
        procs.append(subprocess.Popen([_binary("slurmctld"), "-D", "-i", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([_binary("slurmd"), "-D", "-f", str(conf), "-N", host], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: "idle" in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                               text=True).stdout, "slurmd (idle)", root)
        yield env
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _wait(ok, what: str, root: Path, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > end:
            logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in root.rglob("*.log"))
            raise AssertionError(f"{what} did not come up in {timeout:.0f} s\n{logs}")
        time.sleep(0.2)


def wait_job(job_id: str, env: dict[str, str], timeout: float = 600.0) -> None:
    """Until the job has left the queue."""
    end = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True).stdout.strip():
        if time.monotonic() > end:
            raise AssertionError(f"Slurm job {job_id} still queued or running after {timeout:.0f} s")
        time.sleep(0.5)
