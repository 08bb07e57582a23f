"""The cost model: hand-computed FLOPs, bytes and times on a tiny model, then the shapes the lessons rely on."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import pairwise

import pytest

from core.arch_config import ArchConfig
from core.interfaces import ScheduledRequest, SchedulerOutput
from sim.cost_model import (
    ROOFLINE_FEATURE_NAMES,
    ROOFLINE_UNKNOWNS,
    BatchShape,
    CostModel,
    estimate_activation_bytes,
    kv_cache_num_blocks,
)
from sim.executor import CostModelTimer
from sim.hardware import HardwareProfile, dtype_bytes

# ---- a tiny model and a made-up profile with round numbers ----------------------------------------
#
# L=2, H=8, 2 heads of d=4 (q_size 8), 1 KV head (kv_size 4), I=16, V=32, untied.
#   params_per_layer = 8*(8 + 2*4) + 8*8 + 3*8*16 + 2*8 = 128 + 64 + 384 + 16 = 592
#   P = L * 592 = 1184;  num_params = 32*8 (embed) + 32*8 (lm_head) + 1184 + 8 = 1704
#   kv bytes per token (bf16) = 2 * 2 layers * 4 * 2 bytes = 32
#   attention FLOPs per (query, key) pair = 4 * L * nh * d = 64
#   activation bytes per token = L * (4H + 2*8 + 2*4 + 3I) * 2 = 2 * 104 * 2 = 416; per logit row V*2 = 64


@pytest.fixture
def tiny() -> ArchConfig:
    return ArchConfig(name="tiny", architecture="llama", num_layers=2, hidden_size=8, num_attention_heads=2,
                      num_kv_heads=1, head_dim=4, intermediate_size=16, vocab_size=32)


@pytest.fixture
def toy_hw() -> HardwareProfile:
    # ridge point 2 FLOP/byte: the tiny decode below is memory-bound, the tiny prefill compute-bound
    return HardwareProfile(name="toy", peak_flops={"bfloat16": 2e8}, memory_bandwidth=1e8, memory_bytes=10_000,
                           step_overhead_s=1e-3, per_seq_overhead_s=1e-4, per_token_overhead_s=1e-5,
                           per_block_overhead_s=1e-6, interconnect_bandwidth=1e7, interconnect_latency_s=1e-5,
                           network_bandwidth=1e6, network_latency_s=1e-3)


def test_tiny_arch_sizes(tiny):
    assert tiny.params_per_layer == 592
    assert tiny.num_params == 1704
    assert tiny.kv_bytes_per_token(2) == 32


def test_decode_by_hand(tiny, toy_hw):
    # two requests decoding one token each after 3 and 6 cached tokens, block size 4
    cost = CostModel(tiny, toy_hw, block_size=4).breakdown(BatchShape.from_pairs([(1, 3), (1, 6)]))
    assert cost.linear_flops == 2 * 1184 * 2 + 2 * 32 * 8 * 2 == 5760
    assert cost.attention_flops == 64 * (1 * (3 + 1) + 1 * (6 + 1)) == 704
    assert cost.weight_bytes == (1184 + 8) * 2 + 32 * 8 * 2 + 2 * 8 * 2 == 2928
    assert cost.kv_read_bytes == 32 * (4 + 7) == 352
    assert cost.kv_write_bytes == 32 * 2 == 64
    assert cost.activation_bytes == 416 * 2 + 64 * 2 == 960
    assert cost.num_blocks == 1 + 2
    assert cost.compute_s == pytest.approx(6464 / 2e8)
    assert cost.memory_s == pytest.approx(4304 / 1e8)
    assert cost.overhead_s == pytest.approx(1e-3 + 2 * 1e-4 + 2 * 1e-5 + 3 * 1e-6)
    assert cost.comm_s == 0
    assert cost.bound == "memory"
    assert cost.total_s == pytest.approx(4.304e-5 + 1.223e-3)


def test_weight_and_kv_dtypes_by_hand(tiny, toy_hw):
    """The decode above with float32 weights and a bfloat16 KV cache, then int8 weights: weight bytes follow
    the layers' dtype (embeddings, lm_head and norms stay in 16 bits under 8-bit weights), KV bytes follow
    the cache's dtype, and the linear FLOPs are priced at the weights' dtype's rate."""
    hw = replace(toy_hw, peak_flops={"float32": 1e8, "bfloat16": 2e8, "int8": 4e8})
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    fp32 = CostModel(tiny, hw, dtype="float32", block_size=4, kv_cache_dtype="bfloat16").breakdown(shape)
    assert fp32.weight_bytes == (1184 + 8) * 4 + 32 * 8 * 4 + 2 * 8 * 4 == 5856
    assert fp32.kv_read_bytes == 32 * (4 + 7) and fp32.kv_write_bytes == 32 * 2  # 2-byte K/V as before
    assert fp32.activation_bytes == 960 * 2
    assert fp32.compute_s == pytest.approx(5760 / 1e8 + 704 / 1e8)
    fp32_kv = CostModel(tiny, hw, dtype="float32", block_size=4).breakdown(shape)  # cache in the model's dtype
    assert (fp32_kv.kv_read_bytes, fp32_kv.kv_write_bytes) == (64 * 11, 64 * 2)
    int8 = CostModel(tiny, hw, dtype="int8", block_size=4).breakdown(shape)
    assert int8.weight_bytes == 1184 * 1 + 8 * 2 + 32 * 8 * 2 + 2 * 8 * 2 == 1744
    assert int8.kv_read_bytes == 16 * 11  # an 8-bit model's cache, unless kv_cache_dtype says otherwise
    assert int8.compute_s == pytest.approx(5760 / 4e8 + 704 / 2e8)  # attention in the 16-bit activations


