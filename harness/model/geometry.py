"""KV-cache geometry: presets, and reading it from a GGUF file or a Hugging Face config.json.

Bytes of KV per token = layers x 2 (K and V) x kv_heads x head_dim x dtype_bytes. The dtype is the
cache's, not the weights': llama.cpp's server stores KV as f16 (2 bytes) by default whatever the
weight quantisation, and vLLM/SGLang default to the model's dtype (bf16/f16: 2 bytes).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.errors import InputError

DEFAULT_KV_DTYPE_BYTES = 2


@dataclass(frozen=True)
class Geometry:
    """The shape of a model's KV cache."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    name: str = "custom"
    source: str = "flags"

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def validate(self) -> Geometry:
        """Return self, or raise InputError naming the first non-positive dimension."""
        for key in ("layers", "kv_heads", "head_dim", "dtype_bytes"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise InputError(f"geometry {key} must be a positive integer, got {v!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kv_bytes_per_token"] = self.kv_bytes_per_token
        d["kv_kib_per_token"] = self.kv_bytes_per_token / 1024
        return d


@dataclass(frozen=True)
class Scenario:
    """A complete analytical-model input: geometry plus a workload and rates."""

    geometry: Geometry
    tokens: int
    pauses_s: tuple[float, ...]
    bandwidth_gib_s: float
    prefill_tok_s: float


PRESETS: dict[str, Geometry] = {
    "qwen2.5-3b": Geometry(36, 2, 128, 2, "qwen2.5-3b", "preset"),
    "llama-3.1-8b": Geometry(32, 8, 128, 2, "llama-3.1-8b", "preset"),
    "llama-3.1-70b": Geometry(80, 8, 128, 2, "llama-3.1-70b", "preset"),
    # SmolLM2-135M: 30 blocks, 9 query heads over a 576 embedding (head dim 64), 3 KV heads.
    "smollm2-135m": Geometry(30, 3, 64, 2, "smollm2-135m", "preset"),
}

SCENARIOS: dict[str, Scenario] = {
    # The seed experiment of the design: Qwen2.5-3B geometry, two 4096-token pauses.
    "seed-lab": Scenario(
        geometry=Geometry(36, 2, 128, 2, "qwen2.5-3b", "preset seed-lab"),
        tokens=4096,
        pauses_s=(0.05, 5.0),
        bandwidth_gib_s=8.0,
        prefill_tok_s=20_000.0,
    ),
}


def preset_names() -> list[str]:
    return sorted([*PRESETS, *SCENARIOS])


def lookup_preset(name: str) -> tuple[Geometry, Scenario | None]:
    """The geometry of a preset and, for a scenario preset, its workload and rates."""
    key = name.strip().lower()
    if key in SCENARIOS:
        return SCENARIOS[key].geometry, SCENARIOS[key]
    if key in PRESETS:
        return PRESETS[key], None
    raise InputError(f"unknown preset {name!r}; one of {', '.join(preset_names())}")


def _gguf_value(fields: dict[str, Any], key: str) -> Any:
    f = fields.get(key)
    if f is None:
        return None
    return f.contents()


def _uniform(value: Any, key: str, notes: list[str]) -> int:
    """A per-layer array of counts collapses to one number (its maximum: an upper bound)."""
    if isinstance(value, list):
        if not value:
            raise InputError(f"GGUF key {key} is an empty array")
        if len(set(value)) > 1:
            notes.append(f"{key} varies per layer; the maximum {max(value)} is used")
        return int(max(value))
    return int(value)


def from_gguf(path: str | Path, dtype_bytes: int = DEFAULT_KV_DTYPE_BYTES) -> Geometry:
    """Read the KV geometry from a GGUF file's metadata (no tensor data is loaded)."""
    from gguf import GGUFReader  # imported here: reading is the only use, and it is not cheap

    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: GGUF file does not exist")
    try:
        fields = GGUFReader(p, "r").fields
    except Exception as exc:  # the reader raises several types for a file that is not GGUF
        raise InputError(f"{p}: cannot read as GGUF: {exc}") from None
    arch = _gguf_value(fields, "general.architecture")
    if not isinstance(arch, str):
        raise InputError(f"{p}: GGUF metadata has no general.architecture")
    notes: list[str] = []

    def need(key: str) -> Any:
        v = _gguf_value(fields, f"{arch}.{key}")
        if v is None:
            raise InputError(f"{p}: GGUF metadata has no {arch}.{key}")
        return v

    layers = _uniform(need("block_count"), "block_count", notes)
    heads = _uniform(need("attention.head_count"), "attention.head_count", notes)
    kv_raw = _gguf_value(fields, f"{arch}.attention.head_count_kv")
    kv_heads = heads if kv_raw is None else _uniform(kv_raw, "attention.head_count_kv", notes)
    k_len = _gguf_value(fields, f"{arch}.attention.key_length")
    v_len = _gguf_value(fields, f"{arch}.attention.value_length")
    if k_len is not None and v_len is not None:
        if (int(k_len) + int(v_len)) % 2:
            raise InputError(f"{p}: key_length + value_length is odd; give --head-dim")
        head_dim = (int(k_len) + int(v_len)) // 2
    else:
        emb = int(need("embedding_length"))
        if heads <= 0 or emb % heads:
            raise InputError(f"{p}: embedding_length {emb} is not a multiple of head_count "
                             f"{heads}; give --head-dim")
        head_dim = emb // heads
    name = _gguf_value(fields, "general.name")
    source = f"gguf {p.name} ({arch})" + (f"; {'; '.join(notes)}" if notes else "")
    return Geometry(layers, kv_heads, head_dim, dtype_bytes,
                    str(name) if name else p.stem, source).validate()


_HF_DTYPES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 4, "float": 4,
              "float8_e4m3fn": 1, "float8_e5m2": 1}


def from_hf_config(path: str | Path) -> Geometry:
    """Read the KV geometry from a Hugging Face `config.json` (text_config for multimodal ones)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"{p}: config file does not exist") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{p}: cannot read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a JSON object")
    cfg = data
    if "num_hidden_layers" not in cfg and isinstance(data.get("text_config"), dict):
        cfg = data["text_config"]

    def num(key: str, default: Any = None) -> int:
        v = cfg.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise InputError(f"{p}: {key} must be a positive integer, got {v!r}")
        return v

    layers = num("num_hidden_layers")
    heads = num("num_attention_heads")
    kv_heads = num("num_key_value_heads", heads)
    if cfg.get("head_dim") is not None:
        head_dim = num("head_dim")
    else:
        hidden = num("hidden_size")
        if hidden % heads:
            raise InputError(f"{p}: hidden_size {hidden} is not a multiple of "
                             f"num_attention_heads {heads}")
        head_dim = hidden // heads
    dtype = str(cfg.get("torch_dtype") or data.get("torch_dtype") or cfg.get("dtype") or "")
    dtype_bytes = _HF_DTYPES.get(dtype.removeprefix("torch."), DEFAULT_KV_DTYPE_BYTES)
    name = str(data.get("_name_or_path") or cfg.get("model_type") or p.parent.name or "hf")
    return Geometry(layers, kv_heads, head_dim, dtype_bytes, name,
                    f"hf-config {p.name} (dtype {dtype or 'unset'})").validate()
