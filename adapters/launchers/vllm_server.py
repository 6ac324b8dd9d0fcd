"""The vLLM runtime: a local vLLM server (CPU build, installed by install_vllm.sh) per run, or
one at --url.

The server runs the vLLM virtualenv's python (never the harness's), listens on 127.0.0.1 only, in
its own process group (vLLM forks an engine-core process), and is stopped (SIGTERM to the group,
then SIGKILL) however the run ends, with its private TMPDIR.

A local server always runs the harness's KV connector (`vllm_connector/harness_pause_connector`,
put on the server's PYTHONPATH), whatever the policy: through it the harness pins, unpins,
offloads to host memory and drops a paused context per pause (`SERVER_POLICIES`). A server at
--url offers those actions only if it was started with the same connector; the adapter asks it.
"""

from __future__ import annotations

import json
import os
import secrets
import urllib.request
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
from harness.adapters.launchers.installs import script_output, tiny_model
from harness.adapters.launchers.process import PROBE_ERRORS, ServerProcess, pinned
from harness.adapters.models import hf_geometry, local_vocab, model_record
from harness.adapters.vllm import (
    CONNECTOR_CLASS,
    CONNECTOR_KEY,
    CONNECTOR_MODULE,
    VllmAdapter,
    control_body,
    session_prefix,
)
from harness.policies.pin_release import DEFAULT_PIN_RELEASE

SERVED_NAME = "tiny"

LEAKED_SHM = ("sem.mp-", "psm_")  # shared-memory names its processes leave when killed
# The folder put on the server's PYTHONPATH: it holds the connector package alone.
CONNECTOR_DIR = Path(__file__).resolve().parent / "vllm_connector"
# Always on the server's PYTHONPATH: a sitecustomize that lets its processes use AMX tiles (vLLM's
# CPU attention kernel does on CPUs that have them, without asking Linux first: SIGILL).
SITE_DIR = Path(__file__).resolve().parent / "vllm_site"
PIN_TTL_S = 900.0  # a pin's or host copy's expiry when the harness sets none (a safety net)
HOST_CAP_BYTES = 1 << 30  # host memory for offloaded contexts


@dataclass(frozen=True)
class ServerPolicy:
    """How one harness policy name is realised on vLLM."""

    harness_policy: str  # what the executor runs per pause
    label: str  # what run.json says was measured


_PER_PAUSE = ("through the harness's KV connector: keep pins the context (an extra block "
              "reference, out of eviction until resumed, released or expired), keep-evictable "
              "leaves it to vLLM's evictable prefix cache, swap offloads it to host memory and "
              "restores it on the resumed call, recompute drops it and salts the resumed call")

SERVER_POLICIES: dict[str, ServerPolicy] = {
    "keep": ServerPolicy(
        "keep", "keep: pinned per pause through the harness's KV connector (an extra block "
        "reference: out of eviction until resumed, released or expired)"),
    "keep-evictable": ServerPolicy(
        "keep-evictable", "keep-evictable: vLLM's prefix cache; a paused request's blocks "
        "stay in the pool as evictable cached blocks (not pinned: memory pressure may evict "
        "them)"),
    "swap": ServerPolicy(
        "swap", "swap: offloaded per pause to host memory through the harness's KV connector "
        "(device blocks freed) and loaded back into new blocks on the resumed call"),
    "recompute": ServerPolicy(
        "recompute", "recompute: the connector drops the context and the resumed call carries "
        "a fresh cache_salt, so the whole context is prefilled again"),
}


def server_policy(policy: str) -> ServerPolicy:
    """The vLLM realisation of `policy`; per-pause policies (ttl, threshold, ...) choose per
    pause among all four actions."""
    if policy in SERVER_POLICIES:
        return SERVER_POLICIES[policy]
    note = ("; ttl pins the context, then at tau swaps it (after=swap) or drops it "
            "(after=recompute)" if policy == "ttl" else "")
    return ServerPolicy(policy, f"{policy}: decided per pause by the harness {_PER_PAUSE}{note}")


def vllm_python() -> Path:
    """The vLLM virtualenv's python: $HARNESS_VLLM_PYTHON, or installed once and cached."""
    return script_output("install_vllm.sh", "HARNESS_VLLM_PYTHON")


