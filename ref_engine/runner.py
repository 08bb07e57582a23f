"""`ModelRunner`: a `SchedulerOutput` in, logits out — the only place the engine touches the device.

It owns the paged KV cache tensors (one per layer, [2, num_blocks, block_size, kv_heads, head_dim]) and the
host pool that swapped-out blocks go to. Each step it
1. carries out the scheduler's copy plan (swap-out device -> host, copy-on-write device -> device for a
   fully cached prompt, swap-in host -> device). On CUDA the host pool is pinned and the plan runs on a side
   stream, its swaps asynchronous: this thread goes on building the batch meanwhile, and the compute stream
   waits for the copies (an event) before the forward, which may write blocks a swap-out freed and reads
   those a swap-in filled. A CPU copies in place, in order;
2. flattens the scheduled requests into one token batch: token ids, positions, and the attention metadata
   (query start offsets, context lengths, slot mapping, block tables) that tells attention which slots
   to write and which blocks to read;
3. runs the model once over all those tokens, then the LM head only on each request's last token where
   the scheduler asked for a sample, or on its last 1 + k tokens when it verifies k draft tokens.
It decides nothing: what to run comes from the scheduler, what to emit from the sampler.

Under tensor parallelism each worker has its own runner over its share of the model and of the KV heads
(ref_engine/worker/); all of them run every step, and only rank 0's computes logits.

With `enforce_eager=False` the model's forward runs compiled (ref_engine/model/compile.py), and the runner
compiles it when it is built, on two dummy passes (1 token and 2), so that the first request's step does not
pay for compiling and a compiler that fails stops the engine at start. On a GPU (one rank) it means CUDA graphs
instead (ref_engine/cuda_graphs.py): decode steps replay graphs captured at `cudagraph_capture_sizes`, other
steps run eagerly, and the cache has one block more than the pool for the graphs' padding rows to write to.

Lesson: lessons/02-paged-attention.md (block table and slot mapping); lessons/05-speculative-decoding.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.arch_config import ArchConfig
from core.interfaces import SchedulerOutput
from core.math_utils import cdiv
from ref_engine.attention import AttentionMetadata, allocate_kv_cache
from ref_engine.cuda_graphs import CUDAGraphRunner, uses_cuda_graphs
from ref_engine.model.compile import compile_decoder


@dataclass
class ModelOutput:
    request_ids: list[str]  # whose rows `logits` holds, in order
    # [rows, vocab] float32: 1 + num_draft_tokens rows per request, in order; None from a runner that does not
    # compute logits (a tensor-parallel rank other than 0)
    logits: torch.Tensor | None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock reading taken next covers it: CUDA launches
    kernels asynchronously, and a step that samples nothing would otherwise record only launch time. A
    CPU computes in place; nothing to wait for."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, arch: ArchConfig, *, num_kv_blocks: int, num_swap_blocks: int,
                 block_size: int, dtype: torch.dtype, device: torch.device, enforce_eager: bool = True,
                 tensor_parallel_size: int = 1, compute_logits: bool = True,
                 cudagraph_capture_sizes: Sequence[int] = (), max_model_len: int | None = None) -> None:
        """`tensor_parallel_size`: the model is one rank's share, and its KV cache holds that rank's KV heads;
        `compute_logits`: run the LM head (on tensor-parallel rank 0 only: the engine samples from its rows);
        `cudagraph_capture_sizes` (`cuda_graphs.capture_sizes`), `max_model_len`: the decode graphs' shapes."""
        self.model = model
        self.block_size = block_size
        self.device = device
        self.compute_logits = compute_logits
        graphs = uses_cuda_graphs(enforce_eager, device, tensor_parallel_size, cudagraph_capture_sizes)
        self.kv_caches = allocate_kv_cache(arch, num_kv_blocks + int(graphs), block_size, dtype, device,
                                           tensor_parallel_size)  # + the graphs' scratch block, past the pool
        self.cuda_graphs = CUDAGraphRunner(model, self.kv_caches, cudagraph_capture_sizes, block_size,
                                           max_model_len) if graphs else None
        on_cuda = device.type == "cuda"
        self.host_kv_caches = allocate_kv_cache(arch, num_swap_blocks, block_size, dtype, torch.device("cpu"),
                                                tensor_parallel_size, zeroed=False, pin_memory=on_cuda)
        self.copy_stream = torch.cuda.Stream(device) if on_cuda else None  # the copy plan's, beside the compute stream
        compiles = not enforce_eager and not graphs  # graphs record the eager forward: see ref_engine/cuda_graphs.py
        self.forward = compile_decoder(model) if compiles else model
        if compiles:
            self._compile_now()

    @torch.inference_mode()
    def execute_model(self, output: SchedulerOutput) -> ModelOutput:
        self.run_copy_plan(output)

        input_ids: list[int] = []
        positions: list[int] = []
        logits_indices: list[int] = []  # the flat rows whose logits are sampled or verified
        for s in output.scheduled:
            input_ids += s.token_ids
            positions += range(s.num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens)
            if s.needs_logits:
                logits_indices += range(len(input_ids) - 1 - s.num_draft_tokens, len(input_ids))
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(output.scheduled):
            hidden = self.cuda_graphs.run(output.scheduled)
        else:
            meta = AttentionMetadata.build(
                query_lens=[s.num_scheduled_tokens for s in output.scheduled],
                seq_lens=[s.num_computed_tokens + s.num_scheduled_tokens for s in output.scheduled],
                block_tables=[s.block_ids for s in output.scheduled],
                block_size=self.block_size,
                device=self.device,
            )
            hidden = self.forward(
                torch.tensor(input_ids, dtype=torch.long, device=self.device),
                torch.tensor(positions, dtype=torch.long, device=self.device),
                self.kv_caches,
                meta,
            )
        request_ids = [s.request_id for s in output.scheduled if s.needs_logits]
        if not self.compute_logits:
            return ModelOutput(request_ids, None)
        rows = torch.tensor(logits_indices, dtype=torch.long, device=self.device)
        return ModelOutput(request_ids, self.model.compute_logits(hidden[rows]))

    @torch.inference_mode()
    def _compile_now(self) -> None:
        """Run the compiled forward once on 1 token and once on 2 (the two graphs of each piece: torch
        specialises size 1), in the first blocks of the cache, then zero the cache again."""
        for num_tokens in (1, 2):
            tokens = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
            meta = AttentionMetadata.build([num_tokens], [num_tokens], [list(range(cdiv(num_tokens, self.block_size)))],
                                           self.block_size, self.device)
            self.forward(tokens, torch.arange(num_tokens, device=self.device), self.kv_caches, meta)
        for layer in self.kv_caches:
            layer.zero_()

    def run_copy_plan(self, output: SchedulerOutput) -> None:
        """The step's block copies in the plan's order: swap-out, copy-on-write, swap-in (each reads a block
        before a later one overwrites it). On CUDA on `copy_stream`, after the compute stream's earlier work
        (the blocks' last writes), with the swaps asynchronous; the compute stream then waits for them."""
        plans = ((output.swap_out, self.kv_caches, self.host_kv_caches, True),  # (plan, src, dst, is a swap)
                 (output.copy_blocks, self.kv_caches, self.kv_caches, False),
                 (output.swap_in, self.host_kv_caches, self.kv_caches, True))
        if self.copy_stream is None:
            for plan, src, dst, _ in plans:
                self.copy_blocks(plan, src=src, dst=dst)
            return
        if not any(plan for plan, *_ in plans):
            return
        compute_stream = torch.cuda.current_stream(self.device)
        self.copy_stream.wait_stream(compute_stream)
        with torch.cuda.stream(self.copy_stream):
            for plan, src, dst, is_swap in plans:
                self.copy_blocks(plan, src=src, dst=dst, non_blocking=is_swap)
        compute_stream.wait_stream(self.copy_stream)  # records an event on the copy stream and waits on it

    @staticmethod
    def copy_blocks(plan: list[tuple[int, int]], *, src: list[torch.Tensor], dst: list[torch.Tensor],
                    non_blocking: bool = False) -> None:
        """Copy blocks src[i] -> dst[j] for each (i, j) in the plan, in every layer: a step's swap and
        copy-on-write plans, and lesson 2's timing of a swap. K and V of all the plan's blocks move in one
        gather per layer; `non_blocking` (a swap beside a CUDA device) copies each block's K and V on its own
        instead, straight between the pools: each is one contiguous slab, which a pinned host pool copies
        asynchronously, where a gather would go through a temporary the host must wait for."""
        if not plan:
            return
        if non_blocking:
            for src_layer, dst_layer in zip(src, dst):
                for i, j in plan:
                    dst_layer[0, j].copy_(src_layer[0, i], non_blocking=True)
                    dst_layer[1, j].copy_(src_layer[1, i], non_blocking=True)
            return
        src_ids = torch.tensor([i for i, _ in plan], dtype=torch.long, device=src[0].device)
        dst_ids = torch.tensor([j for _, j in plan], dtype=torch.long, device=dst[0].device)
        for src_layer, dst_layer in zip(src, dst):
            dst_layer[:, dst_ids] = src_layer[:, src_ids].to(dst_layer.device)
