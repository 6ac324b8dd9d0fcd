"""`harness run`: replay a trace against a runtime under one pause policy."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import click

from harness import __version__
from harness.errors import InputError
from harness.model.calibration import read_calibration
from harness.plan.injection import load_injection
from harness.plan.planner import Arrivals, make_plan
from harness.policies import POLICIES, ServerRates, make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.replay.clock import RealClock
from harness.replay.runner import dumps_for_run, replay
from harness.traces.validate import load_trajectories

RUNTIMES = ("llamacpp", "vllm")


def parse_kv(pairs: tuple[str, ...], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs:
        if "=" not in p:
            raise InputError(f"{flag} {p!r}: expected KEY=VALUE")
        k, v = p.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def model_geometry(model: Path | None) -> dict[str, Any] | None:
    """KV geometry from the GGUF's metadata, when the model file is on this machine."""
    if model is None:
        return None
    from harness.model.geometry import from_gguf

    try:
        return from_gguf(model).to_dict()
    except Exception as exc:  # geometry is metadata: a model we cannot parse still replays
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def pin_harness_cpu() -> str | None:
    """Keep the harness off the server's core on a 2+ core machine; returns the server's CPUs."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return None
    os.sched_setaffinity(0, {cpus[0]})
    return ",".join(str(c) for c in cpus[1:])


@dataclass
class RunOptions:
    """Everything one replay run needs; `harness run` and `harness bench` both build these."""

    trace: Path
    policy: str
    out: Path
    runtime: str = "llamacpp"
    url: str | None = None
    policy_args: dict[str, str] = field(default_factory=dict)
    inject: str = "none"
    arrivals: Arrivals = field(default_factory=Arrivals)
    seed: int = 0
    slots: int = 4
    ctx_per_slot: int = 4096
    threads: int = 1
    model: Path | None = None
    scrape_interval_s: float = 0.2
    calibration: Path | None = None


def execute_run(o: RunOptions, echo: Callable[[str], None] = click.echo) -> dict[str, Any]:
    """Validate inputs, plan, replay (starting a local server unless `url`); returns run.json."""
    pol = make_policy(o.policy, o.policy_args)
    steps = load_trajectories(o.trace)
    injection = load_injection(o.inject)
    plan = make_plan(steps, injection, o.arrivals, o.seed)
    a = o.arrivals
    run: dict[str, Any] = {
        "run_id": f"{o.policy}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
        "policy": o.policy, "policy_args": dict(o.policy_args),
        "policy_sees_true_latency": pol.sees_true_latency,
        "trace": {"path": str(o.trace), "sha256": file_sha256(o.trace),
                  "trajectories": len(plan.trajectories), "steps": int(len(steps))},
        "seed": o.seed, "injection": injection.as_dict(),
        "arrivals": {"mode": a.mode, "concurrency": a.concurrency, "rate": a.rate,
                     "time_scale": a.time_scale},
        "harness_version": __version__, "git_commit": git_commit(),
        "started_at": datetime.now(UTC).isoformat(),
    }
    cal = read_calibration(o.calibration) if o.calibration else None
    if o.calibration and cal:
        run["calibration"] = {"path": str(o.calibration), **cal.to_dict()}
    o.out.mkdir(parents=True, exist_ok=True)
    if o.runtime == "vllm":
        _run_vllm(o, plan, run, echo)
    elif o.url:
        echo("note: remote server: the harness cannot delete slot dump files on its disk; "
             "swap dumps are left to the server's --slot-save-path")
        run.update({"server_url": o.url, "server_flags": None})
        rates = cal.rates() if cal else FALLBACK_RATES
        asyncio.run(_run_remote(o.url, plan, pol, o.out, run, o.scrape_interval_s, rates))
    else:
        _run_local(plan, pol, o.out, run, o.scrape_interval_s, o.slots, o.ctx_per_slot,
                   o.threads, o.model, cal.rates() if cal else None)
    return run


def arrivals_from_flags(concurrency: int | None, rate: float | None, trace_timing: bool,
                        time_scale: float) -> Arrivals:
    if sum(x is not None and x is not False for x in (concurrency, rate, trace_timing)) > 1:
        raise InputError("choose one of --concurrency, --rate, --trace-timing")
    mode: Literal["closed", "poisson", "trace"] = (
        "poisson" if rate is not None else "trace" if trace_timing else "closed")
    return Arrivals(mode=mode, concurrency=concurrency or 4, rate=rate or 1.0,
                    time_scale=time_scale)


@click.command("run")
@click.option("--runtime", type=click.Choice(RUNTIMES), default="llamacpp", show_default=True)
@click.option("--url", help="A running server; without it a local one is started and stopped.")
@click.option("--trace", "trace_path", required=True, type=click.Path(path_type=Path))
@click.option("--policy", required=True, type=click.Choice(list(POLICIES)))
@click.option("--policy-arg", "policy_args", multiple=True, metavar="KEY=VALUE")
@click.option("--inject", default="none", show_default=True,
              help="Injection profile: none, slow-tools, abandoned-tools, chaos, or a TOML file.")
@click.option("--concurrency", type=int, help="Closed loop: N agents (default 4).")
@click.option("--rate", type=float, help="Open loop: Poisson arrivals per second.")
@click.option("--trace-timing", is_flag=True, help="Open loop: the trace's start_s.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Multiply arrivals, tool latencies and deadlines by this.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", required=True, type=click.Path(path_type=Path))
@click.option("--slots", type=int, default=4, show_default=True, help="Local server: -np.")
@click.option("--ctx-per-slot", type=int, default=4096, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--model", "model_path", type=click.Path(path_type=Path),
              help="Local server: GGUF model (default: SmolLM2-135M-Instruct).")
@click.option("--scrape-interval", type=float, default=0.2, show_default=True)
@click.option("--calibration", type=click.Path(path_type=Path),
              help="Rates from `harness calibrate` for the policies to price actions with.")
def run_cmd(runtime: str, url: str | None, trace_path: Path, policy: str,
            policy_args: tuple[str, ...], inject: str, concurrency: int | None,
            rate: float | None, trace_timing: bool, time_scale: float, seed: int, out: Path,
            slots: int, ctx_per_slot: int, threads: int, model_path: Path | None,
            scrape_interval: float, calibration: Path | None) -> None:
    """Replay TRACE against a runtime under POLICY and write a results directory."""
    opts = RunOptions(
        trace=trace_path, policy=policy, out=out, runtime=runtime, url=url,
        policy_args=parse_kv(policy_args, "--policy-arg"), inject=inject,
        arrivals=arrivals_from_flags(concurrency, rate, trace_timing, time_scale), seed=seed,
        slots=slots, ctx_per_slot=ctx_per_slot, threads=threads, model=model_path,
        scrape_interval_s=scrape_interval, calibration=calibration)
    run = execute_run(opts, lambda m: click.echo(m, err=True))
    _print_result(out, run)


async def _run_remote(url: str, plan: Any, pol: Any, out: Path, run: dict[str, Any],
                      scrape_interval: float, rates: ServerRates) -> None:
    from harness.adapters.llamacpp import LlamaCppAdapter, client_session

    async with client_session() as session:
        adapter = LlamaCppAdapter(session, url)
        await replay(adapter, RealClock(), plan, pol, out, run, rates, scrape_interval)


def _run_local(plan: Any, pol: Any, out: Path, run: dict[str, Any], scrape_interval: float,
               slots: int, ctx_per_slot: int, threads: int, model_path: Path | None,
               measured: ServerRates | None) -> None:
    from harness.adapters.launchers.llamacpp_server import (
        LlamaServerConfig,
        LocalLlamaServer,
        default_model,
    )
    from harness.adapters.llamacpp import LlamaCppAdapter, client_session

    model = model_path or default_model()
    server_cpus = pin_harness_cpu()
    cfg = LlamaServerConfig(model=model, slots=slots, ctx_per_slot=ctx_per_slot,
                            threads=threads, server_cpus=server_cpus)
    geometry = model_geometry(model)
    kv_bpt = float(geometry["kv_bytes_per_token"]) if geometry and \
        "kv_bytes_per_token" in geometry else FALLBACK_RATES.kv_bytes_per_token
    rates = measured or ServerRates(FALLBACK_RATES.prefill_tok_s,
                                    FALLBACK_RATES.swap_bytes_per_s, kv_bpt)
    t0 = time.monotonic()
    with LocalLlamaServer(cfg, out / "server.log") as server:
        run.update({
            "model": {"name": model.name, "path": str(model), "geometry": geometry,
                      "kv_bytes_per_token": kv_bpt if geometry else None},
            "server_flags": server.flags, "server_binary": str(server.binary),
            "cpu_pinning": {"server": server_cpus, "harness": sorted(os.sched_getaffinity(0))}
            if server_cpus else None,
            "server_start_s": round(time.monotonic() - t0, 3),
        })

        async def go() -> None:
            async with client_session() as session:
                adapter = LlamaCppAdapter(session, server.url, dump_dir=server.dump_dir)
                await replay(adapter, RealClock(), plan, pol, out, run, rates, scrape_interval,
                             leftover_dumps=dumps_for_run(server.dump_dir, run["run_id"]))

        asyncio.run(go())


def _run_vllm(o: RunOptions, plan: Any, run: dict[str, Any],
              echo: Callable[[str], None]) -> None:
    """vLLM: the policy is a server configuration (see vllm_server.SERVER_POLICIES)."""
    from harness.adapters.launchers.vllm_server import (
        LocalVllmServer,
        VllmServerConfig,
        model_vocab,
        server_policy,
        tiny_model,
        vllm_python,
    )
    from harness.adapters.vllm import VllmAdapter, client_session
    from harness.model.geometry import from_hf_config

    sp = server_policy(o.policy)
    pol = make_policy(sp.harness_policy, o.policy_args if sp.harness_policy == o.policy else {})
    run.update({"server_policy": sp.label, "harness_policy": sp.harness_policy,
                "kv_connector": sp.connector})

    async def go(url: str, vocab: int | None, rates: ServerRates) -> None:
        async with client_session() as session:
            adapter = VllmAdapter(session, url, salt=run["run_id"], vocab_size=vocab)
            run["server_extra"] = (await adapter.server_info()).extra
            await replay(adapter, RealClock(), plan, pol, o.out, run, rates, o.scrape_interval_s)

    if o.url:
        if sp.connector:
            echo(f"note: remote vLLM: {o.policy} needs the server started with a KV connector "
                 f"({sp.connector}); the harness keeps per pause")
            run["server_policy"] = f"{sp.label} -- if the server at {o.url} runs a connector"
        run.update({"server_url": o.url, "server_flags": None})
        asyncio.run(go(o.url, None, FALLBACK_RATES))
        return
    python = vllm_python()
    model = o.model or tiny_model(python)
    try:
        geometry: dict[str, Any] = from_hf_config(model / "config.json").to_dict()
    except InputError as exc:
        geometry = {"error": str(exc)[:200]}
    kv_bpt = float(geometry.get("kv_bytes_per_token", FALLBACK_RATES.kv_bytes_per_token))
    rates = ServerRates(FALLBACK_RATES.prefill_tok_s, FALLBACK_RATES.swap_bytes_per_s, kv_bpt)
    cfg = VllmServerConfig(model=model, max_model_len=o.ctx_per_slot, connector=sp.connector)
    with LocalVllmServer(cfg, o.out / "server.log", python=python) as server:
        run.update({"model": {"name": model.name, "path": str(model), "geometry": geometry},
                    "server_flags": server.flags, "server_env": server.env,
                    "server_python": str(python), "server_start_s": server.start_s})
        asyncio.run(go(server.url, model_vocab(model), rates))


def _print_result(out: Path, run: dict[str, Any]) -> None:
    o = run.get("outcome", {})
    click.echo(f"{run['policy']}: {o.get('completed', 0)} completed, "
               f"{o.get('cancelled', 0)} cancelled, {o.get('failed', 0)} failed in "
               f"{run.get('duration_s', 0):.1f}s -> {out}")
    c = run.get("cleanup") or {}
    if c.get("dump_files_left") or c.get("errors") or c.get("slots_idle") is False:
        click.echo(f"warning: cleanup incomplete: {c}", err=True)