def vllm_model(python: Path) -> Path:
    """The local random-weight model: $HARNESS_VLLM_MODEL, or made once by make_tiny_model.py."""
    return tiny_model(python, "HARNESS_VLLM_MODEL")


@dataclass
class VllmServerConfig:
    model: Path
    max_model_len: int = 4096
    block_size: int = 32  # the CPU default is 128; 32 makes cache reuse finer-grained
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE
    num_gpu_blocks_override: int | None = None  # small: memory pressure, preemptions
    max_num_seqs: int | None = None
    pause_connector: bool = True  # the harness's KV connector (every policy uses it)
    pin_ttl_s: float = PIN_TTL_S
    host_cap_bytes: int = HOST_CAP_BYTES
    pin_release: str = DEFAULT_PIN_RELEASE  # the valve's order (harness.policies.pin_release)
    extra_args: list[str] = field(default_factory=list)
    server_cpus: str | None = None  # taskset list for the server, e.g. "1"

    def connector_record(self) -> dict[str, Any] | None:
        """The connector as run.json records it (None: the server runs none)."""
        if not self.pause_connector:
            return None
        return {"name": CONNECTOR_CLASS, "module": CONNECTOR_MODULE, "path": str(CONNECTOR_DIR),
                "default_ttl_s": self.pin_ttl_s, "host_cap_bytes": self.host_cap_bytes,
                "pin_release": self.pin_release}


class LocalVllmServer(ServerProcess):
    """Context manager: a running vLLM server; `url`, `flags`, `env`, `start_s` describe it."""

    def __init__(self, config: VllmServerConfig, log_path: Path, python: Path | None = None,
                 startup_timeout_s: float = 300.0) -> None:
        self.config = config
        self.python = python or vllm_python()
        self.startup_timeout_s = startup_timeout_s
        super().__init__("vLLM", log_path, "harness-vllm-", LEAKED_SHM)
        c = config
        self.flags = [
            "--model", str(c.model), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), "--enable-prefix-caching",
            "--dtype", "bfloat16", "--max-model-len", str(c.max_model_len),
            "--block-size", str(c.block_size), "--enforce-eager",
            "--enable-prompt-tokens-details", "--enable-per-request-metrics",
            "--disable-uvicorn-access-log"]
        if c.num_gpu_blocks_override is not None:
            self.flags += ["--num-gpu-blocks-override", str(c.num_gpu_blocks_override)]
        if c.max_num_seqs is not None:
            self.flags += ["--max-num-seqs", str(c.max_num_seqs)]
        self.env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": str(c.kv_cache_gib), "VLLM_SERVER_DEV_MODE": "1",
                    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                    "TMPDIR": str(self.tmp_dir)}
        if c.server_cpus:  # its OpenMP threads on its own CPUs (else vLLM binds them to all)
            self.env["VLLM_CPU_OMP_THREADS_BIND"] = c.server_cpus
        paths = [str(SITE_DIR)]
        if c.pause_connector:
            self.flags += ["--kv-transfer-config", json.dumps({
                "kv_connector": CONNECTOR_CLASS, "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_both", "kv_connector_extra_config": {
                    "default_ttl_s": c.pin_ttl_s, "host_cap_bytes": c.host_cap_bytes,
                    "pin_release": c.pin_release}})]
            paths.append(str(CONNECTOR_DIR))
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        self.env["PYTHONPATH"] = os.pathsep.join(paths)
        self.flags += c.extra_args

    def command(self) -> list[str]:
        return pinned([str(self.python), "-m", "vllm.entrypoints.openai.api_server",
                       *self.flags], self.config.server_cpus)

    def __enter__(self) -> LocalVllmServer:
        self.start(self.command(), self.env, self.url + "/health", self.startup_timeout_s)
        return self


