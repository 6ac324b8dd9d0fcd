"""The identity of the machine a run measured on, for run.json and comparability checks.

Two runs are only comparable when they ran on the same kind of machine: `host_identity()` reads
what decides a benchmark's numbers (CPU model and vector flags, cores, memory, kernel, GPUs,
Python and key package versions) and `host_key()` reduces it to the part that must match.
Everything is read from the operating system (procfs, `nvidia-smi` when on PATH) and never
fails: what cannot be read is None.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any

# Packages whose versions change what the client measures.
PACKAGES = ("httptools", "aiohttp", "uvloop", "orjson", "numpy", "pandas", "pyarrow")
# The CPU flags that change kernel speed (vector units, matrix engines), kept by name; the
# whole set is kept as a digest.
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni",
                "asimd", "sve", "sve2")
_GPU_QUERY = ("nvidia-smi", "--query-gpu=name,memory.total,driver_version",
              "--format=csv,noheader")


def _cpuinfo(text: str) -> tuple[str | None, list[str]]:
    """(model name, flags) from /proc/cpuinfo's text (x86 'flags', Arm 'Features')."""
    model: str | None = None
    flags: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and model is None:
            model = value.strip() or None
        elif key in ("flags", "features") and not flags:
            flags = value.split()
    return model, flags


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def meminfo_bytes(field: str, meminfo: str | None = None) -> int | None:
    """A /proc/meminfo field (MemTotal, MemAvailable, ...) in bytes; None where unreadable.
    `meminfo`: the file's text, read when not given."""
    text = _read("/proc/meminfo") if meminfo is None else meminfo
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def gpus() -> list[dict[str, str]] | None:
    """The NVIDIA GPUs `nvidia-smi` lists ([] for none); None without nvidia-smi."""
    if shutil.which(_GPU_QUERY[0]) is None:
        return None
    try:
        out = subprocess.run(_GPU_QUERY, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    rows = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            rows.append({"name": parts[0], "memory": parts[1], "driver": parts[2]})
    return rows


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def host_identity() -> dict[str, Any]:
    """What this machine is, for run.json's `host`."""
    model, flags = _cpuinfo(_read("/proc/cpuinfo"))
    # (Not the process's CPU affinity: a run pins itself first; cpu_pinning records that.)
    return {
        "hostname": platform.node() or None,
        "machine": platform.machine() or None,
        "cpu_model": model or platform.processor() or None,
        "cpu_flags": [f for f in VECTOR_FLAGS if f in set(flags)],
        "cpu_flags_sha256": (hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]
                             if flags else None),
        "logical_cpus": os.cpu_count(),
        "memory_bytes": meminfo_bytes("MemTotal"),
        "os": platform.system() or None,
        "kernel": platform.release() or None,
        "gpus": gpus(),
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in PACKAGES},
    }


def host_key(host: dict[str, Any] | None) -> str | None:
    """The part of a host's identity two comparable runs share: CPU model and flags, cores,
    memory (to the GiB) and GPU models. Not the hostname (two identical CI runners compare) nor
    the kernel or packages (shown, not enforced). None when the run did not record its host."""
    if not host:
        return None
    mem = host.get("memory_bytes")
    gib = f"{round(mem / (1 << 30))} GiB" if isinstance(mem, int | float) else "? GiB"
    gpu_list = host.get("gpus") or []
    gpu = "+".join(str(g.get("name")) for g in gpu_list if isinstance(g, dict)) or "no GPU"
    flags = host.get("cpu_flags_sha256") or "?"
    return (f"{host.get('cpu_model') or '?'} ({flags}), {host.get('logical_cpus') or '?'} "
            f"CPUs, {gib}, {gpu}")
