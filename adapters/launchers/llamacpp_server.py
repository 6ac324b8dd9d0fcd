"""Start and stop a local llama-server (built by install_llamacpp.sh) for a run.

The server listens on 127.0.0.1 only, keeps slot dumps in a private 0700 directory (files 0600),
and is stopped (SIGTERM, then SIGKILL) however the run ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from harness.adapters.launchers.process import free_port, log_tail, wait_healthy
from harness.errors import ServerError

LAUNCHERS = Path(__file__).resolve().parent


def _script_output(script: str, env_override: str) -> Path:
    """Path printed by an install script (last stdout line); an env variable overrides it."""
    if os.environ.get(env_override):
        p = Path(os.environ[env_override])
        if not p.exists():
            raise ServerError(f"{env_override}={p} does not exist")
        return p
    proc = subprocess.run(["bash", str(LAUNCHERS / script)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise ServerError(f"{script} failed (exit {proc.returncode}):\n{tail}")
    return Path(proc.stdout.strip().splitlines()[-1])


def llama_server_binary() -> Path:
    """The llama-server binary: $HARNESS_LLAMA_SERVER, or built once and cached."""
    return _script_output("install_llamacpp.sh", "HARNESS_LLAMA_SERVER")


def default_model() -> Path:
    """The default GGUF model: $HARNESS_MODEL, or SmolLM2-135M-Instruct fetched once."""
    return _script_output("fetch_model.sh", "HARNESS_MODEL")


@dataclass
class LlamaServerConfig:
    model: Path
    slots: int = 4
    ctx_per_slot: int = 4096
    threads: int = 1
    cache_ram_mib: int = 0  # 0: no host-RAM prompt cache, so keep/recompute stay distinct
    extra_args: list[str] = field(default_factory=list)
    server_cpus: str | None = None  # taskset list for the server, e.g. "1"


class LocalLlamaServer:
    """Context manager: a running llama-server; `url`, `dump_dir`, `flags` describe it."""

    def __init__(self, config: LlamaServerConfig, log_path: Path, binary: Path | None = None,
                 startup_timeout_s: float = 180.0) -> None:
        self.config = config
        self.binary = binary or llama_server_binary()
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dump_dir = Path(tempfile.mkdtemp(prefix="harness-slots-"))
        os.chmod(self.dump_dir, 0o700)
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        c = config
        self.flags = ["-m", str(c.model), "--host", "127.0.0.1", "--port", str(self.port),
                      "-c", str(c.slots * c.ctx_per_slot), "-np", str(c.slots),
                      "-t", str(c.threads), "--slot-save-path", str(self.dump_dir),
                      "--metrics", "--cache-ram", str(c.cache_ram_mib), "--no-webui",
                      *c.extra_args]

    def command(self) -> list[str]:
        cmd = [str(self.binary), *self.flags]
        if self.config.server_cpus and shutil.which("taskset"):
            cmd = ["taskset", "-c", self.config.server_cpus, *cmd]
        return cmd

    def __enter__(self) -> LocalLlamaServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL,
                                      preexec_fn=lambda: os.umask(0o077))
        try:
            wait_healthy(self._proc, self.url + "/health", "llama-server",
                         self.startup_timeout_s, lambda: log_tail(self.log_path, 12),
                         poll_s=0.25)
        except BaseException:
            self.stop()
            raise
        return self

    def build_label(self) -> str:
        """The llama.cpp build, from the cache directory the install script chose."""
        return self.binary.parent.name if self.binary.parent.name.startswith("b") else "unknown"

    def leftover_dumps(self) -> list[str]:
        return sorted(p.name for p in self.dump_dir.iterdir()) if self.dump_dir.exists() else []

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if getattr(self, "_log", None) is not None:
            self._log.close()
        shutil.rmtree(self.dump_dir, ignore_errors=True)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