def release_all(url: str, scope: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """Release every pin and host copy of the sessions of `scope` (a VllmAdapter's) on the
    server at `url` (the run's end, however it ended); the connector's answer, or None when the
    server did not give one (no connector, gone, or too slow)."""
    base = url.rstrip("/")
    try:
        with urllib.request.urlopen(base + "/v1/models", timeout=timeout_s) as r:
            model = str(json.loads(r.read())["data"][0]["id"])
        body = json.dumps(control_body(model, {"op": "release_all",
                                               "prefix": session_prefix(scope)})).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            answer = json.loads(r.read()).get("kv_transfer_params") or {}
    except PROBE_ERRORS + (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    found = answer.get(CONNECTOR_KEY) if isinstance(answer, dict) else None
    return found if isinstance(found, dict) else None


def server_config(options: ServerOptions, model: Path) -> VllmServerConfig:
    """A local server's settings for `options`: scheduling by call priority where the policy
    asks for program order (unless the extra flags choose a scheduling policy themselves)."""
    extra = list(options.server_args)
    if options.program_order and not any(a.startswith("--scheduling-policy") for a in extra):
        extra += ["--scheduling-policy", "priority"]  # program order travels as priorities
    pins = options.pins
    return VllmServerConfig(
        model=model, max_model_len=options.ctx_per_slot, server_cpus=options.server_cpus,
        extra_args=extra, pin_release=pins.release_order,
        pin_ttl_s=PIN_TTL_S if pins.expiry_s is None else pins.expiry_s,
        host_cap_bytes=HOST_CAP_BYTES if pins.host_cap_bytes is None else pins.host_cap_bytes)


def realisation(policy: str, info: ServerInfo) -> PolicyRealisation:
    """How `policy` runs on the server `info` describes: with the connector every action per
    pause; without it the label says what is recorded unsupported."""
    sp = server_policy(policy)
    if info.extra.get("scheduler_policy") == "priority":
        sp = ServerPolicy(sp.harness_policy, sp.label + "; waiting calls served by their "
                          "priority (--scheduling-policy priority)")
    if info.extra.get("pause_connector"):
        return PolicyRealisation(sp.harness_policy, sp.label)
    # Without the connector only the engine's own cache and a fresh salt are available.
    missing = ("; this server runs no harness KV connector: keep and swap decisions are "
               "recorded unsupported")
    return PolicyRealisation(sp.harness_policy, sp.label + missing)


class VllmRuntime:
    """`harness run --runtime vllm`: a server with the harness's KV connector, which executes
    every pause action per pause (SERVER_POLICIES)."""

    name = "vllm"
    # Pinned like every local server: the process to the server's CPUs and vLLM's CPU backend
    # told to bind its OpenMP threads there (by default it binds them to every core, the
    # harness's included, whose client then stalled 100-200 ms at a time).
    pins_local_server = True
    per_slot_control = False
    server_policies: dict[str, str] = {}
    # Pinned against the engine's own evictable cache is what the connector adds to compare.
    default_policies = ("keep", "keep-evictable", "swap", "recompute")

    @contextmanager
    def start(self, options: ServerOptions, out: Path) -> Iterator[RuntimeSession]:
        """A local vLLM server with the KV connector (stopped on exit), or the one at
        options.url (whatever the run left held on it is released on exit)."""
        # This client's sessions on the server: a run of several load generators shares its
        # run id (and salt), and each one's end releases only its own.
        scope = f"{options.run_id}-{secrets.token_hex(4)}"

        def session(details: ServerDetails, vocab: int | None) -> RuntimeSession:
            def connect(http: HttpClient) -> VllmAdapter:
                return VllmAdapter(http, salt=options.run_id, vocab_size=vocab, scope=scope)

            def realise(info: ServerInfo) -> PolicyRealisation:
                return realisation(options.policy, info)

            return RuntimeSession(details, connect, realise)

        if options.url:
            try:
                yield session(ServerDetails(options.url), None)
            finally:
                # The run's own end-of-run release: a pin or host copy that a killed run left
                # on a server that outlives it would otherwise wait for its expiry.
                release_all(options.url, scope)
            return
        python = vllm_python()
        model = options.model or vllm_model(python)
        geometry = hf_geometry(model)
        cfg = server_config(options, model)
        with LocalVllmServer(cfg, out / "server.log", python=python) as server:
            details = ServerDetails(
                url=server.url, flags=server.flags, python=str(python), env=server.env,
                start_s=server.start_s, process=server.process_record(),
                model=model_record(model, geometry))
            details.extra["kv_connector"] = cfg.connector_record()
            local = session(details, local_vocab(model))
            local.server_exited = server.exit_reason
            yield local


RUNTIME = VllmRuntime()
