"""Checks for lesson 6's exercises; `impl` is the reference or your stub (see conftest.py).

E06.1 splits hand-made traces (one prefill step, or a prompt chunked over two) and compares with the parts
they were built from. E06.2 runs bursts through the shared scheduler in the simulator, with a fixed time for
a step that holds a prefill and another for a decode-only step, and compares each request's first step and
queue time with your estimate. E06.3 splits SmolLM2-135M's MLP (random weights of its real shapes) over 1, 2, 3
and 9 simulated ranks and compares the summed partial outputs with the engine's unsplit `LlamaMLP` loaded with
the same weights: within rtol = atol = 1e-5 in float32 (the ranks add in another order than one matrix product,
so the last bits differ; about 1.4e-6 relative was seen) and 1e-12 in float64. E06.4 records traces in the simulator, with step times that grow with the
tokens a step runs, each slow for a known reason (a burst queued behind `max_num_seqs`, or a long prompt
prefilled in one step without chunking), and one where nothing is slow, and compares your diagnosis with it.
"""

from __future__ import annotations

import pytest

from core import EngineConfig, Workload
from core.arch_config import KNOWN_MODELS
from core.workload import WorkloadRequest
from sim import Simulator


def trace(prompt_len: int, chunks: list[int], times: dict[str, float]) -> list[dict]:
    """A one-request timeline with the server's event names; `chunks`: the prompt's split over steps."""
    def event(name, t, **attrs):
        return {"request_id": "r-0", "event": name, "time": t, "box": "", "attrs": attrs}

    events = [event("arrived", times["arrived"]), event("tokenized", times["arrived"] + 0.001),
              event("sent_to_core", times["queued"] - 0.001), event("queued", times["queued"],
                                                                     num_prompt_tokens=prompt_len)]
    t, computed = times["scheduled"], 0
    for n in chunks:
        events += [event("scheduled", t, num_tokens=n, num_computed_tokens=computed, batch_size=1),
                   event("sampled", t + times["step"])]
        computed += n
        t += times["step"] + 0.002
    first_sampled = t - 0.002
    events += [event("detokenized", first_sampled + 0.001), event("output_received", first_sampled + 0.002),
               event("chunk_sent", first_sampled + 0.003)]
    return sorted(events, key=lambda e: e["time"])


@pytest.mark.parametrize("chunks", [[64], [48, 16]])
def test_e06_1_parts_add_up_to_ttft(impl, chunks):
    times = {"arrived": 10.002, "queued": 10.010, "scheduled": 10.250, "step": 0.300}
    events = trace(64, chunks, times)
    first_sampled = max(e["time"] for e in events if e["event"] == "sampled")
    parts = impl.ttft_parts(events, sent=10.0, first_chunk=first_sampled + 0.004)
    assert set(parts) == {"front_end", "queueing", "prefill", "return"}
    assert parts["front_end"] == pytest.approx(0.010)
    assert parts["queueing"] == pytest.approx(0.240)
    assert parts["prefill"] == pytest.approx(first_sampled - 10.250)  # every chunk of the prompt
    assert parts["return"] == pytest.approx(0.004)
    assert sum(parts.values()) == pytest.approx(first_sampled + 0.004 - 10.0)


class WaveTimer:
    """A step's time: `prefill_s` when some request in it is prefilling, else `decode_s`."""

    def __init__(self, prefill_s: float, decode_s: float) -> None:
        self.prefill_s, self.decode_s = prefill_s, decode_s

    def step_time(self, output) -> float:
        return self.prefill_s if any(s.num_computed_tokens == 0 for s in output.scheduled) else self.decode_s


@pytest.mark.parametrize(("num_requests", "max_num_seqs", "output_len"), [(6, 2, 8), (7, 3, 5), (4, 4, 3)])
def test_e06_2_first_step_and_queue_time_match_the_scheduler(impl, num_requests, max_num_seqs, output_len):
    prefill_s, decode_s = 0.4, 0.06
    config = EngineConfig(max_num_seqs=max_num_seqs, num_kv_blocks=256)
    run = Simulator(config=config, num_kv_blocks=256, step_timer=WaveTimer(prefill_s, decode_s)).run(
        Workload.synthetic(num_requests, prompt_len=32, output_len=output_len))
    starts = sorted({r.first_scheduled_time for r in run.requests})
    for k, r in enumerate(run.requests):
        step = sum(s.duration > 0 and s.start < r.first_scheduled_time for s in run.steps)
        assert impl.first_step(k, max_num_seqs, output_len) == step, k
        assert impl.queue_time(k, max_num_seqs, output_len, prefill_s, decode_s) == pytest.approx(
            r.first_scheduled_time - r.arrival_time), k
    assert len(starts) == -(-num_requests // max_num_seqs)  # one start per wave


SMOLLM2 = KNOWN_MODELS["smollm2-135m"]  # hidden 576, intermediate 1536
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}  # rtol = atol, see the module docstring


