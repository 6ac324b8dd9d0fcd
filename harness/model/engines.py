"""The serving engines the harness knows, in one table: their names, which keep a paged prefix
cache, their default KV block size, and the runtimes whose servers schedule and cache like them.

Every other module reads its engine facts here (the simulator's memory semantics, the
calibration's `engine`, the bench's and the advisor's choices), so an engine is added in one
place.
"""

from __future__ import annotations

from dataclasses import dataclass

LLAMACPP, VLLM, SGLANG = "llamacpp", "vllm", "sglang"


@dataclass(frozen=True)
class EngineFacts:
    """One engine: `prefix_cache` (a paged token pool whose freed blocks stay cached,
    evictable) or not (llama.cpp's slots or a plain pool: nothing cached once dropped);
    `block_size`: its KV block in tokens when the server tells none; `runtimes`: the runtime
    names whose servers are this engine."""

    name: str
    prefix_cache: bool
    block_size: int
    runtimes: tuple[str, ...]


ENGINE_TABLE: dict[str, EngineFacts] = {
    LLAMACPP: EngineFacts(LLAMACPP, prefix_cache=False, block_size=1,
                          runtimes=("llamacpp", "llama.cpp")),
    VLLM: EngineFacts(VLLM, prefix_cache=True, block_size=16, runtimes=("vllm",)),
    SGLANG: EngineFacts(SGLANG, prefix_cache=True, block_size=1, runtimes=("sglang",)),
}
ENGINES: tuple[str, ...] = tuple(ENGINE_TABLE)
# The engines with a paged prefix cache (vLLM, SGLang).
PREFIX_CACHE_ENGINES: tuple[str, ...] = tuple(e.name for e in ENGINE_TABLE.values()
                                              if e.prefix_cache)
# The engines' default block sizes, where they have a prefix cache and the server tells none.
BLOCK_SIZE: dict[str, int] = {e: ENGINE_TABLE[e].block_size for e in PREFIX_CACHE_ENGINES}
# What a runtime's servers schedule and cache like (runtimes not listed: no known engine).
RUNTIME_ENGINES: dict[str, str] = {r: e.name for e in ENGINE_TABLE.values() for r in e.runtimes}
