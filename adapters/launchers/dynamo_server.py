"""The NVIDIA Dynamo runtime: a local Dynamo deployment per run (the OpenAI frontend with its
router, and GPU-free mocker workers: a simulated engine with paged KV and prefix caching), or a
frontend at --url.

The local deployment (installed by install_dynamo.sh, run by dynamo_stack.py as one process
group) uses file-based discovery in a private 0700 folder, listens on 127.0.0.1 only (every
`DYN_*_HOST` set, the event plane through a broker bound to 127.0.0.1), and serves the tiny
model's config and tokenizer (make_tiny_model.py --no-weights: no hub, no weights). Its HOME and
TMPDIR are in the private folder too (the frontend caches model cards under $HOME, each process
leaves a logging config in $TMPDIR), so stopping it leaves nothing behind.

Dynamo's controls for a paused agent are server configurations (`SERVER_POLICIES`): the router
mode, and session affinity. Per pause the harness can keep, or recompute with a fresh
`nvext.cache_salt` where the workers honour it (the mocker does not: recorded unsupported).
"""

from __future__ import annotations

import json
import time
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
from harness.adapters.dynamo import DynamoAdapter, ready_workers
from harness.adapters.http import HttpClient
from harness.adapters.launchers.installs import LAUNCHERS, script_output, tiny_model
from harness.adapters.launchers.openai_server import realisation
from harness.adapters.launchers.process import PROBE_ERRORS, ServerProcess, free_port, pinned
from harness.adapters.models import hf_geometry, local_vocab, model_record
from harness.errors import ServerError

SERVED_NAME = "tiny"
WORKERS = 2
BLOCK_SIZE = 16  # the mocker's KV block (its vLLM default is 64): finer-grained reuse
SESSION_TTL_S = 600  # an idle session's binding to its worker lasts this long
MODEL_ENV = "HARNESS_DYNAMO_MODEL"
@dataclass(frozen=True)
class DynamoPolicy:
    """How one policy name is realised on Dynamo: the per-pause policy, the router mode and
    whether calls carry their session (with the frontend's session affinity on)."""

    harness_policy: str
    router_mode: str
    session_affinity: bool
    label: str


KV_ROUTING = ("KV-aware routing (--router-mode kv): each call goes to the worker whose cache "
              "holds most of its prefix")
SERVER_POLICIES: dict[str, DynamoPolicy] = {
    "keep-evictable": DynamoPolicy(
        "keep-evictable", "kv", False, f"keep-evictable under {KV_ROUTING}; a paused "
        "request's blocks stay cached there, evictable (not pinned)"),
    "round-robin": DynamoPolicy(
        "keep-evictable", "round-robin", False, "keep-evictable under round-robin routing "
        "(--router-mode "
        "round-robin): calls alternate between the workers whatever their caches hold, the "
        "baseline KV-aware routing and session affinity are measured against"),
    "session": DynamoPolicy(
        "keep-evictable", "round-robin", True, "keep-evictable under session affinity "
        "(--router-session-affinity-"
        f"ttl-secs {SESSION_TTL_S}, header x-dynamo-session-id per trajectory) over round-robin "
        "routing: each trajectory's calls are bound to one worker"),
}


def dynamo_policy(policy: str) -> DynamoPolicy:
    """The Dynamo realisation of `policy`: a server policy, or a per-pause policy of the
    harness under KV-aware routing."""
    if policy in SERVER_POLICIES:
        return SERVER_POLICIES[policy]
    return DynamoPolicy(policy, "kv", False, f"under {KV_ROUTING}")


def dynamo_python() -> Path:
    """The Dynamo virtualenv's python: $HARNESS_DYNAMO_PYTHON, or installed once and cached."""
    return script_output("install_dynamo.sh", "HARNESS_DYNAMO_PYTHON")


def dynamo_model(python: Path) -> Path:
    """The tiny model's config and tokenizer: $HARNESS_DYNAMO_MODEL, or made once."""
    return tiny_model(python, MODEL_ENV, "--no-weights")


@dataclass
class DynamoConfig:
    model: Path
    router_mode: str = "kv"
    session_affinity: bool = False
    workers: int = WORKERS
    block_size: int = BLOCK_SIZE
    max_model_len: int = 4096
    speedup_ratio: float = 1.0  # the mocker's simulated time: 1.0 = its engine model's timing
    extra_args: list[str] = field(default_factory=list)  # more frontend flags
    server_cpus: str | None = None  # taskset list for the whole deployment, e.g. "1"


