"""Checks for lesson 7's exercises; `impl` is the reference or your stub (see conftest.py).

E07.1 computes fronts of hand-built tables, of seeded random tables full of ties (against a brute-force
reading of the definition), and of a real sweep simulated on the CPU profile (against the sweep's own
`pareto_front`). E07.2 checks the arithmetic on hand-made numbers. Then it asks the simulator for the goodput
of three configurations of Llama-3.1-8B on an H100 (the highest rate on a short ladder at which at least 90%
of requests meet the SLO), and checks that the cheapest plan is the one the table implies and that one replica
of it, at its share of the traffic, meets the SLO in the simulator too. E07.3 routes among replicas whose queues
are placed by hand, then runs as a plug-in of a simulated fleet against the least-loaded router. Simulated runs
are deterministic; nothing here reads a clock.
"""

from __future__ import annotations

import math
import random
import warnings

import pytest
import simpy

from core import EngineConfig, Exponential, Request, Workload
from serving_lab.manifest import EXAMPLE_MANIFEST, load_manifest
from serving_lab.sweep import Sweep, parse_grid, run_sweep
from serving_lab.sweep import pareto_front as sweep_front
from sim import Cluster, Simulator
from sim.router import ROUTERS, register_router

# ---- E07.1: the Pareto front of a sweep -----------------------------------------------------------------

HAND_TABLE = [
    {"output_throughput": 300, "p99_itl_ms": 30, "p99_ttft_ms": 400},  # 0: dominated by 1 (same, but slower ITL)
    {"output_throughput": 300, "p99_itl_ms": 25, "p99_ttft_ms": 400},  # 1: front (most throughput)
    {"output_throughput": 120, "p99_itl_ms": 8, "p99_ttft_ms": 900},   # 2: front (lowest ITL)
    {"output_throughput": 250, "p99_itl_ms": 25, "p99_ttft_ms": 200},  # 3: front (trades throughput for TTFT)
    {"output_throughput": 250, "p99_itl_ms": 25, "p99_ttft_ms": 200},  # 4: equal to 3: neither dominates
    {"output_throughput": 100, "p99_itl_ms": 9, "p99_ttft_ms": 950},   # 5: dominated by 2
    {"output_throughput": 80, "p99_itl_ms": 40, "p99_ttft_ms": 100},   # 6: front (lowest TTFT)
]


def test_e07_1_hand_built_table(impl):
    assert impl.pareto_front(HAND_TABLE) == [1, 2, 3, 4, 6]
    assert impl.pareto_front(HAND_TABLE, ("output_throughput",), ("p99_itl_ms", "p99_ttft_ms")) == [1, 2, 3, 4, 6]
    assert impl.pareto_front(HAND_TABLE, minimize=()) == [0, 1]  # throughput alone: the two best, tied
    assert impl.pareto_front(HAND_TABLE, maximize=(), minimize=("p99_itl_ms",)) == [2]
    assert impl.pareto_front(HAND_TABLE, maximize=(), minimize=("p99_ttft_ms",)) == [6]