def test_int4_weights_by_hand(tiny, toy_hw):
    """The same decode with int4 weights: 4 bits a weight plus a 2-byte scale and a 2-byte zero per group of
    32 (0.625 bytes a weight); embeddings, lm_head and norms, the KV cache and the products in the 16-bit
    activations (weight-only: the profile has no int4 rate), unless a calibrated profile measured int4."""
    hw = replace(toy_hw, peak_flops={"float32": 1e8, "bfloat16": 2e8, "int8": 4e8})
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    int4 = CostModel(tiny, hw, dtype="int4", block_size=4).breakdown(shape)
    assert int4.weight_bytes == 1184 * 0.625 + 8 * 2 + 32 * 8 * 2 + 2 * 8 * 2 == 1300
    assert int4.kv_read_bytes == 32 * 11 and int4.kv_write_bytes == 32 * 2  # a 2-byte cache, not a 4-bit one
    assert int4.compute_s == pytest.approx(5760 / 2e8 + 704 / 2e8)
    calibrated = replace(hw, peak_flops={"int4": 3e8})  # a CPU profile fitted on the int4 engine
    assert CostModel(tiny, calibrated, dtype="int4", block_size=4).breakdown(shape).compute_s == pytest.approx(
        (5760 + 704) / 3e8)


def test_this_engine_s_quantized_paths_read_the_lm_head_in_8_bits(tiny, toy_hw):
    """A profile calibrated on the engine's int4 (or int8) path, whose activations are float32: the layers at
    0.625 bytes a weight, the final norm and the embedded rows in float32, and the LM head at 1 byte a weight
    (its int8 screen, ref_engine/model/lm_head.py), where a datasheet profile's int4 keeps it in 16 bits."""
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    engine = replace(toy_hw, peak_flops={"int4": 3e8, "float32": 1e8},
                     provenance={"device_type": "cpu", "dtype": "float32", "quantization": "int4"})
    cost = CostModel(tiny, engine, dtype="int4", block_size=4).breakdown(shape)
    assert cost.weight_bytes == 1184 * 0.625 + 8 * 4 + 32 * 8 * 1 + 2 * 8 * 4 == 1092
    datasheet = CostModel(tiny, replace(toy_hw, peak_flops={"bfloat16": 2e8}), dtype="int4", block_size=4)
    assert datasheet.breakdown(shape).weight_bytes == 1300  # the head in bfloat16, as above


def test_an_int4_group_size_is_priced_by_its_bytes(tiny, toy_hw):
    """"int4-g128" (the engine's label for `quantization_group_size=128`): 4 bits plus 4 bytes of scale and
    zero per 128 weights, 0.53125 bytes a weight; the same FLOPs, and a profile's int4 rate still applies."""
    hw = replace(toy_hw, peak_flops={"float32": 1e8, "bfloat16": 2e8})
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    g128 = CostModel(tiny, hw, dtype="int4-g128", block_size=4).breakdown(shape)
    assert g128.weight_bytes == 1184 * 0.53125 + 8 * 2 + 32 * 8 * 2 + 2 * 8 * 2 == 1189
    g32 = CostModel(tiny, hw, dtype="int4", block_size=4).breakdown(shape)
    assert (g128.compute_s, g128.kv_read_bytes) == (g32.compute_s, g32.kv_read_bytes)
    calibrated = replace(hw, peak_flops={"int4": 3e8})
    assert CostModel(tiny, calibrated, dtype="int4-g64", block_size=4).breakdown(shape).compute_s == pytest.approx(
        (5760 + 704) / 3e8)


@pytest.mark.parametrize("dtype", ["int4-g0", "int4-gx", "int4-g"])
def test_a_bad_int4_group_size_is_named(dtype):
    with pytest.raises(ValueError, match=f"dtype '{dtype}': int4-gN takes a positive group size N"):
        dtype_bytes(dtype)


