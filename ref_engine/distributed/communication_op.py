"""`tensor_model_parallel_all_reduce`: the one collective tensor parallelism needs in a Llama layer (vLLM's
name). A row-parallel projection (o_proj, down_proj) leaves each rank a partial sum of the full output;
this adds them up so that every rank holds the whole activation again. Under `enforce_eager=False` it runs
eagerly between the compiled pieces of a layer (ref_engine/model/compile.py, as paged attention does): the
collective and its timer are nothing a compiler can fuse.

Lesson: lessons/07-tuning-knobs.md#parallelism
"""

from __future__ import annotations

import torch

from ref_engine.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """`x` summed over this process's tensor-parallel ranks, in place (timed, `GroupCoordinator`)."""
    return get_tp_group().all_reduce(x)
