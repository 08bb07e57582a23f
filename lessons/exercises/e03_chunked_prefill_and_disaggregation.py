"""Exercises of lesson 3, "The scheduler": E03.1 to E03.4.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e03_chunked_prefill_and_disaggregation.py --impl=learner          # all four
    pytest tests/exercises/test_e03_chunked_prefill_and_disaggregation.py --impl=learner -k e03_2 # one

The tests check E03.1 against the engine's fair queue (`FairRequestQueue` in core/fair.py,
driven with the same counters), E03.2 against the simulator's `CostModel.kv_transfer_time` and the
model's `ArchConfig.kv_bytes_per_token`, E03.3's plan in the simulated cluster (sim/cluster.py), and
E03.4, a debug exercise (its code runs; its tests fail until you fix it), in the simulator against the
engine's own `FairScheduler`. Reference solutions:
lessons/exercises/solutions/e03_chunked_prefill_and_disaggregation.py.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#exercises
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.fair import FairRequestQueue
from core.request import Request
from core.scheduler import Scheduler
from core.workload import Workload


def vtc_order(requests: Sequence[tuple[str, int]], weights: Mapping[str, float] | None = None) -> list[int]:
    """E03.1 (implement): the order in which virtual token counters admit `requests`.

    `requests[i]` is (tenant, tokens): request i of that tenant costs `tokens` tokens of service. All are
    queued at time 0 in list order (index = arrival order); every tenant's counter starts at 0. Repeat
    until the queue is empty: take the tenant with the lowest counter among those with requests left (ties:
    the tenant whose oldest remaining request came first), admit its oldest request, and add
    tokens / weight to its counter (`weights`: missing tenants weigh 1). Return the admitted indices in order.
    Example: [("a", 10), ("a", 10), ("b", 10)] -> [0, 2, 1]: after a's first request a's counter is 10, b's 0.

    Interview questions: Q-FAIR-01 (lessons/interview-bank.md#q-fair-01).
    """
    raise NotImplementedError("E03.1: virtual token counter order")


def kv_transfer_bytes(arch: ArchConfig, prompt_len: int, dtype_bytes: int = 2) -> int:
    """E03.2 (estimate), part a: bytes of KV cache a `prompt_len`-token prompt holds, over all layers:
    keys and values, one vector of head_dim per KV head per layer, `dtype_bytes` per element.
    By hand first: Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128), 4096 tokens, bf16.

    Interview questions: Q-PD-02 (lessons/interview-bank.md#q-pd-02).
    """
    raise NotImplementedError("E03.2: KV bytes of a prompt")


def kv_transfer_seconds(arch: ArchConfig, prompt_len: int, bandwidth: float, latency_s: float = 0.0,
                        dtype_bytes: int = 2) -> float:
    """E03.2 (estimate), part b: seconds to send that KV cache over a link of `bandwidth` bytes/s with a
    fixed `latency_s`, one request at a time. Try 400 Gb/s InfiniBand (50 GB/s) and 10 GbE (1.25 GB/s).

    Interview questions: Q-PD-02 (lessons/interview-bank.md#q-pd-02).
    """
    raise NotImplementedError("E03.2: KV transfer time")


def size_pd_cluster(workload: Workload, ttft_slo_ms: float, itl_slo_ms: float, links: Mapping[str, float], *,
                    model: str = "llama-3.1-8b", hardware: str = "h100-sxm", config: EngineConfig | None = None,
                    max_instances: int = 8) -> tuple[int, int, str]:
    """E03.3 (design): size a disaggregated deployment: x prefill instances, y decode instances, and the KV link.

    The deployment serves `workload` (its prompt and output lengths and its arrival rate) with `model` on
    `hardware`, one GPU per instance, every instance running `config` (None: `EngineConfig(
    max_num_batched_tokens=2048, max_num_seqs=256)`). A layout meets the SLOs when the simulated cluster
    `sim.cluster.Cluster(model, hardware, config, num_prefill_replicas=x, num_decode_replicas=y,
    router="least_loaded", kv_link_bandwidth=links[name])` completes every request of `workload` with a
    p90 TTFT of at most `ttft_slo_ms` and a p99 ITL of at most `itl_slo_ms`. Return (x, y, name): a layout
    with the fewest instances x + y that meets the SLOs (x >= 1, y >= 1, x + y <= `max_instances`; raise
    ValueError if there is none) and, for that layout, the slowest link of `links` (name -> bytes/s) with
    which it still meets them.

    Size it by hand first, with the simulator's own cost model
    (`Simulator(model, hardware, config).cost_model.step_time`, a `BatchShape` per step):
    - the prefill pool: one prompt's prefill takes t_p; at r requests/s the pool is busy r x t_p GPU-seconds
      every second, and TTFT grows fast as one instance's share nears 1;
    - the decode pool: by Little's law, about r x output_len x ITL requests are decoding at once; the largest
      batch whose decode step (context about prompt + output / 2) still fits the ITL SLO says how many of
      them one instance can hold;
    - the link: a prompt's KV cache (prompt_len x `ArchConfig.kv_bytes_per_token`) crosses it once, adding
      its transfer time to TTFT, and each prefill instance's link is busy r / x x that time every second.
    Then confirm and correct with the cluster itself, and write the plan up in half a page (the rubric is in
    the reference solution). Try the tests' two mixes: 2048-token prompts with 256-token outputs at
    30 requests/s, and 512 with 512 at 40, both within TTFT 200 ms; ITL 10 ms and 8 ms.

    Interview questions: Q-PD-01, Q-PD-03 (lessons/interview-bank.md#q-pd-03).
    """
    raise NotImplementedError("E03.3: size xP+yD and the KV link")


class VTCScheduler(Scheduler):
    """E03.4 (debug): virtual token counters that let a tenant bank credit while it is idle.

    Fair scheduling between tenants (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24),
    written on the core scheduler's hooks as the engine's own `FairScheduler` (core/fair.py) is, with equal
    weights: each tenant (`Request.group_key`) has a counter of the tokens it was served, its uncomputed
    prompt tokens charged when a request is admitted and its output tokens as they come; the waiting queue
    is the engine's `FairRequestQueue`, which admits the next request of the backlogged tenant with the
    lowest counter; preemption takes the most-served tenant's latest request. A tenant must not bank credit
    while it has nothing to run: when it becomes active again it competes from where the backlogged
    tenants are, not from where it left off.

    While every tenant stays backlogged, this is fair. Yet `pytest tests/exercises --impl=learner -k e03_4`
    replays a tenant that sends a few requests, goes quiet while another tenant keeps the server busy, and
    comes back with a burst: for a long while after its return the other tenant gets no admission at all,
    although it is backlogged the whole time. Find out why from the test's output, fix it here, and keep the
    method signatures: the tests select this class as a `scheduling_policy` and run it in the simulator.

    Interview questions: Q-FAIR-01 (lessons/interview-bank.md#q-fair-01).
    """

    def __init__(self, config: EngineConfig, num_kv_blocks: int, *, cache_namespace: str = "",
                 explain_misses: bool = False) -> None:
        # Before the base's __init__, which builds the queue that reads them (`make_request_queue`).
        self.virtual_counters: dict[str, float] = {}  # tenant -> tokens served
        self.num_running_by_group: Counter[str] = Counter()  # tenant -> running requests (the queue's tie-break)
        self.num_unfinished_by_group: Counter[str] = Counter()  # tenant -> waiting + running requests
        super().__init__(config, num_kv_blocks, cache_namespace=cache_namespace, explain_misses=explain_misses)

    def make_request_queue(self) -> FairRequestQueue:
        return FairRequestQueue(self.virtual_counters, self.num_running_by_group)

    def on_added(self, request: Request) -> None:
        """A request arrived. A tenant seen for the first time starts level with the lowest counter among the
        active tenants (0 on an idle server), so a newcomer cannot claim the server for itself."""
        tenant = request.group_key
        if tenant not in self.virtual_counters:
            active = [self.virtual_counters[t] for t in self.num_unfinished_by_group]
            self.virtual_counters[tenant] = min(active, default=0.0)
        self.num_unfinished_by_group[tenant] += 1

    def on_admitted(self, request: Request) -> None:
        """Charge the tenant the tokens the request computes now (its prompt, less the cached part)."""
        self.num_running_by_group[request.group_key] += 1
        self.virtual_counters[request.group_key] += request.num_tokens - request.num_computed_tokens

    def on_computed(self, request: Request, num_new_tokens: int) -> None:
        """Charge the tenant the output tokens the request got."""
        self.virtual_counters[request.group_key] += num_new_tokens

    def on_left_running(self, request: Request) -> None:
        _decrement(self.num_running_by_group, request.group_key)

    def on_released(self, request: Request) -> None:
        _decrement(self.num_unfinished_by_group, request.group_key)

    def select_victim(self, candidates: Sequence[Request]) -> Request:
        """The most recently admitted request of the most-served tenant among `candidates`."""
        most = max(self.virtual_counters[r.group_key] for r in candidates)
        return next(r for r in reversed(candidates) if self.virtual_counters[r.group_key] == most)


def _decrement(counts: Counter[str], tenant: str) -> None:
    """One fewer for `tenant`, and no entry at zero, so a tenant with nothing left is not counted as active."""
    counts[tenant] -= 1
    if not counts[tenant]:
        del counts[tenant]
