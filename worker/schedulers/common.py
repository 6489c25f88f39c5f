"""What every scheduler launch shares: the job's shape (nodes x processes per node) and the
per-node command line."""

from __future__ import annotations

from dataclasses import dataclass

from search import InputError, Plan
from search.plans.nodes import nodes_blocker


@dataclass(frozen=True)
class ServiceClaim:
    """A run of a paretoplan service this job carries out: its nodes heartbeat the run and the
    merge posts the report, as workers do (worker.client)."""

    api: str
    run_id: int
    token: str
    lease_seconds: float

    def args(self) -> list[str]:
        return ["--api", self.api, "--run-id", str(self.run_id), "--token", self.token,
                "--lease", f"{self.lease_seconds:g}"]


@dataclass(frozen=True)
class BatchJob:
    plan: Plan
    nodes: int
    steps: int
    seed: int = 0
    port: int = 29500
    timeout_s: float = 300.0
    service: ServiceClaim | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise InputError(f"--nodes must be at least 1, got {self.nodes}")
        if self.steps < 1:
            raise InputError(f"--steps must be at least 1, got {self.steps}")
        if not 1 <= self.port <= 65535:
            raise InputError(f"--port must be a TCP port, got {self.port}")
        blocker = nodes_blocker(self.plan, self.nodes)
        if blocker is not None:
            raise InputError(blocker)

    @property
    def per_node(self) -> int:
        return self.plan.num_devices // self.nodes

    @property
    def device(self) -> str:
        return "cpu" if self.plan.device == "cpu" else "cuda"

    @property
    def name(self) -> str:
        safe = "".join(c if c.isalnum() else "-" for c in self.plan.model.lower()).strip("-")
        return f"paretoplan-{safe}"[:50].rstrip("-")

    def node_command(self, plan_path: str, out: str, endpoint: str, rdzv_id: str, node_rank: str,
                     python: str = "python") -> list[str]:
        return [python, "-m", "worker.batch", "node", "--plan", plan_path, "--steps", str(self.steps),
                "--seed", str(self.seed), "--nnodes", str(self.nodes), "--nproc-per-node", str(self.per_node),
                "--endpoint", endpoint, "--rdzv-id", rdzv_id, "--node-rank", node_rank, "--out", out,
                "--device", self.device, "--timeout", f"{self.timeout_s:g}", *self.service_args()]

    def service_args(self) -> list[str]:
        return self.service.args() if self.service else []

    def merge_command(self, out: str, python: str = "python", wait_s: float = 0.0) -> list[str]:
        return [python, "-m", "worker.batch", "merge", out, "--nodes", str(self.nodes), "--report",
                f"{out}/report.json", *(["--wait", f"{wait_s:g}"] if wait_s else []), *self.service_args()]
