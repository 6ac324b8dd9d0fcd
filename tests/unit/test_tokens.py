"""Token ids: a pure function of (seed, index, vocabulary), the same on either code path."""

from __future__ import annotations

import pytest

from harness.plan import tokens
from harness.plan.tokens import LOW_ID, shared_token_ids, token_ids


def test_exact_ids_for_a_seed() -> None:
    assert token_ids(1, 5, 32000) == [12993, 9575, 27742, 9483, 17593]
    assert token_ids(1, 0, 32000) == [] and token_ids(1, -3, 32000) == []


@pytest.mark.parametrize("seed", [0, 1, 2**62 + 5, 2**63 - 1])
@pytest.mark.parametrize("n", [1, 7, 48, 49, 500])
def test_scalar_and_vector_paths_agree(seed: int, n: int) -> None:
    span = tokens._span(32000)
    assert tokens._scalar(seed, n, span) == tokens._vector(seed, n, span)


def test_ids_stay_in_range_and_prefixes_extend() -> None:
    ids = token_ids(7, 5000, 1000)
    assert min(ids) >= LOW_ID and max(ids) < 1000 - LOW_ID
    assert token_ids(7, 30, 1000) == ids[:30]  # a longer draw extends a shorter one
    assert len(set(ids)) > 400  # spread over the range, not a constant


def test_shared_ids_equal_plain_ids_and_are_private_copies() -> None:
    a = shared_token_ids(3, 100, 32000)
    assert a == token_ids(3, 100, 32000)
    a.append(1)
    assert shared_token_ids(3, 100, 32000) == token_ids(3, 100, 32000)
