"""Write a random-weight Llama GGUF of a given shape, for timing a server, not for answers.

    python benchmarks/gpu/write_gguf.py --shape llama-3.1-8b --out /tmp/llama-3.1-8b.gguf

A server's speed depends on a model's shape (layers, widths, heads, vocabulary) and its
number type, not on its weights' values, so the GPU check times llama-server on a GGUF of
Llama-3.1-8B's shape (https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/
config.json) filled with small random f16 values: nothing is downloaded, and the device it runs
on reaches no network. The vocabulary is a placeholder of the same size (byte tokens and
numbered pieces, SentencePiece style): the harness sends prompts as token ids. `--shape tiny`
writes the same layout at a few kilobytes, which the CPU rehearsal serves with llama-server.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType


@dataclass(frozen=True)
class Shape:
    """A Llama model's geometry."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    context: int
    rope_theta: float


SHAPES = {
    "llama-3.1-8b": Shape(32, 4096, 32, 8, 14336, 128256, 131072, 500000.0),
    "tiny": Shape(2, 64, 4, 2, 128, 384, 4096, 10000.0),
}
SPECIALS = ("<unk>", "<s>", "</s>")


def vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: the specials, the 256 byte tokens, then numbered pieces."""
    tokens = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    tokens += [f"\u2581p{i}" for i in range(size - len(tokens))]
    types += [TokenType.NORMAL] * (size - len(types))
    scores = [0.0] * len(SPECIALS) + [0.0] * 256 + [-float(i) for i in range(size - 259)]
    return tokens, scores, [int(t) for t in types]


def tensors(s: Shape, seed: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) of every tensor, in llama.cpp's names; kind: norm or weight."""
    hd = s.hidden // s.heads
    out = [("token_embd.weight", (s.vocab, s.hidden), "weight")]
    for i in range(s.layers):
        b = f"blk.{i}"
        out += [(f"{b}.attn_norm.weight", (s.hidden,), "norm"),
                (f"{b}.attn_q.weight", (s.heads * hd, s.hidden), "weight"),
                (f"{b}.attn_k.weight", (s.kv_heads * hd, s.hidden), "weight"),
                (f"{b}.attn_v.weight", (s.kv_heads * hd, s.hidden), "weight"),
                (f"{b}.attn_output.weight", (s.hidden, s.heads * hd), "weight"),
                (f"{b}.ffn_norm.weight", (s.hidden,), "norm"),
                (f"{b}.ffn_gate.weight", (s.ffn, s.hidden), "weight"),
                (f"{b}.ffn_up.weight", (s.ffn, s.hidden), "weight"),
                (f"{b}.ffn_down.weight", (s.hidden, s.ffn), "weight")]
    return out + [("output_norm.weight", (s.hidden,), "norm"),
                  ("output.weight", (s.vocab, s.hidden), "weight")]


def write(shape: str, out: Path, seed: int = 0) -> Path:
    """The GGUF of `shape` at `out`: f16 weights drawn once from N(0, 0.02) in a block of 1M
    values repeated (drawing 8 billion would cost minutes and change no timing), f32 norms of 1."""
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    block = (rng.standard_normal(1 << 20) * 0.02).astype(np.float16)
    w = GGUFWriter(str(out), "llama")
    w.add_name(f"random {shape}")
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_dimension_count(s.hidden // s.heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s.vocab)
    tokens, scores, types = vocabulary(s.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    for name, dims, kind in tensors(s, seed):
        if kind == "norm":
            w.add_tensor(name, np.ones(dims, dtype=np.float32))
        else:
            w.add_tensor(name, np.resize(block, dims))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write(a.shape, a.out, a.seed)
    print(f"wrote {a.out} ({a.out.stat().st_size / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