def test_prefill_by_hand(tiny, toy_hw):
    model = CostModel(tiny, toy_hw, block_size=4)
    cost = model.breakdown(BatchShape.prefill(8))
    assert cost.linear_flops == 2 * 1184 * 8 + 2 * 32 * 8 * 1 == 19456  # lm_head for the last row only
    assert cost.attention_flops == 64 * 8 * (0 + 9 / 2) == 2304  # 36 causal (query, key) pairs
    assert cost.weight_bytes == 2384 + 512 + 8 * 16 == 3024
    assert cost.kv_read_bytes == cost.kv_write_bytes == 256
    assert cost.activation_bytes == 416 * 8 + 64 == 3392
    assert cost.bound == "compute"
    assert cost.compute_s == pytest.approx(21760 / 2e8)
    assert cost.total_s == pytest.approx(1.088e-4 + 1e-3 + 1e-4 + 8e-5 + 2e-6)
    assert model.step_time(BatchShape.prefill(8)) == pytest.approx(cost.total_s)


def test_mid_prompt_chunk_needs_no_logits(tiny, toy_hw):
    # a 4-token chunk after 4 cached tokens that does not end the prompt: no lm_head at all
    cost = CostModel(tiny, toy_hw, block_size=4).breakdown(BatchShape((4,), (4,), num_logit_rows=0))
    assert cost.linear_flops == 2 * 1184 * 4
    assert cost.attention_flops == 64 * 4 * (4 + 5 / 2)
    assert cost.weight_bytes == 2384 + 4 * 16
    assert cost.kv_read_bytes == 32 * 8
    assert cost.num_blocks == 2


def test_a_verify_step_pays_the_lm_head_on_every_draft(tiny, toy_hw):
    # The simulator's timer prices a verify of k drafts with 1 + k logit rows, as the runner computes them
    # (every draft is scored), and a plain decode or a mid-prompt chunk with 1 and 0.
    timer = CostModelTimer(CostModel(tiny, toy_hw, block_size=4))

    def step(*scheduled: ScheduledRequest) -> SchedulerOutput:
        return SchedulerOutput(step_id=0, scheduled=list(scheduled))

    verify = step(ScheduledRequest("a", [7] * 4, 6, [0, 1, 2], needs_logits=True, num_draft_tokens=3))
    assert BatchShape.verify(1, 6, 3) == BatchShape((4,), (6,), num_logit_rows=4)
    by_hand = CostModel(tiny, toy_hw, block_size=4).breakdown(BatchShape.verify(1, 6, 3))
    # 4 tokens through the layers, and the lm_head (32 x 8) on all 4 rows: 2 * 1184 * 4 + 2 * 256 * 4
    assert by_hand.linear_flops == 9472 + 2048 == 11520
    assert by_hand.activation_bytes == 416 * 4 + 64 * 4 == 1920
    assert timer.step_time(verify) == pytest.approx(by_hand.total_s)
    one_row = CostModel(tiny, toy_hw, block_size=4).step_time(BatchShape((4,), (6,), num_logit_rows=1))
    assert timer.step_time(verify) > one_row  # the under-priced LM head this test guards against
    # two requests: a verify of 2 drafts and a plain decode (3 + 1 rows), next to a mid-prompt chunk (0 rows)
    mixed = step(ScheduledRequest("a", [7] * 3, 6, [0, 1, 2], needs_logits=True, num_draft_tokens=2),
                 ScheduledRequest("b", [7], 5, [3, 4], needs_logits=True),
                 ScheduledRequest("c", [7] * 4, 0, [5], needs_logits=False))
    expected = CostModel(tiny, toy_hw, block_size=4).step_time(BatchShape((3, 1, 4), (6, 5, 0), num_logit_rows=4))
    assert timer.step_time(mixed) == pytest.approx(expected)


def test_sum_combine_and_roofline_features(tiny, toy_hw):
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    model = CostModel(tiny, toy_hw, block_size=4, combine="sum")
    cost = model.breakdown(shape)
    assert cost.total_s == pytest.approx(6.464e-5 / 2 + 4.304e-5 + 1.223e-3)
    assert model.step_time(shape) > CostModel(tiny, toy_hw, block_size=4).step_time(shape)
    features = model.roofline_features(shape)
    assert len(features) == len(ROOFLINE_FEATURE_NAMES) == len(ROOFLINE_UNKNOWNS)
    # two tokens and two logit rows: both the layers' 2384 weight bytes and the lm_head's 512 count as packed
    assert features == (1.0, 2.0, 2.0, 3.0, cost.linear_flops, cost.attention_flops, 2896.0, 4304.0)
    assert cost.linear_flops + cost.attention_flops == 6464.0
    unknowns = (toy_hw.step_overhead_s, toy_hw.per_seq_overhead_s, toy_hw.per_token_overhead_s,
                toy_hw.per_block_overhead_s, 1 / 2e8, 1 / 2e8, toy_hw.weight_packing_passes / 1e8, 1 / 1e8)
    assert sum(f * u for f, u in zip(features, unknowns, strict=True)) == pytest.approx(model.step_time(shape))


