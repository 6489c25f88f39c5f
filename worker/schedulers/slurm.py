"""Slurm: the run as one batch job, one task per node, each task torchrun's multi-node agent for
its node; the rendezvous on the first node of the allocation, the job id as rendezvous id.

We write an sbatch script rather than use submitit: submitit pickles a Python callable and runs
it in every task, which adds a dependency and hides the job behind pickles; the script is what a
cluster's users read, keep and resubmit by hand, and `sbatch` is all it takes.

`srun --kill-on-bad-exit=1` ends every task when one fails, so no node waits on a dead one; the
script then merges the nodes' reports into DIR/report.json (it fails when a node did not report).
A job that carries out a service's run takes the worker token from the environment it is
submitted in (PARETOPLAN_WORKER_TOKEN); the script checks it is there and never holds it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from search import InputError
from worker.schedulers.common import BatchJob


def script(job: BatchJob, folder: Path, *, python: str = sys.executable, tasks_per_node: int = 1,
           partition: str | None = None, time_limit: str | None = None, extra: list[str] | None = None) -> str:
    """The sbatch script of `job`, its plan at folder/plan.json and its reports in folder.
    `tasks_per_node` > 1 puts several of the run's nodes on one Slurm node (a single test host)."""
    folder = folder.resolve()
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job.name}", f"#SBATCH --ntasks={job.nodes}",
             f"#SBATCH --ntasks-per-node={tasks_per_node}", f"#SBATCH --nodes={-(-job.nodes // tasks_per_node)}",
             f"#SBATCH --output={folder}/slurm-%j.out", f"#SBATCH --chdir={folder}"]
    if job.device == "cuda":
        lines.append(f"#SBATCH --gpus-per-task={job.per_node}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    lines += [f"#SBATCH {x}" for x in extra or []]
    repo = Path(__file__).resolve().parents[2]
    node = job.node_command(str(folder / "plan.json"), str(folder), f"$HEAD:{job.port}", "slurm-$SLURM_JOB_ID",
                            "$SLURM_PROCID", python=python)
    # each task expands $SLURM_PROCID itself: the srun command runs through bash -c
    inner = " ".join(shlex.quote(a) if "$" not in a else f'"{a}"' for a in node)
    lines += ["set -euo pipefail"]
    if job.service is not None:
        # the nodes and the merge speak the worker protocol: the token comes from the environment the
        # job is submitted in (sbatch passes it on, srun to every task), never written into the script
        lines.append(': "${PARETOPLAN_WORKER_TOKEN:?this job reports to a paretoplan service: submit it with '
                     'PARETOPLAN_WORKER_TOKEN set to a worker token}"')
    lines += [
        f"export PYTHONPATH={shlex.quote(str(repo))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export HEAD=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
        "# one task per node of the run; a task that fails ends the others",
        f"srun --kill-on-bad-exit=1 --ntasks={job.nodes} bash -c {shlex.quote(inner)}",
        " ".join(shlex.quote(a) for a in job.merge_command(str(folder), python=python)),
    ]
    return "\n".join(lines) + "\n"


def prepare(job: BatchJob, folder: Path, **kwargs) -> Path:
    """Write the plan and the script into `folder`; the script's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(job.plan.model_dump_json())
    path = folder / "job.sbatch"
    path.write_text(script(job, folder, **kwargs))
    path.chmod(0o755)
    return path


def submit(path: Path) -> str:
    """sbatch the script; the job id."""
    if shutil.which("sbatch") is None:
        raise InputError("sbatch is not on PATH: run this on a Slurm login node (the script is at "
                         f"{path}; submit it there with `sbatch {path.name}`)")
    p = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, cwd=path.parent)
    if p.returncode != 0:
        raise InputError(f"sbatch refused the job: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout.strip().split(";")[0]
