"""The `paretoplan` command: a thin face over the packages (docs/architecture.md).

Every user mistake is an `InputError`, printed as one line with exit code 2; a budget no plan
fits is reported with the least memory any plan needs and exit code 3.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from search.errors import InputError, NoFeasiblePlan, invalid, read_json

EXIT_INPUT = 2
EXIT_NO_PLAN = 3
EXIT_RUN_FAILED = 4  # `run`: a rank failed or the run timed out
EXIT_STOPPED = 5  # `run`: stopped by SIGTERM after saving a checkpoint (go on with --resume)


class _Parser(argparse.ArgumentParser):
    """argparse's own errors as one line too (subparsers inherit the class)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"paretoplan: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_INPUT)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="paretoplan", description="Pareto frontiers of parallel training strategies.")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("models", help="list the model zoo with parameter counts")
    sub.add_parser("devices", help="list the device catalog")

    _add_search(sub)
    _add_estimate(sub)
    _add_profile(sub)
    _add_run(sub)
    _add_serve(sub)
    _add_worker(sub)
    _add_resize(sub)
    _add_token(sub)
    return p


def _add_job_flags(s: argparse.ArgumentParser) -> None:
    """The model, the cluster and the job: the flags `search` and `estimate` share (a
    search.plans.api.JobRequest)."""
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="zoo model name (see `paretoplan models`)")
    src.add_argument("--hf-config", help="a HuggingFace transformers config.json (random init, no download)")
    src.add_argument("--graph", help="an OpGraph JSON file (format in docs/cli.md)")
    s.add_argument("--device", default=None,
                   help="catalog device type (default h100-80gb, or the --profile's device)")
    s.add_argument("--devices", type=int, default=8, help="number of devices (default 8)")
    s.add_argument("--devices-per-node", type=int, default=None, help="node size (default: the device's usual)")
    s.add_argument("--cluster", help="cluster JSON file (overrides --device/--devices/--devices-per-node)")
    s.add_argument("--memory-budget", help="per-device memory budget, e.g. 40GiB (default: device memory)")
    s.add_argument("--global-batch", type=int, default=None, help="samples per iteration (default: max(8, devices))")
    s.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    s.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    s.add_argument("--profile", help="a DeviceProfile JSON from `paretoplan profile`: price from measured costs")


def _add_search(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`search`: the model, the cluster, the job and what to write."""
    s = sub.add_parser("search", help="search the time/memory Pareto frontier of a model on a cluster")
    _add_job_flags(s)
    s.add_argument("--eps", type=float, default=0.0, help="approximate mode: keep one point per (1+eps) cell")
    s.add_argument("--exhaustive", action="store_true", help="enumerate every plan (the exact reference; small graphs)")
    s.add_argument("--no-block-reuse", action="store_true", help="solve every layer separately")
    s.add_argument("--zero", default="0,1,2,3", help="ZeRO stages to consider, e.g. 0 or 1,3 (default 0,1,2,3)")
    s.add_argument("--no-recompute", action="store_true", help="never recompute activations of a block")
    s.add_argument("--no-baselines", action="store_true", help="skip the baseline planners (DP, FSDP, Megatron)")
    s.add_argument("--no-pipeline", action="store_true",
                   help="plans without pipeline stages only (by default the layers may also be split into stages "
                        "under 1F1B; GPipe is costed and always dominated)")
    s.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old scripts
    s.add_argument("--no-accumulation", action="store_true",
                   help="plans without pipelines run the whole per-rank batch at once (by default they may run it "
                        "as micro-batches, accumulating gradients)")
    s.add_argument("--allow-async-pipeline", action="store_true",
                   help="also consider PipeDream-2BW (double-buffered weights, 1-stale updates)")
    s.add_argument("--tensor-2d", action="store_true",
                   help="also consider 2-D tensor parallelism (two tensor axes inside a node, each op splitting a "
                        "different dimension on each); the search takes longer")
    s.add_argument("--interleave", action="store_true",
                   help="also consider interleaved 1F1B (2-4 virtual stages per device, Megatron-LM's schedule); "
                        "the search takes longer")
    s.add_argument("--json", dest="json_out", help="write the frontier with every full Plan as JSON")
    s.add_argument("--html", dest="html_out", help="write an interactive offline Plotly chart of the frontier")
    s.add_argument("--dump-graph", help="write the captured OpGraph as JSON")
    s.add_argument("--all", action="store_true", help="print every frontier point, not a sample")
    s.add_argument("--time-target", default=None,
                   help="pick the leanest plan that fits the memory budget and runs an iteration within this time, "
                        "e.g. 250ms or 1.5s (default: the fastest plan that fits)")


def _add_estimate(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`estimate`: the model, the cluster, the job, and one plan in Megatron-LM's terms."""
    e = sub.add_parser("estimate", help="price one plan you write Megatron-style (tp, pp, micro-batch, ...) and "
                                        "place it against the frontier",
                       description="Price the plan Megatron-LM's flags describe with the search's cost model: "
                                   "time per iteration, memory per device, model FLOPs and MFU, whether the "
                                   "executor runs it, and (with --frontier or --compare) where it lands against "
                                   "the Pareto frontier. dp = devices / (tp x pp); micro-batches per iteration = "
                                   "global batch / (dp x micro-batch).")
    _add_job_flags(e)
    e.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    e.add_argument("--pp", type=int, default=1, help="pipeline stages (default 1)")
    e.add_argument("--micro-batch", type=int, default=1,
                   help="samples per micro-batch per data-parallel rank, Megatron's --micro-batch-size (default 1)")
    e.add_argument("--virtual-stages", type=int, default=1,
                   help="chunks of layers per device: > 1 is interleaved 1F1B (priced, not executed; default 1)")
    e.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0, help="ZeRO stage over dp (default 0)")
    e.add_argument("--recompute", choices=["none", "selective", "full"], default="none",
                   help="activation recomputation: full layers or the attention core (default none)")
    e.add_argument("--sequence-parallel", action="store_true", help="sequence-parallel norms and residuals (tp > 1)")
    e.add_argument("--schedule", choices=["1f1b", "gpipe", "2bw"], default="1f1b", help="pipeline schedule (default 1f1b)")
    cmp = e.add_mutually_exclusive_group()
    cmp.add_argument("--frontier", help="a frontier JSON written by `paretoplan search --json` to compare with")
    cmp.add_argument("--compare", action="store_true", help="search the same model and cluster, and compare")
    e.add_argument("--json", dest="json_out", help="write the estimate (time, memory, MFU, the Plan, ...) as JSON")


