"""CUDA graphs for decode: what vLLM's `enforce_eager=False` means on a GPU, beside compiling.

Why: a decode step of a small model is launch-bound. Each layer runs a few dozen small kernels (norms, three
projections, rotary, the KV write, the gather, attention, the MLP), each launched by Python through torch's
dispatcher in some microseconds, while the GPU finishes it in about as long: SmolLM2's 30 layers are over a
thousand launches a step, and the GPU waits between them. A CUDA graph records a step's kernels once, with
the memory they read and write, and replays them all with one launch. The price: every replay runs the same
shapes on the same buffers. So, as vLLM does (`cudagraph_capture_sizes`):

* graphs are captured at a few decode batch sizes (`capture_sizes`: vLLM's 1, 2, 4, then multiples of 8 and
  from 256 of 16, up to `max_num_seqs`), and a step's batch is padded to the next one up (`padded_size`); a step that does not
  qualify (`is_graph_step`: a prompt chunk, draft tokens to verify, more rows than the largest size) runs
  eagerly;
* each graph owns static input buffers (token ids, positions, slot mapping, block tables, context lengths);
  a replay first copies the step's values into them (`pad_decode_batch` lays them out);
* padding rows write their K/V into a scratch block that the scheduler never hands out (one block past the
  pool, `ModelRunner` allocates it), attend only to it, and their outputs are dropped: they never touch a real
  request's cache.

What the reference attention decides per step in Python, that a graph cannot (ref_engine/attention.py):
`AttentionMetadata.__post_init__` picks the decode rows from the query lengths and sizes the gather by the
step's longest context (`num_blocks = cdiv(max_ctx, block_size)`: a shape that follows the data), and
prefill rows run one request at a time, each with its own shapes and its own choice of causal or offset mask.
The graph path runs only pure decode steps through `AttentionMetadata.fixed_decode`: every row one query,
block tables at a fixed width, the key mask computed on the device from the context lengths. The width is
the step's blocks padded to a power of two (`padded_width`), so graphs are keyed by (batch size, width) and
captured on first use; a step reads at most twice the blocks it needs, never the whole `max_model_len`.

Graphs record the eager forward, and take the place of torch.compile on a GPU: the engine then stays
token-exact with eager (the same kernels on the same values, checked on a GPU by tests/engine/test_cuda_graphs.py;
on a CPU the whole path runs with each replay done eagerly). Recording compiled pieces instead (vLLM's piecewise
compile) is the next step, once a GPU can measure what it adds. Tensor parallelism (a timed all-reduce in
every layer) keeps the compiled path, without graphs.

Lesson: lessons/07-tuning-knobs.md (enforce_eager: what compiling buys on the course CPU, and graphs on a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from core.interfaces import ScheduledRequest
from core.math_utils import cdiv
from ref_engine.attention import AttentionMetadata

# vLLM V1's default sizes: 1, 2, 4, every multiple of 8 below 256, then of 16 up to 512. vLLM keeps those up to
# 2 x max_num_seqs (its graphs also hold speculative rows of 1 + k tokens); ours hold one token a row.
DEFAULT_CAPTURE_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))


def uses_cuda_graphs(enforce_eager: bool, device: torch.device, tensor_parallel_size: int,
                     sizes: Sequence[int]) -> bool:
    """Whether a runner replays decode graphs (and so does not compile): `enforce_eager=False` on a CUDA device, on
    one rank (a tensor-parallel layer's all-reduce is timed on the host), with sizes to capture. A CPU compiles
    instead: it has no graphs, and its launches cost little beside its matmuls."""
    return not enforce_eager and device.type == "cuda" and tensor_parallel_size == 1 and len(sizes) > 0


def capture_sizes(sizes: Sequence[int] | None, max_num_seqs: int) -> tuple[int, ...]:
    """The decode batch sizes to capture: `sizes` (`EngineConfig.cudagraph_capture_sizes`, checked there) or,
    for None, vLLM's default ones up to `max_num_seqs`."""
    if sizes is not None:
        return tuple(sorted(sizes))
    return tuple(s for s in DEFAULT_CAPTURE_SIZES if s <= max_num_seqs)


def padded_size(batch_size: int, sizes: Sequence[int]) -> int | None:
    """The smallest capture size that holds `batch_size` rows (None: more rows than the largest)."""
    return next((s for s in sorted(sizes) if s >= batch_size), None)


def padded_width(num_blocks: int, max_blocks: int) -> int:
    """Block-table width of a graph for a step whose longest context spans `num_blocks`: the next power of two,
    at most `max_blocks` (the blocks of `max_model_len`)."""
    return min(1 << max(num_blocks - 1, 0).bit_length(), max_blocks)


def is_graph_step(scheduled: Sequence[ScheduledRequest], sizes: Sequence[int]) -> bool:
    """Whether a step can replay a decode graph: every request computes exactly one token (no prompt chunk, no
    draft tokens to verify) and the batch fits the largest capture size."""
    return (0 < len(scheduled) <= max(sizes, default=0)
            and all(s.num_scheduled_tokens == 1 for s in scheduled))


@dataclass(frozen=True)
class DecodeBatch:
    """A decode step's inputs laid out for a graph of `len(input_ids)` rows and `width` blocks per row."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    block_tables: list[list[int]]  # each row `width` blocks long
    seq_lens: list[int]


def pad_decode_batch(scheduled: Sequence[ScheduledRequest], size: int, width: int, block_size: int,
                     scratch_block: int) -> DecodeBatch:
    """The rows of a pure decode step, then `size - len(scheduled)` padding rows. A padding row's one token sits
    at position 0 of the scratch block (its K/V land there), its table is the scratch block alone and its
    context one token, so its attention reads only what it wrote. Real rows' tables are padded with the scratch
    block too: those entries lie past the row's context and are masked."""
    if not len(scheduled) <= size:
        raise ValueError(f"{len(scheduled)} rows do not fit a graph of {size}")
    pad = size - len(scheduled)
    positions = [s.num_computed_tokens for s in scheduled]
    tables = [list(s.block_ids[:width]) + [scratch_block] * (width - len(s.block_ids[:width])) for s in scheduled]
    return DecodeBatch(
        input_ids=[s.token_ids[0] for s in scheduled] + [0] * pad,
        positions=positions + [0] * pad,
        slot_mapping=[t[p // block_size] * block_size + p % block_size for t, p in zip(tables, positions)]
        + [scratch_block * block_size] * pad,
        block_tables=tables + [[scratch_block] * width] * pad,
        seq_lens=[p + 1 for p in positions] + [1] * pad,
    )


@dataclass
class GraphInputs:
    """One graph's static input buffers, on the device: a replay reads them where they were at capture."""

    input_ids: torch.Tensor  # int64 [size]
    positions: torch.Tensor  # int64 [size]
    slot_mapping: torch.Tensor  # int64 [size]
    block_tables: torch.Tensor  # int64 [size, width]
    seq_lens: torch.Tensor  # int64 [size]

    @classmethod
    def of(cls, batch: DecodeBatch, device: torch.device) -> GraphInputs:
        def as_tensor(values: list) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(*(as_tensor(getattr(batch, f.name)) for f in fields(cls)))

    def copy_from(self, batch: DecodeBatch) -> None:
        """Put a step's values into the buffers (one host-to-device copy each, outside the graph)."""
        for f in fields(self):
            getattr(self, f.name).copy_(torch.tensor(getattr(batch, f.name), dtype=torch.int64))


class CUDAGraphRunner:
    """Decode steps of `model` replayed from CUDA graphs, keyed by (batch size, block-table width)."""

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], sizes: Sequence[int], block_size: int,
                 max_model_len: int) -> None:
        """`kv_caches`: the runner's, whose last block is the scratch block (never in the scheduler's pool)."""
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = tuple(sizes)
        self.block_size = block_size
        self.max_blocks = cdiv(max_model_len, block_size)
        self.scratch_block = kv_caches[0].shape[1] - 1
        self.device = kv_caches[0].device
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, GraphInputs, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None

    def can_run(self, scheduled: Sequence[ScheduledRequest]) -> bool:
        return is_graph_step(scheduled, self.sizes)

    def graph_shape(self, scheduled: Sequence[ScheduledRequest]) -> tuple[int, int]:
        """(rows, width) of the graph that runs this step."""
        longest = max(s.num_computed_tokens + 1 for s in scheduled)
        return padded_size(len(scheduled), self.sizes), padded_width(cdiv(longest, self.block_size), self.max_blocks)

    def run(self, scheduled: Sequence[ScheduledRequest]) -> torch.Tensor:
        """Hidden states `[len(scheduled), hidden]` of a decode step (`can_run`), from its graph, captured first
        if this shape is new."""
        size, width = self.graph_shape(scheduled)
        if (size, width) not in self.graphs:
            self.graphs[size, width] = self._capture(size, width)
        graph, inputs, hidden = self.graphs[size, width]
        inputs.copy_from(pad_decode_batch(scheduled, size, width, self.block_size, self.scratch_block))
        graph.replay()
        return hidden[:len(scheduled)]

    def forward(self, inputs: GraphInputs) -> torch.Tensor:
        """The eager forward over a graph's buffers: what a capture records (and, on a CPU, what a test runs)."""
        meta = AttentionMetadata.fixed_decode(inputs.slot_mapping, inputs.block_tables, inputs.seq_lens,
                                              self.block_size)
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, meta)

    def padding_inputs(self, size: int, width: int) -> GraphInputs:
        """Buffers for a graph of `size` rows and `width` blocks, holding padding rows only: a capture's warm-up
        run computes on them, and so writes nothing but the scratch block."""
        return GraphInputs.of(pad_decode_batch([], size, width, self.block_size, self.scratch_block), self.device)

    def _capture(self, size: int, width: int) -> tuple[torch.cuda.CUDAGraph, GraphInputs, torch.Tensor]:
        """Warm up on a side stream (cuBLAS and the allocator settle there, as torch's graph docs require), then
        record the forward into a graph whose temporaries live in one pool shared by all the graphs."""
        inputs = self.padding_inputs(size, width)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.forward(inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self.forward(inputs)
        return graph, inputs, hidden
