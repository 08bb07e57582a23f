"""Pipeline parallelism: one engine step run as micro-batches through `pp` stages of layers.

This module owns `PipelineCostModel`, the step timer of a replica whose L layers are cut into `pp` stages
of L / pp layers, each stage on its own tensor-parallel group of `tp` devices (so a replica holds tp x pp
devices). It reuses `CostModel` for the arithmetic and adds only what a pipeline adds:

    micro-batches   the step's requests, dealt round-robin into m groups (m = num_microbatches, default pp;
                    fewer when the step has fewer requests), so stages can work on different groups at once
    stage time      t_j = (combine(compute_s, memory_s) + comm_s)(group j) / pp
                    a stage does 1/pp of every layer-proportional term of group j, weights included: each
                    micro-batch re-reads its stage's weights, which is why more micro-batches are not free.
                    Embedding and lm_head are spread over the stages like the layers (a simplification: they
                    really sit on the first and the last stage)
    transfer        x_j = interconnect_latency_s + T_j * H * a / (tp * interconnect_bandwidth)
                    between consecutive stages, the hidden states of group j's T_j tokens (a bytes each, the
                    activation dtype); each of the tp ranks sends its 1/tp slice over its own link
    makespan        stage s starts group j when stage s-1 has finished it and its transfer has arrived, and
                    when stage s itself has finished group j-1:
                        finish[s][j] = max(finish[s-1][j] + x_j, finish[s][j-1]) + t_j
                    for equal groups that is (m + pp - 1) * t + (pp - 1) * x
    bubble          1 - (sum_j t_j) / makespan, the share of the step a stage sits idle; for equal groups and
                    free transfers (pp - 1) / (m + pp - 1) (GPipe, Huang et al. 2019, section 2.2)
    total_s         makespan + overhead_s (the step's scheduling overheads, paid once)

A step is one scheduler step, so this is a pipeline that drains every step: the bubble is paid per step
(vLLM instead keeps pp batches in flight across steps, which hides most of it at high load).

The KV pool of each device holds only its stage's layers: ceil(L / pp) of L layers' KV per block, and
1/(tp x pp) of the weights (`sim.simulator.num_kv_blocks_for`).

Lesson: lessons/07-tuning-knobs.md (parallelism degrees, to come).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.arch_config import ArchConfig
from core.config import EngineConfig
from sim.cost_model import BatchShape, CostModel, StepCost
from sim.hardware import HardwareProfile, dtype_bytes


@dataclass(frozen=True)
class PipelineStepCost:
    """One pipelined step: the per-micro-batch stage and transfer times, and the step's totals."""

    stage_s: tuple[float, ...]  # t_j, one stage's time on micro-batch j
    transfer_s: tuple[float, ...]  # x_j, one hop of micro-batch j's activations
    makespan_s: float
    overhead_s: float
    total_s: float

    @property
    def num_microbatches(self) -> int:
        return len(self.stage_s)

    @property
    def bubble_fraction(self) -> float:
        """Share of the makespan a stage is idle (waiting for work or for a transfer)."""
        return 1.0 - sum(self.stage_s) / self.makespan_s


def pipeline_makespan(stage_s: tuple[float, ...], transfer_s: tuple[float, ...], num_stages: int) -> float:
    """Time from the first stage starting micro-batch 0 to the last stage finishing the last micro-batch."""
    finish = [0.0] * len(stage_s)  # finish[j]: when the previous stage finished micro-batch j
    for stage in range(num_stages):
        busy_until = 0.0
        for j, (t, x) in enumerate(zip(stage_s, transfer_s, strict=True)):
            ready = finish[j] + (x if stage > 0 else 0.0)
            finish[j] = max(ready, busy_until) + t
            busy_until = finish[j]
    return finish[-1]


class PipelineCostModel:
    """Step time of `arch` split into `pipeline_parallel_size` stages of `tensor_parallel_size` devices each."""

    def __init__(self, arch: ArchConfig, hardware: HardwareProfile, dtype: str = "bfloat16",
                 tensor_parallel_size: int = 1, pipeline_parallel_size: int = 2,
                 block_size: int = EngineConfig.block_size, kv_cache_dtype: str | None = None,
                 num_microbatches: int | None = None) -> None:
        if pipeline_parallel_size < 2:
            raise ValueError(f"a pipeline has >= 2 stages, got {pipeline_parallel_size}; use CostModel for 1")
        if pipeline_parallel_size > arch.num_layers:
            raise ValueError(f"{arch.name} has {arch.num_layers} layers: cannot cut {pipeline_parallel_size} stages")
        if hardware.interconnect_bandwidth <= 0:
            raise ValueError(f"profile {hardware.name!r} has no interconnect to pass activations between stages")
        self.num_microbatches = pipeline_parallel_size if num_microbatches is None else num_microbatches
        if self.num_microbatches < 1:
            raise ValueError(f"num_microbatches must be >= 1, got {self.num_microbatches}")
        self.cost_model = CostModel(arch, hardware, dtype, tensor_parallel_size, block_size=block_size,
                                    kv_cache_dtype=kv_cache_dtype)
        self.arch, self.hardware = arch, hardware
        self.pipeline_parallel_size = pipeline_parallel_size
        self.tensor_parallel_size = tensor_parallel_size
        a = dtype_bytes(self.cost_model.activation_dtype)
        self._transfer_s_per_token = arch.hidden_size * a / (tensor_parallel_size * hardware.interconnect_bandwidth)

    def microbatches(self, shape: BatchShape) -> list[BatchShape]:
        """The step's requests dealt round-robin into min(num_microbatches, requests) groups."""
        m = min(self.num_microbatches, shape.num_seqs)
        rows = shape.logit_rows
        groups = []
        for j in range(m):
            q, c = shape.query_lens[j::m], shape.context_lens[j::m]
            # logit rows go with their requests; when the caller gave a count, spread it the same way (the
            # total is kept; a verify step's requests carry 1 + k rows each, so its split is even, not exact)
            group_rows = None if shape.num_logit_rows is None else len(range(j, rows, m))
            groups.append(BatchShape(q, c, num_logit_rows=group_rows))
        return groups

    def breakdown(self, shape: BatchShape) -> PipelineStepCost:
        pp = self.pipeline_parallel_size
        costs: list[StepCost] = [self.cost_model.breakdown(group) for group in self.microbatches(shape)]
        stage = tuple((c.total_s - c.overhead_s) / pp for c in costs)
        transfer = tuple(self.hardware.interconnect_latency_s + self._transfer_s_per_token * c.num_tokens
                         for c in costs)
        makespan = pipeline_makespan(stage, transfer, pp)
        overhead = self.cost_model.breakdown(shape).overhead_s
        return PipelineStepCost(stage_s=stage, transfer_s=transfer, makespan_s=makespan, overhead_s=overhead,
                                total_s=makespan + overhead)

    def step_time(self, shape: BatchShape) -> float:
        return self.breakdown(shape).total_s

    def block_copy_time(self, num_swapped: int, num_copied: int) -> float:
        """A step's KV copies (`CostModel.block_copy_time`): each stage holds and copies its own layers'
        blocks, all stages at once."""
        return self.cost_model.block_copy_time(num_swapped, num_copied) / self.pipeline_parallel_size
