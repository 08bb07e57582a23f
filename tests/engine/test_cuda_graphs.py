"""CUDA graphs for decode (ref_engine/cuda_graphs.py): what a CPU can check, and the GPU's token-exactness.

- the capture sizes: vLLM's default list cut at max_num_seqs, or the config's own, checked and sorted;
- a decode batch is padded to the next capture size and its block tables to the next power of two;
- only pure decode steps qualify (no prompt chunk, no draft tokens), and only on CUDA: a CPU keeps compiling;
- padding rows write to and read from the scratch block only;
- the padded fixed-shape forward (what a graph records) gives eager's tokens and leaves the pool's other
  blocks as eager leaves them;
- the runner's whole graph path, each replay run eagerly on a CPU, is token-exact with eager through every
  batched regime;
- on a GPU (skipped elsewhere): graphs replay token-exact with eager through every batched regime, in float32
  and float16.
"""

from __future__ import annotations

import pytest
import torch
from batched_regimes import BATCHED_REGIMES, regime_prompts

from core.config import EngineConfig
from core.interfaces import ScheduledRequest
from ref_engine import LLM, LLMEngine, SamplingParams
from ref_engine.attention import AttentionMetadata, allocate_kv_cache
from ref_engine.cuda_graphs import (
    CUDAGraphRunner,
    GraphInputs,
    capture_sizes,
    is_graph_step,
    pad_decode_batch,
    padded_size,
    padded_width,
    uses_cuda_graphs,
)
from ref_engine.model.loader import load_model


def decode(request_id: str, token: int, position: int, blocks: list[int]) -> ScheduledRequest:
    return ScheduledRequest(request_id, [token], position, blocks, needs_logits=True)


def test_the_default_sizes_are_vllms_up_to_max_num_seqs():
    assert capture_sizes(None, 64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert capture_sizes(None, 6) == (1, 2, 4)
    assert capture_sizes(None, 300)[-5:] == (240, 248, 256, 272, 288)  # from 256 on, every 16
    assert capture_sizes(None, 1024)[-1] == 512
    assert capture_sizes((), 64) == ()


def test_the_config_keeps_its_sizes_sorted_and_unique_and_names_the_knob():
    assert EngineConfig(cudagraph_capture_sizes=[8, 1, 4, 1]).cudagraph_capture_sizes == (1, 4, 8)
    assert capture_sizes(EngineConfig(cudagraph_capture_sizes=[8, 1, 4]).cudagraph_capture_sizes, 64) == (1, 4, 8)
    for bad in ([0, 4], [65], [2.5], [True], ["8"]):
        with pytest.raises(ValueError, match=r"cudagraph_capture_sizes holds .*; each size must be an integer from "
                                             r"1 to max_num_seqs \(64\)"):
            EngineConfig(cudagraph_capture_sizes=bad)
    with pytest.raises(ValueError, match=r"cudagraph_capture_sizes must be a list of positive integers or None"):
        EngineConfig(cudagraph_capture_sizes=8)
    with pytest.raises(ValueError, match=r"max_num_seqs \(4\)"):
        EngineConfig(cudagraph_capture_sizes=[1, 8]).replace(max_num_seqs=4)


def test_a_batch_pads_to_the_next_size_and_its_tables_to_a_power_of_two():
    sizes = (1, 2, 4, 8, 16)
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16, 17)] == [1, 2, 4, 8, 8, 16, 16, None]
    assert [padded_width(n, 100) for n in (1, 2, 3, 4, 5, 33, 64, 65, 100)] == [1, 2, 4, 4, 8, 64, 64, 100, 100]


def test_only_pure_decode_steps_that_fit_qualify():
    sizes = (1, 2, 4)
    rows = [decode(str(i), 5, 10, [0]) for i in range(4)]
    assert is_graph_step(rows, sizes)
    assert not is_graph_step([], sizes)
    assert not is_graph_step(rows + [decode("4", 5, 10, [0])], sizes)  # more rows than the largest size
    chunk = ScheduledRequest("p", [1, 2, 3], 0, [1], needs_logits=True)
    drafts = ScheduledRequest("d", [7, 8, 9], 10, [2], needs_logits=True, num_draft_tokens=2)
    assert not is_graph_step(rows[:3] + [chunk], sizes)
    assert not is_graph_step(rows[:3] + [drafts], sizes)
    assert not is_graph_step(rows, ())


def test_graphs_only_on_cuda_when_compiling_on_one_rank():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert uses_cuda_graphs(False, cuda, 1, (1, 2))
    assert not uses_cuda_graphs(False, cpu, 1, (1, 2))  # a CPU keeps torch.compile
    assert not uses_cuda_graphs(True, cuda, 1, (1, 2))
    assert not uses_cuda_graphs(False, cuda, 2, (1, 2))
    assert not uses_cuda_graphs(False, cuda, 1, ())


def test_padding_rows_map_to_the_scratch_block():
    block_size, scratch = 4, 99
    rows = [decode("a", 11, 5, [3, 7]), decode("b", 12, 0, [2])]
    batch = pad_decode_batch(rows, size=4, width=2, block_size=block_size, scratch_block=scratch)
    assert batch.input_ids == [11, 12, 0, 0]
    assert batch.positions == [5, 0, 0, 0]
    assert batch.slot_mapping == [7 * 4 + 1, 2 * 4, scratch * 4, scratch * 4]
    assert batch.block_tables == [[3, 7], [2, scratch], [scratch, scratch], [scratch, scratch]]
    assert batch.seq_lens == [6, 1, 1, 1]
    with pytest.raises(ValueError, match="2 rows do not fit a graph of 1"):
        pad_decode_batch(rows, size=1, width=2, block_size=block_size, scratch_block=scratch)


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return load_model(make_tiny_hf_model("llama", name="cuda-graphs-llama"), device="cpu")


