"""`SeededTokens`: a prompt of seeded random token ids that takes memory only while someone reads it.

A simulated trace replay sends prompts whose token ids are random: only their length drives the schedule,
and their content matters only where something hashes it (the prefix cache, a prefix-aware router). As a
list, a 1,000-token prompt costs ~36 KB (a pointer and an int object per token), so a million of them do
not fit in memory, and drawing them takes minutes. `SeededTokens` stores a key and a length instead and
makes any token on demand: token j is drawn from a keyed hash of its 16-token chunk, H(key, j // 16), so
a slice costs only its own chunks, in any order, and reading it twice gives the same ids.

It is a read-only `Sequence[int]` that behaves as the list it stands for where the core uses a prompt:
`len`, indexing, iteration, `==` with a list, and slicing, which returns another `SeededTokens` (a view)
so that a prefill chunk's ids (`Request.token_ids`) stay lazy; `+` with a list gives a list.

Lesson: lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet (a million simulated requests).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Sequence
from typing import overload

CHUNK = 16  # tokens per keyed hash: 64 bytes of BLAKE2b output, 4 bytes a token


class SeededTokens(Sequence[int]):
    """`length` token ids in [low, high), fixed by `key`; `offset` > 0 for a view that starts inside them."""

    __slots__ = ("key", "low", "span", "offset", "length")

    def __init__(self, key: bytes, length: int, low: int, high: int, offset: int = 0) -> None:
        if length < 0 or not 0 <= low < high:
            raise ValueError(f"SeededTokens needs length >= 0 and 0 <= low < high, got {length}, {low}, {high}")
        self.key, self.low, self.span, self.offset, self.length = key, low, high - low, offset, length

    @classmethod
    def seeded(cls, seed: object, length: int, low: int, high: int) -> SeededTokens:
        """The tokens a seed names (any value whose `str` identifies it: "3:prompt:17")."""
        return cls(hashlib.blake2b(str(seed).encode(), digest_size=32).digest(), length, low, high)

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.length)
            if step != 1:
                return self._tokens(0, self.length)[index]
            return SeededTokens(self.key, max(0, stop - start), self.low, self.low + self.span,
                                self.offset + start)
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError("SeededTokens index out of range")
        return self._tokens(index, index + 1)[0]

    def __iter__(self) -> Iterator[int]:
        return iter(self._tokens(0, self.length))

    def __add__(self, other: object) -> list[int]:
        if not isinstance(other, (list, tuple, SeededTokens)):
            return NotImplemented
        return self._tokens(0, self.length) + list(other)

    def __radd__(self, other: object) -> list[int]:
        if not isinstance(other, (list, tuple)):
            return NotImplemented
        return list(other) + self._tokens(0, self.length)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, tuple, SeededTokens)):
            return NotImplemented
        return len(other) == self.length and self._tokens(0, self.length) == list(other)

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable like one

    def __repr__(self) -> str:
        return f"SeededTokens(key={self.key.hex()[:8]}..., length={self.length}, offset={self.offset})"

    def _tokens(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of this view, as a list: the chunks that hold them, drawn and cut."""
        first, last = self.offset + start, self.offset + stop
        if first >= last:
            return []
        words = array("I")
        for chunk in range(first // CHUNK, (last - 1) // CHUNK + 1):
            words.frombytes(hashlib.blake2b(chunk.to_bytes(8, "little"), key=self.key, digest_size=64).digest())
        low, span, skip = self.low, self.span, first % CHUNK
        return [low + word % span for word in words[skip:skip + last - first]]
