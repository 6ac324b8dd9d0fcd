"""The SGLang runtime: a local SGLang server (CPU engine, installed by install_sglang.sh) per
run, or one at --url.

The server runs the SGLang virtualenv's python (never the harness's) with SGLang's CPU engine
(SGLANG_USE_CPU_ENGINE=1) and the harness's `sgl_kernel` CPU stand-in on its PYTHONPATH. It
listens on 127.0.0.1 only, in its own process group (SGLang forks a scheduler and a detokenizer),
with a private TMPDIR, and is stopped (SIGTERM to the group, then SIGKILL) however the run ends.

Every local server runs streaming sessions (`--enable-streaming-session`), through which the
adapter pins a paused trajectory's KV (keep); keep-evictable is the radix cache's own evictable
tokens, recompute a fresh extra_key. `keep-preferred` is a server policy of this runtime: radix
sessions (`--enable-session-radix-cache`) give each trajectory's context soft retention under
keep-evictable. The scheduler of a local server carries the pin-release valve
(sglang_site/harness_pin_valve.py, on its PYTHONPATH, in the --pin-release order): when idle
sessions' pins stall a full pool, it closes them until the scheduler can go on. This CPU
setup is not supported upstream; SGLang and torch are pinned in install_sglang.sh to the
releases it was verified with.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.adapters.base import (
    PolicyRealisation,
    RuntimeSession,
    ServerDetails,
    ServerInfo,
    ServerOptions,
)
from harness.adapters.http import HttpClient
from harness.adapters.launchers.installs import LAUNCHERS, script_output, tiny_model
from harness.adapters.launchers.process import ServerProcess, pinned
from harness.adapters.models import hf_geometry, model_record
from harness.adapters.sglang import SglangAdapter
from harness.adapters.sglang_sessions import SESSION_TIMEOUT_S

VALVE_ENV = "HARNESS_SGLANG_PIN_RELEASE"  # read by sglang_site/harness_pin_valve.py

SERVED_NAME = "tiny"
STAND_IN = LAUNCHERS / "sgl_kernel_cpu"  # holds the `sgl_kernel` stand-in package
SITE = LAUNCHERS / "sglang_site"  # the pin-release valve, patched into SGLang's scheduler
HICACHE_UNSUPPORTED = (
    "SGLang 0.5.23's HiCache (--enable-hierarchical-cache) does not run on its CPU engine: the "
    "host KV pool is registered with cudaHostRegister (torch.cuda.cudart() fails with 'Found no "
    "NVIDIA driver'), and its transfers use sgl_kernel.kvcacheio CUDA/XPU kernels")

LEAKED_SHM = ("sglang_loads_", "sem.mp-")  # shared-memory names its processes leave when killed
KEEP_PREFERRED = "keep-preferred"  # the server policy of radix sessions (soft retention)


@dataclass(frozen=True)
class ServerPolicy:
    """How one harness policy name is realised on SGLang."""

    harness_policy: str  # what the executor runs per pause
    label: str  # what run.json says was measured


SERVER_POLICIES: dict[str, ServerPolicy] = {
    "keep": ServerPolicy(
        "keep", "keep: each trajectory's calls run in a streaming session "
        "(--enable-streaming-session), which pins its KV (out of the radix cache's eviction, "
        "blocking admission of other requests) until the trajectory ends"),
    "keep-evictable": ServerPolicy(
        "keep-evictable", "keep-evictable: radix cache on; a paused request's KV stays in the "
        "radix tree as evictable cached tokens (not pinned: memory pressure may evict them)"),
    "recompute": ServerPolicy(
        "recompute", "recompute: a fresh extra_key (SGLang's cache salt) on every resumed call, "
        "so no cached prefix matches and the whole context is prefilled again; the old KV stays "
        "in the radix tree as evictable tokens until memory pressure evicts it (radix cache on)"),
    "swap": ServerPolicy(
        "swap", f"swap: not run -- {HICACHE_UNSUPPORTED}; every swap decision is recorded as "
        "unsupported and the context stays where it was (pinned in its streaming session)"),
    "ttl": ServerPolicy(
        "ttl", "ttl: each pause keeps the context pinned in its streaming session; at tau the "
        "harness closes the session itself (the server's session timeout is only a safety net) "
        "and the resumed call carries a fresh extra_key (after=recompute); after=swap decisions "
        "are recorded as unsupported"),
    KEEP_PREFERRED: ServerPolicy(
        "keep-evictable", "keep-preferred: radix sessions (--enable-session-radix-cache): each "
        "trajectory's calls carry its session_id, and its context is retained softly (it "
        "survives plain traffic, other sessions' traffic may evict it); the harness leaves "
        "each pause to the radix cache (keep-evictable) and closes the session at the "
        "trajectory's end"),
}


def server_policy(policy: str) -> ServerPolicy:
    """The SGLang realisation of `policy` on a local CPU server; other per-pause policies
    (threshold, min-waste, ...) run on the harness with keep (a pinned streaming session),
    keep-evictable and recompute (swap decisions are recorded as unsupported)."""
    return SERVER_POLICIES.get(policy) or ServerPolicy(
        policy, f"{policy}: decided per pause by the harness; keep (a pinned streaming "
        "session), keep-evictable (the radix cache) and recompute (a fresh extra_key) execute, "
        "swap decisions are recorded as unsupported")


def sglang_python() -> Path:
    """The SGLang virtualenv's python: $HARNESS_SGLANG_PYTHON, or installed once and cached."""
    return script_output("install_sglang.sh", "HARNESS_SGLANG_PYTHON")


