"""Checks for lesson 6's exercises; `impl` is the reference or your stub (see conftest.py).

E06.1 splits hand-made traces (one prefill step, or a prompt chunked over two) and compares with the parts
they were built from. E06.2 runs bursts through the shared scheduler in the simulator, with a fixed time for
a step that holds a prefill and another for a decode-only step, and compares each request's first step and
queue time with your estimate.
"""

from __future__ import annotations

import pytest

from core import EngineConfig, Workload
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
