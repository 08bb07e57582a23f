"""`SeededTokens`: a prompt of seeded random token ids that takes memory only once someone reads it.

A simulated trace replay sends prompts whose token ids are random: only their length drives the schedule,
and their content matters only where something hashes it (the prefix cache, a prefix-aware router). As a
list, a 1,000-token prompt costs ~36 KB (a pointer and an int object per token), so a million of them do
not fit in memory, and drawing them all takes minutes. `SeededTokens` holds a seed and a length; the first
read draws the ids (`random.Random(seed).choices`, as `Workload` draws its prompts) and keeps them in an
array of int64, 8 bytes a token, shared by every slice, for as long as the prompt lives. Without prefix
caching nothing reads a simulated prompt, so it is never drawn.

It is a read-only `Sequence[int]` that behaves as the list it stands for where the core uses a prompt:
`len`, indexing, iteration, `==` with a list, and slicing, which returns another `SeededTokens` (a view of
the same draw) while nothing has been read, so that a prefill chunk's ids (`Request.token_ids`) stay unread,
and a list once the ids are drawn (the prefix cache reads each block's ids: a list is the fastest to read);
`+` with a list gives a list.

Lesson: lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet (fleets, up to a million requests).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterator, Sequence
from typing import overload


class _Draw:
    """A whole prompt's ids: a seed and a range until first read, then the drawn ids."""

    __slots__ = ("seed", "length", "low", "high", "ids")

    def __init__(self, seed: str, length: int, low: int, high: int) -> None:
        self.seed, self.length, self.low, self.high = seed, length, low, high
        self.ids: array | None = None

    def drawn(self) -> array:
        if self.ids is None:
            self.ids = array("q", random.Random(self.seed).choices(range(self.low, self.high), k=self.length))
        return self.ids


class SeededTokens(Sequence[int]):
    """`length` ids of a seeded draw from `offset` on (a whole prompt: offset 0, its whole length)."""

    __slots__ = ("draw", "offset", "length")

    def __init__(self, draw: _Draw, offset: int, length: int) -> None:
        self.draw, self.offset, self.length = draw, offset, length

    @classmethod
    def seeded(cls, seed: object, length: int, low: int, high: int) -> SeededTokens:
        """`length` ids in [low, high) that `seed` fixes (its `str` is the seed: "3:prompt:17")."""
        if length < 0 or not 0 <= low < high:
            raise ValueError(f"SeededTokens needs length >= 0 and 0 <= low < high, got {length}, {low}, {high}")
        return cls(_Draw(str(seed), length, low, high), 0, length)

    @property
    def is_drawn(self) -> bool:
        """Whether anyone has read the ids yet (until then they take no memory)."""
        return self.draw.ids is not None

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
                return self._ids()[index]
            if self.draw.ids is not None:  # drawn already: a list, as fast to read as a list prompt's slice
                return self.draw.ids[self.offset + start:self.offset + max(start, stop)].tolist()
            return SeededTokens(self.draw, self.offset + start, max(0, stop - start))
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError("SeededTokens index out of range")
        return self.draw.drawn()[self.offset + index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.draw.drawn()[self.offset:self.offset + self.length])

    def __add__(self, other: object) -> list[int]:
        if not isinstance(other, (list, tuple, SeededTokens)):
            return NotImplemented
        return self._ids() + list(other)

    def __radd__(self, other: object) -> list[int]:
        if not isinstance(other, (list, tuple)):
            return NotImplemented
        return list(other) + self._ids()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, tuple, SeededTokens)):
            return NotImplemented
        return len(other) == self.length and self._ids() == list(other)

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable like one

    def __repr__(self) -> str:
        return f"SeededTokens(seed={self.draw.seed!r}, offset={self.offset}, length={self.length})"

    def _ids(self) -> list[int]:
        return self.draw.drawn()[self.offset:self.offset + self.length].tolist()