def test_kernels_combine_by_hand(tiny, toy_hw):
    """combine="kernels": the linear layers and attention each on a roofline of their own, one after the other.
    Eight requests decoding one token after 7 cached ones, on a profile whose ridge is 3.2 FLOP/byte: the matmuls
    (23040 FLOPs over 6864 bytes, 3.4 FLOP/byte) are compute-bound, the attention (4096 FLOPs over 2304 KV bytes,
    1.8 FLOP/byte) memory-bound; one max over the whole step (27136 FLOPs over 9168 bytes) calls it memory-bound
    and hides the attention's reads behind the matmuls' arithmetic."""
    hw = replace(toy_hw, peak_flops={"bfloat16": 3.2e8})
    shape = BatchShape.decode(8, 7)
    cost = CostModel(tiny, hw, block_size=4, combine="kernels").breakdown(shape)
    # 8 tokens through the layers (2 * 1184 each) and 8 logit rows through the lm_head (2 * 32 * 8 each)
    assert cost.linear_flops == 2 * 1184 * 8 + 2 * 256 * 8 == 23040
    assert cost.attention_flops == 64 * 8 * (7 + 1) == 4096
    # layer weights and norm 2384, lm_head 512, 8 embedding rows of 16; activations 8 x 416, logits 8 x 64
    assert cost.weight_bytes + cost.activation_bytes == 2384 + 512 + 8 * 16 + 8 * 416 + 8 * 64 == 6864
    assert cost.kv_read_bytes + cost.kv_write_bytes == 32 * 8 * 8 + 32 * 8 == 2304
    linear_s = max(23040 / 3.2e8, 6864 / 1e8)  # 7.2e-5 s: compute-bound
    attention_s = max(4096 / 3.2e8, 2304 / 1e8)  # 2.304e-5 s: memory-bound
    assert (linear_s, attention_s) == (pytest.approx(7.2e-5), pytest.approx(2.304e-5))
    # compute_s and memory_s stay the step's totals; the bound is the one most of the kernel time ran under
    assert cost.compute_s == pytest.approx(27136 / 3.2e8) and cost.memory_s == pytest.approx(9168 / 1e8)
    assert cost.bound == "compute"
    overhead_s = 1e-3 + 8 * 1e-4 + 8 * 1e-5 + 16 * 1e-6  # two blocks of 4 per request
    assert cost.overhead_s == pytest.approx(overhead_s) and cost.comm_s == 0
    assert cost.total_s == pytest.approx(9.504e-5 + overhead_s)
    # between the two other forms: the whole step's max (memory, 9.168e-5 s) and the sum (1.7648e-4 s)
    as_max = CostModel(tiny, hw, block_size=4).breakdown(shape)
    assert (as_max.bound, as_max.total_s) == ("memory", pytest.approx(9.168e-5 + overhead_s))
    assert CostModel(tiny, hw, block_size=4, combine="sum").step_time(shape) == pytest.approx(1.7648e-4 + overhead_s)
    # the profile's form is the model's default
    assert CostModel(tiny, replace(hw, combine="kernels"), block_size=4).step_time(shape) == cost.total_s


def test_kernels_combine_is_max_where_both_groups_have_one_bound(tiny, toy_hw):
    """A decode at toy_hw's ridge of 2 is memory-bound in both groups, a whole prefill compute-bound in both: there
    the groups' maxes add up to the step's, on a GPU and on a CPU whose three ranks take turns on two cores."""
    cpu = replace(toy_hw, cores=2, threads=2, measured_allreduce={3: [1e-4, 1e6]})
    for hw, tp in ((toy_hw, 1), (toy_hw, 2), (cpu, 3)):
        for shape in (BatchShape.from_pairs([(1, 3), (1, 6)]), BatchShape.prefill(8)):
            kernels = CostModel(tiny, hw, block_size=4, tensor_parallel_size=tp, combine="kernels").breakdown(shape)
            whole = CostModel(tiny, hw, block_size=4, tensor_parallel_size=tp).breakdown(shape)
            assert kernels.total_s == pytest.approx(whole.total_s, rel=1e-12), (tp, shape)
            assert (kernels.bound, kernels.tp_turns) == (whole.bound, whole.tp_turns)


def test_kernels_combine_on_a_cpus_tensor_parallel_step_by_hand(tiny, toy_hw):
    """The mixed decode of `test_kernels_combine_by_hand` on three ranks sharing 2 cores (2 turns where fair
    sharing takes 1.5: the layers at 0.75 of the rates measured), the LM head on rank 0 alone at 0.5: the head is
    one of the linear layers, so its time joins theirs before the group's max."""
    cpu = replace(toy_hw, peak_flops={"bfloat16": 3.2e8}, cores=2, threads=2, measured_allreduce={3: [1e-4, 1e6]})
    cost = CostModel(tiny, cpu, block_size=4, tensor_parallel_size=3, combine="kernels").breakdown(BatchShape.decode(8, 7))
    assert cost.tp_turns == pytest.approx(2 / 1.5)
    # the head: 2 * 32 * 8 FLOPs a row, 8 rows; its 512 weight bytes and 8 rows of 64 logit bytes
    linear_compute_s = (23040 - 4096) / (3.2e8 * 0.75) + 4096 / (3.2e8 * 0.5)  # 1.0453e-4 s
    linear_memory_s = (6864 - 1024) / (1e8 * 0.75) + 1024 / (1e8 * 0.5)  # 9.835e-5 s
    attention_compute_s, attention_memory_s = 4096 / (3.2e8 * 0.75), 2304 / (1e8 * 0.75)
    assert cost.compute_s == pytest.approx(linear_compute_s + attention_compute_s)
    assert cost.memory_s == pytest.approx(linear_memory_s + attention_memory_s)
    assert cost.total_s - cost.comm_s - cost.overhead_s == pytest.approx(linear_compute_s + attention_memory_s)
    assert cost.bound == "compute"


