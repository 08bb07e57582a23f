"""One policy, two clocks: fed the engine's own step times, the simulator reproduces the engine's run.

The real engine serves a workload with Poisson arrivals and a pool small enough to preempt. The simulator
then runs the same workload with a `ReplayTimer` whose durations are the gaps between the engine's step
starts, so each simulated step starts when the engine's did and sees the same arrivals. (Arrivals before
the engine's first step are moved to that step's start: the engine notices a request a fraction of a
millisecond after it arrives, and the replay starts from what the engine saw.) Since both run the
same core scheduler, every step's batch (which requests, how many tokens, at what context) and every
preemption must be identical: only the timing model can make the two sides differ, and here it cannot.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from ref_engine.bench import run
from ref_engine.core import EngineConfig, Workload
from ref_engine.model.loader import load_model
from sim import Simulator
from sim.executor import ReplayTimer


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return load_model(make_tiny_hf_model("llama", name="replay-llama", max_position_embeddings=512))


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_replayed_simulation_makes_the_engines_decisions(tiny, preemption_mode):
    workload = Workload.synthetic(24, prompt_len=(8, 120), output_len=(4, 40), arrival=150.0, seed=5)
    config = EngineConfig(max_num_seqs=6, max_num_batched_tokens=64, num_kv_blocks=24, block_size=8,
                          preemption_mode=preemption_mode, num_swap_blocks=12)
    measured = run(workload, config, model=tiny)
    starts = [s.start for s in measured.steps]
    gaps = [b - a for a, b in pairwise(starts)] + [measured.steps[-1].duration]
    seen = Workload(tuple(replace(r, arrival_time=max(r.arrival_time, starts[0])) for r in workload.requests),
                    workload.seed, "as the engine saw it")
    simulated = Simulator(tiny.arch, "local-cpu", config, dtype="float32", step_timer=ReplayTimer(gaps)).run(seen)

    assert measured.num_preemptions > 0, "the pool was meant to be small enough to preempt"
    assert [(s.query_lens, s.context_lens) for s in simulated.steps] == \
        [(s.query_lens, s.context_lens) for s in measured.steps]
    assert simulated.num_preemptions == measured.num_preemptions
    assert [s.start for s in simulated.steps] == pytest.approx(starts, abs=1e-9)
