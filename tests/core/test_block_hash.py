"""The hash chain's two entry points agree: `extend_block_hashes` (packs a run of tokens once, the hot
path) and `hash_block_tokens` (one block at a time, what the exercises and miss explanations use)."""

from __future__ import annotations

import hashlib
from array import array

from hypothesis import given
from hypothesis import strategies as st

from core.block_hash import extend_block_hashes, hash_block_tokens


def test_a_link_is_blake2b_of_parent_keys_and_tokens() -> None:
    """Pinned to the streaming form (three updates), so a stored or exchanged hash never changes."""
    parent, keys, tokens = b"p" * 16, b"keys", [1, 2, 3, 4]
    h = hashlib.blake2b(digest_size=16)
    for part in (parent, keys, array("q", tokens).tobytes()):
        h.update(part)
    assert hash_block_tokens(parent, tokens, keys) == h.digest()
    assert hash_block_tokens(None, tokens, keys) == hash_block_tokens(b"\0" * 16, tokens, keys)


@given(tokens=st.lists(st.integers(0, 2**40), max_size=80), block_size=st.integers(1, 9),
       cuts=st.lists(st.integers(0, 80), max_size=4), extra_keys=st.binary(max_size=8))
def test_extend_matches_block_by_block(tokens: list[int], block_size: int, cuts: list[int],
                                       extra_keys: bytes) -> None:
    expected: list[bytes] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        expected.append(hash_block_tokens(expected[-1] if expected else None,
                                          tokens[start:start + block_size], extra_keys))
    hashes: list[bytes] = []
    for cut in [*sorted(cuts), len(tokens)]:  # tokens arrive in pieces, as a request's do
        done = len(hashes) * block_size
        if cut >= done:
            extend_block_hashes(hashes, tokens[done:cut], block_size, extra_keys)
    assert hashes == expected