def test_a_bad_combine_is_named(tiny, toy_hw):
    with pytest.raises(ValueError, match="combine must be one of 'max', 'sum', 'kernels', got 'overlap'"):
        replace(toy_hw, combine="overlap")
    with pytest.raises(ValueError, match="combine must be one of 'max', 'sum', 'kernels', got 'min'"):
        CostModel(tiny, toy_hw, combine="min")  # type: ignore[arg-type]
    kernels = replace(toy_hw, combine="kernels")
    assert HardwareProfile.from_dict(kernels.to_dict()).combine == "kernels"


def test_weight_packing_prices_a_step_of_two_or_more_rows(tiny, toy_hw):
    # 1.5 extra passes at 1e8 B/s over the layers' (1184 + 8) * 2 = 2384 weight bytes once a step has two or
    # more tokens, and over the lm_head's 32 * 8 * 2 = 512 once two or more rows need logits
    packing = CostModel(tiny, replace(toy_hw, weight_packing_passes=1.5), block_size=4, combine="sum")
    plain = CostModel(tiny, toy_hw, block_size=4, combine="sum")

    def extra(shape: BatchShape) -> float:
        return packing.step_time(shape) - plain.step_time(shape)
    assert extra(BatchShape.decode(1, 8)) == 0.0  # one row: a GEMV streams the weights once
    assert extra(BatchShape.decode(2, 8)) == pytest.approx(1.5 * (2384 + 512) / 1e8)
    assert extra(BatchShape.decode(16, 8)) == pytest.approx(extra(BatchShape.decode(2, 8)))  # once per step
    assert extra(BatchShape.verify(1, 8, k=3)) == pytest.approx(1.5 * (2384 + 512) / 1e8)  # 4 rows of one request
    assert extra(BatchShape((16,), (0,), num_logit_rows=0)) == pytest.approx(1.5 * 2384 / 1e8)  # mid-prompt chunk
    assert extra(BatchShape.prefill(16)) == pytest.approx(1.5 * 2384 / 1e8)  # one logit row: lm_head as a GEMV
    with pytest.raises(ValueError, match="weight_packing_passes"):
        replace(toy_hw, weight_packing_passes=-1.0)


def test_tensor_parallel_by_hand(tiny, toy_hw):
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    cost = CostModel(tiny, toy_hw, block_size=4, tensor_parallel_size=2).breakdown(shape)
    # 2 all-reduces per layer x 2 layers, each 1e-5 s + 2*(2-1)/2 * (2 tokens * 8 * 2 bytes) / 1e7 B/s
    assert cost.comm_s == pytest.approx(4 * (1e-5 + 32 / 1e7))
    assert cost.memory_s == pytest.approx(4304 / 1e8 / 2)
    assert cost.total_s == pytest.approx(4304 / 2e8 + cost.comm_s + 1.223e-3)


def test_tensor_parallel_on_a_cpu_by_hand(tiny, toy_hw):
    """Three ranks on a 2-core CPU whose rates were measured on 2 threads: each rank runs 1 thread, two at once
    and then the third, so the layers' third of the work each takes two turns at half the rates (rate 0.75),
    and so does each rank's Python (the overheads twice); the LM head runs on rank 0's one thread alone (half
    the rates); the all-reduce is the 3-process measurement, not the interconnect."""
    cpu = replace(toy_hw, cores=2, threads=2, measured_allreduce={3: [1e-4, 1e6]})
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    one = CostModel(tiny, cpu, block_size=4).breakdown(shape)
    three = CostModel(tiny, cpu, block_size=4, tensor_parallel_size=3).breakdown(shape)
    assert one.memory_s == pytest.approx(4304 / 1e8)
    # of the step's 5760 linear FLOPs the head's are 2 * V * H * 2 rows = 1024; of its 4304 bytes the head's are
    # V * H * 2 + 2 rows * V * 2 = 640
    assert three.compute_s == pytest.approx((5760 - 1024 + 704) / (2e8 * 0.75) + 1024 / (2e8 * 0.5))
    assert three.memory_s == pytest.approx((4304 - 640) / (1e8 * 0.75) + 640 / (1e8 * 0.5))
    assert three.linear_flops == one.linear_flops == 5760  # the step's FLOPs, not their price
    assert three.overhead_s == pytest.approx(2 * one.overhead_s) and one.overhead_s == pytest.approx(1.223e-3)
    # 2 all-reduces x 2 layers, each 1e-4 s + 2*(3-1)/3 * (2 tokens * 8 * 2 bytes) / 1e6 B/s
    assert three.comm_s == pytest.approx(4 * (1e-4 + 4 / 3 * 32 / 1e6))
    assert three.total_s == pytest.approx(three.memory_s + three.comm_s + 2 * 1.223e-3)
    # 8 cores: 3 ranks of 2 threads (8 // 3) at once reach 3x the rates measured on 2 threads, the head 1x
    eight = CostModel(tiny, replace(cpu, cores=8), block_size=4, tensor_parallel_size=3).breakdown(shape)
    assert eight.memory_s == pytest.approx((4304 - 640) / 1e8 / 3 + 640 / 1e8)
    assert eight.overhead_s == pytest.approx(one.overhead_s)
    with pytest.raises(ValueError, match="not 2"):
        CostModel(tiny, cpu, tensor_parallel_size=2)


