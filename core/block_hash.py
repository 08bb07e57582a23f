"""Content hashes of KV blocks: what makes a block findable again by the next request with the same prefix.

A full block's K/V depends on every token before it, not only on its own tokens, so its identity is a
hash **chain**: `hash(block i) = H(hash(block i - 1), tokens of block i, extra keys)`. Two requests get the
same hash for block i exactly when their first (i + 1) * block_size tokens agree (up to a hash collision,
which the block pool rules out by comparing tokens on a hit).

The extra keys go into every link: the model identity (K/V from another model is garbage) and the
isolation key, the tenant combined with the request's `cache_salt`. Requests with different isolation
keys can never share a block, which closes the timing side channel of a shared cache (lesson 4).

H is BLAKE2b with a 16-byte digest, never Python's `hash()`: that one is salted per process for strings
and trivially collides for small ints, so it would be neither stable nor safe.

Lesson: lessons/04-prefix-caching.md (content-hashed blocks and the hash chain).
"""

from __future__ import annotations

import functools
import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes


@functools.lru_cache(maxsize=1024)  # asked each time a request's chain grows; a run has few distinct keys
def isolation_key(model_id: str, tenant: str | None, cache_salt: str | None) -> bytes:
    """The extra keys every block hash of a request includes: model, tenant and cache salt.

    Fields are length-prefixed so that ("ab", "c") and ("a", "bc") cannot produce the same key.
    """
    parts = (model_id, tenant or "", cache_salt or "")
    return b"".join(len(p.encode()).to_bytes(4, "little") + p.encode() for p in parts)


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: bytes) -> BlockHash:
    """One link of the chain: the hash of a full block given its parent's hash (None for the first block)."""
    return _hash_link(parent, extra_keys, array("q", token_ids).tobytes())


def _hash_link(parent: BlockHash | None, extra_keys: bytes, token_bytes: bytes) -> BlockHash:
    """H(parent, extra keys, the block's tokens as int64s): the one definition of a link."""
    return hashlib.blake2b((parent or b"\0" * 16) + extra_keys + token_bytes, digest_size=16).digest()


def extend_block_hashes(hashes: list[BlockHash], new_token_ids: Sequence[int], block_size: int,
                        extra_keys: bytes) -> None:
    """Append the hashes of the full blocks in `new_token_ids`, the tokens that follow the last hashed block.

    Tokens only ever grow (prompt, then outputs), so a request's chain is computed once, block by block;
    a trailing partial block is left for a later call. The tokens are packed to bytes once and each link
    hashes its slice: the same bytes `hash_block_tokens` packs block by block, so the same hashes.
    """
    token_bytes = array("q", new_token_ids).tobytes()
    width = block_size * array("q").itemsize
    for start in range(0, len(token_bytes) - width + 1, width):
        parent = hashes[-1] if hashes else None
        hashes.append(_hash_link(parent, extra_keys, token_bytes[start:start + width]))