def mlp_weights(dtype_name: str, seed: int = 0):
    """Hugging Face-layout gate, up and down weights of SmolLM2's shapes, scaled so activations stay O(1),
    and 7 tokens of input."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(seed)
    hidden, inter = SMOLLM2.hidden_size, SMOLLM2.intermediate_size
    gate = torch.randn(inter, hidden, generator=g, dtype=dtype) * hidden**-0.5
    up = torch.randn(inter, hidden, generator=g, dtype=dtype) * hidden**-0.5
    down = torch.randn(hidden, inter, generator=g, dtype=dtype) * inter**-0.5
    return torch.randn(7, hidden, generator=g, dtype=dtype), gate, up, down


def engine_mlp(x, gate, up, down):
    """The engine's unsplit `LlamaMLP`, loaded with the same weights through its own loader."""
    import torch

    from ref_engine.model.llama import LlamaMLP

    mlp = LlamaMLP(SMOLLM2, x.dtype, None)
    with torch.no_grad():
        mlp.gate_up_proj.load_hf_shard("weight", gate, 0)
        mlp.gate_up_proj.load_hf_shard("weight", up, 1)
        mlp.down_proj.load_hf_shard("weight", down)
        return mlp(x)


@pytest.mark.parametrize("size", [1536, 576, 10, 7])
@pytest.mark.parametrize("tp_size", [1, 2, 3, 4, 9])
def test_e06_3_shard_ranges_cover_every_feature_once(impl, size, tp_size):
    torch = pytest.importorskip("torch")
    ranges = [impl.shard_range(size, rank, tp_size) for rank in range(tp_size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), ranges  # contiguous, in rank order
    sizes = [end - start for start, end in ranges]
    assert sizes == [len(part) for part in torch.tensor_split(torch.arange(size), tp_size)]


@pytest.mark.parametrize("tp_size", [2, 3, 9])
def test_e06_3_gate_and_up_split_by_rows_down_by_columns(impl, tp_size):
    torch = pytest.importorskip("torch")
    _, gate, up, down = mlp_weights("float32")
    shards = [impl.shard_mlp(gate, up, down, rank, tp_size) for rank in range(tp_size)]
    for g, u, d in shards:  # one rank: the same intermediate features in all three
        assert g.shape == u.shape == (d.shape[1], SMOLLM2.hidden_size)
        assert d.shape[0] == SMOLLM2.hidden_size
    assert torch.equal(torch.cat([g for g, _, _ in shards], dim=0), gate)  # column-parallel: output features
    assert torch.equal(torch.cat([u for _, u, _ in shards], dim=0), up)
    assert torch.equal(torch.cat([d for _, _, d in shards], dim=1), down)  # row-parallel: input features


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
@pytest.mark.parametrize("tp_size", [1, 2, 3, 9])
def test_e06_3_summed_partials_equal_the_unsplit_mlp(impl, dtype_name, tp_size):
    torch = pytest.importorskip("torch")
    x, gate, up, down = mlp_weights(dtype_name)
    expected = engine_mlp(x, gate, up, down)
    partials = [impl.rank_mlp(x, *impl.shard_mlp(gate, up, down, rank, tp_size)) for rank in range(tp_size)]
    assert all(p.shape == expected.shape for p in partials)
    tol = TOLERANCE[dtype_name]
    torch.testing.assert_close(sum(partials), expected, rtol=tol, atol=tol)
    torch.testing.assert_close(impl.tensor_parallel_mlp(x, gate, up, down, tp_size), expected, rtol=tol, atol=tol)
    if tp_size > 1:  # no rank has the answer alone: that is why row-parallel down_proj needs the all-reduce
        alone = max(((p - expected).norm() / expected.norm()).item() for p in partials)
        assert alone > 0.5


class LinearTimer:
    """A step's time: 10 ms plus 0.2 ms per token it runs (a 3,000-token prompt: 0.61 s)."""

    def step_time(self, output) -> float:
        return 0.010 + 0.0002 * sum(len(s.token_ids) for s in output.scheduled)


def recorded_trace(workload: Workload, config: EngineConfig, ttft_slo_s: float) -> dict:
    """What E06.4's `diagnose` reads: the simulator's record of one run, as the stub's docstring describes it."""
    run = Simulator(config=config, num_kv_blocks=config.num_kv_blocks, step_timer=LinearTimer()).run(workload)
    return {
        "config": {"max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
                   "enable_chunked_prefill": config.enable_chunked_prefill},
        "ttft_slo_s": ttft_slo_s,
        "requests": [{"request_id": f"r{r.request_id}", "num_prompt_tokens": r.num_prompt_tokens,
                      "queued": r.arrival_time, "scheduled": r.first_scheduled_time,
                      "first_token": r.first_token_time} for r in run.requests],
        "steps": [{"step": st.step_id, "start": st.start, "end": st.start + st.duration,
                   "tokens": {f"r{i}": n for i, n in zip(st.request_ids, st.query_lens, strict=True)}}
                  for st in run.steps],
    }


def burst_trace(num_requests: int, max_num_seqs: int, output_len: int, ttft_slo_s: float) -> dict:
    """A burst of equal 32-token prompts against `max_num_seqs` seats: later waves queue (lesson 6's burst)."""
    config = EngineConfig(max_num_seqs=max_num_seqs, num_kv_blocks=128)
    return recorded_trace(Workload.synthetic(num_requests, prompt_len=32, output_len=output_len), config, ttft_slo_s)


def long_prompt_trace(long_len: int, long_arrival: float, ttft_slo_s: float) -> dict:
    """Short requests every 50 ms and one long prompt, chunked prefill off: the long prompt takes one step."""
    short = [WorkloadRequest(arrival_time=0.05 * i, prompt_len=32, output_len=24) for i in range(9)]
    long = WorkloadRequest(arrival_time=long_arrival, prompt_len=long_len, output_len=4)
    config = EngineConfig(max_num_seqs=16, enable_chunked_prefill=False, max_num_batched_tokens=4096,
                          max_model_len=4096, num_kv_blocks=512)
    requests = sorted([*short, long], key=lambda r: r.arrival_time)
    return recorded_trace(Workload(tuple(requests)), config, ttft_slo_s)


def slow_ids(trace: dict) -> list[str]:
    return [r["request_id"] for r in trace["requests"] if r["first_token"] - r["queued"] > trace["ttft_slo_s"]]


def shown(trace: dict) -> str:
    """The trace, one line per request and per step, for a failure message."""
    lines = [f"SLO {trace['ttft_slo_s']} s, config {trace['config']}"]
    lines += [f"{r['request_id']}: {r['num_prompt_tokens']} prompt tokens, queued {r['queued']:.3f}, scheduled "
              f"{r['scheduled']:.3f}, first token {r['first_token']:.3f} (TTFT {r['first_token'] - r['queued']:.3f})"
              for r in trace["requests"]]
    lines += [f"step {st['step']}: {st['start']:.3f}-{st['end']:.3f} {st['tokens']}" for st in trace["steps"]]
    return "\n  ".join(lines)


@pytest.mark.parametrize(("num_requests", "max_num_seqs", "output_len", "slow"),
                         [(6, 2, 12, ["r2", "r3", "r4", "r5"]), (7, 3, 8, ["r3", "r4", "r5", "r6"])])
def test_e06_4_a_burst_queued_behind_max_num_seqs(impl, num_requests, max_num_seqs, output_len, slow):
    trace = burst_trace(num_requests, max_num_seqs, output_len, ttft_slo_s=0.1)
    assert slow_ids(trace) == slow  # the first wave makes the SLO, the later ones wait for seats
    last_start = max(r["scheduled"] for r in trace["requests"])
    waited = [st["step"] for st in trace["steps"] if st["start"] < last_start]  # all full: the waves before the last
    assert impl.diagnose(trace) == {"cause": "max_num_seqs", "requests": slow, "steps": waited}, shown(trace)


@pytest.mark.parametrize(("long_len", "long_arrival", "ttft_slo_s"), [(3000, 0.12, 0.2), (2000, 0.27, 0.25)])
def test_e06_4_a_long_prompt_prefilled_in_one_step(impl, long_len, long_arrival, ttft_slo_s):
    trace = long_prompt_trace(long_len, long_arrival, ttft_slo_s)
    long_step = next(st["step"] for st in trace["steps"] if long_len in st["tokens"].values())
    slow = slow_ids(trace)
    assert len(slow) >= 3  # the long prompt itself and the short requests that arrived while it ran
    assert impl.diagnose(trace) == {"cause": "long_prefill", "requests": slow, "steps": [long_step]}, shown(trace)


def test_e06_4_nothing_slow(impl):
    trace = burst_trace(6, 2, 12, ttft_slo_s=0.5)
    assert impl.diagnose(trace) == {"cause": None, "requests": [], "steps": []}, shown(trace)
