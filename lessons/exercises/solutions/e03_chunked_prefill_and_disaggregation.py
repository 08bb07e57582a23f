"""Reference solutions of lesson 3's exercises (E03.1 to E03.4). Try them yourself first.

E03.1 is the admission rule of the engine's fair scheduler (`FairRequestQueue.peek_request` in
core/fair.py), on a static queue with every request charged in full when it is admitted.
E03.2 is `ArchConfig.kv_bytes_per_token` times the prompt, over the link as `CostModel.kv_transfer_time`
prices it (tensor parallelism 1).
E03.3 searches the simulated cluster (sim/cluster.py) in order of instances; the design is in the arithmetic
that comes before the search, and the rubric below grades it.
E03.4 is the stub's scheduler with its bug fixed: the counter lift of the engine's `FairScheduler.on_added`.

Rubric for E03.3 (design; 10 points). A written plan for "serve this mix at this rate within these SLOs with
xP+yD" gets:
- 2: the prefill pool from prefill GPU-seconds per second: t_p = one prompt's prefill (51 ms for 2048 tokens
  of Llama-3.1-8B on the simulated H100), r x t_p = 1.5 at 30 requests/s, so two instances, each 77% busy,
  and the TTFT SLO checked against queueing at that load, not only against t_p;
- 2: the decode pool from Little's law and the ITL SLO: about r x output_len x ITL requests decode at once
  (30 x 256 x 9 ms = 69), the decode step at that batch priced at the mean context (one instance: 14 ms at
  batch 69, over a 10 ms SLO; two instances of about 35: 9.9 ms, just within it), and the rounding done up;
- 2: the link from both of its costs: the transfer adds to TTFT (256 MiB per 2048-token prompt: 21 ms on
  100 GbE, 86 ms on 25 GbE), and each prefill instance's link is busy r / x x transfer per second (15 x 86 ms
  = 1.3 on 25 GbE: the transfers queue without bound), so the cheapest link is the slowest one well under 1;
- 1: the answer checked in the simulator, including that the next smaller layout and the next slower link
  fail (2P+2D on 100 GbE for the long prompts; 1P+3D on 25 GbE for 512-token prompts with 512-token outputs
  at 40 requests/s: the mix sets the ratio);
- 1: headroom: the plan holds at the planned rate, and a burst, a lost instance or a rolling restart needs
  one more of the pool that breaks first;
- 1: the comparison with colocated serving on as many GPUs, with chunked prefill under a budget chosen for
  the ITL SLO (lesson 3, "When disaggregation pays"): disaggregation must beat that, not the unchunked one;
- 1: sensitivity: what changes when prompts double (prefill pool and link), outputs double (decode pool), or
  the ITL SLO tightens (decode pool), and which pool to grow first.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#exercises
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.fair import FairRequestQueue
from core.metrics import RunMetrics
from core.request import Request
from core.scheduler import Scheduler
from core.workload import Workload
from sim.cluster import Cluster


def vtc_order(requests: Sequence[tuple[str, int]], weights: Mapping[str, float] | None = None) -> list[int]:
    """E03.1: lowest counter first, ties by the oldest head request; charge tokens / weight on admission."""
    weights = dict(weights or {})
    queues: dict[str, deque[int]] = {}
    for i, (tenant, _) in enumerate(requests):
        queues.setdefault(tenant, deque()).append(i)
    counters = dict.fromkeys(queues, 0.0)
    order = []
    while any(queues.values()):
        tenant = min((t for t, q in queues.items() if q), key=lambda t: (counters[t], queues[t][0]))
        i = queues[tenant].popleft()
        counters[tenant] += requests[i][1] / weights.get(tenant, 1.0)
        order.append(i)
    return order


def kv_transfer_bytes(arch: ArchConfig, prompt_len: int, dtype_bytes: int = 2) -> int:
    """E03.2a: 2 (K and V) x layers x KV heads x head_dim x dtype bytes, per token, times the prompt."""
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * dtype_bytes * prompt_len


def kv_transfer_seconds(arch: ArchConfig, prompt_len: int, bandwidth: float, latency_s: float = 0.0,
                        dtype_bytes: int = 2) -> float:
    """E03.2b: latency + bytes / bandwidth."""
    return latency_s + kv_transfer_bytes(arch, prompt_len, dtype_bytes) / bandwidth


def size_pd_cluster(workload: Workload, ttft_slo_ms: float, itl_slo_ms: float, links: Mapping[str, float], *,
                    model: str = "llama-3.1-8b", hardware: str = "h100-sxm", config: EngineConfig | None = None,
                    max_instances: int = 8) -> tuple[int, int, str]:
    """E03.3: layouts in order of instances (and of prefill instances within a total), each tried on the
    fastest link: a layout that misses the SLOs there misses them on every slower one. The first that meets
    them is the plan; then its slowest link that still does."""
    config = config or EngineConfig(max_num_batched_tokens=2048, max_num_seqs=256)

    def meets(x: int, y: int, bandwidth: float) -> bool:
        cluster = Cluster(model, hardware, config, num_prefill_replicas=x, num_decode_replicas=y,
                          router="least_loaded", kv_link_bandwidth=bandwidth)
        return _within_slos(cluster.run(workload), len(workload.requests), ttft_slo_ms, itl_slo_ms)

    fastest = max(links.values())
    for total in range(2, max_instances + 1):
        for x in range(1, total):
            if meets(x, total - x, fastest):
                link = next(name for name in sorted(links, key=links.get) if meets(x, total - x, links[name]))
                return x, total - x, link
    raise ValueError(f"no layout of at most {max_instances} instances meets TTFT <= {ttft_slo_ms} ms (p90) and "
                     f"ITL <= {itl_slo_ms} ms (p99), even on the fastest link")


def _within_slos(metrics: RunMetrics, num_requests: int, ttft_slo_ms: float, itl_slo_ms: float) -> bool:
    return (metrics.completed == num_requests and metrics.p90_ttft_ms <= ttft_slo_ms
            and metrics.p99_itl_ms <= itl_slo_ms)


class VTCScheduler(Scheduler):
    """E03.4 (debug), fixed: the lift must apply to every tenant that becomes active, not only to one seen
    for the first time. The stub lifted newcomers only, so a tenant that had been served before, went idle
    and came back kept the counter it left with. Meanwhile the backlogged tenant's counter kept growing, so
    the returning tenant had the lowest counter by the whole service the other got while it was away, and
    the queue gave it every admission until it caught up: the tenant that kept the server busy starved for
    that long. VTC's rule (Sheng et al., OSDI'24, the counter lift of its algorithm) lifts a tenant whose
    queue goes from empty to non-empty to max(its own counter, the lowest counter among the backlogged
    tenants). With nobody else backlogged there is nobody to starve; like the engine's
    `FairScheduler.on_added`, this lifts it to the highest counter on record then, so that it cannot carry
    credit from its idle time into the next competition either."""

    def __init__(self, config: EngineConfig, num_kv_blocks: int, *, cache_namespace: str = "",
                 explain_misses: bool = False) -> None:
        self.virtual_counters: dict[str, float] = {}
        self.num_running_by_group: Counter[str] = Counter()
        self.num_unfinished_by_group: Counter[str] = Counter()
        super().__init__(config, num_kv_blocks, cache_namespace=cache_namespace, explain_misses=explain_misses)

    def make_request_queue(self) -> FairRequestQueue:
        return FairRequestQueue(self.virtual_counters, self.num_running_by_group)

    def on_added(self, request: Request) -> None:
        """A tenant with nothing unfinished (new, or back from idle) is lifted to the backlogged floor."""
        tenant = request.group_key
        if tenant not in self.num_unfinished_by_group:
            counters = self.virtual_counters
            active = [counters[t] for t in self.num_unfinished_by_group]
            floor = min(active) if active else max(counters.values(), default=0.0)
            counters[tenant] = max(counters.get(tenant, 0.0), floor)
        self.num_unfinished_by_group[tenant] += 1

    def on_admitted(self, request: Request) -> None:
        self.num_running_by_group[request.group_key] += 1
        self.virtual_counters[request.group_key] += request.num_tokens - request.num_computed_tokens

    def on_computed(self, request: Request, num_new_tokens: int) -> None:
        self.virtual_counters[request.group_key] += num_new_tokens

    def on_left_running(self, request: Request) -> None:
        _decrement(self.num_running_by_group, request.group_key)

    def on_released(self, request: Request) -> None:
        _decrement(self.num_unfinished_by_group, request.group_key)

    def select_victim(self, candidates: Sequence[Request]) -> Request:
        most = max(self.virtual_counters[r.group_key] for r in candidates)
        return next(r for r in reversed(candidates) if self.virtual_counters[r.group_key] == most)


def _decrement(counts: Counter[str], tenant: str) -> None:
    counts[tenant] -= 1
    if not counts[tenant]:
        del counts[tenant]
