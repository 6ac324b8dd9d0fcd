"""The vLLM runtime: a local vLLM server (CPU build, installed by install_vllm.sh) per run, or
one at --url.

The server runs the vLLM virtualenv's python (never the harness's), listens on 127.0.0.1 only, in
its own process group (vLLM forks an engine-core process), and is stopped (SIGTERM to the group,
then SIGKILL) however the run ends. A KV connector's disk store lives in a private 0700 directory
that is removed at stop, with the server's private TMPDIR.

A pause policy is a server configuration on vLLM (`SERVER_POLICIES`): the client cannot pin,
save or restore a request's KV blocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.adapters.base import (
    PolicyRealisation,
    RuntimeSession,
    ServerDetails,
    ServerInfo,
    ServerOptions,
)
from harness.adapters.http import HttpClient
from harness.adapters.launchers.installs import script_output, tiny_model
from harness.adapters.launchers.process import ServerProcess, pinned
from harness.adapters.models import hf_geometry, local_vocab, model_record
from harness.adapters.vllm import VllmAdapter

SERVED_NAME = "tiny"

LEAKED_SHM = ("sem.mp-", "psm_")  # shared-memory names its processes leave when killed


@dataclass(frozen=True)
class ServerPolicy:
    """How one harness policy name is realised on vLLM."""

    harness_policy: str  # what the executor runs per pause
    connector: str | None  # KV connector the server runs with, if any
    label: str  # what run.json says was measured


SERVER_POLICIES: dict[str, ServerPolicy] = {
    "keep": ServerPolicy(
        "keep", None, "keep: prefix caching on; a paused request's blocks stay in the pool as "
        "evictable cached blocks (not pinned: memory pressure may evict them)"),
    "recompute": ServerPolicy(
        "recompute", None, "recompute: a fresh cache_salt on every resumed call, so the whole "
        "context is prefilled again (prefix caching on)"),
    "swap": ServerPolicy(
        "keep", "ExampleConnector", "swap via ExampleConnector (disk): the server stores each "
        "new prompt's KV blocks on disk and loads them back on an exact prompt match; the "
        "harness keeps per pause"),
}


def server_policy(policy: str) -> ServerPolicy:
    """The vLLM realisation of `policy`; per-pause policies (ttl, threshold, ...) run on the
    harness with keep and recompute only (a swap decision is recorded as unsupported)."""
    if policy in SERVER_POLICIES:
        return SERVER_POLICIES[policy]
    note = ("; at a ttl expiry the harness recomputes (a fresh cache salt: the resumed call "
            "cannot reuse the kept prefix), and ttl after=swap (its default) is recorded "
            "unsupported, so pass --policy-arg after=recompute" if policy == "ttl" else "")
    return ServerPolicy(
        policy, None, f"{policy}: decided per pause by the harness; keep and recompute execute, "
        f"swap decisions are recorded as unsupported (prefix caching on){note}")


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
    connector: str | None = None  # e.g. "ExampleConnector"
    extra_args: list[str] = field(default_factory=list)
    server_cpus: str | None = None  # taskset list for the server, e.g. "1"


class LocalVllmServer(ServerProcess):
    """Context manager: a running vLLM server; `url`, `flags`, `env`, `start_s` describe it."""

    def __init__(self, config: VllmServerConfig, log_path: Path, python: Path | None = None,
                 startup_timeout_s: float = 300.0) -> None:
        self.config = config
        self.python = python or vllm_python()
        self.startup_timeout_s = startup_timeout_s
        # tmp_dir: the server's TMPDIR (vLLM leaves files there) and the connector's store
        super().__init__("vLLM", log_path, "harness-vllm-", LEAKED_SHM)
        self.store_dir: Path | None = None
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
        if c.connector is not None:
            self.store_dir = self.tmp_dir / "kv-store"
            self.store_dir.mkdir(mode=0o700)
            self.flags += ["--kv-transfer-config", json.dumps({
                "kv_connector": c.connector, "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": str(self.store_dir)}})]
        self.flags += c.extra_args
        self.env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": str(c.kv_cache_gib), "VLLM_SERVER_DEV_MODE": "1",
                    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                    "TMPDIR": str(self.tmp_dir)}

    def command(self) -> list[str]:
        return pinned([str(self.python), "-m", "vllm.entrypoints.openai.api_server",
                       *self.flags], self.config.server_cpus)

    def __enter__(self) -> LocalVllmServer:
        self.start(self.command(), self.env, self.url + "/health", self.startup_timeout_s)
        return self


def _remote_realisation(policy: str, url: str) -> PolicyRealisation:
    sp = server_policy(policy)
    if not sp.connector:
        return PolicyRealisation(sp.harness_policy, sp.label)
    return PolicyRealisation(sp.harness_policy, f"{sp.label} -- if the server at {url} runs a "
                             "connector")


class VllmRuntime:
    """`harness run --runtime vllm`: each policy is a server configuration (SERVER_POLICIES)."""

    name = "vllm"
    # vLLM's CPU backend binds its OpenMP threads to cores itself; it is never pinned here.
    pins_local_server = False
    per_slot_control = False
    server_policies: dict[str, str] = {}
    default_policies = ("keep", "swap", "recompute")

    @contextmanager
    def start(self, options: ServerOptions, out: Path) -> Iterator[RuntimeSession]:
        """A local vLLM server configured for the run's policy (stopped on exit), or the one
        at options.url."""
        sp = server_policy(options.policy)

        def session(details: ServerDetails, vocab: int | None) -> RuntimeSession:
            def connect(http: HttpClient) -> VllmAdapter:
                return VllmAdapter(http, salt=options.run_id, vocab_size=vocab)

            def realise(_: ServerInfo) -> PolicyRealisation:
                return (_remote_realisation(options.policy, details.url) if options.url
                        else PolicyRealisation(sp.harness_policy, sp.label))

            notes = [f"note: remote vLLM: {options.policy} needs the server started with a KV "
                     f"connector ({sp.connector}); the harness keeps per pause"
                     ] if options.url and sp.connector else []
            details.extra["kv_connector"] = sp.connector
            return RuntimeSession(details, connect, realise, notes=notes)

        if options.url:
            yield session(ServerDetails(options.url), None)
            return
        python = vllm_python()
        model = options.model or vllm_model(python)
        geometry = hf_geometry(model)
        cfg = VllmServerConfig(model=model, max_model_len=options.ctx_per_slot,
                               connector=sp.connector, server_cpus=options.server_cpus,
                               extra_args=list(options.server_args))
        with LocalVllmServer(cfg, out / "server.log", python=python) as server:
            details = ServerDetails(
                url=server.url, flags=server.flags, python=str(python), env=server.env,
                start_s=server.start_s, process=server.process_record(),
                model=model_record(model, geometry))
            local = session(details, local_vocab(model))
            local.server_exited = server.exit_reason
            yield local


RUNTIME = VllmRuntime()
