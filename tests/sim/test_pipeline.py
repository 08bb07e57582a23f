"""Pipeline parallelism by hand on a tiny model: stage times, the bubble, the inter-stage transfer; 1 x 1 is
the single-device simulator exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.workload import Workload
from sim.cost_model import BatchShape, CostModel
from sim.hardware import HardwareProfile
from sim.pipeline import PipelineCostModel, pipeline_makespan
from sim.simulator import Simulator


@pytest.fixture
def tiny() -> ArchConfig:
    return ArchConfig(name="tiny", architecture="llama", num_layers=2, hidden_size=8, num_attention_heads=2,
                      num_kv_heads=1, head_dim=4, intermediate_size=16, vocab_size=32)


@pytest.fixture
def toy_hw() -> HardwareProfile:
    return HardwareProfile(name="toy", peak_flops={"bfloat16": 2e8}, memory_bandwidth=1e8, memory_bytes=100_000,
                           step_overhead_s=1e-3, per_seq_overhead_s=1e-4, per_token_overhead_s=1e-5,
                           per_block_overhead_s=1e-6, interconnect_bandwidth=1e7, interconnect_latency_s=1e-5)


def test_two_stages_two_microbatches_by_hand(tiny, toy_hw):
    # Two requests decoding after 4 cached tokens, block size 4: dealt into two micro-batches of one each.
    # One micro-batch on the whole model (tests/sim/test_cost_model.py's arithmetic): memory-bound,
    #   bytes = (1184*2 + 8*2) + 32*8*2 + 8*2   weights, lm_head, one embedding row   = 2912
    #         + 32 * 5 + 32                      KV read (4 cached + 1 new), KV write  =  192
    #         + 416 + 64                         activations, one logit row            =  480
    #   3584 bytes / 1e8 B/s = 35.84 us (compute: 3200 FLOPs / 2e8 = 16 us);
    # a stage holds 1 of the 2 layers' share: t = 17.92 us.
    # Transfer of one token's hidden state between the stages: x = 10 us + 8 * 2 bytes / 1e7 B/s = 11.6 us.
    # Makespan (m + pp - 1) t + (pp - 1) x = 3 t + x = 65.36 us; bubble 1 - 2 t / makespan.
    # Overheads once per step: 1 ms + 2 x 0.1 ms + 2 tokens x 10 us + 4 blocks x 1 us = 1.224 ms.
    model = PipelineCostModel(tiny, toy_hw, pipeline_parallel_size=2, block_size=4)
    cost = model.breakdown(BatchShape.decode(2, 4))
    assert cost.num_microbatches == 2
    assert cost.stage_s == pytest.approx((17.92e-6, 17.92e-6))
    assert cost.transfer_s == pytest.approx((11.6e-6, 11.6e-6))
    assert cost.makespan_s == pytest.approx(3 * 17.92e-6 + 11.6e-6)
    assert cost.bubble_fraction == pytest.approx(1 - 2 * 17.92e-6 / 65.36e-6)
    assert cost.overhead_s == pytest.approx(1.224e-3)
    assert model.step_time(BatchShape.decode(2, 4)) == pytest.approx(65.36e-6 + 1.224e-3)


def test_free_transfers_give_gpipes_bubble(tiny, toy_hw):
    # equal micro-batches and instant transfers: bubble = (pp - 1) / (m + pp - 1)
    instant = replace(toy_hw, interconnect_bandwidth=1e30, interconnect_latency_s=0.0)
    for pp, m in ((2, 2), (2, 4), (4, 4)):
        layers = replace(tiny, num_layers=4)
        cost = PipelineCostModel(layers, instant, pipeline_parallel_size=pp, num_microbatches=m,
                                 block_size=4).breakdown(BatchShape.decode(m, 4))
        assert cost.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))
    assert pipeline_makespan((1.0, 1.0, 1.0), (0.5, 0.5, 0.5), 3) == 3 + 2 + 2 * 0.5


def test_tensor_and_pipeline_parallelism_combine(tiny, toy_hw):
    # tp=2 inside each of pp=2 stages: a stage is half of the tp=2 model's time (all-reduces included),
    # and each of the 2 ranks sends half of the hidden state
    shape = BatchShape.decode(2, 4)
    tp2 = CostModel(tiny, toy_hw, tensor_parallel_size=2, block_size=4).breakdown(BatchShape.decode(1, 4))
    cost = PipelineCostModel(tiny, toy_hw, tensor_parallel_size=2, pipeline_parallel_size=2,
                             block_size=4).breakdown(shape)
    assert tp2.comm_s > 0
    assert cost.stage_s[0] == pytest.approx((tp2.total_s - tp2.overhead_s) / 2)
    assert cost.transfer_s[0] == pytest.approx(1e-5 + 8 * 2 / (2 * 1e7))


def test_one_by_one_is_the_single_device_simulator(tiny, toy_hw):
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, num_kv_blocks=64, block_size=4)
    workload = Workload.synthetic(6, (4, 20), (2, 10), arrival=50.0, seed=3)
    plain = Simulator(tiny, toy_hw, config).run(workload)
    explicit = Simulator(tiny, toy_hw, config, tensor_parallel_size=1, pipeline_parallel_size=1).run(workload)
    assert explicit == plain
    piped = Simulator(tiny, toy_hw, config, pipeline_parallel_size=2).run(workload)
    assert piped.duration != plain.duration and piped.completed == plain.completed


def test_pipeline_needs_stages_and_a_link(tiny, toy_hw):
    with pytest.raises(ValueError, match=">= 2 stages"):
        PipelineCostModel(tiny, toy_hw, pipeline_parallel_size=1)
    with pytest.raises(ValueError, match="cannot cut 3 stages"):
        PipelineCostModel(tiny, toy_hw, pipeline_parallel_size=3)
    with pytest.raises(ValueError, match="no interconnect"):
        PipelineCostModel(tiny, replace(toy_hw, interconnect_bandwidth=0.0), pipeline_parallel_size=2)
