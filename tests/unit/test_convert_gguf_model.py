"""The GGUF -> safetensors conversion's pure parts: folder naming and reuse, tensor names, the
rotary un-permutation and the config written (no torch; the real GGUF's metadata when cached)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.adapters.launchers import convert_gguf_model as conv
from harness.model.geometry import Geometry

SMOLLM2_META: dict[str, Any] = {
    "general.architecture": "llama", "llama.block_count": 30, "llama.context_length": 8192,
    "llama.embedding_length": 576, "llama.feed_forward_length": 1536,
    "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3,
    "llama.rope.freq_base": 100000.0, "llama.rope.dimension_count": 64,
    "llama.attention.layer_norm_rms_epsilon": 9.999999747378752e-06,
    "llama.vocab_size": 49152, "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 2}


def test_folder_name_carries_the_source_and_the_recipe() -> None:
    a = conv.folder_name("SmolLM2-135M-Instruct.Q4_1.gguf", "ab" * 32, "recipe1")
    assert a.startswith("smollm2-135m-instruct-q4-1-") and len(a.rsplit("-", 1)[1]) == 12
    assert a == conv.folder_name("SmolLM2-135M-Instruct.Q4_1.gguf", "ab" * 32, "recipe1")
    assert a != conv.folder_name("SmolLM2-135M-Instruct.Q4_1.gguf", "cd" * 32, "recipe1")
    assert a != conv.folder_name("SmolLM2-135M-Instruct.Q4_1.gguf", "ab" * 32, "recipe2")
    assert conv.folder_name("...gguf", "0", "r").startswith("model-")


def test_a_finished_folder_is_reused_without_converting(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"not really a model")
    dest = tmp_path / "out" / conv.folder_name(gguf.name, conv.file_sha256(gguf),
                                               conv.recipe_key())
    dest.mkdir(parents=True)
    (dest / ".complete").touch()
    assert conv.convert(gguf, tmp_path / "out") == dest
    assert conv.main(["--gguf", str(gguf), "--out-root", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(dest)


def test_a_missing_gguf_is_one_line_exit_2(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert conv.main(["--gguf", str(tmp_path / "none.gguf")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_tensor_names_map_to_llama() -> None:
    assert conv.hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert conv.hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert conv.hf_tensor_name("blk.29.attn_q.weight") == "model.layers.29.self_attn.q_proj.weight"
    assert conv.hf_tensor_name("blk.0.ffn_norm.weight") == \
        "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(ValueError, match="rope_freqs"):
        conv.hf_tensor_name("rope_freqs.weight")


def _llamacpp_permute(w: Any, n_head: int) -> Any:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows, which the conversion undoes."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_unpermute_undoes_llamacpps_rotary_permutation() -> None:
    w = np.arange(192 * 8, dtype=np.float32).reshape(192, 8)  # 3 KV heads of head_dim 64
    assert np.array_equal(conv.unpermute(_llamacpp_permute(w, 3), 3), w)
    assert not np.array_equal(_llamacpp_permute(w, 3), w)


def test_config_from_metadata() -> None:
    cfg = conv.hf_config(SMOLLM2_META, {"token_embd.weight", "output_norm.weight"})
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]) == (30, 3, 64)
    assert cfg["rms_norm_eps"] == 1e-05 and cfg["rope_theta"] == 100000.0
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)
    assert cfg["torch_dtype"] == "bfloat16" and cfg["vocab_size"] == 49152
    untied = conv.hf_config(SMOLLM2_META, {"token_embd.weight", "output.weight"})
    assert untied["tie_word_embeddings"] is False
    kv = Geometry(cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"], 2)
    assert kv.kv_bytes_per_token == 23_040  # 30 layers x K,V x 3 heads x 64 x 2 bytes


@pytest.mark.parametrize("change, match", [
    ({"general.architecture": "qwen2"}, "only Llama"),
    ({"llama.rope.scaling.type": "linear"}, "rope scaling"),
    ({"llama.rope.dimension_count": 32}, "head_dim"),
])
def test_config_refuses_what_the_recipe_does_not_convert(change: dict[str, Any],
                                                         match: str) -> None:
    with pytest.raises(ValueError, match=match):
        conv.hf_config({**SMOLLM2_META, **change}, set())


def test_the_cached_gguf_converts_to_smollm2s_geometry() -> None:
    path = conv.cache_root() / "models" / conv.DEFAULT_GGUF
    if not path.is_file():
        pytest.skip(f"{path} is absent (make llama fetches it)")
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(path), "r")
    names = {t.name for t in reader.tensors}
    meta = conv.read_metadata(reader)
    cfg = conv.hf_config(meta, names)
    expected = conv.hf_config(SMOLLM2_META, {"token_embd.weight"})
    assert {k: cfg[k] for k in expected} == expected
    assert {conv.hf_tensor_name(n) for n in names} >= {
        "model.embed_tokens.weight", "model.norm.weight",
        "model.layers.29.mlp.down_proj.weight"}
    assert len(names) == 2 + 9 * cfg["num_hidden_layers"]  # tied: no output.weight
