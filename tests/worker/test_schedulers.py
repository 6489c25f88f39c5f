"""`paretoplan launch --scheduler slurm|kubernetes`: the Kubernetes manifest validated against the
PyTorchJob CRD's schema (tests/worker/data), the Slurm script's shape, and a real 2-task Slurm job
where Slurm is installed (a single-host slurmctld + slurmd + munged started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from paretoplan.cli import main
from search import EstimateRequest, estimate

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    """gpt2-tiny, tp2 inside a node, dp2 across two nodes of 2."""
    plan = estimate(EstimateRequest(model="gpt2-tiny", device="cpu", devices=4, devices_per_node=2, global_batch=8,
                                    precision="fp32", tp=2)).plan
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(plan.model_dump_json())
    return path


def _strict(schema: dict) -> dict:
    """The schema as `kubectl apply --validate=strict` applies it: an object's unknown fields are errors."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _validator():
    import jsonschema

    schema = _strict(json.loads((DATA / "pytorchjob-v1.schema.json").read_text()))
    return jsonschema.Draft7Validator(schema)


def test_the_pytorchjob_manifest_is_valid_against_the_crd_schema(plan_file, tmp_path, capsys):
    out = tmp_path / "job.yaml"
    assert main(["launch", str(plan_file), "--scheduler", "kubernetes", "--image", "registry.example/paretoplan:1",
                 "--steps", "5", "--out", str(out)]) == 0
    assert "2 nodes x 2 devices" in capsys.readouterr().out
    config_map, job = list(yaml.safe_load_all(out.read_text()))
    assert config_map["kind"] == "ConfigMap" and json.loads(config_map["data"]["plan.json"])["num_devices"] == 4
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    errors = sorted(_validator().iter_errors(job), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1
    master = specs["Master"]["template"]["spec"]["containers"][0]
    cmd = master["command"][2]
    assert master["name"] == "pytorch" and "--nnodes 2 --nproc-per-node 2" in cmd
    assert '"$MASTER_ADDR:$MASTER_PORT"' in cmd and '--node-rank "$RANK"' in cmd and "worker.batch merge" in cmd
    assert "worker.batch merge" not in specs["Worker"]["template"]["spec"]["containers"][0]["command"][2]


def test_the_schema_check_catches_a_broken_manifest(plan_file, tmp_path):
    """The validation can fail: a misspelt field and a wrong type are caught."""
    out = tmp_path / "job.yaml"
    assert main(["launch", str(plan_file), "--scheduler", "kubernetes", "--image", "i", "--out", str(out)]) == 0
    job = list(yaml.safe_load_all(out.read_text()))[1]
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
    job["spec"]["runPolicy"]["backofLimit"] = 0
    messages = [e.message for e in _validator().iter_errors(job)]
    assert any("'one' is not of type 'integer'" in m for m in messages), messages
    assert any("backofLimit" in m for m in messages), messages


def test_refusals_are_one_line(plan_file, tmp_path, capsys):
    assert main(["launch", str(plan_file), "--scheduler", "kubernetes", "--out", str(tmp_path / "j.yaml")]) == 2
    assert "needs --image" in capsys.readouterr().err
    # tp2 across 4 nodes of 1 device would leave a node: refused with the node size to search for
    assert main(["launch", str(plan_file), "--scheduler", "slurm", "--nodes", "4", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tensor axis tp2" in err, err


def test_the_slurm_script_runs_one_task_per_node_and_merges(plan_file, tmp_path, capsys):
    assert main(["launch", str(plan_file), "--scheduler", "slurm", "--steps", "3", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --ntasks=2\n" in text and "#SBATCH --ntasks-per-node=1\n" in text
    assert "srun --kill-on-bad-exit=1 --ntasks=2" in text and "--rdzv-id" in text and "slurm-$SLURM_JOB_ID" in text
    assert '--node-rank "$SLURM_PROCID"' in text and text.rstrip().splitlines()[-1].split()[1:4] == [
        "-m", "worker.batch", "merge"]
    assert json.loads((tmp_path / "plan.json").read_text())["num_devices"] == 4


@pytest.mark.processes
@pytest.mark.slow
def test_a_real_slurm_job_runs_the_plan_on_two_tasks(plan_file, tmp_path, capsys, monkeypatch):
    """sbatch on a single-host Slurm: two tasks (the run's two nodes, one Slurm node here), each a
    torchrun multi-node agent; the batch script merges their reports into the single process's run."""
    from tests.worker.parity import assert_losses_match
    from tests.worker.slurmhelp import missing, single_host_slurm, wait_job
    from worker.nodes import free_port
    from worker.reference import reference_losses

    why = missing()
    if why:
        pytest.skip(why)
    job_dir = tmp_path / "job"
    with single_host_slurm(tmp_path / "slurm") as env:
        monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
        assert main(["launch", str(plan_file), "--scheduler", "slurm", "--steps", "3", "--tasks-per-node", "2",
                     "--port", str(free_port()), "--rendezvous-timeout", "120", "--out", str(job_dir),
                     "--submit"]) == 0
        out = capsys.readouterr().out
        job_id = out.split("submitted Slurm job ")[1].split(";")[0]
        wait_job(job_id, env)
    log = "\n".join(p.read_text(errors="replace") for p in job_dir.glob("slurm-*.out"))
    assert (job_dir / "report.json").is_file(), log[-4000:]
    rep = json.loads((job_dir / "report.json").read_text())
    assert [(n["node_rank"], n["ranks"]) for n in rep["nodes"]] == [(0, [0, 1]), (1, [2, 3])]
    ref = reference_losses("gpt2-tiny", 3, 8, rep["plan"]["seq_len"])
    assert_losses_match("gpt2-tiny as a Slurm job of 2 tasks", rep["losses"], ref, 3, 2e-5)


def test_a_job_for_a_service_takes_the_worker_token_from_its_environment_never_inline(plan_file, tmp_path,
                                                                                      monkeypatch):
    """A job that reports to a service: its pods read the worker token from a Secret by reference
    (still a valid PyTorchJob), and the Slurm script stops at once without the variable (it never
    holds the token); without a service neither mentions it."""
    import os
    import subprocess

    from search import Plan
    from worker.schedulers import kubernetes, slurm
    from worker.schedulers.common import BatchJob, ServiceClaim

    plan = Plan.model_validate_json(plan_file.read_text())
    claim = ServiceClaim("http://svc:8000", 7, "c1a1m", 600.0)
    job = BatchJob(plan=plan, nodes=2, steps=3, service=claim)
    secret = "ppt_" + "s3cret" * 8
    monkeypatch.setenv("PARETOPLAN_WORKER_TOKEN", secret)
    ref = {"name": "PARETOPLAN_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}}
    docs = kubernetes.manifest(job, image="img", token_secret="tok")
    assert secret not in kubernetes.to_yaml(docs)
    errors = sorted(_validator().iter_errors(docs[1]), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    for spec in docs[1]["spec"]["pytorchReplicaSpecs"].values():
        assert ref in spec["template"]["spec"]["containers"][0]["env"]
    plain = kubernetes.manifest(BatchJob(plan=plan, nodes=2, steps=3), image="img")
    assert "PARETOPLAN_WORKER_TOKEN" not in kubernetes.to_yaml(plain)

    path = slurm.prepare(job, tmp_path / "job")
    text = path.read_text()
    assert secret not in text and "${PARETOPLAN_WORKER_TOKEN:?" in text
    # the script's own check, run as bash runs it: without the variable it stops before srun
    check = next(line for line in text.splitlines() if "PARETOPLAN_WORKER_TOKEN:?" in line)
    bare = {k: v for k, v in os.environ.items() if k != "PARETOPLAN_WORKER_TOKEN"}
    p = subprocess.run(["bash", "-c", f"set -euo pipefail\n{check}\necho reached"], capture_output=True, text=True,
                       env=bare)
    assert p.returncode != 0 and "reached" not in p.stdout and "PARETOPLAN_WORKER_TOKEN" in p.stderr
    p = subprocess.run(["bash", "-c", f"set -euo pipefail\n{check}\necho reached"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "reached"
    assert "PARETOPLAN_WORKER_TOKEN" not in slurm.script(BatchJob(plan=plan, nodes=2, steps=3), tmp_path)
