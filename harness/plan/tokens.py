"""Deterministic pseudo-random token ids: each trajectory appends the same ids on every run.

The i-th id of a seed is splitmix64(seed + i * golden) folded into the id range: a pure
function of (seed, i, vocabulary size), computed in plain integers for the short appends a
replay sends on every call (a generator object per call cost ~40 us) and with numpy for long
ones; both give the same ids.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

# Ids below this are left alone: tokenizers keep their special and control tokens there.
LOW_ID = 256
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
# Up to this many ids, plain integers are faster than numpy's per-call overhead.
_SCALAR_MAX = 48


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from the parts' text (stable across processes, unlike hash())."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _span(vocab_size: int) -> int:
    return max(vocab_size - LOW_ID, LOW_ID + 1) - LOW_ID


def _scalar(seed: int, n: int, span: int) -> list[int]:
    out = []
    x = seed & _MASK
    for _ in range(n):
        x = (x + _GOLDEN) & _MASK
        z = ((x ^ (x >> 30)) * _M1) & _MASK
        z = ((z ^ (z >> 27)) * _M2) & _MASK
        out.append((z ^ (z >> 31)) % span + LOW_ID)
    return out


def _vector(seed: int, n: int, span: int) -> list[int]:
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as splitmix64 intends
        x = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GOLDEN) + np.uint64(seed & _MASK)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
        x ^= x >> np.uint64(31)
    ids: list[int] = (x % np.uint64(span) + np.uint64(LOW_ID)).tolist()
    return ids


def token_ids(seed: int, n: int, vocab_size: int) -> list[int]:
    """`n` ids in [LOW_ID, vocab_size - LOW_ID), reproducible for `seed`."""
    if n <= 0:
        return []
    span = _span(vocab_size)
    return _scalar(seed, n, span) if n <= _SCALAR_MAX else _vector(seed, n, span)


@functools.lru_cache(maxsize=256)
def _shared(seed: int, n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(token_ids(seed, n, vocab_size))


def shared_token_ids(seed: int, n: int, vocab_size: int) -> list[int]:
    """token_ids for ids many calls send alike (a shared system prompt), computed once."""
    return list(_shared(seed, n, vocab_size))
