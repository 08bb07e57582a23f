"""Reference solutions of lesson 6's exercises (E06.1 to E06.4). Try them yourself first.

E06.1 groups the rows of the lesson's own breakdown (`ttft_breakdown`). E06.2: under FCFS with room for
`max_num_seqs` requests, a burst of equal requests runs in waves; a wave holds its slots for `output_len`
steps (one prefill step, which samples the first token, then output_len - 1 decode steps), so request k
starts with wave k // max_num_seqs. E06.3 splits the MLP as Megatron-LM does (Shoeybi et al., 2019, §3): gate
and up by output features, down by input features, so each rank's SwiGLU needs only its own features and the
one sum at the end (the all-reduce) restores the unsplit output. The ranks are simulated (a loop, no processes),
in plain torch; torch is imported inside the functions, so that the course checkers, which import this module,
stay torch-free. E06.4 reads a trace the way the lesson's symptom table does: a step
longer than the SLO first (lesson 3's stall, fixed by chunked prefill), then seats (`max_num_seqs`).

Lesson: lessons/06-architecture-map.md#exercises
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from course.architecture_map import TracedRequest, ttft_breakdown

if TYPE_CHECKING:
    import torch

__all__ = ["diagnose", "first_step", "queue_time", "rank_mlp", "shard_mlp", "shard_range", "tensor_parallel_mlp",
           "ttft_parts"]

# the parts of `ttft_breakdown`'s ten rows, in path order
PARTS = ("front_end",) * 4 + ("queueing", "prefill") + ("return",) * 4


def ttft_parts(events: list[dict[str, Any]], sent: float, first_chunk: float) -> dict[str, float]:
    """E06.1: the lesson's breakdown, its rows summed into four parts."""
    queued = next(e for e in events if e["event"] == "queued")
    traced = TracedRequest(queued["request_id"], queued["attrs"]["num_prompt_tokens"], 1, sent, [first_chunk],
                           events)
    parts = dict.fromkeys(PARTS, 0.0)
    for part, row in zip(PARTS, ttft_breakdown(traced), strict=True):
        parts[part] += row["ms"] / 1000
    return parts


def first_step(k: int, max_num_seqs: int, output_len: int) -> int:
    """E06.2a: wave k // max_num_seqs starts after that many waves of output_len steps."""
    return (k // max_num_seqs) * output_len


def queue_time(k: int, max_num_seqs: int, output_len: int, prefill_s: float, decode_s: float) -> float:
    """E06.2b: each earlier wave took one prefill step and output_len - 1 decode steps."""
    return (k // max_num_seqs) * (prefill_s + (output_len - 1) * decode_s)


def shard_range(size: int, rank: int, tp_size: int) -> tuple[int, int]:
    """E06.3a: `size // tp_size` features each, and one more for each of the first `size % tp_size` ranks."""
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank {rank} is not one of {tp_size} ranks")
    base, extra = divmod(size, tp_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def shard_mlp(gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor, rank: int,
              tp_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """E06.3b: the same intermediate features from all three: rows of gate and up, columns of down."""
    start, end = shard_range(gate_proj.shape[0], rank, tp_size)
    return gate_proj[start:end], up_proj[start:end], down_proj[:, start:end]


def rank_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """E06.3c: SwiGLU is elementwise per feature, so a rank needs no other rank's features before down."""
    import torch.nn.functional as F

    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def tensor_parallel_mlp(x: torch.Tensor, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor,
                        tp_size: int) -> torch.Tensor:
    """E06.3d: the partial outputs of every rank, summed (the all-reduce, here a plain sum)."""
    partials = [rank_mlp(x, *shard_mlp(gate_proj, up_proj, down_proj, rank, tp_size)) for rank in range(tp_size)]
    total = partials[0]
    for partial in partials[1:]:
        total = total + partial
    return total


def diagnose(trace: dict[str, Any]) -> dict[str, Any]:
    """E06.4: the slow requests, then the first cause whose evidence holds for them."""
    slo, steps = trace["ttft_slo_s"], trace["steps"]
    slow = [r for r in trace["requests"] if r["first_token"] - r["queued"] > slo]
    ids = [r["request_id"] for r in slow]
    if not slow:
        return {"cause": None, "requests": [], "steps": []}
    blocking = [s["step"] for s in steps
                if s["end"] - s["start"] > slo and any(n > 1 for n in s["tokens"].values())
                and any(s["start"] < r["first_token"] and s["end"] > r["queued"] for r in slow)]
    if blocking:
        return {"cause": "long_prefill", "requests": ids, "steps": blocking}
    waited = [s for s in steps if any(r["queued"] <= s["start"] < r["scheduled"] for r in slow)]
    if waited and all(len(s["tokens"]) == trace["config"]["max_num_seqs"] for s in waited):
        return {"cause": "max_num_seqs", "requests": ids, "steps": [s["step"] for s in waited]}
    return {"cause": None, "requests": ids, "steps": []}
