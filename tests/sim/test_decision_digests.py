"""Every scheduling decision of a few fixed simulated runs, hashed and compared with recorded digests.

Speed work on the core scheduler, the KV cache manager and the simulator (benchmarks/sim_speed.py) must not
change what they decide. Each run below hashes, step by step, the whole `SchedulerOutput` (who runs, their
tokens, positions, block tables and logits flags, who was preempted, the swap and copy-on-write plans, the
memory snapshot, the drafts proposed) and the step's priced duration, then every request's row (arrival,
first scheduling, first token, finish, token times, cached tokens, preemptions). A digest that moves means a
decision moved: find out why before recording the new one. A change that is meant to alter decisions (a
policy, a cost-model refit) records the new digests, printed by

    python tests/sim/test_decision_digests.py
"""

from __future__ import annotations

import hashlib

import pytest

from core import EngineConfig, Exponential, SchedulerOutput, Workload
from sim import Simulator
from sim.executor import StepTimer
from sim.spec_decode import AcceptanceRate

# vLLM's GPU defaults for the knobs that matter, as in benchmarks/sim_speed.py
GPU = dict(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=4096)


def mixed(num_requests: int, seed: int = 0) -> Workload:
    """benchmarks/sim_speed.py's workload."""
    return Workload.synthetic(num_requests, prompt_len=(32, 1024), output_len=Exponential(256, 2048),
                              arrival=25.0, seed=seed, name="mixed")


class HashingTimer:
    """Feeds every step's whole plan, and the time the wrapped timer gives it, into a hash."""

    def __init__(self, timer: StepTimer, digest: hashlib._Hash) -> None:
        self.timer, self.digest = timer, digest

    def step_time(self, output: SchedulerOutput) -> float:
        duration = self.timer.step_time(output)
        self.digest.update(repr((
            output.step_id, output.preempted_request_ids, output.swap_out, output.swap_in, output.copy_blocks,
            output.kv_usage, output.num_live_tokens, output.num_reserved_slots,
            sorted(output.num_proposed_tokens.items()), duration,
            [(s.request_id, list(s.token_ids), s.num_computed_tokens, list(s.block_ids), s.needs_logits,
              s.num_draft_tokens) for s in output.scheduled])).encode())
        return duration


RUNS = {
    # the speed benchmark's workload: prefix caching on, no preemption
    "mixed_2000": lambda: (EngineConfig(**GPU), mixed(2000), {}),
    # a small pool: preemption by recompute, and by swap while the host pool has room
    "recompute": lambda: (EngineConfig(**GPU, num_kv_blocks=1500), mixed(300), {}),
    "swap": lambda: (EngineConfig(**GPU, num_kv_blocks=1500, preemption_mode="swap", num_swap_blocks=700),
                     mixed(300), {}),
    # reservations up front
    "contiguous": lambda: (EngineConfig(max_num_seqs=64, max_model_len=2048, kv_allocation="contiguous",
                                        num_kv_blocks=3000), mixed(150), {}),
    # shared prefixes (hits, copy-on-write of a fully cached block-aligned prompt), chunked under budgets
    "shared_prefix": lambda: (EngineConfig(max_num_seqs=32, max_num_batched_tokens=512, max_model_len=4096,
                                           num_kv_blocks=800, long_prefill_token_threshold=128),
                              Workload.shared_prefix(4, 30, 256, 0, (1, 64), arrival="all", seed=2), {}),
    # speculative decoding with a draft model, preempted by swap
    "spec_draft": lambda: (EngineConfig(max_num_seqs=8, max_model_len=4096, speculative_method="draft_model",
                                        speculative_model="self:4", num_speculative_tokens=3,
                                        speculative_disable_by_batch_size=None, num_kv_blocks=40,
                                        preemption_mode="swap", num_swap_blocks=40),
                           Workload.synthetic(60, (16, 256), (8, 200), arrival=2.0, seed=4),
                           {"acceptance": AcceptanceRate((0.7,))}),
}

DIGESTS = {
    "mixed_2000": "a7cba6c6a5465ebd8c9649788bb6feae41e9c274dee63185fe55ea6d65592d96",
    "recompute": "09c0f3d9d6312c91fb46a83c967172a160a91f63279358acd1227ca5591b1dd6",
    "swap": "a5edc4375d48e9901beb203f267a249ef981c0cacef932ba70acf1bd22f57c64",
    "contiguous": "b415fae5aeef053f30edaeb40c906632ee9a071fafdf166b5ed3755285695998",
    "shared_prefix": "ab127910a4d705c9632f53e4b30e0371c5415aea0f28940dc1ef90b0aebe8cb1",
    "spec_draft": "56914d8744ae80db9b94da3fb06067986a6429d2c6a2a7901f5a86fe49fbf7ed",
}


def run_digest(name: str) -> str:
    config, workload, extra = RUNS[name]()
    digest = hashlib.sha256()
    simulator = Simulator("llama-3.1-8b", "h100-sxm", config, **extra)
    simulator.step_timer = HashingTimer(simulator.step_timer, digest)
    metrics = simulator.run(workload)
    for row in metrics.requests:
        digest.update(repr((row, row.token_times)).encode())
    return digest.hexdigest()


@pytest.mark.parametrize("name", sorted(RUNS))
def test_decisions_match_the_recorded_digest(name: str) -> None:
    assert run_digest(name) == DIGESTS[name], f"{name}: the simulated run's decisions changed"


if __name__ == "__main__":
    for name in RUNS:
        print(f'    "{name}": "{run_digest(name)}",')
