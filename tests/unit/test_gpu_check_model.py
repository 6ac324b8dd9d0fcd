"""The GPU check's model writer (benchmarks/gpu/write_gguf.py): the GGUF it writes has the
shape asked for, in llama.cpp's tensor names, and Llama-3.1-8B's parameter count exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
import write_gguf  # noqa: E402


def test_the_8b_shape_has_llama_3_1_8bs_parameters() -> None:
    s = write_gguf.SHAPES["llama-3.1-8b"]
    total = sum(int(np.prod(dims)) for _, dims, _ in write_gguf.tensors(s, 0))
    assert total == 8_030_261_248  # Llama-3.1-8B's published count
    assert len(write_gguf.tensors(s, 0)) == 2 + 32 * 9 + 1


def test_the_tiny_gguf_reads_back_with_its_shape(tmp_path: Path) -> None:
    out = write_gguf.write("tiny", tmp_path / "tiny.gguf")
    r = GGUFReader(out)
    s = write_gguf.SHAPES["tiny"]

    def field(key: str) -> object:
        f = r.fields[key]
        return f.parts[f.data[0]][0]

    assert int(field("llama.block_count")) == s.layers
    assert int(field("llama.embedding_length")) == s.hidden
    assert int(field("llama.attention.head_count_kv")) == s.kv_heads
    assert len(r.fields["tokenizer.ggml.tokens"].data) == s.vocab
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    want = {name: tuple(reversed(dims)) for name, dims, _ in write_gguf.tensors(s, 0)}
    assert got == want  # GGUF lists a tensor's dimensions innermost first
    q = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    assert q.data.dtype == np.float16 and 0 < float(np.abs(q.data).std()) < 0.1
