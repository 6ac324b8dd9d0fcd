"""Paths the install scripts print: the llama-server build, the default model, each runtime's
cached virtualenv, and the tiny random-weight model vLLM and SGLang serve."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from harness.errors import ServerError

LAUNCHERS = Path(__file__).resolve().parent


def script_output(script: str, env_override: str) -> Path:
    """The path an install script in this folder prints on its last stdout line; the variable
    `env_override`, when set, names it instead."""
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


def tiny_model(python: Path, env_override: str, *args: str) -> Path:
    """The local random-weight model folder: $`env_override`, or made once by
    make_tiny_model.py (with `args`, e.g. --no-weights) run with the runtime's `python`."""
    if os.environ.get(env_override):
        p = Path(os.environ[env_override])
        if not p.is_dir():
            raise ServerError(f"{env_override}={p} is not a model folder")
        return p
    proc = subprocess.run([str(python), str(LAUNCHERS / "make_tiny_model.py"), *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        what = " ".join(["make_tiny_model.py", *args])
        raise ServerError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return Path(proc.stdout.strip().splitlines()[-1])