def test_an_engine_takes_the_knob_and_a_cpu_keeps_its_pool_as_it_was(tiny):
    engine = LLMEngine(tiny, num_kv_blocks=32, cudagraph_capture_sizes=[2, 1])
    assert engine.config.cudagraph_capture_sizes == (1, 2)
    assert engine.runner.cuda_graphs is None and engine.runner.kv_caches[0].shape[1] == 32  # no scratch block
    with pytest.raises(ValueError, match=r"cudagraph_capture_sizes holds 0"):
        LLMEngine(tiny, cudagraph_capture_sizes=[0, 1])


@torch.inference_mode()
def test_the_padded_fixed_shape_forward_matches_eager_and_touches_only_the_scratch_block(tiny):
    model, block_size, pool = tiny.model, 4, 16
    prompts = [[1 + (7 * i + j) % 200 for j in range(n)] for i, n in enumerate((5, 9, 3))]
    tables = [[0, 1], [2, 3, 4], [5]]
    cache = allocate_kv_cache(tiny.arch, pool + 1, block_size, torch.float32)  # + the scratch block
    prefill = AttentionMetadata.build([len(p) for p in prompts], [len(p) for p in prompts], tables, block_size)
    model(torch.tensor(sum(prompts, [])), torch.cat([torch.arange(len(p)) for p in prompts]), cache, prefill)
    eager_cache, graph_cache = cache, [layer.clone() for layer in cache]

    rows = [decode(str(i), 40 + i, len(p), t) for i, (p, t) in enumerate(zip(prompts, tables))]
    meta = AttentionMetadata.build([1] * 3, [len(p) + 1 for p in prompts], tables, block_size)
    expected = model(torch.tensor([40, 41, 42]), torch.tensor([len(p) for p in prompts]), eager_cache, meta)

    runner = CUDAGraphRunner(model, graph_cache, (1, 2, 4, 8), block_size, max_model_len=256)
    assert runner.scratch_block == pool and runner.graph_shape(rows) == (4, 4)  # 3 rows -> 4; 3 blocks -> 4
    inputs = GraphInputs.of(pad_decode_batch(rows, 4, 4, block_size, runner.scratch_block), runner.device)
    got = runner.forward(inputs)[:3]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.compute_logits(got).argmax(-1), model.compute_logits(expected).argmax(-1))
    for eager_layer, graph_layer in zip(eager_cache, graph_cache):
        torch.testing.assert_close(graph_layer[:, :pool], eager_layer[:, :pool], rtol=1e-5, atol=1e-5)
        assert not eager_layer[:, pool].any() and graph_layer[:, pool, 0].any()  # padding wrote its one slot
        assert not graph_layer[:, pool, 1:].any()


class EagerReplay:
    """A captured graph's stand-in on a CPU: each replay runs the forward the capture would record, on the same
    input buffers, into the same output tensor."""

    def __init__(self, runner: CUDAGraphRunner, inputs: GraphInputs) -> None:
        self.runner, self.inputs = runner, inputs
        self.hidden = runner.forward(inputs)  # the capture's run: padding rows only

    def replay(self) -> None:
        self.hidden.copy_(self.runner.forward(self.inputs))


@BATCHED_REGIMES
def test_the_graph_path_is_token_exact_with_eager_with_replays_run_eagerly(tiny, knobs, monkeypatch):
    """The runner's whole graph path (which steps qualify, buffers refilled per step, padding, the scratch block
    past the pool) on a CPU, each replay run eagerly where a GPU would launch the graph."""
    prompts = regime_prompts()
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(tiny, **knobs).generate(prompts, params, use_tqdm=False)]
    monkeypatch.setattr("ref_engine.runner.uses_cuda_graphs", lambda *args: True)

    def capture(runner: CUDAGraphRunner, size: int, width: int):
        replay = EagerReplay(runner, runner.padding_inputs(size, width))
        return replay, replay.inputs, replay.hidden

    monkeypatch.setattr(CUDAGraphRunner, "_capture", capture)
    llm = LLM(tiny, cudagraph_capture_sizes=[1, 2, 4, 8], **knobs)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    engine = llm.llm_engine
    assert engine.runner.kv_caches[0].shape[1] == engine.num_kv_blocks + 1  # the scratch block
    assert engine.runner.cuda_graphs.graphs, "no decode step took the graph path"
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@BATCHED_REGIMES
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_decode_graphs_are_token_exact_with_eager_on_a_gpu(make_tiny_hf_model, knobs, dtype):
    loaded = load_model(make_tiny_hf_model("llama", name="cuda-graphs-gpu"), dtype=dtype, device="cuda")
    prompts = regime_prompts()
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    eager, graphs = (LLM(loaded, enforce_eager=enforce_eager, cudagraph_capture_sizes=[1, 2, 4, 8, 16], **knobs)
                     for enforce_eager in (True, False))
    expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in graphs.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    engine = graphs.llm_engine
    assert engine.runner.cuda_graphs.graphs, "no decode step replayed a graph"
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks
