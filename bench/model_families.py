"""Every HuggingFace model family, from transformers' own default config and a tiny variant.

Per family: the default config (`AutoConfig.for_model(TYPE)`, random weights on the meta device)
searched on 64 H100s at global batch 64 and sequence 2,048 (or the model's positions if fewer):
parameters, capture seconds, search seconds (wall), CPU seconds of the whole request (capture,
search and plans), ops, frontier size, the fastest plan that fits 80 GiB and the leanest memory;
or the one-line refusal. Then the tiny variant (2 layers, width 64) searched on 4 CPU
processes, and its fastest and leanest plans launched on 4 gloo processes against one process
(losses step by step), or the reason they cannot run.

    python bench/model_families.py                      # everything (long: minutes per family)
    python bench/model_families.py --families llama,opt --no-run
    python bench/model_families.py --rest --families llama,gpt2   # each default config as a REST job

`--rest` submits each default config as a job (POST /api/jobs, baselines included) to a real
`paretoplan serve --no-auth` on loopback, with one local worker and a fresh SQLite database, and
records the state each job reaches (done, failed with its error, or the 422 refusal at submit).
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FAMILIES = ("llama llama4_text mistral mixtral qwen2 qwen2_moe qwen3 qwen3_moe qwen3_next gemma gemma2 gemma3_text "
            "phi phi3 phimoe falcon falcon_h1 falcon_mamba gpt_neox gptj gpt2 gpt_bigcode gpt_oss opt bloom mpt "
            "cohere cohere2 deepseek_v2 deepseek_v3 olmo olmo2 olmoe granite granitemoe jamba mamba mamba2 starcoder2 "
            "stablelm glm4 glm4_moe internlm3 minimax bert roberta t5 bart mbart whisper vit").split()

# the tiny variant: each size the family's config has, narrowed (aliases as transformers names them)
TINY = {"num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "hidden_size": 64, "n_embd": 64,
        "d_model": 64, "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "d_ff": 128,
        "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 128, "n_positions": 128,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "num_experts": 4,
        "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "word_embed_proj_dim": 64,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
        "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "image_size": 32, "patch_size": 8,
        "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "layer_types": None, "rotary_dim": 8,
        "pad_token_id": 0}
# dropout off: with it, no two shardings draw the same masks, and parity has no meaning
DROPOUT = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob",
           "dropout", "attention_dropout", "activation_dropout", "hidden_dropout", "resid_dropout",
           "embedding_dropout", "ffn_dropout", "attn_dropout", "summary_first_dropout", "classifier_dropout",
           "mlp_dropout", "emb_pdrop", "layer_norm_dropout", "dropout_rate", "encoder_layerdrop", "decoder_layerdrop")

# families whose training step draws random numbers that no config turns off: their runs are compared
# all the same, but a difference is the draws', not the plan's (each rank draws for its own tokens)
STOCHASTIC = {"phimoe": "its sparsemixer router samples experts (Gumbel) and masks its gradient at random "
                        "(Heun's method, rand > 0.75) in training; router_jitter_noise is only a threshold"}

H100S, BATCH, SEQ = 64, 64, 2048
GIB = 2**30


class TimedOut(Exception):
    pass


def _alarm(*_: object) -> None:
    raise TimedOut()


def tiny_config(family: str) -> dict[str, Any]:
    from transformers import AutoConfig

    base = AutoConfig.for_model(family).to_dict()
    cfg: dict[str, Any] = {"model_type": family}
    for k, v in TINY.items():
        if k in base and v is not None:
            cfg[k] = v
    for k in DROPOUT:
        if isinstance(base.get(k), float):
            cfg[k] = 0.0
    if "head_dim" in cfg and "hidden_size" not in base:
        cfg.pop("head_dim")
    if isinstance(base.get("expand"), int) and "num_heads" in cfg and "head_dim" in cfg:
        # Mamba-2: the heads tile the expanded width (hidden_size * expand == num_heads * head_dim)
        cfg["num_heads"] = cfg["hidden_size"] * base["expand"] // cfg["head_dim"]
    if "qk_rope_head_dim" in base:
        # multi-latent attention: head_dim is the rotary part's (derived from it), and every query
        # head has its own key and value, expanded from the latent (no grouped-query sharing)
        cfg.pop("head_dim", None)
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    return cfg


def _seq(family: str) -> int:
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(family)
    except ValueError:  # not a transformers model type: the search (or the service) refuses it by name
        return SEQ
    # an encoder-decoder's sequence is its decoder's (Whisper: 448 positions; its encoder reads 1,500 frames)
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "max_target_positions", None)
    return min(SEQ, positions) if isinstance(positions, int) and positions > 0 else SEQ


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:160]


def default_row(family: str, timeout: int) -> dict[str, Any]:
    from search.plans.api import SearchRequest, run_search

    row: dict[str, Any] = {"family": family}
    t0, cpu0 = time.perf_counter(), time.process_time()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        seq = _seq(family)
        o = run_search(SearchRequest(hf_config={"model_type": family}, name=family, device="h100-80gb",
                                     devices=H100S, global_batch=BATCH, seq_len=seq, baselines=False))
    except TimedOut:
        row["outcome"] = f"no answer in {timeout} s"
        return row
    except Exception as e:  # noqa: BLE001 - each family's refusal (or failure) is a row of the table
        row["outcome"] = _one_line(e)
        row["seconds"] = time.perf_counter() - t0
        return row
    finally:
        signal.alarm(0)
    row.update(seconds=time.perf_counter() - t0, cpu=time.process_time() - cpu0, search=o.result.search_seconds,
               params=o.report.params, capture=o.capture_seconds,
               ops=len(o.result.graph.ops), frontier=len(o.plans), seq=seq,
               leanest=min(p.memory_bytes for p in o.result.points))
    if o.best is not None:
        plan = o.plans[o.result.points.index(o.best)]
        row["outcome"] = "planned"
        row["fastest"] = f"{o.best.time_s:.2f} s, {o.best.memory_bytes / GIB:.0f} GiB: {plan.summary.split(' | ')[0]}"
    else:
        row["outcome"] = "no plan fits 80 GiB"
    return row


def tiny_row(family: str, timeout: int, run: bool) -> dict[str, Any]:
    from search.plans.api import SearchRequest, run_search
    from worker.analyze import analyze

    row: dict[str, Any] = {}
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        cfg = tiny_config(family)
        o = run_search(SearchRequest(hf_config=cfg, name=family, device="cpu", devices=4, devices_per_node=4,
                                     global_batch=8, seq_len=32, precision="fp32", baselines=False))
    except TimedOut:
        return {"tiny": f"no answer in {timeout} s"}
    except Exception as e:  # noqa: BLE001 - a row of the table
        return {"tiny": _one_line(e)}
    finally:
        signal.alarm(0)
    fastest = min(o.plans, key=lambda p: p.predicted.time_s)
    leanest = min(o.plans, key=lambda p: p.predicted.memory_bytes)
    row["tiny_frontier"] = len(o.plans)
    if not run:
        row["tiny"] = "searched (not run)"
        return row
    verdicts = []
    specs = {}
    for what, plan in (("fastest", fastest), ("leanest", leanest)):
        try:
            specs[what] = analyze(plan)
        except Exception as e:  # noqa: BLE001 - the refusal is the verdict
            verdicts.append(f"{what}: {_one_line(e)}")
    verdicts += _launch(specs)
    if family in STOCHASTIC:
        verdicts.append(f"random, no parity to expect: {STOCHASTIC[family]}")
    row["tiny"] = "; ".join(verdicts)
    return row


def parity(spec: Any, steps: int = 3) -> tuple[bool, float]:
    """Launch an ExecSpec for `steps` steps (one warm-up) and compare its losses with one
    process's: (at parity, the largest difference). A failed run raises."""
    from worker.launch import run_jobs
    from worker.reference import reference_losses
    from worker.spec import Job, RunSettings

    raw = run_jobs([Job(spec=spec, settings=RunSettings(steps=steps, warmup=1))], timeout=600)[0]
    ref = reference_losses(spec.model, steps, spec.global_batch, spec.seq_len, source=spec.source)
    diff = max(abs(a - b) for a, b in zip(raw["losses"], ref, strict=True))
    return diff < 2e-5 and all(math.isfinite(x) for x in raw["losses"]), diff


def _launch(specs: dict) -> list[str]:
    out = [f"{k}: needs {s.num_devices} processes" for k, s in specs.items() if s.num_devices != 4]
    for what, spec in specs.items():
        if spec.num_devices != 4:
            continue
        try:  # one launch per plan: a plan that fails does not hide the other's verdict
            ok, diff = parity(spec)
        except Exception as e:  # noqa: BLE001 - the run's failure is the verdict
            out.append(f"{what} run failed: {_one_line(e)} ({spec.summary.split(' | ')[0]})")
            continue
        out.append(f"{what} {'parity' if ok else 'NO parity'} ({diff:.0e}; {spec.summary.split(' | ')[0]})")
    return out


class Service:
    """`paretoplan serve --no-auth` on a free loopback port with one local worker and a fresh SQLite
    database, as a user would start it; stopped (with its worker) on exit."""

    def __init__(self, tmp: Path) -> None:
        cmd = [sys.executable, "-m", "paretoplan", "serve", "--port", "0", "--no-auth", "--workers", "1",
               "--db", f"sqlite:///{tmp / 'rest.db'}"]
        self.log = (tmp / "serve.log").open("w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=tmp)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # the server says where it listens once it does
            if m := re.search(r"serving on (http://\S+) ", line):
                self.url = m.group(1)
                return
        raise RuntimeError(f"paretoplan serve exited ({self.proc.wait()}); see {tmp / 'serve.log'}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # serve stops its worker on SIGINT
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def rest_state(client: Any, family: str, timeout: int) -> str:
    """The state a job from the family's default config reaches over REST: done, failed (its error),
    refused at submit (the 422's detail), or still pending after `timeout` seconds."""
    body = {"hf_config": {"model_type": family}, "name": family, "device": "h100-80gb", "devices": H100S,
            "global_batch": BATCH, "seq_len": _seq(family)}
    r = client.post("/api/jobs", json=body)
    if r.status_code != 201:
        return f"{r.status_code} at submit: {' '.join(str(r.json().get('detail')).split())[:140]}"
    job_id, end = r.json()["id"], time.monotonic() + timeout
    while (job := client.get(f"/api/jobs/{job_id}").json())["status"] not in ("done", "failed"):
        if time.monotonic() > end:
            return f"{job['status']} after {timeout} s"
        time.sleep(1)
    if job["status"] == "failed":
        return f"failed: {' '.join(str(job['error']).split())[:140]}"
    return f"done in {_seconds(job):.0f} s"


def _seconds(job: dict[str, Any]) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["created_at"])).total_seconds()


