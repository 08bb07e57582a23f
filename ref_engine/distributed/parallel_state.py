"""Parallel state: the process group of one engine's tensor-parallel ranks, and this process's place in it.

vLLM's `parallel_state`, cut to one group: all of an engine's ranks form one tensor-parallel group (no
pipeline or data parallelism). `init_distributed_environment` joins it through torch.distributed, with gloo
on a CPU and NCCL on CUDA (rank r of an engine on cuda:i on cuda:i+r), meeting at a rendezvous file the
executor names (`file://...`: no TCP port to pick, so no race for one). `get_tp_group()` is this process's
`GroupCoordinator`; the model's row-parallel layers all-reduce through it (communication_op.py).

The coordinator adds up the wall time spent inside all-reduce calls, which the worker hands back with each
step: on a CPU (gloo) that is the transfer and the wait for the slowest rank; on CUDA the call only
enqueues the collective, so there it is the launch, not the transfer.

Lesson: lessons/07-tuning-knobs.md#parallelism
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# How long a collective may wait for a rank before it raises, instead of gloo's default 30 minutes. A step
# that waits this long is dead anyway; the executor gives up on it sooner (its own timeout) and ends the ranks.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


@dataclass
class GroupCoordinator:
    """This process's tensor-parallel group (vLLM's name): its rank and size, the collective, and the time
    spent in all-reduces since the last `take_all_reduce_stats`."""

    rank: int
    world_size: int
    all_reduce_s: float = 0.0
    num_all_reduces: int = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; every rank gets the sum."""
        start = time.perf_counter()
        dist.all_reduce(x)
        self.all_reduce_s += time.perf_counter() - start
        self.num_all_reduces += 1
        return x

    def take_all_reduce_stats(self) -> tuple[float, int]:
        """(seconds, calls) of all-reduce since the last call, and start counting again."""
        stats = self.all_reduce_s, self.num_all_reduces
        self.all_reduce_s, self.num_all_reduces = 0.0, 0
        return stats


_TP_GROUP: GroupCoordinator | None = None


def distributed_backend(device: torch.device) -> str:
    """The collective library for `device`: NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Where rank `rank` of an engine on `device` runs: on CUDA its own GPU, counted from the engine's (an
    engine on cuda:1 keeps rank 0 there), the shared CPU otherwise."""
    return torch.device("cuda", (device.index or 0) + rank) if device.type == "cuda" else device


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one, as `nproc` counts)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_threads(tensor_parallel_size: int, cores: int | None = None) -> int:
    """Torch threads each of `tensor_parallel_size` worker processes runs on a CPU: the cores (None:
    `cpu_cores()`) shared out, at least one each, so the ranks do not fight over cores."""
    return max(1, (cpu_cores() if cores is None else cores) // tensor_parallel_size)


def init_distributed_environment(rank: int, world_size: int, init_method: str,
                                 device: torch.device) -> GroupCoordinator:
    """Join the engine's process group as `rank` of `world_size` (every rank calls this, and each waits for
    all the others at `init_method`); the group becomes `get_tp_group()`."""
    global _TP_GROUP
    if _TP_GROUP is not None:
        raise RuntimeError("this process is already a rank of a tensor-parallel group")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(distributed_backend(device), init_method=init_method, rank=rank,
                            world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    _TP_GROUP = GroupCoordinator(rank, world_size)
    return _TP_GROUP


def get_tp_group() -> GroupCoordinator:
    if _TP_GROUP is None:
        raise RuntimeError("no tensor-parallel group: init_distributed_environment was not called in this process")
    return _TP_GROUP


def destroy_distributed_environment() -> None:
    """Leave the group (a no-op if this process never joined one)."""
    global _TP_GROUP
    if _TP_GROUP is not None:
        dist.destroy_process_group()
        _TP_GROUP = None