def test_e07_1_edge_cases(impl):
    assert impl.pareto_front([]) == []
    one = [{"output_throughput": 1.0, "p99_itl_ms": 5.0, "p99_ttft_ms": 9.0}]
    assert impl.pareto_front(one) == [0]
    assert impl.pareto_front(one * 3) == [0, 1, 2]  # equal rows stay on the front together
    # the direction matters: the same two rows, one better on each axis, then one better on both
    rows = [{"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 2.0}]
    assert impl.pareto_front(rows, ("a",), ("b",)) == [0, 1]
    assert impl.pareto_front(rows, ("a", "b"), ()) == [1]
    assert impl.pareto_front(rows, (), ("a", "b")) == [0]
    # columns not named do not count, whatever their type
    labelled = [{"point": "x", "a": 1.0, "b": 3.0}, {"point": "y", "a": 1.0, "b": 2.0}]
    assert impl.pareto_front(labelled, ("a",), ("b",)) == [1]


def dominates(a: dict, b: dict, maximize: tuple[str, ...], minimize: tuple[str, ...]) -> bool:
    """The definition, read literally: as good on every axis, better on one."""
    as_good = all(a[m] >= b[m] for m in maximize) and all(a[m] <= b[m] for m in minimize)
    better = any(a[m] > b[m] for m in maximize) or any(a[m] < b[m] for m in minimize)
    return as_good and better


@pytest.mark.parametrize("seed", range(5))
def test_e07_1_random_tables_with_ties(impl, seed):
    rng = random.Random(seed)
    axes = (("thr",), ("itl", "ttft"))
    rows = [{"thr": rng.randint(0, 4), "itl": rng.randint(0, 4), "ttft": rng.randint(0, 4)} for _ in range(40)]
    expected = [i for i, row in enumerate(rows) if not any(dominates(other, row, *axes) for other in rows)]
    assert impl.pareto_front(rows, *axes) == expected


@pytest.fixture(scope="module")
def sweep_rows() -> list[dict]:
    """A 12-point sweep of the example manifest on the CPU profile."""
    grid = parse_grid({"max_num_seqs": [2, 8, 32], "prefill_budget_tokens": [32, 256], "block_size": [16, 32]})
    sweep = Sweep(load_manifest(EXAMPLE_MANIFEST), grid, "synthetic:24:96:24:20", hardware="local-cpu")
    return run_sweep(sweep).simulated()


@pytest.mark.parametrize("axes", [
    (("output_throughput",), ("p99_itl_ms", "p99_ttft_ms")),  # the sweep's own axes
    (("output_throughput",), ("p99_ttft_ms",)),
    (("request_throughput",), ("p99_itl_ms",)),
    (("output_throughput", "request_throughput"), ("mean_ttft_ms", "mean_itl_ms")),
], ids=["default", "ttft", "requests-itl", "two-and-two"])
def test_e07_1_agrees_with_the_sweep_on_a_simulated_table(impl, sweep_rows, axes):
    front = impl.pareto_front(sweep_rows, *axes)
    assert front == sweep_front(sweep_rows, *axes)
    assert 0 < len(front) < len(sweep_rows)  # a real trade-off: some points are on the front, some are not


# ---- E07.2: capacity planning ----------------------------------------------------------------------------

def test_e07_2_replicas_needed_by_hand(impl):
    assert impl.replicas_needed(100, 25) == 4
    assert impl.replicas_needed(101, 25) == 5  # rounding is up: 4.04 replicas do not exist
    assert impl.replicas_needed(30, 10) == 3  # an exact ratio needs no extra replica
    assert impl.replicas_needed(100, 25, max_utilization=0.8) == 5  # 20% headroom: 20 req/s each
    assert impl.replicas_needed(0, 25) == 0
    for goodput, utilization in [(0, 1.0), (-5, 1.0), (25, 0.0), (25, 1.5)]:
        with pytest.raises(ValueError):
            impl.replicas_needed(100, goodput, max_utilization=utilization)


def test_e07_2_cost_per_million_tokens_by_hand(impl):
    # one $3/h GPU making 6,400 tokens/s: $3 buys 23.04 M tokens
    assert impl.cost_per_million_tokens(3.0, 1, 6400) == pytest.approx(3.0 / 23.04)
    assert impl.cost_per_million_tokens(3.0, 2, 6400) == pytest.approx(2 * 3.0 / 23.04)
    assert impl.cost_per_million_tokens(3.0, 10, 51_200) == pytest.approx(30 / 184.32)  # a fleet: $0.163
    with pytest.raises(ValueError):
        impl.cost_per_million_tokens(3.0, 1, 0.0)


def test_e07_2_cheapest_deployment_by_hand(impl):
    small = {"name": "small", "goodput": 10.0, "gpus": 1}
    big = {"name": "big", "goodput": 25.0, "gpus": 2}
    # 100 req/s: 10 small GPUs against 4 x 2 = 8 big ones
    assert impl.cheapest_deployment([small, big], 100, 2.0) == {
        "name": "big", "replicas": 4, "gpus": 8, "usd_per_hour": pytest.approx(16.0)}
    # 20 req/s: 2 GPUs either way; the big pair has more spare capacity (25 against 20 req/s)
    assert impl.cheapest_deployment([small, big], 20, 2.0)["name"] == "big"
    # 10 req/s: 1 small GPU against 2 big ones
    assert impl.cheapest_deployment([small, big], 10, 2.0) == {
        "name": "small", "replicas": 1, "gpus": 1, "usd_per_hour": pytest.approx(2.0)}
    # headroom changes the answer: at 80%, 100 req/s needs 13 small GPUs or 5 x 2 big ones
    assert impl.cheapest_deployment([small, big], 100, 2.0, max_utilization=0.8)["gpus"] == 10
    # a row's own GPU price wins over the argument (a cheaper, older GPU)
    old = {"name": "old", "goodput": 7.0, "gpus": 1, "gpu_hour_usd": 1.0}  # 15 x $1 against big's 8 x $2
    assert impl.cheapest_deployment([small, big, old], 100, 2.0) == {
        "name": "old", "replicas": 15, "gpus": 15, "usd_per_hour": pytest.approx(15.0)}
    # a perfect tie is broken by the order of the table
    twin = dict(small, name="twin")
    assert impl.cheapest_deployment([small, twin], 30, 2.0)["name"] == "small"
    assert impl.cheapest_deployment([twin, small], 30, 2.0)["name"] == "twin"
    # configs that never met the SLO are skipped; none left is an error
    dead = [{"name": "dead", "goodput": 0.0, "gpus": 1}, {"name": "nan", "goodput": math.nan, "gpus": 1}]
    assert impl.cheapest_deployment(dead + [small], 30, 2.0)["name"] == "small"
    with pytest.raises(ValueError):
        impl.cheapest_deployment(dead, 30, 2.0)


# Llama-3.1-8B on the fitted H100 profile: 100 chat-like requests per rate, SLO TTFT <= 200 ms and TPOT <= 10 ms
# for at least 90% of them. About 10 short simulated runs in all.
SLO_MS = (200.0, 10.0)
RATES = (20.0, 40.0, 60.0)
CONFIGS = {"tp1-bf16": ({}, 1), "tp1-fp8": ({"dtype": "fp8"}, 1), "tp2-bf16": ({"tensor_parallel_size": 2}, 2)}


def chat(rate: float) -> Workload:
    return Workload.synthetic(100, prompt_len=(256, 768), output_len=(32, 128), arrival=rate, seed=0)


def simulator(name: str) -> Simulator:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Simulator("llama-3.1-8b", "h100-sxm", EngineConfig(max_num_seqs=256), **CONFIGS[name][0])


@pytest.fixture(scope="module")
def goodput_table() -> list[dict]:
    """Each configuration's goodput per replica: the highest rate of the ladder, climbing until the first
    failure, at which at least 90% of the requests meet the SLO (0 if even the lowest fails)."""
    table = []
    for name, (_, gpus) in CONFIGS.items():
        sim, goodput = simulator(name), 0.0
        for rate in RATES:
            if sim.run(chat(rate)).slo_attainment(*SLO_MS) < 0.9:
                break
            goodput = rate
        table.append({"name": name, "goodput": goodput, "gpus": gpus})
    return table


def test_e07_2_the_cheapest_plan_holds_in_the_simulator(impl, goodput_table):
    qps, price, utilization = 200.0, 3.0, 0.8
    assert all(row["goodput"] > 0 for row in goodput_table)
    plan = impl.cheapest_deployment(goodput_table, qps, price, max_utilization=utilization)

    def cost(row):  # the plan the table implies, worked out here without the exercise's code
        replicas = math.ceil(qps / (row["goodput"] * utilization) - 1e-9)
        return replicas * row["gpus"] * price, -replicas * row["goodput"]

    best = min(goodput_table, key=cost)
    replicas = impl.replicas_needed(qps, best["goodput"], max_utilization=utilization)
    assert plan == {"name": best["name"], "replicas": replicas, "gpus": replicas * best["gpus"],
                    "usd_per_hour": pytest.approx(cost(best)[0])}

    # one replica of the plan, at its share of the traffic, meets the SLO in the simulator
    run = simulator(plan["name"]).run(chat(qps / plan["replicas"]))
    assert run.slo_attainment(*SLO_MS) >= 0.9

    # the fleet's cost per million output tokens: what it pays per hour over what it makes per hour
    workload = chat(qps)
    tokens_per_s = qps * workload.total_output_tokens / len(workload)
    assert impl.cost_per_million_tokens(price, plan["gpus"], tokens_per_s) == pytest.approx(
        plan["usd_per_hour"] / (tokens_per_s * 3600) * 1e6)
    # and one replica's, from its simulated output throughput
    assert impl.cost_per_million_tokens(price, CONFIGS[plan["name"]][1], run.output_throughput) == pytest.approx(
        price * CONFIGS[plan["name"]][1] / (run.output_throughput * 3600) * 1e6)


# ---- E07.3: a router plug-in ------------------------------------------------------------------------------

def three_replicas():
    cluster = Cluster("llama-3.1-8b", "h100-sxm", EngineConfig(max_num_seqs=64, max_num_batched_tokens=512),
                      num_replicas=3)
    env = simpy.Environment()
    return cluster.fleet, [cluster.simulator.make_executor(env, f"replica{i}") for i in range(3)]


def test_e07_3_counts_prompt_tokens_not_requests(impl):
    fleet, replicas = three_replicas()
    router = impl.LeastPendingPrefillRouter(fleet)
    replicas[0].add_request(Request("long", [7] * 4000, max_tokens=4))
    for i in range(3):
        replicas[1].add_request(Request(f"short{i}", [7] * 100, max_tokens=4))
    replicas[2].add_request(Request("mid", [7] * 1000, max_tokens=4))
    assert router.route(Request("next", [7] * 10, max_tokens=1), replicas) is replicas[1]  # 300 < 1,000 < 4,000


def test_e07_3_counts_only_what_is_left_to_prefill(impl):
    fleet, replicas = three_replicas()
    router = impl.LeastPendingPrefillRouter(fleet)
    replicas[0].add_request(Request("chunked", [7] * 1200, max_tokens=4))
    replicas[0].scheduler.schedule(0.0)  # a 512-token chunk is scheduled: 688 tokens left once it ran
    replicas[0].scheduler.running[0].num_computed_tokens = 512
    replicas[1].add_request(Request("waiting", [7] * 700, max_tokens=4))
    replicas[2].add_request(Request("decoding", [7] * 2000, max_tokens=4))
    replicas[2].scheduler.schedule(0.0)
    replicas[2].scheduler.running[0].num_computed_tokens = 2003  # prompt done, three tokens decoded
    assert router.route(Request("next", [7] * 10, max_tokens=1), replicas) is replicas[2]
    assert router.route(Request("next", [7] * 10, max_tokens=1), replicas[:2]) is replicas[0]  # 688 < 700


def test_e07_3_breaks_ties_by_requests_then_order(impl):
    fleet, replicas = three_replicas()
    router = impl.LeastPendingPrefillRouter(fleet)
    assert router.route(Request("first", [7] * 10, max_tokens=1), replicas) is replicas[0]
    for replica, n in zip(replicas, (2, 1, 1)):
        for i in range(n):
            request = Request(f"{replica.name}-{i}", [7] * 10, max_tokens=4)
            replica.add_request(request)
            replica.scheduler.schedule(0.0)
            request.num_computed_tokens = 10  # prefilled: no pending tokens anywhere
    assert router.route(Request("next", [7] * 10, max_tokens=1), replicas) is replicas[1]
    assert router.route(Request("next", [7] * 10, max_tokens=1), replicas[::-1]) is replicas[2]


def test_e07_3_as_a_plug_in_it_beats_least_loaded_on_prompts_that_differ_a_hundredfold(impl):
    """Prompts exponential with mean 1,024 tokens (16 to 8,192), 80 requests/s on four H100 replicas."""
    register_router("e07_3_least_pending_prefill")(impl.LeastPendingPrefillRouter)
    try:
        workload = Workload.synthetic(400, Exponential(1024, 8192, 16), Exponential(128, 512), arrival=80.0, seed=1)
        config = EngineConfig(max_num_seqs=64, max_num_batched_tokens=512)
        p99 = {router: Cluster("llama-3.1-8b", "h100-sxm", config, num_replicas=4, router=router).run(workload)
               .p99_ttft_ms for router in ("least_loaded", "e07_3_least_pending_prefill")}
    finally:
        del ROUTERS["e07_3_least_pending_prefill"]
    assert p99["e07_3_least_pending_prefill"] < 0.9 * p99["least_loaded"], p99