def rest_main(families: list[str], timeout: int) -> None:
    import httpx

    print("| family | REST job from the default config |")
    print("|---|---|")
    done = 0
    with tempfile.TemporaryDirectory(prefix="families-rest-") as tmp:
        service = Service(Path(tmp))
        try:
            with httpx.Client(base_url=service.url, timeout=60) as client:
                for family in families:
                    state = rest_state(client, family, timeout)
                    done += state.startswith("done")
                    print(f"| {family} | {state} |", flush=True)
        finally:
            service.stop()
    print(f"\n{done}/{len(families)} jobs done")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", help="comma-separated model types (default: all 51)")
    ap.add_argument("--no-run", action="store_true", help="search the tiny variants, do not launch them")
    ap.add_argument("--no-tiny", action="store_true", help="default configs only")
    ap.add_argument("--no-default", action="store_true", help="tiny variants only")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per search before a family counts as no answer")
    ap.add_argument("--rest", action="store_true", help="submit each default config to a local service instead")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()
    families = args.families.split(",") if args.families else FAMILIES
    if args.rest:
        rest_main(families, args.timeout)
        return
    print(f"| family | params | capture s | search s | CPU s | ops | frontier | fastest fitting plan on {H100S} H100 "
          f"(batch {BATCH}) | leanest | tiny variant on 4 gloo processes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    planned = 0
    for family in families:
        r = {"family": family, "outcome": "not searched"} if args.no_default else default_row(family, args.timeout)
        if not args.no_tiny:
            r.update(tiny_row(family, args.timeout, not args.no_run))
        planned += r["outcome"] == "planned"
        if "params" in r:
            cells = [f"{r['params'] / 1e9:.2f}B", f"{r['capture']:.1f}", f"{r['search']:.1f}", f"{r['cpu']:.1f}",
                     str(r["ops"]), str(r["frontier"]),
                     r.get("fastest", r["outcome"]), f"{r['leanest'] / GIB:.1f} GiB"]
        else:
            cells = ["-", "-", "-", "-", "-", "-", r["outcome"], "-"]
        print(f"| {family} | " + " | ".join(cells) + f" | {r.get('tiny', '-')} |", flush=True)
    print(f"\n{planned}/{len(families)} families planned within 80 GiB")


if __name__ == "__main__":
    main()