def sglang_model(python: Path) -> Path:
    """The local random-weight model: $HARNESS_SGLANG_MODEL, or made once by the shared
    make_tiny_model.py (run with SGLang's python; the same recipe as the vLLM side's)."""
    return tiny_model(python, "HARNESS_SGLANG_MODEL")


@dataclass
class SglangServerConfig:
    model: Path
    context_length: int = 4096
    max_total_tokens: int = 65536  # the KV pool in tokens (SGLang's default fills the memory)
    disable_radix_cache: bool = False  # every request prefilled in full, KV freed at finish
    streaming_sessions: bool = True  # what the adapter pins a paused context with (keep)
    session_radix_cache: bool = False  # radix sessions: soft retention (keep-preferred)
    max_running_requests: int | None = None
    extra_args: list[str] = field(default_factory=list)
    server_cpus: str | None = None  # taskset list for the server, e.g. "1"
    # The order in which the scheduler's pin-release valve closes idle streaming sessions
    # when their pins stall a full pool (harness.policies.pin_release); None: no valve.
    pin_release: str | None = None


class LocalSglangServer(ServerProcess):
    """Context manager: a running SGLang server; `url`, `flags`, `env`, `start_s` describe it."""

    def __init__(self, config: SglangServerConfig, log_path: Path, python: Path | None = None,
                 startup_timeout_s: float = 300.0) -> None:
        self.config = config
        self.python = python or sglang_python()
        self.startup_timeout_s = startup_timeout_s
        # SGLang's per-model import notes are left out of the log tails errors show.
        super().__init__("SGLang", log_path, "harness-sglang-", LEAKED_SHM,
                         lambda ln: "Ignore import error" not in ln)
        c = config
        self.flags = [
            "--model-path", str(c.model), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu",
            "--attention-backend", "torch_native", "--disable-cuda-graph",
            # without it the CPU engine's decode crawls
            "--disable-overlap-schedule",
            "--enable-metrics", "--enable-cache-report",
            # the idle scheduler busy-polls a whole core without it (woken at once by a request)
            "--sleep-on-idle",
            "--context-length", str(c.context_length),
            "--max-total-tokens", str(c.max_total_tokens)]
        if c.disable_radix_cache:
            self.flags.append("--disable-radix-cache")
        if c.streaming_sessions:
            self.flags.append("--enable-streaming-session")
        if c.session_radix_cache:
            self.flags.append("--enable-session-radix-cache")
        if c.max_running_requests is not None:
            self.flags += ["--max-running-requests", str(c.max_running_requests)]
        self.flags += c.extra_args
        path = os.pathsep.join([str(STAND_IN), str(SITE)] + (
            [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        self.env = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": path,
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
                    "TMPDIR": str(self.tmp_dir)}
        if c.server_cpus:  # its OpenMP threads on its own CPUs (else SGLang binds them to all;
            # with them named it sizes no KV memory itself: --max-total-tokens always does)
            self.env["SGLANG_CPU_OMP_THREADS_BIND"] = c.server_cpus
        if c.pin_release and c.streaming_sessions:
            self.env[VALVE_ENV] = c.pin_release

    def command(self) -> list[str]:
        return pinned([str(self.python), "-m", "sglang.launch_server", *self.flags],
                      self.config.server_cpus)

    def __enter__(self) -> LocalSglangServer:
        self.start(self.command(), self.env, self.url + "/health", self.startup_timeout_s,
                   probe_timeout_s=5.0)
        return self


def remote_policy(policy: str, server_extra: dict[str, Any], url: str) -> ServerPolicy:
    """The realisation of `policy` on a running server, from what /server_info reported."""
    if policy == "swap" and server_extra.get("enable_hierarchical_cache"):
        return ServerPolicy("keep-evictable", f"swap via HiCache on the server at {url} "
                            "(host-memory KV tier, the server's own write and load-back "
                            "policy); the harness leaves each pause to the radix cache")
    sp = server_policy(policy)
    if server_extra.get("disable_radix_cache"):
        return ServerPolicy(sp.harness_policy, f"{sp.label} -- but the server at {url} runs "
                            "with --disable-radix-cache: keep and keep-evictable decisions are "
                            "recorded as unsupported, every call is prefilled in full")
    if policy == "swap":
        return ServerPolicy("swap", f"swap: the server at {url} runs without HiCache; every "
                            "swap decision is recorded as unsupported")
    if policy == KEEP_PREFERRED and not server_extra.get("enable_session_radix_cache"):
        return ServerPolicy(sp.harness_policy, f"{sp.label} -- but the server at {url} runs "
                            "without --enable-session-radix-cache: its calls carry no "
                            "retention, the radix cache alone decides")
    if not server_extra.get("enable_streaming_session") and policy != KEEP_PREFERRED:
        return ServerPolicy(sp.harness_policy, f"{sp.label} -- but the server at {url} runs "
                            "without --enable-streaming-session: nothing can be pinned, keep "
                            "decisions are recorded as unsupported")
    return sp


class SglangRuntime:
    """`harness run --runtime sglang`: keep (a pinned streaming session), keep-evictable and
    recompute per pause; swap only as a server's HiCache; keep-preferred as radix sessions."""

    name = "sglang"
    # Pinned like every local server: the process to the server's CPUs and its CPU engine's
    # OpenMP threads bound there (by default it binds them to every core, the harness's too).
    pins_local_server = True
    per_slot_control = False
    server_policies: dict[str, str] = {KEEP_PREFERRED: "keep-evictable"}
    default_policies = ("keep", "keep-evictable", "swap", "recompute")

    @contextmanager
    def start(self, options: ServerOptions, out: Path) -> Iterator[RuntimeSession]:
        """A local SGLang server (stopped on exit), or the one at options.url."""
        def realise(info: ServerInfo) -> PolicyRealisation:
            sp = (remote_policy(options.policy, info.extra, options.url) if options.url
                  else server_policy(options.policy))
            return PolicyRealisation(sp.harness_policy, sp.label)

        def connect(http: HttpClient) -> SglangAdapter:
            # --pin-expiry-s caps the sessions' timeouts (the pins' safety net)
            return SglangAdapter(http, salt=options.run_id,
                                 session_timeout_s=options.pins.expiry_s or SESSION_TIMEOUT_S)

        if options.url:
            yield RuntimeSession(ServerDetails(options.url), connect, realise)
            return
        python = sglang_python()
        model = options.model or sglang_model(python)
        geometry = hf_geometry(model)
        cfg = SglangServerConfig(model=model, context_length=options.ctx_per_slot,
                                 server_cpus=options.server_cpus,
                                 session_radix_cache=options.policy == KEEP_PREFERRED,
                                 pin_release=options.pins.release_order,
                                 extra_args=list(options.server_args))
        with LocalSglangServer(cfg, out / "server.log", python=python) as server:
            # KV in the model's dtype (SGLang's --kv-cache-dtype auto)
            details = ServerDetails(
                url=server.url, flags=server.flags, python=str(python), env=server.env,
                start_s=server.start_s, process=server.process_record(),
                model=model_record(model, geometry),
                extra={"streaming_sessions": cfg.streaming_sessions,
                       "session_radix_cache": cfg.session_radix_cache,
                       "pin_release": cfg.pin_release})
            yield RuntimeSession(details, connect, realise, server_exited=server.exit_reason)


RUNTIME = SglangRuntime()