class LocalDynamo(ServerProcess):
    """Context manager: a running Dynamo deployment (broker, frontend, `workers` mockers) whose
    frontend is at `url`; `flags`, `env`, `spec` describe it."""

    def __init__(self, config: DynamoConfig, log_dir: Path, python: Path | None = None,
                 startup_timeout_s: float = 120.0) -> None:
        self.config = config
        self.python = python or dynamo_python()
        self.startup_timeout_s = startup_timeout_s
        super().__init__("Dynamo", log_dir / "server.log", "harness-dynamo-", ())
        c, tmp = config, self.tmp_dir
        for sub in ("home", "tmp", "discovery"):
            (tmp / sub).mkdir(mode=0o700)
        ports = [self.port]  # every port the deployment listens on, each one different
        def new_port() -> int:
            ports.append(free_port(taken=ports))
            return ports[-1]
        broker = [new_port(), new_port()]
        self.env = {
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HOME": str(tmp / "home"),
            "TMPDIR": str(tmp / "tmp"), "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": str(tmp / "discovery"), "DYN_HTTP_HOST": "127.0.0.1",
            "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_TCP_RPC_HOST": "127.0.0.1",
            "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1", "DYN_EVENT_PLANE_HOST": "127.0.0.1",
            "DYN_ZMQ_BROKER_URL": (f"xsub=tcp://127.0.0.1:{broker[0]} , "
                                   f"xpub=tcp://127.0.0.1:{broker[1]}")}
        self.flags = ["--http-port", str(self.port), "--router-mode", c.router_mode,
                      *(["--router-session-affinity-ttl-secs", str(SESSION_TTL_S)]
                        if c.session_affinity else []), *c.extra_args]
        self.worker_flags = ["--model-path", str(c.model), "--model-name", SERVED_NAME,
                             "--block-size", str(c.block_size), "--max-model-len",
                             str(c.max_model_len), "--speedup-ratio", f"{c.speedup_ratio:g}"]
        self.system_ports = [new_port() for _ in range(c.workers)]
        py = str(self.python)
        procs: list[dict[str, Any]] = [{
            "name": "frontend", "cmd": [py, "-m", "dynamo.frontend", *self.flags],
            "env": {"DYN_TCP_RESPONSE_STREAM_PORT": str(new_port())},
            "log": str(log_dir / "dynamo-frontend.log")}]
        for i, port in enumerate(self.system_ports):
            procs.append({"name": f"worker-{i}", "cmd": [py, "-m", "dynamo.mocker",
                                                         *self.worker_flags],
                          "env": {"DYN_SYSTEM_PORT": str(port),
                                  "DYN_TCP_RPC_PORT": str(new_port())},
                          "log": str(log_dir / f"dynamo-worker-{i}.log")})
        self.spec = {"broker": broker, "processes": procs}
        self.spec_path = tmp / "stack.json"
        self.spec_path.write_text(json.dumps(self.spec, indent=1))

    def __enter__(self) -> LocalDynamo:
        t0 = time.monotonic()
        # Pinned, the whole group runs on its CPUs (children inherit the affinity), away from
        # the harness's: its Python processes would otherwise delay the client's wake-ups.
        self.start(pinned([str(self.python), str(LAUNCHERS / "dynamo_stack.py"),
                           str(self.spec_path)], self.config.server_cpus),
                   self.env, self.url + "/live", self.startup_timeout_s)
        try:
            self._wait_workers()
        except BaseException:
            self.stop()
            raise
        self.start_s = round(time.monotonic() - t0, 3)  # until every worker is ready
        return self

    def _wait_workers(self) -> None:
        """Until the frontend has every worker ready for the model (ServerError after the
        start-up timeout, with the deployment's log)."""
        deadline = time.monotonic() + self.startup_timeout_s
        seen: int | None = None
        while time.monotonic() < deadline:
            if (reason := self.exit_reason()) is not None:
                raise ServerError(f"{reason}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models/{SERVED_NAME}/ready",
                                            timeout=2.0) as r:
                    seen = ready_workers(json.loads(r.read()))
            except PROBE_ERRORS + (ValueError,):
                seen = None
            if seen is not None and seen >= self.config.workers:
                return
            time.sleep(0.2)
        raise ServerError(f"Dynamo: {seen or 0} of {self.config.workers} workers ready after "
                          f"{self.startup_timeout_s:.0f}s; last log lines:\n{self.log_tail()}")


class DynamoRuntime:
    """`harness run --runtime dynamo`: Dynamo's controls are server policies (SERVER_POLICIES)."""

    name = "dynamo"
    pins_local_server = True
    per_slot_control = False
    server_policies: dict[str, str] = {
        k: p.harness_policy for k, p in SERVER_POLICIES.items() if k not in ("keep-evictable",)}
    default_policies = ("keep-evictable", "round-robin", "session", "recompute")

    @contextmanager
    def start(self, options: ServerOptions, out: Path) -> Iterator[RuntimeSession]:
        """A local deployment configured for the run's policy (stopped on exit), or the
        frontend at options.url."""
        dp = dynamo_policy(options.policy)
        adapters: list[DynamoAdapter] = []

        def session(details: ServerDetails, vocab: int | None) -> RuntimeSession:
            def connect(http: HttpClient) -> DynamoAdapter:
                model = str(options.model) if options.url and options.model else None
                adapters.append(DynamoAdapter(http, salt=options.run_id, model=model,
                                              vocab_size=vocab,
                                              session_affinity=dp.session_affinity))
                return adapters[-1]

            def realise(_: ServerInfo) -> PolicyRealisation:
                base = realisation(dp.harness_policy, adapters[-1].probed, "Dynamo")
                where = (f" -- if the frontend at {options.url} runs --router-mode "
                         f"{dp.router_mode}" + (" with session affinity" if dp.session_affinity
                                                else "") if options.url else "")
                return PolicyRealisation(dp.harness_policy, f"{dp.label}; {base.label}{where}")

            details.extra.update({"router_mode": dp.router_mode,
                                  "session_affinity": dp.session_affinity})
            return RuntimeSession(details, connect, realise)

        if options.url:
            yield session(ServerDetails(options.url), None)
            return
        python = dynamo_python()
        model = dynamo_model(python)
        cfg = DynamoConfig(model=model, router_mode=dp.router_mode,
                           session_affinity=dp.session_affinity,
                           max_model_len=options.ctx_per_slot,
                           extra_args=list(options.server_args),
                           server_cpus=options.server_cpus)
        with LocalDynamo(cfg, out, python=python) as stack:
            details = ServerDetails(
                url=stack.url, flags=stack.flags, python=str(python), env=stack.env,
                start_s=stack.start_s, process=stack.process_record(),
                model=model_record(model, hf_geometry(model)),
                extra={"workers": cfg.workers, "worker_flags": stack.worker_flags,
                       "worker_metrics_ports": stack.system_ports})
            local = session(details, local_vocab(model))
            local.server_exited = stack.exit_reason
            yield local


RUNTIME = DynamoRuntime()