def test_ranks_take_turns_on_stretches_shorter_than_a_time_slice(tiny, toy_hw):
    """Three one-thread ranks on a 2-core CPU (measured on 2 threads) share the cores 1.5 ways. Where one rank's
    stretch between two all-reduces is shorter than the OS's time slice it runs whole, so the ranks take 2 turns
    (the layers' work and each rank's overheads x 2 / 1.5 over fair sharing); where it is longer the OS shares
    fairly (x 1: the layers at the rates measured, the overheads 1.5 times, one per rank on 2 cores). The LM
    head (rank 0 alone, half the rates) and the all-reduce are the same either way."""
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    cpu = replace(toy_hw, cores=2, threads=2, measured_allreduce={2: [1e-4, 1e6], 3: [1e-4, 1e6]})
    one = CostModel(tiny, cpu, block_size=4).breakdown(shape)
    # one rank's stretch: (layers' memory time shared fairly / 1.5 + its overheads) / (2 all-reduces x 2 layers)
    layers_s = (4304 - 640) / 1e8
    stretch_s = (layers_s / 1.5 + one.overhead_s) / 4
    turns = CostModel(tiny, replace(cpu, scheduler_slice_s=1.01 * stretch_s), block_size=4, tensor_parallel_size=3)
    shared = CostModel(tiny, replace(cpu, scheduler_slice_s=stretch_s), block_size=4, tensor_parallel_size=3)
    t, s = turns.breakdown(shape), shared.breakdown(shape)
    assert (t.tp_turns, s.tp_turns) == (pytest.approx(2 / 1.5), 1.0)
    assert t.memory_s == pytest.approx(layers_s * 2 / 1.5 + 640 / (1e8 * 0.5))
    assert s.memory_s == pytest.approx(layers_s + 640 / (1e8 * 0.5))
    assert (t.overhead_s, s.overhead_s) == (pytest.approx(2 * one.overhead_s), pytest.approx(1.5 * one.overhead_s))
    assert t.comm_s == s.comm_s == pytest.approx(4 * (1e-4 + 4 / 3 * 32 / 1e6))
    # no slice measured (0): turns, the rule before the slice was measured; and ranks that fit never take turns
    assert CostModel(tiny, cpu, block_size=4, tensor_parallel_size=3).breakdown(shape).total_s == t.total_s
    assert CostModel(tiny, replace(cpu, scheduler_slice_s=1.0), block_size=4, tensor_parallel_size=2
                     ).breakdown(shape).tp_turns == 1.0


def test_roofline_features_price_a_cpus_tensor_parallel_step(tiny, toy_hw):
    """The calibrator's identity, step time - comm = features . unknowns, holds with ranks taking turns on the
    cores and the LM head on rank 0."""
    cpu = replace(toy_hw, cores=2, threads=2, weight_packing_passes=1.5, measured_allreduce={3: [1e-4, 1e6]})
    unknowns = (cpu.step_overhead_s, cpu.per_seq_overhead_s, cpu.per_token_overhead_s, cpu.per_block_overhead_s,
                1 / 2e8, 1 / 2e8, 1.5 / 1e8, 1 / 1e8)
    for slice_s in (0.0, 1e-9):  # 2 turns, or (stretches longer than the slice) shared fairly; head on rank 0
        model = CostModel(tiny, replace(cpu, scheduler_slice_s=slice_s), block_size=4, tensor_parallel_size=3,
                          combine="sum")
        for shape in (BatchShape.from_pairs([(1, 3), (1, 6)]), BatchShape.prefill(16), BatchShape.decode(1, 8)):
            cost = model.breakdown(shape)
            features = model.roofline_features(shape)
            assert cost.tp_turns == (pytest.approx(2 / 1.5) if slice_s == 0 else 1.0)
            assert sum(f * u for f, u in zip(features, unknowns, strict=True)) == pytest.approx(
                cost.total_s - cost.comm_s)


def test_given_blocks_and_kv_transfer(tiny, toy_hw):
    model = CostModel(tiny, toy_hw, block_size=4)
    assert model.breakdown(BatchShape((1,), (3,), num_blocks_touched=10)).num_blocks == 10
    assert model.kv_transfer_time(100) == pytest.approx(1e-3 + 32 * 100 / 1e6)
    assert model.kv_transfer_time(100, link="interconnect") == pytest.approx(1e-5 + 32 * 100 / 1e7)


