"""Convert a llama.cpp GGUF Llama once into a Hugging Face safetensors folder for vLLM and SGLang.

The local vLLM and SGLang servers serve a tiny random-weight model by default (make_tiny_model.py).
This script gives them real weights instead: the SmolLM2-135M-Instruct GGUF that llama-server
serves (fetch_model.sh), dequantised to bfloat16, with its config, tokenizer and chat template,
in the layout both CPU engines load. Nothing but the GGUF and PyPI is needed.

Run it with the vLLM or SGLang virtualenv's python (it needs torch, transformers, safetensors):

    python convert_gguf_model.py --gguf MODEL.gguf [--out-root DIR] [--check]

The `gguf` package (pinned) is used from the virtualenv when it has that version, else installed
once into a small folder under the cache root. The output folder's name carries a digest of the
GGUF's sha256 and of this script, so a new source or recipe makes a new folder; a finished one is
reused at once. `--check` loads the result and prints a greedy continuation to stderr. The model
folder is printed on the last line.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

GGUF_PIN = "0.19.0"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# For a GGUF without a chat template: the tiny model's plain one (the harness sends token ids;
# some frontends only need a template to exist).
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}")
# GGUF tensor names (llama.cpp's Llama layout) -> Hugging Face LlamaForCausalLM names.
GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                  "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight"}
LAYER_TENSORS = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
                 "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def cache_root() -> Path:
    """The harness's cache root, as the install scripts compute it."""
    return Path(os.environ.get("HARNESS_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agent-pause-harness")


def recipe_key() -> str:
    """A short hash of this script: a changed recipe makes a new folder."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def folder_name(gguf_name: str, gguf_sha: str, recipe: str) -> str:
    """The output folder's name: the GGUF's stem in lowercase (its quantisation suffix kept) and
    a digest of the GGUF's sha256 and the recipe."""
    stem = gguf_name.removesuffix(".gguf").lower()
    slug = re.sub(r"[^a-z0-9]+", "-", stem).strip("-") or "model"
    digest = hashlib.sha256(f"{gguf_sha}:{recipe}".encode()).hexdigest()[:12]
    return f"{slug}-{digest}"


def hf_tensor_name(name: str) -> str:
    """The Hugging Face name of a GGUF tensor; ValueError for one this recipe does not map."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    m = _LAYER_RE.fullmatch(name)
    if m and m.group(2) in LAYER_TENSORS:
        return f"model.layers.{m.group(1)}.{LAYER_TENSORS[m.group(2)]}.weight"
    raise ValueError(f"GGUF tensor {name!r} has no Hugging Face Llama counterpart")


def unpermute(weight: Any, n_head: int) -> Any:
    """Undo llama.cpp's rotary permutation of a q/k projection (rows grouped per head as pairs
    for the interleaved rotation) back to Hugging Face's half-split rotation layout."""
    rows = weight.shape[0]
    return (weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def hf_config(meta: Mapping[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """A LlamaForCausalLM config from GGUF metadata (`meta`: key -> value) and its tensor names.
    A GGUF without output.weight ties the output head to the token embedding."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"only Llama GGUFs are converted, this one is {arch!r}")

    def key(name: str) -> Any:
        if f"llama.{name}" not in meta:
            raise ValueError(f"GGUF metadata has no llama.{name}")
        return meta[f"llama.{name}"]

    if meta.get("llama.rope.scaling.type") not in (None, "none"):
        raise ValueError("a GGUF with rope scaling is not converted by this recipe")
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(meta.get("llama.rope.dimension_count", hidden // heads))
    if head_dim * heads != hidden:
        raise ValueError(f"head_dim {head_dim} x {heads} heads is not the hidden size {hidden}")
    vocab = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta \
        else int(key("vocab_size"))
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(key("context_length")),
        # GGUF stores float32: 9.999999747e-06 is the checkpoint's 1e-05.
        "rms_norm_eps": float(f"{float(key('attention.layer_norm_rms_epsilon')):.7g}"),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "bfloat16",
    }
    for hf_key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                             ("pad_token_id", "padding_token_id")):
        if f"tokenizer.ggml.{gguf_key}" in meta:
            cfg[hf_key] = int(meta[f"tokenizer.ggml.{gguf_key}"])
    return cfg


def import_gguf(cache: Path) -> ModuleType:
    """The pinned `gguf` package: the running environment's when it has that version, else one
    installed once (pip --target, no dependencies: numpy, pyyaml, tqdm and requests come with
    the runtimes) into the cache. Call before importing transformers, which looks for it once."""
    try:
        present = importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        present = None
    if present != GGUF_PIN:
        target = cache / "pylibs" / f"gguf-{GGUF_PIN}"
        if not (target / ".complete").exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=".gguf-", dir=target.parent))
            try:
                subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                                "--target", str(work), f"gguf=={GGUF_PIN}"],
                               check=True, stdout=sys.stderr)
                (work / ".complete").touch()
                shutil.rmtree(target, ignore_errors=True)
                os.replace(work, target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        sys.path.insert(0, str(target))
    import gguf

    return gguf


def read_metadata(reader: Any) -> dict[str, Any]:
    """A GGUFReader's metadata as plain values (token lists included)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def _write_weights(reader: Any, gguf: ModuleType, cfg: Mapping[str, Any], out: Path) -> None:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions innermost first
        # a copy: the reader's arrays are read-only views of the file
        arr = np.array(gguf.quants.dequantize(t.data, t.tensor_type),
                       dtype=np.float32).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            arr = unpermute(arr, cfg["num_attention_heads"])
        elif t.name.endswith("attn_k.weight"):
            arr = unpermute(arr, cfg["num_key_value_heads"])
        tensors[hf_tensor_name(t.name)] = torch.from_numpy(np.ascontiguousarray(arr)).to(
            torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def _write_tokenizer(gguf_path: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = FALLBACK_CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    config = out / "tokenizer_config.json"  # newer releases keep the template in its own file
    data = json.loads(config.read_text())
    if "chat_template" not in data:
        data["chat_template"] = tok.chat_template
        config.write_text(json.dumps(data, indent=1))


def convert(gguf_path: Path, out_root: Path) -> Path:
    """Convert `gguf_path` under `out_root` (once) and return the model folder."""
    sha = file_sha256(gguf_path)
    dest = out_root / folder_name(gguf_path.name, sha, recipe_key())
    if (dest / ".complete").exists():
        return dest
    gguf = import_gguf(cache_root())
    from transformers import LlamaConfig

    reader = gguf.GGUFReader(str(gguf_path), "r")
    cfg = hf_config(read_metadata(reader), {t.name for t in reader.tensors})
    out_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=out_root))
    try:
        LlamaConfig(**cfg).save_pretrained(str(work))
        _write_weights(reader, gguf, cfg, work)
        _write_tokenizer(gguf_path, work)
        (work / "source.json").write_text(json.dumps(
            {"gguf": gguf_path.name, "sha256": sha, "gguf_package": GGUF_PIN,
             "recipe": recipe_key()}, indent=1, sort_keys=True))
        (work / ".complete").touch()
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def check(folder: Path, prompt: str = "The capital of France is") -> str:
    """Load the folder with transformers and return a 24-token greedy continuation of `prompt`
    (a sanity check: real weights give sensible text, broken ones gibberish)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
    return str(tok.decode(out[0][ids.shape[1]:], skip_special_tokens=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=cache_root() / "models" / DEFAULT_GGUF,
                    help="the GGUF to convert (default: fetch_model.sh's SmolLM2)")
    ap.add_argument("--out-root", type=Path, default=cache_root() / "models")
    ap.add_argument("--check", action="store_true",
                    help="load the result and print a greedy continuation to stderr")
    args = ap.parse_args(argv)
    if not args.gguf.is_file():
        print(f"error: {args.gguf} does not exist (make llama fetches the default GGUF)",
              file=sys.stderr)
        return 2
    try:
        folder = convert(args.gguf, args.out_root)
    except ImportError as exc:  # a python without the runtimes' packages, and no folder yet
        print(f"error: converting needs torch, transformers and safetensors ({exc}): run this "
              "with the vLLM or SGLang virtualenv's python (make vllm / make sglang)",
              file=sys.stderr)
        return 2
    if args.check:
        print(f"greedy continuation: {check(folder)!r}", file=sys.stderr)
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
