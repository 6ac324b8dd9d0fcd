"""The llama.cpp runtime: a local llama-server (built by install_llamacpp.sh) per run, or one at
--url.

The local server listens on 127.0.0.1 only, in its own process group, keeps slot dumps in a
private 0700 directory (files 0600, removed at stop), and is stopped (SIGTERM to the group, then
SIGKILL) however the run ends. Every pause action executes per request on llama-server's slots,
so a policy is decided by the harness and never a server configuration.
"""

from __future__ import annotations

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
from harness.adapters.launchers.installs import script_output
from harness.adapters.launchers.process import ServerProcess, pinned
from harness.adapters.llamacpp import LlamaCppAdapter
from harness.adapters.models import gguf_geometry, model_record

REMOTE_NOTE = ("note: remote server: the harness cannot delete slot dump files on its disk; "
               "swap dumps are left to the server's --slot-save-path")


def llama_server_binary() -> Path:
    """The llama-server binary: $HARNESS_LLAMA_SERVER, or built once and cached."""
    return script_output("install_llamacpp.sh", "HARNESS_LLAMA_SERVER")


def default_model() -> Path:
    """The default GGUF model: $HARNESS_MODEL, or SmolLM2-135M-Instruct fetched once."""
    return script_output("fetch_model.sh", "HARNESS_MODEL")


@dataclass
class LlamaServerConfig:
    model: Path
    slots: int = 4
    ctx_per_slot: int = 4096
    threads: int = 1
    cache_ram_mib: int = 0  # 0: no host-RAM prompt cache, so keep/recompute stay distinct
    extra_args: list[str] = field(default_factory=list)
    server_cpus: str | None = None  # taskset list for the server, e.g. "1"
    # httplib serves a keep-alive connection on one thread for as long as it stays open: with
    # fewer threads than the client's pooled connections, requests would queue in the server's
    # HTTP layer. llama-server's own default is max(slots + 2, cores - 1).
    client_connections: int = 0

    def threads_http(self) -> int:
        return max(self.slots + 2, self.client_connections + 2)


class LocalLlamaServer(ServerProcess):
    """Context manager: a running llama-server; `url`, `dump_dir`, `flags` describe it."""

    def __init__(self, config: LlamaServerConfig, log_path: Path, binary: Path | None = None,
                 startup_timeout_s: float = 180.0) -> None:
        self.config = config
        self.binary = binary or llama_server_binary()
        self.startup_timeout_s = startup_timeout_s
        # tmp_dir: the slot dumps (--slot-save-path); llama-server leaks no shared memory
        super().__init__("llama-server", log_path, "harness-slots-", ())
        self.dump_dir = self.tmp_dir
        c = config
        self.flags = ["-m", str(c.model), "--host", "127.0.0.1", "--port", str(self.port),
                      "-c", str(c.slots * c.ctx_per_slot), "-np", str(c.slots),
                      "-t", str(c.threads), "--slot-save-path", str(self.dump_dir),
                      "--metrics", "--cache-ram", str(c.cache_ram_mib), "--no-webui",
                      *([] if "--threads-http" in c.extra_args
                        else ["--threads-http", str(c.threads_http())]),
                      *c.extra_args]

    def command(self) -> list[str]:
        return pinned([str(self.binary), *self.flags], self.config.server_cpus)

    def __enter__(self) -> LocalLlamaServer:
        # umask 077: slot dumps hold prompt-derived KV, readable by this user only
        self.start(self.command(), {}, self.url + "/health", self.startup_timeout_s,
                   poll_s=0.25, umask=0o077)
        return self

    def build_label(self) -> str:
        """The llama.cpp build, from the cache directory the install script chose."""
        return self.binary.parent.name if self.binary.parent.name.startswith("b") else "unknown"

    def leftover_dumps(self, prefix: str = "") -> list[str]:
        """Dump files in the server's dump folder (those named `prefix`...)."""
        if not self.dump_dir.exists():
            return []
        return sorted(p.name for p in self.dump_dir.glob(f"{prefix}*"))


def _realise(policy: str) -> PolicyRealisation:
    return PolicyRealisation(policy, f"{policy}: decided per pause by the harness; keep, swap "
                             "(slot save, then erase) and recompute (erase) execute on "
                             "llama-server's slots")


class LlamaCppRuntime:
    """`harness run --runtime llamacpp`."""

    name = "llamacpp"
    pins_local_server = True
    per_slot_control = True
    server_policies: dict[str, str] = {}
    default_policies = ("keep", "swap", "recompute")

    @contextmanager
    def start(self, options: ServerOptions, out: Path) -> Iterator[RuntimeSession]:
        """A local llama-server for the run (stopped on exit), or the one at options.url."""
        def realise(_: ServerInfo) -> PolicyRealisation:
            return _realise(options.policy)

        if options.url:
            shared = (options.shared or {}).get("dump_dir")
            if shared:  # a server this run started on this machine: its dumps are deletable
                dump_dir = Path(shared)
                yield RuntimeSession(ServerDetails(options.url),
                                     lambda http: LlamaCppAdapter(http, dump_dir=dump_dir),
                                     realise)
                return
            yield RuntimeSession(ServerDetails(options.url), LlamaCppAdapter, realise,
                                 notes=[REMOTE_NOTE])
            return
        model = options.model or default_model()
        geometry = gguf_geometry(model)
        cfg = LlamaServerConfig(model=model, slots=options.slots,
                                ctx_per_slot=options.ctx_per_slot, threads=options.threads,
                                server_cpus=options.server_cpus,
                                extra_args=list(options.server_args),
                                client_connections=options.connections)
        with LocalLlamaServer(cfg, out / "server.log") as server:
            details = ServerDetails(
                url=server.url, flags=server.flags, binary=str(server.binary),
                build=server.build_label(), start_s=server.start_s,
                process=server.process_record(),
                model=model_record(model, geometry), shared={"dump_dir": str(server.dump_dir)})

            def connect(http: HttpClient) -> LlamaCppAdapter:
                return LlamaCppAdapter(http, dump_dir=server.dump_dir)

            yield RuntimeSession(details, connect, realise, leftover_dumps=server.leftover_dumps,
                                 server_exited=server.exit_reason)


RUNTIME = LlamaCppRuntime()
