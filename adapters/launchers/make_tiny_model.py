"""Make a small random-weight Llama model and a locally trained tokenizer for a local vLLM server.

No model hub is needed: the tokenizer is a byte-level BPE trained with the `tokenizers` package on
a seeded synthetic corpus, and the model's weights are drawn from a seeded generator. The same
script makes the same model (weights and vocabulary) on every machine.

Run it with the vLLM virtualenv's python (it needs torch, transformers and tokenizers):

    python make_tiny_model.py [--out-root DIR]

`--no-weights` makes the same folder without weights (config, tokenizer and chat template only;
no torch needed): what a simulated engine such as Dynamo's mocker serves.

It prints the model folder on its last line. A finished folder is reused at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import string
import sys
import tempfile
from pathlib import Path
from typing import Any

# Geometry: 2 layers, GQA (4 query heads over 2 KV heads), head_dim 32 (the smallest the CPU
# attention backend supports). KV bytes per token in bfloat16: 2 x 2 x 2 x 32 x 2 = 512.
GEOMETRY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
}
VOCAB_SIZE = 2048
SEED = 1234
NAME = "tiny-llama"
# A plain template: the model folder must have one for servers whose frontends require it
# (Dynamo's); the harness itself sends token ids, never chat messages.
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant: {% endif %}")


def _corpus(seed: int, n_words: int = 40_000) -> list[str]:
    """Seeded pseudo-text: words of 1-9 lowercase letters, some digits and punctuation."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase
    weights = [rng.random() ** 2 for _ in letters]  # a skewed letter distribution
    lines, line = [], []
    for _ in range(n_words):
        word = "".join(rng.choices(letters, weights, k=rng.randint(1, 9)))
        if rng.random() < 0.05:
            word += rng.choice(".,:;!?") if rng.random() < 0.7 else str(rng.randint(0, 999))
        line.append(word)
        if len(line) >= rng.randint(6, 16):
            lines.append(" ".join(line))
            line = []
    return lines


def _train_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(SEED), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    config = out / "tokenizer_config.json"  # some releases save the template elsewhere
    data = json.loads(config.read_text())
    if "chat_template" not in data:
        data["chat_template"] = CHAT_TEMPLATE
        config.write_text(json.dumps(data, indent=1))
    return int(tok.get_vocab_size())


def _config(vocab_size: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                       tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0,
                       torch_dtype="bfloat16", architectures=["LlamaForCausalLM"], **GEOMETRY)


def _make_model(out: Path, vocab_size: int) -> None:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(_config(vocab_size))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)


def recipe_key() -> str:
    """A short hash of this script: a changed recipe makes a new folder."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def make(out_root: Path, weights: bool = True) -> Path:
    """Make the model under `out_root` (once) and return its folder; without `weights`, only
    its config and tokenizer."""
    dest = out_root / f"{NAME}{'' if weights else '-no-weights'}-{recipe_key()}"
    if (dest / ".complete").exists():
        return dest
    out_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=out_root))
    try:
        vocab = _train_tokenizer(work)
        if weights:
            _make_model(work, vocab)
        else:
            _config(vocab).save_pretrained(str(work))
        (work / "recipe.json").write_text(json.dumps(
            {"seed": SEED, "vocab_size": vocab, **GEOMETRY}, indent=1, sort_keys=True))
        (work / ".complete").touch()
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cache = Path(os.environ.get("HARNESS_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agent-pause-harness")
    ap.add_argument("--out-root", type=Path, default=cache / "models")
    ap.add_argument("--no-weights", action="store_true",
                    help="config, tokenizer and chat template only (no torch needed)")
    args = ap.parse_args(argv)
    print(make(args.out_root, weights=not args.no_weights))
    return 0


if __name__ == "__main__":
    sys.exit(main())
