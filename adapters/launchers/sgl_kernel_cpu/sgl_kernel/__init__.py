"""A CPU stand-in for the `sgl_kernel` functions SGLang's CPU engine needs on a dense model.

SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) imports CPU kernels from the `sgl_kernel` package,
whose registry builds are CUDA-only. This package is put on the SGLang server's PYTHONPATH (never
installed into the harness's environment). It implements the one function a dense model's
prefill and decode call, `assign_req_to_token_pool_cpu`, in plain tensor indexing. Every other
name imports (SGLang imports many at module load, e.g. speculative-decoding tree builders and
`copy_all_layer_kv_cache_cpu`) but raises NotImplementedError when called, so a code path that
needs a real kernel fails loudly instead of silently computing something else.

The function only indexes and slices, so it works on torch tensors and numpy arrays alike.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

__version__ = "0.0.0+harness-cpu-stand-in"


def _ints(x: Any) -> list[int]:
    return [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


def assign_req_to_token_pool_cpu(req_pool_indices: Any, req_to_token: Any, start_offset: Any,
                                 end_offset: Any, out_cache_loc: Any, pool_len: int) -> None:
    """Write each request's new KV locations into its row of the request-to-token table.

    Request i owns row `req_pool_indices[i]` of `req_to_token` (rows are `pool_len` wide); its
    positions `start_offset[i]:end_offset[i]` receive the next `end - start` entries of
    `out_cache_loc`, which holds the batch's new locations request after request.
    """
    taken = 0
    for row, start, end in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset),
                               strict=True):
        n = end - start
        if n <= 0:
            continue
        if end > pool_len:
            raise IndexError(f"request row {row}: end {end} exceeds the pool width {pool_len}")
        req_to_token[row, start:end] = out_cache_loc[taken:taken + n]
        taken += n


def missing(qualname: str) -> Callable[..., Any]:
    """A function that raises NotImplementedError naming `qualname` when called."""

    def stub(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{qualname} is not provided by the harness's CPU stand-in for sgl_kernel (only "
            "assign_req_to_token_pool_cpu is); this SGLang code path needs a real sgl_kernel")

    stub.__name__ = stub.__qualname__ = qualname.rsplit(".", 1)[-1]
    return stub


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule (mamba)
        return importlib.import_module(f"{__name__}.{name}")
    return missing(f"sgl_kernel.{name}")
