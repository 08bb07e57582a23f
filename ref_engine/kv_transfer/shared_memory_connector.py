"""`SharedMemoryConnector`: a request's K/V crosses from the prefill process to the decode process through
a POSIX shared-memory segment; only its name travels with the request's control messages.

Why shared memory and not the pipe: the pipe that carries control messages (add this request, this one
finished) would pickle the K/V, push it through a kernel buffer in chunks and unpickle it on the other side,
several copies of megabytes per request, while the router process in the middle relays every byte. With a
segment the producer copies the prompt's blocks once, from its paged cache into the segment, and the
consumer copies them once, from the segment into its own blocks; the router relays a name of a few dozen
bytes. (On a GPU cluster this is where NIXL or NCCL would move the blocks device to device.)

Ownership is explicit: the producer creates a segment per request (`serving_lab_kv_<pid>_<n>`), the
consumer unlinks it once loaded, and `discard_kv` unlinks one that will never be loaded. A segment left by
a process killed mid-transfer is unlinked by Python's resource tracker when the program that started the
engines exits.

Layout of a segment: `[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`, the paged cache's
own layout (ref_engine/attention.py) for the request's blocks, stacked over layers.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from __future__ import annotations

import itertools
import math
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.shared_memory import SharedMemory

import torch

from ref_engine.kv_transfer.connector import KVConnectorBase

SEGMENT_PREFIX = "serving_lab_kv_"

_segment_numbers = itertools.count()


class SharedMemoryConnector(KVConnectorBase):
    def save_kv(self, request_id: str, kv_caches: list[torch.Tensor], block_ids: list[int]) -> str:
        shape = _segment_shape(kv_caches, len(block_ids))
        segment = SharedMemory(f"{SEGMENT_PREFIX}{os.getpid()}_{next(_segment_numbers)}", create=True,
                               size=math.prod(shape) * kv_caches[0].element_size())
        with _closing(segment):
            _copy_out(kv_caches, block_ids, _view(segment, shape, kv_caches[0].dtype))
        return segment.name

    def load_kv(self, handle: str, kv_caches: list[torch.Tensor], block_ids: list[int]) -> None:
        segment = SharedMemory(handle)
        with _closing(segment):
            _copy_in(_view(segment, _segment_shape(kv_caches, len(block_ids)), kv_caches[0].dtype), kv_caches,
                     block_ids)
        segment.unlink()

    def discard_kv(self, handle: str) -> None:
        try:
            segment = SharedMemory(handle)
        except FileNotFoundError:
            return
        segment.close()
        segment.unlink()


def _segment_shape(kv_caches: list[torch.Tensor], num_blocks: int) -> tuple[int, ...]:
    _, _, block_size, num_kv_heads, head_dim = kv_caches[0].shape
    return len(kv_caches), 2, num_blocks, block_size, num_kv_heads, head_dim


def _view(segment: SharedMemory, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The segment's bytes as a tensor of this shape, without copying; checks that they are all there."""
    count = math.prod(shape)
    if segment.size < count * dtype.itemsize:
        raise ValueError(f"KV segment {segment.name} holds {segment.size} bytes, expected "
                         f"{count * dtype.itemsize}: producer and consumer disagree on the model or block size")
    return torch.frombuffer(segment.buf, dtype=dtype, count=count).view(shape)


def _copy_out(kv_caches: list[torch.Tensor], block_ids: list[int], staged: torch.Tensor) -> None:
    """The blocks of every layer, from the paged cache into the segment."""
    ids = torch.tensor(block_ids, dtype=torch.long, device=kv_caches[0].device)
    for i, layer in enumerate(kv_caches):
        staged[i].copy_(layer.index_select(1, ids))


def _copy_in(staged: torch.Tensor, kv_caches: list[torch.Tensor], block_ids: list[int]) -> None:
    """The segment's blocks into these blocks of every layer of the paged cache."""
    ids = torch.tensor(block_ids, dtype=torch.long, device=kv_caches[0].device)
    for i, layer in enumerate(kv_caches):
        layer[:, ids] = staged[i].to(layer.device)


@contextmanager
def _closing(segment: SharedMemory) -> Iterator[None]:
    """Close the segment after the block, and on an error unlink it too (its K/V is of no use then). A tensor
    viewing the segment keeps it from closing, so the views live only inside `_copy_out` / `_copy_in`, whose frames an exception's
    traceback would keep alive: they are cleared first."""
    try:
        yield
    except BaseException as error:
        traceback.clear_frames(error.__traceback__)
        segment.close()
        segment.unlink()
        raise
    segment.close()