def test_batch_shape_validation():
    shape = BatchShape([2, 1], [0, 5])  # lists become tuples
    assert shape.query_lens == (2, 1) and shape.num_tokens == 3 and shape.num_seqs == 2
    assert BatchShape.from_lists([2, 1], [0, 5]) == shape == BatchShape.from_pairs([(2, 0), (1, 5)])
    assert hash(shape) == hash(BatchShape.from_pairs([(2, 0), (1, 5)]))
    with pytest.raises(ValueError, match="empty"):
        BatchShape((), ())
    with pytest.raises(ValueError, match="one of each"):
        BatchShape((1, 1), (0,))
    with pytest.raises(ValueError, match=">= 1"):
        BatchShape((0,), (0,))
    with pytest.raises(ValueError, match=">= 0"):
        BatchShape((1,), (-1,))


def test_constructor_errors(tiny, toy_hw):
    with pytest.raises(ValueError, match="float32"):
        CostModel(tiny, toy_hw, dtype="float32")  # the toy profile only knows bfloat16
    with pytest.raises(ValueError, match="combine"):
        CostModel(tiny, toy_hw, combine="min")
    no_link = HardwareProfile(name="lonely", peak_flops={"bfloat16": 1.0}, memory_bandwidth=1, memory_bytes=1)
    with pytest.raises(ValueError, match="interconnect"):
        CostModel(tiny, no_link, tensor_parallel_size=2)


# ---- the shapes the lessons show, on real dims ------------------------------------------------------

LLAMA_8B = ArchConfig.named("llama-3.1-8b")
LLAMA_70B = ArchConfig.named("llama-3.1-70b")


@pytest.fixture
def h100() -> HardwareProfile:
    return HardwareProfile.named("h100-sxm")


def test_decode_batch_1_is_memory_bound_big_prefill_compute_bound(h100):
    model = CostModel(LLAMA_8B, h100)
    decode = model.breakdown(BatchShape.decode(1, 512))
    assert decode.bound == "memory"
    # ~15 GB of bf16 weights at 3.35 TB/s x the fitted bandwidth fraction: ~5 ms. Not the whole 16 GB: of
    # the 1 GB (untied) embedding table a step reads only the rows of its tokens.
    embedding = LLAMA_8B.vocab_size * LLAMA_8B.hidden_size * 2
    bandwidth = 3.35e12 * h100.bandwidth_efficiency
    assert decode.memory_s == pytest.approx((LLAMA_8B.weight_bytes(2) - embedding) / bandwidth, rel=0.02)
    prefill = model.breakdown(BatchShape.prefill(4096))
    assert prefill.bound == "compute"
    assert prefill.arithmetic_intensity > h100.matmul_flops("bfloat16") / h100.effective_bandwidth


def test_decode_is_flat_until_a_knee(h100):
    model = CostModel(LLAMA_8B, h100)
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    times = [model.step_time(BatchShape.decode(b, 512)) for b in batches]
    assert all(later > earlier for earlier, later in pairwise(times))
    assert times[batches.index(32)] / times[0] < 1.3  # 32x the tokens for < 1.3x the time
    assert times[-1] / times[-2] > 1.6  # past the knee: time ~ proportional to batch
    tokens_per_s = [b / t for b, t in zip(batches, times, strict=True)]
    assert tokens_per_s[batches.index(32)] > 25 * tokens_per_s[0]


def test_prefill_throughput_saturates(h100):
    model = CostModel(LLAMA_8B, h100)
    rate = {n: n / model.step_time(BatchShape.prefill(n)) for n in (16, 512, 2048, 8192)}
    assert rate[512] > 10 * rate[16]
    assert rate[8192] == pytest.approx(rate[2048], rel=0.15)  # compute-bound plateau


def test_tensor_parallel_speeds_up_a_big_model(h100):
    for shape in (BatchShape.decode(32, 1024), BatchShape.prefill(2048)):
        times = [CostModel(LLAMA_70B, h100, tensor_parallel_size=tp).step_time(shape) for tp in (1, 2, 4, 8)]
        assert all(later < earlier for earlier, later in pairwise(times)), times
        assert CostModel(LLAMA_70B, h100, tensor_parallel_size=8).breakdown(shape).comm_s > 0


def test_tiny_blocks_cost_more(h100):
    # the left side of the block-size U-shape: per-block work grows as blocks shrink
    shape = BatchShape.decode(64, 1024)
    times = [CostModel(LLAMA_8B, h100, block_size=bs).step_time(shape) for bs in (1, 4, 16)]
    assert times[0] > times[1] > times[2]


