"""Integer arithmetic every block count uses, engine, simulator and experiments alike.

Tokens live in whole blocks, so "how many blocks hold n tokens" is a ceiling division everywhere; one
`cdiv` (vLLM's name) keeps the rounding in one place.

Lesson: lessons/02-paged-attention.md (a sequence holds whole blocks).
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, without floats: the blocks that hold `a` tokens at `b` per block."""
    return -(-a // b)
