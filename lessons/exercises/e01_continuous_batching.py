"""Exercises of lesson 1, "From static to continuous batching": E01.1, E01.2 and E01.3.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e01_continuous_batching.py --impl=learner          # all three exercises
    pytest tests/exercises/test_e01_continuous_batching.py --impl=learner -k e01_1 # one

The tests compare your answers with the engine's own schedulers (core/scheduler.py), run on
the same inputs; E01.3, a design exercise, serves your plan in the simulator and checks it against its
targets. Reference solutions: lessons/exercises/solutions/e01_continuous_batching.py.

Lesson: lessons/01-continuous-batching.md#exercises
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.metrics import RunMetrics
    from core.workload import Workload


@dataclass(frozen=True)
class ToyRequest:
    """A request reduced to the three numbers a scheduler reads (given: nothing to write here).

    `num_computed_tokens` counts the tokens whose K/V is already in the cache; the request still needs
    `num_tokens - num_computed_tokens` tokens run through the model before it can sample its next token.
    """

    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int = 0  # tokens generated so far
    num_computed_tokens: int = 0  # tokens whose K/V is cached

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt plus generated."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_remaining(self) -> int:
        """Tokens to run before the next sample: 1 when decoding, more when (re)filling the prompt."""
        return self.num_tokens - self.num_computed_tokens


def schedule_step(running: list[ToyRequest], waiting: list[ToyRequest], max_num_batched_tokens: int,
                  max_num_seqs: int, enable_chunked_prefill: bool = True) -> dict[str, int]:
    """E01.1 (implement): one step of continuous batching.

    `running` holds the requests already in the batch, in the order they were admitted; `waiting` the
    queue, oldest first (requests there have `num_computed_tokens == 0`). KV memory is plentiful here: no
    request is ever preempted (lesson 2 adds that). Return `{request_id: tokens scheduled this step}`, in
    the order you scheduled them, leaving out requests that get nothing. The rules are the engine's
    (`Scheduler.schedule` in core/scheduler.py):

    1. Running requests first, in order. Each gets all its remaining tokens (`num_remaining`: 1 when
       decoding, the rest of its prompt if its prefill was cut last step), but never more than the token
       budget left (`max_num_batched_tokens` minus what earlier requests took). Stop when the budget is 0.
    2. Then waiting requests, in order, while budget is left and fewer than `max_num_seqs` requests are
       running (every running request counts, even one that got no tokens in step 1; each admitted request
       counts from then on). A waiting request gets its remaining tokens. If they exceed the budget left:
       with `enable_chunked_prefill` it gets what is left (a chunk; the rest comes next step); without it,
       admission stops right there: the queue is first come, first served, so nobody behind it may jump
       ahead, even a request that would fit.

    Example: running = [a (decoding), b (decoding)], waiting = [c (10-token prompt)], budget 8,
    max_num_seqs 4: a and b take 1 token each, c gets a 6-token chunk -> {"a": 1, "b": 1, "c": 6}.
    Without chunked prefill c does not fit the 6 tokens left, so the step is {"a": 1, "b": 1}.

    Interview question: Q-SCHED-01 (lessons/interview-bank.md#q-sched-01).
    """
    raise NotImplementedError("E01.1: schedule one continuous-batching step")


def static_steps(output_lens: list[int], batch_size: int) -> int:
    """E01.2 (predict-then-run), part a: how many steps static batching takes.

    Every request has a 1-token prompt, so the step that runs its prompt also samples its first output
    token, and request i then needs `output_lens[i]` steps in all. Every step costs the same whatever the
    batch holds (decode steps nearly do, below the knee: lesson 1, "The cost of a step").

    Static batching takes the requests in list order, `batch_size` at a time, and runs each batch until its
    longest member finishes; only then does the next batch start.
    Example: output_lens = [4, 1, 1, 2], batch_size 2 -> batches [4, 1] and [1, 2] -> 4 + 2 = 6 steps.
    """
    raise NotImplementedError("E01.2: count the steps of static batching")


def continuous_steps(output_lens: list[int], batch_size: int) -> int:
    """E01.2 (predict-then-run), part b: how many steps continuous batching takes.

    Same requests and costs as `static_steps`. At most `batch_size` requests run in a step; when one
    finishes, the next request in list order takes its place in the very next step.
    Example: [4, 1, 1, 2] with batch_size 2: step 1 runs (r0, r1); step 2 (r0, r2); steps 3-4 (r0, r3)
    -> 4 steps, against 6 for static batching.

    Hint: no schedule beats max(ceil(sum(output_lens) / batch_size), max(output_lens)) steps; the exact
    count follows each of the `batch_size` slots (a heap of "free at step t" works).
    """
    raise NotImplementedError("E01.2: count the steps of continuous batching")


def throughput_ratio(output_lens: list[int], batch_size: int) -> float:
    """E01.2 (predict-then-run), part c: continuous over static throughput (output tokens per step).

    Both produce the same tokens, so the ratio is static steps / continuous steps.
    Predict before you compute: with batch_size 8, what is the ratio when all outputs are 128 tokens? When
    one request of each batch wants 1536 tokens and the others 16? Then run the notebook's experiment
    (outputs exponential with mean 128, capped at 32 / 128 / 512 / 1536) and compare.

    Interview questions: Q-BATCH-01, Q-BATCH-02 (lessons/interview-bank.md#q-batch-01).
    """
    raise NotImplementedError("E01.2: the continuous / static throughput ratio")


@dataclass(frozen=True)
class DeploymentPlan:
    """What E01.3 returns (given: nothing to write here): how many identical replicas, and the two
    scheduler knobs of lesson 1's token budget section, the same on every replica."""

    num_replicas: int
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class DeploymentTarget:
    """What E01.3 is given (given: nothing to write here): a model on a GPU profile (datasheet numbers, bf16),
    the traffic, and the latency targets, as p90 values in milliseconds.

    The traffic is `num_requests` requests arriving as a Poisson process at `arrival_rate` requests/s, every
    prompt `prompt_len` tokens, outputs exponential with mean `mean_output_len` (capped at 4x the mean):
    `workload()` builds exactly the workload the tests serve. `serve(plan)` runs it through the simulator:
    `plan.num_replicas` replicas behind a least-loaded router, each with the plan's knobs and chunked
    prefill (the course's `Cluster`, sim/cluster.py). `met_by(metrics)` says whether a run met the targets.
    """

    model: str
    hardware: str
    arrival_rate: float
    prompt_len: int
    mean_output_len: int
    ttft_p90_ms: float
    tpot_p90_ms: float
    num_requests: int = 200

    def workload(self) -> Workload:
        from core.workload import Exponential, Workload

        return Workload.synthetic(self.num_requests, self.prompt_len,
                                  Exponential(self.mean_output_len, 4 * self.mean_output_len),
                                  arrival=self.arrival_rate, seed=0, name="e01-3")

    def serve(self, plan: DeploymentPlan) -> RunMetrics:
        from core.config import EngineConfig
        from sim.cluster import Cluster

        config = EngineConfig(max_num_seqs=plan.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens)
        return Cluster(self.model, self.hardware, config, num_replicas=plan.num_replicas,
                       router="least_loaded").run(self.workload())

    def met_by(self, metrics: RunMetrics) -> bool:
        """Every request served, p90 TTFT and p90 TPOT within their targets."""
        return (metrics.failed == 0 and metrics.completed == self.num_requests
                and metrics.p90_ttft_ms <= self.ttft_p90_ms and metrics.p90_tpot_ms <= self.tpot_p90_ms)


def plan_deployment(target: DeploymentTarget) -> DeploymentPlan:
    """E01.3 (design): size a deployment that meets a latency target at the lowest cost.

    Choose the number of replicas (the cost), `max_num_seqs` and `max_num_batched_tokens` for
    `target.model` on `target.hardware` so that the traffic of `target` meets its p90 TTFT and p90 TPOT
    targets, with as few replicas as you can justify. Work it out before you simulate: what one step costs
    with a full token budget (`CostModel.step_time` in sim/cost_model.py, or lesson 1's arithmetic), how
    long a prompt waits for its chunks, how many requests per second one replica can complete, and how much
    headroom the queue needs (lesson 1, "Load and capacity"). Then check with `target.serve(plan)` and adjust.

    What the tests check: your plan meets both targets on `target.workload()`, and it uses at most one replica
    more than the reference plan needs. The lesson lists what a reviewer looks for beyond that.
    Example target: Llama-3.1-8B on an H100, 80 requests/s of 1024-token prompts and 128-token answers (mean),
    p90 TTFT <= 200 ms and p90 TPOT <= 12 ms.

    Interview questions: Q-METRIC-02, Q-SCHED-01, Q-SIM-01 (lessons/interview-bank.md#q-metric-02).
    """
    raise NotImplementedError("E01.3: size the deployment (replicas, max_num_seqs, max_num_batched_tokens)")