def _add_profile(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`profile`: what to time on this machine, or a calibration."""
    pr = sub.add_parser("profile", help="measure op and collective costs on this machine (a DeviceProfile)",
                        description="Time every op signature a search of --model on --devices devices will price, "
                                    "and the collectives its meshes use, on this machine (CUDA GPUs with NCCL, "
                                    "else CPU processes with gloo); or, with --calibrate, fit a profile's "
                                    "correction factors to measured runs.")
    pr.add_argument("--model", help="zoo model whose op signatures to time (see `paretoplan models`)")
    pr.add_argument("--devices", type=int, default=None, help="devices the search will plan for")
    pr.add_argument("--devices-per-node", type=int, default=None, help="node size (default: the device's usual)")
    pr.add_argument("--device", default=None, help="catalog device measured (default: this machine's GPU, else cpu)")
    pr.add_argument("--global-batch", type=int, default=None, help="as for search (default: max(8, devices))")
    pr.add_argument("--seq-len", type=int, default=None, help="as for search (default: the model's)")
    pr.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    pr.add_argument("--out", help="profile JSON to write")
    pr.add_argument("--base", help="an existing profile: keep its measurements, time only what is new")
    pr.add_argument("--collectives-only", action="store_true", help="time collectives only, no model ops")
    pr.add_argument("--repeats", type=int, default=10, help="most timed repeats per op signature (default 10)")
    pr.add_argument("--threads", type=int, default=None, help="torch threads while timing ops (default: cores / devices)")
    pr.add_argument("--calibrate", nargs="+", metavar="REPORT", help="RunReport JSON files to calibrate --profile with")
    pr.add_argument("--profile", help="with --calibrate: the profile to calibrate")


def _add_run(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`run`: the plan to launch (searched or from a file) and how to train it."""
    r = sub.add_parser("run", help="launch a plan with torchrun and compare measured with predicted time and memory",
                       description="Search --model for this machine and launch the picked plan, or launch a plan "
                                   "saved by `search --json` (--plan); train on synthetic data with torchrun (gloo "
                                   "CPU processes without a GPU, NCCL with GPUs) and print predicted vs measured "
                                   "iteration time and peak memory per rank.")
    rsrc = r.add_mutually_exclusive_group(required=True)
    rsrc.add_argument("--model", help="zoo model to search and run (see `paretoplan models`)")
    rsrc.add_argument("--plan", help="a Plan JSON, a frontier JSON from `search --json` (choose with --pick), or an "
                                     "estimate JSON from `estimate --json`")
    r.add_argument("--pick", default=None,
                   help="fastest | leanest | budget (fastest within --memory-budget) | N (frontier index) | a "
                        "baseline's name (default: budget with --model, the frontier's pick with a frontier JSON)")
    r.add_argument("--devices", type=int, default=4, help="processes / GPUs to plan for (default 4)")
    r.add_argument("--device", default=None, help="catalog device to search for (default: cpu without a GPU)")
    r.add_argument("--devices-per-node", type=int, default=None, help="node size for the search")
    r.add_argument("--memory-budget", help="per-device memory budget for --pick budget, e.g. 2GiB")
    r.add_argument("--time-target", default=None,
                   help="with --pick budget: the leanest plan within the memory budget that runs an iteration "
                        "within this time, e.g. 250ms (a resize keeps the rule)")
    r.add_argument("--global-batch", type=int, default=None, help="samples per iteration (default: max(8, devices))")
    r.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    r.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None,
                   help="default fp32 on CPU processes, bf16 on GPUs")
    r.add_argument("--zero", default="0,1,2,3", help="ZeRO stages the search considers (default 0,1,2,3)")
    r.add_argument("--no-recompute", action="store_true", help="the search never recomputes activations")
    r.add_argument("--profile", help="a DeviceProfile JSON of this machine for the search to price with")
    r.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    r.add_argument("--warmup", type=int, default=2, help="steps left out of the timing (default 2)")
    r.add_argument("--seed", type=int, default=0, help="seed of the initialisation and the synthetic data")
    r.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    r.add_argument("--report", help="write the RunReport (predicted, measured, losses, plan) as JSON")
    r.add_argument("--max-procs", type=int, default=None, help="most CPU processes to start (default 4 per core)")
    r.add_argument("--timeout", type=float, default=None, help="stop the run after this many seconds")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--resize", metavar="STEP:DEVICES[,...]", default=None,
                   help="resize the running job before these steps: stop, save, re-plan for the new device count "
                        "(the same --pick rule), relaunch and load resharded, e.g. 8:2,16:4")
    r.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="save a checkpoint after every N steps (a rank that dies resumes from the last one)")
    r.add_argument("--checkpoint-dir", default=None,
                   help="keep checkpoints in this run directory (default: a temporary one, removed at the end)")
    r.add_argument("--resume", default=None, metavar="DIR",
                   help="go on from the latest checkpoint in this run directory (of a run stopped by SIGTERM)")


