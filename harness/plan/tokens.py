"""Deterministic pseudo-random token ids: each trajectory appends the same ids on every run."""

from __future__ import annotations

import hashlib

import numpy as np

# Ids below this are left alone: tokenizers keep their special and control tokens there.
LOW_ID = 256


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from the parts' text (stable across processes, unlike hash())."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def token_ids(seed: int, n: int, vocab_size: int) -> list[int]:
    """`n` ids in [LOW_ID, vocab_size - LOW_ID), reproducible for `seed`."""
    if n <= 0:
        return []
    high = max(vocab_size - LOW_ID, LOW_ID + 1)
    rng = np.random.default_rng(seed)
    ids: list[int] = rng.integers(LOW_ID, high, size=n).tolist()
    return ids