def test_kv_cache_num_blocks_llama_8b_on_h100(h100):
    blocks = kv_cache_num_blocks(LLAMA_8B, h100, "bfloat16", block_size=16, gpu_memory_utilization=0.9)
    # (0.9 x 81559 MiB = 77 GB - 16 GB of weights - ~1 GB of activations) / (16 tokens x 128 KiB)
    assert h100.memory_bytes == 81559 * 2**20  # nvidia-smi's size, not the marketing 80 GB
    assert 28_000 <= blocks <= 29_000
    no_activations = kv_cache_num_blocks(LLAMA_8B, h100, activation_reserve_bytes=0)
    assert no_activations == int((0.9 * 81559 * 2**20 - LLAMA_8B.weight_bytes(2)) // (16 * 128 * 1024))
    assert kv_cache_num_blocks(LLAMA_8B, h100, kv_cache_dtype="fp8") > 1.9 * blocks


def test_kv_cache_num_blocks_70b_needs_tensor_parallelism(h100):
    with pytest.raises(ValueError, match="Llama-3.1-70B"):
        kv_cache_num_blocks(LLAMA_70B, h100)
    assert kv_cache_num_blocks(LLAMA_70B, h100, tp=4) > 10_000


def test_kv_cache_num_blocks_by_hand(tiny, toy_hw):
    # (10000 * 0.5 - 1704 * 2) bytes / (4 tokens * 32 bytes) = 1592 / 128 -> 12 blocks
    assert kv_cache_num_blocks(tiny, toy_hw, block_size=4, gpu_memory_utilization=0.5,
                               activation_reserve_bytes=0) == 12
    # tp=2: half the weights; the single KV head is replicated, so a block still costs 128 bytes
    assert kv_cache_num_blocks(tiny, toy_hw, block_size=4, gpu_memory_utilization=0.5, tp=2,
                               activation_reserve_bytes=0) == (5000 - 1704) // 128
    with pytest.raises(ValueError, match="not one KV block"):
        kv_cache_num_blocks(tiny, toy_hw, block_size=4, gpu_memory_utilization=0.5,
                            activation_reserve_bytes=1590)
    assert estimate_activation_bytes(tiny, "bfloat16", 10, 2) == 10 * (16 + 16 + 8 + 48) * 2 + 2 * 32 * 4


def test_step_time_is_cheap(h100):
    """The simulator calls step_time per step; keep it a single pass (no timing assert, just sanity)."""
    model = CostModel(LLAMA_8B, h100)
    shape = BatchShape.decode(256, 1000)
    assert math.isfinite(model.step_time(shape))
    assert model.step_time(shape) == pytest.approx(model.breakdown(shape).total_s)


def test_block_copies_by_hand(tiny, toy_hw):
    # a block is 4 tokens x 32 KV bytes = 128 bytes; a copy within the device reads and writes each byte twice
    cpu = CostModel(tiny, toy_hw, block_size=4)  # no host link: the host pool is in the same memory
    assert cpu.block_copy_time(0, 0) == 0.0
    assert cpu.block_copy_time(3, 2) == pytest.approx(5 * 128 * 4 / 1e8)
    gpu = replace(toy_hw, host_link_bandwidth=1e6)  # swaps cross the host link, copy-on-write stays on the device
    assert CostModel(tiny, gpu, block_size=4).block_copy_time(3, 2) == pytest.approx(3 * 128 / 1e6 + 2 * 128 * 4 / 1e8)
    # tp = 2: each device moves half of every block over its own link
    assert CostModel(tiny, gpu, tensor_parallel_size=2, block_size=4).block_copy_time(3, 2) == pytest.approx(
        3 * 64 / 1e6 + 2 * 64 * 4 / 1e8)
    with pytest.raises(ValueError, match="host_link_bandwidth"):
        replace(toy_hw, host_link_bandwidth=-1.0)


def test_the_default_timer_prices_a_steps_swaps_and_copies(tiny, toy_hw):
    model = CostModel(tiny, toy_hw, block_size=4)
    timer = CostModelTimer(model)
    shape = BatchShape.from_pairs([(1, 3), (1, 6)])
    scheduled = [ScheduledRequest("a", [5], 3, [0], needs_logits=True),
                 ScheduledRequest("b", [6], 6, [1, 2], needs_logits=True)]
    plain = SchedulerOutput(step_id=0, scheduled=scheduled)
    swapping = SchedulerOutput(step_id=0, scheduled=scheduled, swap_out=[(3, 0), (4, 1)], swap_in=[(2, 5)],
                               copy_blocks=[(6, 7)])
    assert timer.step_time(plain) == pytest.approx(model.step_time(shape))
    assert timer.step_time(swapping) == pytest.approx(model.step_time(shape) + model.block_copy_time(3, 1))


def test_larger_int4_groups_leave_more_of_a_gpu_for_the_kv_pool():
    """The simulator sizes a replica's pool from the weights' bytes: groups of 128 read 0.53 bytes a weight
    against 0.625 at 32, so Llama-3.1-8B on an H100 keeps more blocks (the engine's rule, core/kv_sizing.py)."""
    from sim import Simulator

    blocks = {dtype: Simulator("llama-3.1-8b", "h100-sxm", dtype=dtype).num_kv_blocks
              for dtype in ("bfloat16", "int4", "int4-g128")}
    assert blocks["bfloat16"] < blocks["int4"] < blocks["int4-g128"]
