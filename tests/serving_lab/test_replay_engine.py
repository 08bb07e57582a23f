"""One policy, two clocks: fed the engine's own step times, the simulator reproduces the engine's run.

The real engine serves a workload with Poisson arrivals and a pool small enough to preempt. The simulator
then runs the same workload with a `ReplayTimer` whose durations are the gaps between the engine's step
starts, so each simulated step starts when the engine's did and sees the same arrivals (tests/engine_replay.py).
Since both run the
same core scheduler, every step's batch (which requests, how many tokens, at what context) and every
preemption must be identical: only the timing model can make the two sides differ, and here it cannot.
"""

from __future__ import annotations

import pytest
from engine_replay import batches, replay

from core import EngineConfig, Workload
from ref_engine.bench import run
from ref_engine.model.loader import load_model


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model, device):
    return load_model(make_tiny_hf_model("llama", name="replay-llama", max_position_embeddings=512), device=device)


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_replayed_simulation_makes_the_engines_decisions(tiny, preemption_mode):
    workload = Workload.synthetic(24, prompt_len=(8, 120), output_len=(4, 40), arrival=150.0, seed=5)
    config = EngineConfig(max_num_seqs=6, max_num_batched_tokens=64, num_kv_blocks=24, block_size=8,
                          preemption_mode=preemption_mode, num_swap_blocks=12)
    measured = run(workload, config, model=tiny)
    simulated = replay(measured, workload, config, tiny.arch)

    assert measured.num_preemptions > 0, "the pool was meant to be small enough to preempt"
    assert batches(simulated) == batches(measured)
    assert simulated.num_preemptions == measured.num_preemptions
    assert [s.start for s in simulated.steps] == pytest.approx([s.start for s in measured.steps], abs=1e-9)