def _add_serve(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`serve`: the service with its dashboard and local workers."""
    sv = sub.add_parser("serve", help="run the REST API (jobs, frontiers, runs) with a local worker",
                        description="Serve the REST API and dashboard; settings also come from PARETOPLAN_* "
                                    "environment variables and .env (DATABASE_URL for the database).")
    sv.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1, PARETOPLAN_HOST)")
    sv.add_argument("--port", type=int, default=None, help="port (default 8000, PARETOPLAN_PORT; 0: any free port)")
    sv.add_argument("--db", default=None, help="database URL (default sqlite:///./paretoplan.db, or DATABASE_URL)")
    sv.add_argument("--no-worker", action="store_true", help="start no local worker (run `paretoplan worker` elsewhere)")
    sv.add_argument("--workers", type=int, default=1, help="local worker processes to start (default 1)")
    sv.add_argument("--lease", type=float, default=None, help="seconds a task stays claimed without a heartbeat (default 30)")
    sv.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    sv.add_argument("--no-auth", action="store_true",
                    help="no token needed for the API and dashboard (refused unless --host is a loopback address)")


def _add_worker(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`worker`: a worker claiming tasks from a service over REST."""
    wk = sub.add_parser("worker", help="claim searches and runs from a paretoplan service and execute them")
    wk.add_argument("--api", required=True, help="the service's URL, e.g. http://127.0.0.1:8000")
    wk.add_argument("--name", default=None, help="this worker's name in the service (default host:pid)")
    wk.add_argument("--kinds", default="search,run", help="what to claim: search, run or both (default both)")
    wk.add_argument("--poll", type=float, default=1.0, help="seconds between claims when there is nothing to do")
    wk.add_argument("--max-tasks", type=int, default=None, help="exit after this many tasks")
    wk.add_argument("--exit-with-parent", action="store_true", help="exit when the process that started it exits")
    wk.add_argument("--checkpoint-dir", default=None,
                    help="where runs save checkpoints, one run directory each (default ./paretoplan-checkpoints, or "
                         "PARETOPLAN_CHECKPOINT_DIR); workers that may take over each other's runs must share it")

def _add_resize(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`resize`: order a running run of a service onto another device count."""
    rz = sub.add_parser("resize", help="resize a running run of a paretoplan service (it saves, re-plans, goes on)",
                        description="Ask the service to move a running run onto DEVICES devices: at its next step it "
                                    "saves a checkpoint, takes the job's plan for the new count (searched if the job "
                                    "has no frontier for it) and goes on from the same step.")
    rz.add_argument("run_id", type=int, help="the run's id (GET /api/jobs/{id}/runs lists a job's runs)")
    rz.add_argument("--devices", type=int, required=True, help="the new number of devices")
    rz.add_argument("--memory-per-device", default=None, help="a new per-device memory budget, e.g. 40GiB")
    rz.add_argument("--api", default="http://127.0.0.1:8000", help="the service's URL (default http://127.0.0.1:8000)")
    rz.add_argument("--wait", action="store_true", help="wait until the run has moved (or refused), and say how")
    _add_token_flag(rz)


def _add_token_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token", default=None, help="the API token to send (default: PARETOPLAN_TOKEN); "
                                                 "`paretoplan token create --scopes read,submit` makes one")


def _api_token(args: argparse.Namespace) -> str | None:
    import os

    return args.token or os.environ.get("PARETOPLAN_TOKEN") or None


def _add_token(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`token`: API tokens of a service, made and revoked in its database."""
    tk = sub.add_parser("token", help="create, list or revoke API tokens (in the service's database)")
    tsub = tk.add_subparsers(dest="token_command", required=True)
    c = tsub.add_parser("create", help="make a token and print it (it is shown once: only its hash is stored)")
    c.add_argument("--scopes", required=True,
                   help="comma-separated: read, submit, admin (users) or worker (alone, for workers)")
    c.add_argument("--name", default=None, help="what the token is for (default: its scopes)")
    c.add_argument("--from-env", default=None, metavar="VAR",
                   help="store the secret held in environment variable VAR instead of a new random one "
                        "(docker-compose: tokens from .env)")
    ls = tsub.add_parser("list", help="list tokens (names, scopes, not the secrets)")
    rv = tsub.add_parser("revoke", help="revoke a token by id (refused within seconds everywhere)")
    rv.add_argument("token_id", type=int)
    for x in (c, ls, rv):
        x.add_argument("--db", default=None, help="database URL (default sqlite:///./paretoplan.db, or DATABASE_URL)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "models":
            return _models()
        if args.command == "devices":
            return _devices()
        if args.command == "search":
            return _search(args)
        if args.command == "estimate":
            return _estimate(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "worker":
            return _worker(args)
        if args.command == "profile":
            return _profile(args)
        if args.command == "run":
            return _run(args)
        if args.command == "resize":
            return _resize(args)
        if args.command == "token":
            return _token(args)
    except InputError as e:
        print(f"paretoplan: error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except NoFeasiblePlan as e:
        print(f"paretoplan: {e}", file=sys.stderr)
        return EXIT_NO_PLAN
    except BrokenPipeError:  # `paretoplan models | head`
        sys.stderr.close()
        return 0
    return 0


def _as_flag(path: str) -> str:
    """A request field's path as the command-line flag that sets it: 'global_batch' -> ' --global-batch'."""
    return f" --{path.replace('_', '-')}" if path else ""


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from service.server import serve
    from service.settings import Settings

    given = {"host": args.host, "port": args.port, "database_url": args.db, "lease_seconds": args.lease,
             "auth": False if args.no_auth else None}
    try:
        settings = Settings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as e:
        raise invalid(e, "settings", lambda path: f" {path}" if path else "") from None
    if args.workers < 0:
        raise InputError(f"--workers must be 0 or more, got {args.workers}")
    return serve(settings, workers=0 if args.no_worker else args.workers, log_level=args.log_level)


def _worker(args: argparse.Namespace) -> int:
    from worker.agent import main as worker_main

    return worker_main(args.api, name=args.name, kinds=args.kinds, poll_seconds=args.poll, max_tasks=args.max_tasks,
                       exit_with_parent=args.exit_with_parent, checkpoint_dir=args.checkpoint_dir)


def _resize(args: argparse.Namespace) -> int:
    """POST /api/runs/{id}/resize; the service's refusal (404, 409, 422) is one line and exit 2."""
    import time

    import httpx

    body: dict = {"devices": args.devices}
    if args.memory_per_device:
        body["memory_per_device"] = args.memory_per_device
    token = _api_token(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=args.api.rstrip("/"), timeout=60, headers=headers) as http:
        try:
            r = http.post(f"/api/runs/{args.run_id}/resize", json=body)
        except httpx.TransportError as e:
            raise InputError(f"cannot reach the service at {args.api}: {e}") from None
        if r.status_code != 202:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise InputError(f"run {args.run_id}: {detail if isinstance(detail, str) else json_line(detail)} "
                             f"({r.status_code})")
        order = r.json()
        plan = f": {order['strategy']['summary']}" if order.get("strategy") else " (its plan is searched first)"
        print(f"resize {order['id']}: run {args.run_id} moves to {args.devices} devices at its next step{plan}")
        while args.wait:
            run = http.get(f"/api/runs/{args.run_id}").json()
            pending = run.get("resize")
            if run["status"] != "running" or pending is None or pending["id"] != order["id"]:
                done = http.get(f"/api/jobs/{order['job_id']}/resizes/{order['id']}").json()
                print(f"resize {order['id']}: {done.get('outcome') or run['status']}")
                break
            time.sleep(1.0)
    return 0


def _token(args: argparse.Namespace) -> int:
    """`token create|list|revoke` on the service's database (migrated first, as `serve` does)."""
    import os

    from pydantic import ValidationError
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from service.api.auth import create_token, parse_scopes, revoke_token
    from service.db import Database
    from service.models import ApiToken
    from service.settings import Settings

    try:
        settings = Settings(**({"database_url": args.db} if args.db else {}))
    except ValidationError as e:
        raise invalid(e, "settings", lambda path: f" {path}" if path else "") from None
    db = Database(settings.database_url)
    try:
        db.migrate()
        if args.token_command == "create":
            try:
                scopes = parse_scopes(args.scopes)
            except ValueError as e:
                raise InputError(str(e)) from None
            secret = None
            if args.from_env:
                secret = os.environ.get(args.from_env, "").strip()
                if not secret:
                    raise InputError(f"--from-env {args.from_env}: that environment variable is empty or unset")
            with db.write_session() as s:
                existing = (s.scalars(select(ApiToken).where(ApiToken.secret_sha256 == _digest(secret))).first()
                            if secret else None)
                if existing is not None:  # docker-compose starts again: the token from .env is there already
                    print(f"token {existing.id} ({existing.name}) exists already", file=sys.stderr)
                    return 0
                try:
                    row, secret = create_token(s, args.name or ",".join(scopes), scopes, secret)
                except ValueError as e:
                    raise InputError(str(e)) from None
                print(f"token {row.id} ({row.name}; scopes {row.scopes}); it is shown once:", file=sys.stderr)
            if not args.from_env:
                print(secret)
        elif args.token_command == "list":
            with db.session() as s:
                print(f"{'id':>4}  {'scopes':<24} {'created':<20} {'revoked':<20} name")
                for t in s.scalars(select(ApiToken).order_by(ApiToken.id)):
                    revoked = t.revoked_at.isoformat(timespec="seconds") if t.revoked_at else "-"
                    print(f"{t.id:>4}  {t.scopes:<24} {t.created_at.isoformat(timespec='seconds'):<20} "
                          f"{revoked:<20} {t.name}")
        else:
            with db.write_session() as s:
                if not revoke_token(s, args.token_id):
                    raise InputError(f"no token {args.token_id} to revoke (unknown, or revoked already)")
            print(f"token {args.token_id} revoked")
    except SQLAlchemyError as e:
        raise InputError(f"the database at {settings.database_url}: {str(e).splitlines()[0]}") from None
    finally:
        db.dispose()
    return 0


def _digest(secret: str | None) -> str:
    from service.api.auth import digest

    return digest(secret or "")


def json_line(data: object) -> str:
    import json

    return json.dumps(data, separators=(",", ":"))[:500]


def _models() -> int:
    from search.models.zoo import ZOO

    print(f"{'model':<14} {'params':>16}  description")
    for name, spec in ZOO.items():
        print(f"{name:<14} {spec.param_count():>16,}  {spec.description}")
    return 0


def _devices() -> int:
    from search import CATALOG, format_size

    print(f"{'device':<12} {'memory':>10} {'bf16 TFLOP/s':>13} {'HBM GB/s':>9} {'intra GB/s':>10} {'inter GB/s':>10}")
    for name, d in CATALOG.items():
        print(f"{name:<12} {format_size(d.memory_bytes):>10} {d.peak_flops.get('bf16', 0) / 1e12:>13.1f} "
              f"{d.memory_bandwidth / 1e9:>9.0f} {d.intra_node_bandwidth / 1e9:>10.1f} {d.inter_node_bandwidth / 1e9:>10.2f}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from search import format_size, run_search

    req = _request(args)
    for out in (args.json_out, args.html_out, args.dump_graph):  # fail before a long search, not after
        if out:
            _check_writable(out)
    o = run_search(req)
    result = o.result
    if args.dump_graph:
        _write(args.dump_graph, result.graph.to_json())
    _print_table(result, o.best, o.budget, o.capture_seconds, args.all, o.report.time_target_s)
    if "profile" in result.stats:
        _print_profile_use(result.stats["profile"], o.plans)
    from search.prices.accuracy import confidence

    print(confidence("profile" if "profile" in result.stats else "catalog", req.model, result.cluster.num_devices).message)
    if o.baselines or result.stats.get("infeasible_baselines"):
        _print_baselines(result, o.baselines)
    if args.json_out:
        _write(args.json_out, o.report.model_dump_json(indent=1))
    if args.html_out:
        from paretoplan.report import frontier_html

        _write(args.html_out, frontier_html(result, o.plans, o.budget, o.best, o.baselines))
    if o.best is None:
        least = min((p.memory_bytes for p in result.points), default=0.0)
        if o.report.time_target_s is not None:
            raise NoFeasiblePlan(_no_plan_in_time(o.report.model_dump()), int(least))
        raise NoFeasiblePlan(
            f"no plan fits the memory budget of {format_size(int(o.budget))} per device; the leanest plan needs "
            f"{format_size(int(least))}", int(least))
    return 0


def _estimate(args: argparse.Namespace) -> int:
    """`paretoplan estimate`: price one Megatron-style plan, and place it against a frontier."""
    from pydantic import ValidationError

    from search import FrontierReport, format_size, run_search
    from search.plans.estimate import EstimateRequest, compare, compare_request, estimate, same_job

    fields = _job_fields(args)
    fields.update(tp=args.tp, pp=args.pp, micro_batch=args.micro_batch, virtual_stages=args.virtual_stages,
                  zero=args.zero, recompute=args.recompute, sequence_parallel=args.sequence_parallel,
                  schedule=args.schedule)
    try:
        req = EstimateRequest(**fields)
    except ValidationError as e:
        raise invalid(e, "arguments", _as_flag) from None
    if args.json_out:
        _check_writable(args.json_out)
    frontier = None
    if args.frontier:
        try:
            report = FrontierReport.model_validate(_read_json(args.frontier, "frontier"))
        except ValidationError as e:
            raise invalid(e, f"{args.frontier}: not a frontier JSON of `paretoplan search --json`") from None
        frontier = report
    est = estimate(req, frontier.frontier if frontier is not None else None)
    if frontier is not None:
        same_job(frontier, est.plan, f"the frontier in {args.frontier}")
    elif args.compare:
        o = run_search(compare_request(req))
        frontier = o.report
        est.against_frontier = compare(frontier.frontier, est)
    plan, b = est.plan, est.breakdown
    print(f"{plan.model} on {plan.cluster}, global batch {plan.global_batch}"
          + (f", seq {plan.seq_len}" if plan.seq_len else "") + f", {plan.precision}")
    print(f"plan: {est.description}")
    print(f"      {plan.summary}")
    fits = (f"fits the {format_size(est.memory_budget_bytes)} budget" if est.fits_budget
            else f"OVER the {format_size(est.memory_budget_bytes)} budget")
    print(f"time per iteration   {_ms(est.time_s)} ms")
    print(f"memory per device    {format_size(est.memory_bytes)} ({fits})")
    print(f"  params {format_size(b.params)}, grads {format_size(b.grads)}, optimizer {format_size(b.optimizer)}, "
          f"activations {format_size(b.activations)}, buffers {format_size(b.buffers)}")
    print(f"model FLOPs          {est.model_flops:.4g} per iteration (3 x forward, recomputation not counted)")
    print(f"MFU                  {_mfu(est.mfu)} of {est.devices} x {est.peak_flops / 1e12:.4g} TFLOP/s "
          f"({plan.precision} peak)")
    print(est.confidence.message)
    print("launchable: yes" if est.launchable else f"launchable: no: {est.not_launchable_reason}")
    for note in est.notes:
        print(f"note: {note}")
    if est.fallbacks:
        print(f"note: {len(est.fallbacks)} ops replicate where the planned split does not divide: "
              f"{', '.join(est.fallbacks[:5])}{', ...' if len(est.fallbacks) > 5 else ''}")
    if est.against_frontier is not None and frontier is not None:
        a = est.against_frontier
        print(f"against the frontier ({a.points} points): {a.message}")
        if a.dominated_by is not None:
            dom = frontier.frontier[a.dominated_by]
            print(f"  #{a.dominated_by}: {_ms(dom.time_s)} ms, {format_size(dom.memory_bytes)}, MFU {_mfu(dom.mfu)}  "
                  f"{dom.plan['summary']}")
    if args.json_out:
        _write(args.json_out, est.model_dump_json(indent=1))
        print(f"wrote {args.json_out}")
    return 0


def _mfu(m: float | None) -> str:
    from search.plans.flops import format_mfu

    return format_mfu(m)


def _print_profile_use(use: dict, plans: list) -> None:
    est = sum(1 for p in plans if p.predicted.estimated)
    n_est = use["signatures_estimated"]
    print(f"costs from the {use['device']} profile{' (calibrated)' if use['calibrated'] else ''}: "
          f"{use['signatures_measured']} op signatures measured, {n_est} priced from the roofline"
          + (f", collectives without a fit: {', '.join(use['collectives_estimated'])}"
             if use["collectives_estimated"] else "")
          + f"; {est} of {len(plans)} plans carry estimated costs")


def _profile(args: argparse.Namespace) -> int:
    from profiler.collectives import CollectiveBenchmarkError
    from search import load_profile

    if not args.out:
        raise InputError("--out is required: the profile JSON to write")
    _check_writable(args.out)
    if args.calibrate:
        from profiler.calibrate import calibrate, load_report

        if not args.profile:
            raise InputError("--calibrate needs --profile: the profile to calibrate")
        prof = load_profile(args.profile)
        reports = [load_report(r) for r in args.calibrate]
        res = calibrate(reports, prof, names=list(args.calibrate))
        res.profile.dump(args.out)
        for name, why in res.skipped.items():
            print(f"skipped {name}: {why}")
        print(res.line())
        print(f"wrote {args.out}")
        return 0
    if args.profile:
        raise InputError("--profile is for --calibrate; to extend a profile use --base")
    if args.devices is None:
        raise InputError("--devices is required: how many devices the search will plan for")
    from profiler.run import run_profile

    base = load_profile(args.base) if args.base else None
    try:
        prof, summary = run_profile(args.model, args.devices, device=args.device,
                                    devices_per_node=args.devices_per_node, global_batch=args.global_batch,
                                    seq_len=args.seq_len, precision=args.precision, base=base,
                                    collectives_only=args.collectives_only, repeats=args.repeats,
                                    threads=args.threads, progress=sys.stderr.isatty())
    except CollectiveBenchmarkError as e:
        print(f"paretoplan: {e}", file=sys.stderr)
        return 1
    prof.dump(args.out)
    where = f"{args.devices} x {prof.device}" + (f", {args.model}" if args.model and not args.collectives_only else "")
    print(f"profiled {where}: {summary.line()}")
    if summary.failed:
        for sig, why in list(summary.failed.items())[:5]:
            print(f"  not timed (roofline): {sig}: {why}")
    print(f"wrote {args.out} ({len(prof.ops)} op signatures, {len(prof.collectives)} collective fits)")
    return 0


def _run(args: argparse.Namespace) -> int:
    """`paretoplan run`: pick a plan (searched here or read), launch it, print predicted vs measured;
    with --resize, --checkpoint-every and --resume it checkpoints, resizes and recovers (worker.elastic)."""
    import signal

    from worker.elastic import Control, Elastic, RunStopped, check_resizes, run_plan
    from worker.launch import RunFailed, default_device, format_table
    from worker.spec import RunSettings

    if args.steps < 1:
        raise InputError(f"--steps must be at least 1, got {args.steps}")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise InputError(f"--checkpoint-every must be at least 1, got {args.checkpoint_every}")
    resizes = _resizes(args.resize)
    check_resizes(resizes, args.steps)
    if args.report:
        _check_writable(args.report)
    resume = Path(args.resume) if args.resume else None
    if resume is not None and not resume.is_dir():
        raise InputError(f"--resume {args.resume}: not a run directory")
    device = default_device()
    plan = _run_plan_from_search(args, device) if args.model else _run_plan_from_file(args)
    settings = RunSettings(steps=args.steps, warmup=min(args.warmup, max(args.steps - 1, 0)), seed=args.seed,
                           lr=args.lr, device=device)
    control = Control()
    elastic = Elastic(run_dir=Path(args.checkpoint_dir) if args.checkpoint_dir else resume, every=args.checkpoint_every,
                      resizes=resizes, replan=_replanner(args, plan, device), control=control, resume=resume,
                      on_note=lambda m: print(f"paretoplan: {m}", file=sys.stderr))
    # SIGTERM: save at the next step boundary, then stop (resumable with --resume)
    previous = signal.signal(signal.SIGTERM, lambda *_: control.stop("SIGTERM"))
    try:
        report = run_plan(plan, settings=settings, elastic=elastic, show_progress=not args.no_progress,
                          max_procs=args.max_procs, timeout=args.timeout)
    except RunFailed as e:
        print(f"paretoplan: run failed: {str(e).splitlines()[0]}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except RunStopped as e:
        print(f"paretoplan: {e}; go on with the same command and --resume {Path(e.checkpoint).parent}", file=sys.stderr)
        return EXIT_STOPPED
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(format_table(report))
    if len(report.segments) > 1:
        print(format_segments(report))
    for note in report.notes:
        print(f"note: {note}")
    if plan.predicted.priced_from == "catalog":  # what it was measured against is the catalog's price
        from search.prices.accuracy import confidence

        print(f"note: {confidence('catalog', plan.model, plan.num_devices).message}")
    if args.report:
        _write(args.report, report.model_dump_json(indent=1))
    return 0


def _resizes(text: str | None) -> list[tuple[int, int]]:
    """`--resize 8:2,16:4` as [(8, 2), (16, 4)]."""
    if not text:
        return []
    out = []
    for part in text.split(","):
        step, _, devices = part.strip().partition(":")
        if not (step.strip().isdigit() and devices.strip().isdigit()):
            raise InputError(f"--resize takes STEP:DEVICES pairs separated by commas, e.g. 8:2,16:4; got {part!r}")
        out.append((int(step), int(devices)))
    return out


def format_segments(report) -> str:
    """One line per segment: steps, devices, plan, what the resize took."""
    lines = [f"{'segment':>7} {'steps':>11} {'devices':>7} {'save':>8} {'re-plan':>8} {'restart':>8} {'load':>8}  plan"]
    for i, seg in enumerate(report.segments):
        t = seg.resize_s
        cells = (f"{t.save_s:>7.2f}s {t.replan_s:>7.2f}s {t.restart_s:>7.2f}s {t.load_s:>7.2f}s" if t
                 else f"{'-':>8} {'-':>8} {'-':>8} {'-':>8}")
        what = f"{seg.cause}, {seg.ended}" + (f": {seg.error}" if seg.error else "")
        lines.append(f"{i:>7} {f'{seg.from_step}-{seg.to_step}':>11} {seg.devices:>7} {cells}  "
                     f"{seg.plan_summary} ({what})")
    lines.append(f"{len(report.segments)} segments, {report.restarts} restarts; losses of all {report.steps} steps "
                 f"in one list")
    return "\n".join(lines)


def _run_plan_from_search(args: argparse.Namespace, device: str, devices: int | None = None,
                          global_batch: int | None = None):
    """Search this machine (catalog device 'cpu' with N processes when there is no GPU) and pick."""
    from pydantic import ValidationError

    from search import SearchRequest, run_search

    if device == "cuda" and args.device is None:
        raise InputError("this machine has GPUs: name their catalog type with --device (see `paretoplan devices`)")
    fields: dict = dict(model=args.model, device=args.device or "cpu", devices=devices or args.devices,
                        devices_per_node=args.devices_per_node, memory_budget=args.memory_budget,
                        global_batch=global_batch or args.global_batch, seq_len=args.seq_len,
                        precision=args.precision or ("fp32" if device == "cpu" else "bf16"),
                        zero_stages=list(_zero_stages(args.zero)), recompute=not args.no_recompute,
                        # the plan picked here is launched at once: search only what the executor runs as
                        # priced (it refuses some pipelines: fp16, a tied parameter split over the tensor
                        # axis across stages); gradient accumulation it runs
                        pipeline=False, grad_accumulation=True, time_target=args.time_target)
    if args.profile:
        fields["profile"] = _read_json(args.profile, "profile")
        if args.device is None:
            fields.pop("device")
    try:
        req = SearchRequest(**fields)
    except ValidationError as e:
        raise invalid(e, "arguments", _as_flag) from None
    o = run_search(req)
    report = o.report.model_dump()
    return _pick(report, args.pick or "budget")


def _replanner(args: argparse.Namespace, plan, device: str):
    """How a resize re-plans: the same search for the new device count (the global batch the run
    trains with kept), and the same pick rule (a frontier index or a baseline name, which mean
    nothing on another frontier, becomes the fastest within the budget)."""
    def replan(devices: int):
        if args.model:
            return _run_plan_from_search(args, device, devices=devices, global_batch=plan.global_batch)
        from pydantic import ValidationError

        from search import SearchRequest, run_search

        try:
            req = SearchRequest(model=plan.model, device=plan.device, devices=devices, global_batch=plan.global_batch,
                                seq_len=plan.seq_len, precision=plan.precision, pipeline=False, grad_accumulation=True,
                                time_target=args.time_target)
        except ValidationError as e:
            raise invalid(e, f"re-planning for {devices} devices") from None
        pick = args.pick if args.pick in ("fastest", "leanest") else "budget"
        return _pick(run_search(req).report.model_dump(), pick)

    return replan


def _run_plan_from_file(args: argparse.Namespace):
    data = _read_json(args.plan, "plan")
    if isinstance(data, dict) and "frontier" in data:
        return _pick(data, args.pick if args.pick is not None else "budget")
    if args.pick is not None:
        raise InputError("--pick chooses from a frontier JSON; --plan names a single Plan")
    if isinstance(data, dict) and isinstance(data.get("plan"), dict) and "launchable" in data:  # `estimate --json`
        return _as_plan(data["plan"], f"{args.plan}: the estimate's plan")
    return _as_plan(data, args.plan)


def _as_plan(data: object, origin: str):
    from pydantic import ValidationError

    from search import Plan

    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        raise invalid(e, f"{origin}: not a Plan") from None


def _pick(report: dict, pick: str):
    """A Plan from a FrontierReport dict: fastest, leanest, budget, a frontier index or a baseline name."""
    frontier = report.get("frontier") or []
    if not frontier:
        raise InputError("the frontier is empty")
    bases = {b["name"]: b["plan"] for b in report.get("baselines") or []}
    if pick == "fastest":
        return _as_plan(frontier[0]["plan"], "frontier point 0")
    if pick == "leanest":
        return _as_plan(frontier[-1]["plan"], f"frontier point {len(frontier) - 1}")
    if pick == "budget":
        i = report.get("picked")
        if i is None and report.get("time_target_s") is not None:
            least = min(e["memory_bytes"] for e in frontier)
            raise NoFeasiblePlan(_no_plan_in_time(report), int(least))
        if i is None:
            least = min(e["memory_bytes"] for e in frontier)
            from search import format_size

            raise NoFeasiblePlan(f"no plan fits the memory budget of {format_size(int(report['memory_budget_bytes']))} "
                                 f"per device; the leanest plan needs {format_size(int(least))}", int(least))
        return _as_plan(frontier[i]["plan"], f"frontier point {i}")
    if pick.isdigit():
        i = int(pick)
        if i >= len(frontier):
            raise InputError(f"--pick {i}: the frontier has {len(frontier)} plans (0-{len(frontier) - 1})")
        return _as_plan(frontier[i]["plan"], f"frontier point {i}")
    if pick in bases:
        return _as_plan(bases[pick], f"baseline {pick!r}")
    known = ", ".join(["fastest", "leanest", "budget", "N", *bases])
    raise InputError(f"--pick {pick!r}: expected one of {known}")


def _no_plan_in_time(report: dict) -> str:
    """Why a time target picked nothing: the fastest plan within the budget, or none at all."""
    from search import format_size

    budget = float(report["memory_budget_bytes"])
    fitting = [e["time_s"] for e in report.get("frontier") or [] if e["memory_bytes"] <= budget]
    where = (f"the fastest plan within it takes {_ms(min(fitting))} ms" if fitting
             else "no plan fits that budget at all")
    return (f"no plan fits the memory budget of {format_size(int(budget))} per device and runs an iteration within "
            f"{_ms(float(report['time_target_s']))} ms; {where}")


def _read_json(path: str, what: str) -> object:
    p = Path(path)
    if what == "HF config" and p.is_dir():
        p = p / "config.json"
    return read_json(p, f"{what} file")


def _job_fields(args: argparse.Namespace) -> dict:
    """The model, cluster and job flags (`_add_job_flags`) as JobRequest fields."""
    fields: dict = dict(devices=args.devices, devices_per_node=args.devices_per_node,
                        memory_budget=args.memory_budget, global_batch=args.global_batch, seq_len=args.seq_len,
                        precision=args.precision)
    if args.device is not None:
        fields["device"] = args.device
    if args.profile:
        from search import load_profile

        fields["profile"] = load_profile(args.profile).model_dump(mode="json")  # errors name the file
    if args.cluster:
        fields["cluster"] = _read_json(args.cluster, "cluster")
    if args.model:
        fields["model"] = args.model
    elif args.hf_config:
        p = Path(args.hf_config)
        fields["hf_config"] = _read_json(args.hf_config, "HF config")
        fields["name"] = p.name if p.is_dir() else (p.parent.name or p.stem) if p.name == "config.json" else p.stem
    else:
        fields["graph"] = _read_json(args.graph, "graph")
    return fields


def _request(args: argparse.Namespace):
    """The CLI's flags as the SearchRequest the service takes too (one validation path)."""
    from pydantic import ValidationError

    from search import SearchRequest

    fields = _job_fields(args)
    fields.update(eps=args.eps, zero_stages=list(_zero_stages(args.zero)), recompute=not args.no_recompute,
                  baselines=not args.no_baselines, pipeline=not args.no_pipeline,
                  grad_accumulation=not args.no_accumulation,
                  allow_async_pipeline=args.allow_async_pipeline, interleave=args.interleave,
                  tensor_2d=args.tensor_2d, exhaustive=args.exhaustive,
                  reuse_blocks=not args.no_block_reuse, time_target=args.time_target)
    try:
        return SearchRequest(**fields)
    except ValidationError as e:
        raise invalid(e, "arguments", _as_flag) from None


def _zero_stages(text: str) -> tuple[int, ...]:
    try:
        stages = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        stages = ()
    if not stages or any(s not in (0, 1, 2, 3) for s in stages):
        raise InputError(f"--zero takes stages 0-3 separated by commas, got {text!r}")
    return stages


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms >= 0.1 else f"{ms:.4f}"


def _print_baselines(result, bases) -> None:
    from search import format_size
    from search.plans.baselines import against_frontier

    print()
    print(f"{'baseline (same cost model)':<30} {'time/iter':>11} {'memory':>10}   frontier at its memory / at its time")
    for b in bases:
        d = against_frontier(result.points, b)
        faster = f"#{d['faster_point']} {d['speedup']:.2f}x faster" if d["speedup"] else "-"
        leaner = f"#{d['leaner_point']} {d['memory_ratio']:.2f}x less memory" if d["memory_ratio"] else "-"
        print(f"{b.name:<30} {_ms(b.time_s):>8} ms {format_size(int(b.memory_bytes)):>10}   {faster} / {leaner}")
    for b in result.stats.get("infeasible_baselines", []):
        print(f"{b['name']:<30} {'infeasible':>11} {'':>10}   {b['reason']}")


def _check_writable(path: str) -> None:
    """An output path that can take a file, checked before the work that produces it: a missing
    folder or a directory (`--json out/`) would otherwise fail only after the whole search."""
    p = Path(path)
    if path.endswith(("/", "\\")) or p.is_dir():
        raise InputError(f"cannot write {path!r}: it is a directory; give a file name, e.g. {str(p / 'out.json')!r}")
    if not p.resolve().parent.is_dir():
        raise InputError(f"cannot write {path!r}: folder {str(p.parent)!r} does not exist")


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise InputError(f"cannot write {path!r}: {e.strerror or e}") from None


def _sample(points, k: int) -> list[int]:
    """k rows spread evenly along the frontier's curve (arc length in log time and log memory),
    so a frontier with a long flat tail still shows its knee."""
    import numpy as np

    n = len(points)
    if n <= k:
        return list(range(n))
    t = np.log([max(p.time_s, 1e-300) for p in points])
    m = np.log([max(p.memory_bytes, 1.0) for p in points])
    t = (t - t.min()) / (np.ptp(t) or 1.0)
    m = (m - m.min()) / (np.ptp(m) or 1.0)
    arc = np.concatenate([[0.0], np.cumsum(np.hypot(np.diff(t), np.diff(m)))])
    targets = np.linspace(0.0, arc[-1], k)
    return sorted({int(i) for i in np.searchsorted(arc, targets, side="left").clip(0, n - 1)} | {0, n - 1})


def _print_table(result, best, budget: float, capture_s: float, show_all: bool,
                 time_target_s: float | None = None) -> None:
    from search import build_plans, format_size

    pts = result.points
    rows = list(range(len(pts))) if show_all else _sample(pts, 20)
    best_i = pts.index(best) if best is not None else None
    if best_i is not None and best_i not in rows:
        rows = sorted(rows + [best_i])
    print(f"{result.graph.name}: {result.graph.param_count():,} parameters, {len(result.graph.ops)} ops, "
          f"global batch {result.job.global_batch}, {result.job.precision}, on {result.cluster.describe()}")
    print(f"{'':2}{'#':>5} {'time/iter':>12} {'memory/device':>14} {'MFU':>7}  plan")
    plans = build_plans(result, [pts[i] for i in rows])
    for i, plan in zip(rows, plans, strict=True):
        p = pts[i]
        mark = "*" if i == best_i else (" " if p.memory_bytes <= budget else "!")
        print(f"{mark:2}{i:>5} {_ms(p.time_s):>9} ms {format_size(int(p.memory_bytes)):>14} {_mfu(plan.predicted.mfu):>7}  "
              f"{plan.summary}")
    shown = "" if len(rows) == len(pts) else f" (showing {len(rows)}; --all for every point)"
    rule = (f"leanest within {_ms(time_target_s)} ms per iteration that fits" if time_target_s is not None
            else "fastest that fits")
    print(f"{len(pts)} Pareto-optimal plans{shown}; '*' {rule} {format_size(int(budget))}, '!' over budget")
    mode = "exhaustive" if result.stats.get("exhaustive") else ("exact" if result.eps == 0 else f"eps={result.eps}")
    zeros = ",".join(str(z) for z in result.stats.get("zero_stages", [0]))
    n_meshes = len(result.stats.get("meshes", []))
    print(f"search ({mode}) took {result.search_seconds:.3f} s over {n_meshes} mesh{'es' if n_meshes != 1 else ''} "
          f"x ZeRO stages {zeros}{' with per-layer recomputation' if result.stats.get('recompute') else ''}; "
          f"capture {capture_s:.2f} s")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
