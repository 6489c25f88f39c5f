"""Kubernetes: the run as a Kubeflow PyTorchJob (training operator, kubeflow.org/v1): a Master
replica and N - 1 Worker replicas, one pod per node of the run, each running torchrun's
multi-node agent for its node; the rendezvous at the Master's service (MASTER_ADDR:MASTER_PORT,
which the operator sets in every pod, with RANK the replica's place: Master 0, Worker i + 1), the
job's name as rendezvous id.

The plan reaches the pods in a ConfigMap; the nodes' reports go to a volume every pod mounts
(a ReadWriteMany PersistentVolumeClaim), where the Master merges them into report.json once all
are there. The manifest is plain YAML (a ConfigMap and the PyTorchJob) for `kubectl apply -f`:
we write no client code, so the kubernetes package is not needed; `kubectl` is what cluster
users already run. `restartPolicy: Never` and `backoffLimit: 0`: a pod that fails fails the job
(its peers' collectives fail on the closed connections, within the rendezvous timeout at worst).

A job that carries out a service's run (`launch --api`) needs the worker token in every pod: it
comes from a Secret by reference (`secretKeyRef`), never written into the manifest, which people
keep, share and commit.
"""

from __future__ import annotations

from typing import Any

import yaml  # type: ignore[import-untyped]  # (no stubs installed; only safe_dump_all is used)

from worker.schedulers.common import BatchJob

PLAN_DIR = "/etc/paretoplan"
RESULTS_DIR = "/results"


def manifest(job: BatchJob, *, image: str, namespace: str = "default", results_claim: str = "paretoplan-results",
             name: str | None = None, token_secret: str = "paretoplan-worker-token") -> list[dict[str, Any]]:
    """The ConfigMap with the plan and the PyTorchJob that runs it (as Python objects). A job that
    reports to a service reads the worker token from the Secret `token_secret` (key `token`)."""
    name = name or job.name
    out = f"{RESULTS_DIR}/{name}"
    node = job.node_command(f"{PLAN_DIR}/plan.json", out, "$MASTER_ADDR:$MASTER_PORT", name, "$RANK")
    run_node = " ".join(f'"{a}"' if "$" in a else a for a in node)
    merge = " ".join(job.merge_command(out, wait_s=job.timeout_s))
    resources: dict[str, Any] = {}
    if job.device == "cuda":
        resources = {"limits": {"nvidia.com/gpu": job.per_node}}

    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if job.service is not None:  # heartbeats and the report speak the worker protocol: its token, by reference
        env.append({"name": "PARETOPLAN_WORKER_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": token_secret, "key": "token"}}})

    def replica(count: int, master: bool) -> dict[str, Any]:
        command = f"{run_node} && {merge}" if master else run_node
        container: dict[str, Any] = {
            "name": "pytorch",  # the operator finds the training container by this name
            "image": image,
            "command": ["bash", "-c", command],
            "env": env,
            "volumeMounts": [{"name": "plan", "mountPath": PLAN_DIR, "readOnly": True},
                             {"name": "results", "mountPath": RESULTS_DIR}],
        }
        if resources:
            container["resources"] = resources
        return {"replicas": count, "restartPolicy": "Never", "template": {"spec": {
            "containers": [container],
            "volumes": [{"name": "plan", "configMap": {"name": f"{name}-plan"}},
                        {"name": "results", "persistentVolumeClaim": {"claimName": results_claim}}]}}}

    specs = {"Master": replica(1, True)}
    if job.nodes > 1:
        specs["Worker"] = replica(job.nodes - 1, False)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-plan", "namespace": namespace},
                  "data": {"plan.json": job.plan.model_dump_json()}}
    pytorch_job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                   "metadata": {"name": name, "namespace": namespace},
                   "spec": {"runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "Running"},
                            "pytorchReplicaSpecs": specs}}
    return [config_map, pytorch_job]


def to_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, width=120)
